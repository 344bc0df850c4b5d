"""The GPU check: every notebook under the `gpu` preset, its executed copy, and a summary of
the GPU claims (AMP speed-up and peak memory against fp32, checkpointing memory and time, MFU,
the planner's estimate against `torch.cuda.max_memory_allocated`).

    make gpu-check                                            # = the next line
    python scripts/gpu_check.py --out docs/gpu-reference      # on a machine with a CUDA GPU
    python scripts/gpu_check.py --preset cpu-quick --out /tmp/gpu-dry   # CPU dry run, same code path

Each notebook runs in a fresh Python process (as in a fresh kernel) through IPython's
InteractiveShell (scripts/nbrun.py: no Jupyter kernel stack needed), with a timeout; a failing
or timed-out notebook is recorded and the check goes on. Whatever happens, OUT gets
`summary.json`, `log.txt` and `notebooks.tar.gz` (the executed notebooks; also as files in
OUT/notebooks unless --tar-only). Figures only a GPU can give are null, with the reason, on a
CPU dry run.

Without a CUDA GPU the `gpu` preset has nothing to check: the check says so in one line, writes
nothing and exits 0. Not a failure: `make gpu-check` on a laptop or in CPU CI is a question
answered ("no GPU here"), and a non-zero status would make every CPU machine's run of the
documented command look broken; the line names what to run instead (the CPU dry run).

Sizing: the whole check must fit 8 minutes on one H200 (fp32 without TF32 ~67 TFLOP/s, bf16
~790). A gpu-preset GPT step as sized for an H200 (12 layers, d=768, 32 x 512 tokens) is ~10 TFLOP: ~0.2-0.3 s in
fp32, so the preset's 300 steps would take 60-90 s a run, and notebooks 01, 02, 03 and 07 train
2-3 such runs each (11 in all); each notebook's fresh process also pays ~10-15 s of imports and
CUDA start-up. The check therefore caps steps at 30 (WORKBENCH_MAX_STEPS; the shapes stay the gpu
preset's): ~330 s of work estimated, within a 450 s budget. The timing, memory and MFU claims need
a few timed steps, not a trained model; the gpu preset itself keeps 300 steps for a learner.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import tarfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# Seconds each notebook may take at most (the whole check also keeps to --budget-s); a notebook
# not listed here gets DEFAULT_TIMEOUT_S.
DEFAULT_TIMEOUT_S = 120
TIMEOUT_S = {"00_tour": 45, "01_mixed_precision": 90, "02_gradient_accumulation": 75,
             "03_activation_checkpointing": 120, "04_input_pipelines": 90, "05_quantization": 75,
             "06_multi_gpu": 90, "07_planner": 120,
             # two inductor compiles of the 12-layer GPT, 34 s each on an H200 (docs/gpu-reference)
             "08_speed_without_changing_the_math": 240}
NO_GPU = "no CUDA device here (a dry run): a GPU-only figure"
# What the check says on a machine without a CUDA GPU, and all it does there: nothing is written.
NO_CUDA_LINE = ("gpu-check: no CUDA GPU here (torch.cuda.is_available() is False); nothing run, nothing written "
                "to {out}; a CPU dry run of the same code path: python scripts/gpu_check.py --preset cpu-quick --out /tmp/dry")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def run_summary(r: Any) -> dict[str, Any]:
    """The figures of one RunResult that the GPU claims read."""
    m = r.memory
    return {"name": r.name, "status": r.status, "device": r.device, "precision": r.config.precision,
            "checkpointing": r.config.activation_checkpointing, "batch_size": r.config.batch_size,
            "grad_accum_steps": r.config.grad_accum_steps, "steps": r.steps_done,
            "step_time_s": r.step_time_s, "samples_per_sec": r.samples_per_sec, "tokens_per_sec": r.tokens_per_sec,
            "tflops_per_sec": r.tflops_per_sec, "mfu": r.mfu, "peak_flops_source": r.peak_flops_source,
            "activation_bytes": m and m.activation_bytes, "peak_bytes": m and m.peak_bytes,
            "peak_kind": m and m.peak_kind, "held_before_bytes": m and m.held_before_bytes, "final_loss": r.losses[-1] if r.losses else None,
            "accuracy": r.accuracy, "wall_s": round(r.wall_s, 2)}


def _ratio(a: Any, b: Any) -> float | None:
    return round(a / b, 4) if _number(a) and _number(b) else None


def notebook_claims(name: str, ns: dict[str, Any]) -> dict[str, Any]:
    """The claims one executed notebook measured, read from its namespace (what exists of it)."""
    from workbench.measure.result import RunResult

    runs = [run_summary(v) for k, v in ns.items() if isinstance(v, RunResult) and not k.startswith("_")]
    claims: dict[str, Any] = {"runs": runs}
    cuda = any(r["device"] == "cuda" for r in runs)
    try:
        if name == "01_mixed_precision" and "runs" in ns:
            base = ns["baseline"]
            for r in ns["runs"][1:]:
                p = r.config.precision
                claims[f"{p}_speedup_vs_fp32"] = _ratio(base.step_time_s, r.step_time_s)
                claims[f"{p}_peak_vs_fp32"] = (_ratio(r.memory.peak_bytes, base.memory.peak_bytes) if cuda
                                               else None)
                claims[f"{p}_saved_activations_vs_fp32"] = _ratio(r.memory.activation_bytes,
                                                                  base.memory.activation_bytes)
            if not cuda:
                claims["why_null"] = {"peak_vs_fp32": NO_GPU}
        elif name == "03_activation_checkpointing" and "pair" in ns:
            pair = ns["pair"]
            claims.update({"saved_ratio": pair.ratio("saved_bytes", "all"), "peak_ratio": pair.ratio("peak_bytes", "all"),
                           "time_ratio": pair.ratio("step_time_s", "all"), "flops_ratio": pair.ratio("flops", "all"),
                           "peak_kind": pair.points[0].peak_kind, "timing_is_clean": pair.timing_is_clean})
            if "checkpointed" in ns and "baseline" in ns:
                claims["run_peak_ratio"] = (_ratio(ns["checkpointed"].memory.peak_bytes, ns["baseline"].memory.peak_bytes)
                                            if cuda else None)
                claims["run_time_ratio"] = _ratio(ns["checkpointed"].step_time_s, ns["baseline"].step_time_s)
        elif name == "07_planner":
            checks = [ns[k] for k in ("plan_check", "recipe_check") if k in ns]
            # the run's own peak over its training steps: max_memory_allocated less what the notebook
            # held before the run began, evaluation left out (RunResult.memory.peak_bytes)
            claims["estimate_vs_max_memory_allocated"] = [{
                "plan": c.plan.label, "predicted_peak_bytes": c.plan.estimate.peak_bytes,
                "max_memory_allocated": c.result.memory.peak_bytes if c.result.device == "cuda" else None,
                "held_before_bytes": c.result.memory.held_before_bytes,
                "measured_over_predicted": (_ratio(c.result.memory.peak_bytes, c.plan.estimate.peak_bytes)
                                            if c.result.device == "cuda" else None),
                "why_null": None if c.result.device == "cuda" else NO_GPU} for c in checks]
        elif name == "02_gradient_accumulation" and "peaks" in ns:
            claims["window_peaks"] = {f"{b}x{k}": {"bytes": p.bytes, "kind": p.kind} for (b, k), p in ns["peaks"].items()}
        elif name == "05_quantization" and "speeds" in ns:
            claims["int8_speedup_interleaved"] = {k: round(s.ratio, 3) for k, s in ns["speeds"].items()}
        elif name == "06_multi_gpu" and "speedup" in ns:
            claims.update({"two_process_speedup": round(ns["speedup"], 3), "processes_device": ns.get("device")})
    except Exception as error:  # a claim that cannot be read is reported, never fatal
        claims["extraction_error"] = f"{type(error).__name__}: {error}"
    return claims


def child(name: str, out_dir: pathlib.Path) -> int:
    """Run one notebook here; write its executed copy and its claims."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import nbrun

    began = time.perf_counter()
    os.chdir(ROOT / "notebooks")  # notebooks run from their folder, as in JupyterLab
    status, error, ns = nbrun.execute(ROOT / "notebooks" / f"{name}.ipynb", out_dir / f"{name}.ipynb")
    record = {"status": status, "error": error, "seconds": round(time.perf_counter() - began, 1),
              "claims": notebook_claims(name, ns)}
    (out_dir / f"{name}.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return 0 if status == "ok" else 1


def _skips(executed: pathlib.Path) -> list[str]:
    """Lines the notebook printed about cells it skipped (MiniLM or DALI not installed, ...)."""
    if not executed.exists():
        return []
    nb = json.loads(executed.read_text())
    lines = []
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            text = output.get("text", "") if output.get("output_type") == "stream" else ""
            text = "".join(text) if isinstance(text, list) else text  # nbformat allows either
            lines += [line.strip() for line in text.splitlines() if line.strip().lower().startswith("skipped")]
    return sorted(set(lines))


def machine() -> dict[str, Any]:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": None, "cpu_cores": os.cpu_count()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory, capability=f"{props.major}.{props.minor}",
                    gpus=torch.cuda.device_count())
    for package in ("accelerate", "transformers", "datasets", "torchao", "IPython", "numpy", "pyarrow",
                    "huggingface_hub"):
        try:
            info[package] = __import__(package).__version__
        except Exception as error:  # noqa: BLE001: a missing package is a fact to record
            info[package] = f"not importable: {type(error).__name__}"
    return info


def headline(notebooks: dict[str, Any]) -> dict[str, Any]:
    """The four GPU claims in one place, from the notebooks that measure them."""
    def claims(name: str) -> dict[str, Any]:
        return notebooks.get(name, {}).get("claims", {})

    amp = {k: v for k, v in claims("01_mixed_precision").items() if k != "runs"}
    ckpt = {k: v for k, v in claims("03_activation_checkpointing").items() if k != "runs"}
    # MFU against the spec sheet's peak, on the GPU only (on a CPU the peak is a measured matmul,
    # and an emulated dtype's "peak" is a guess: per-run figures stay in each notebook's runs).
    mfu = {f"{name} / {r['name']}": r["mfu"] for name, nb in notebooks.items()
           for r in nb.get("claims", {}).get("runs", []) if r.get("mfu") is not None and r["device"] == "cuda"}
    plan = claims("07_planner").get("estimate_vs_max_memory_allocated")
    return {"amp_vs_fp32": amp or None, "checkpointing": ckpt or None,
            "mfu_vs_spec_sheet_peak": mfu or {"value": None, "why_null": NO_GPU},
            "estimate_vs_max_memory_allocated": plan}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "gpu-reference")
    parser.add_argument("--preset", default="gpu", choices=("gpu", "cpu", "cpu-quick"),
                        help="gpu on a GPU; cpu-quick for a CPU dry run of the same code path")
    parser.add_argument("--max-steps", type=int, default=30, help="WORKBENCH_MAX_STEPS for every run (0: no cap)")
    parser.add_argument("--budget-s", type=float, default=450, help="stop starting notebooks after this many seconds")
    parser.add_argument("--notebooks", nargs="*", default=NOTEBOOKS)
    parser.add_argument("--tar-only", action="store_true", help="executed notebooks only inside notebooks.tar.gz")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Absolute before anything changes directory: each child runs from notebooks/ (child()), and
    # a relative --out then named a folder under notebooks/ that was not there.
    typed_out, args.out = args.out, args.out.resolve()
    if args.child:
        return child(args.child, args.out)
    executed = args.out / "notebooks"
    if executed.resolve() == (ROOT / "notebooks").resolve():  # measured: --out . --tar-only deleted them all
        parser.error(f"--out {typed_out} would write the executed notebooks over the ones it runs, in "
                     f"{ROOT / 'notebooks'} (and --tar-only would delete them); pass another folder such as "
                     "--out docs/gpu-reference")
    if args.preset == "gpu" and not _cuda_available():
        print(NO_CUDA_LINE.format(out=args.out))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    executed.mkdir(exist_ok=True)
    env = {**os.environ, "WORKBENCH_PRESET": args.preset, "WORKBENCH_HEADLESS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.max_steps:
        env["WORKBENCH_MAX_STEPS"] = str(args.max_steps)
    summary: dict[str, Any] = {"preset": args.preset, "max_steps": args.max_steps or None, "budget_s": args.budget_s,
                               "machine": machine(), "notebooks": {}}
    began = time.perf_counter()
    with open(args.out / "log.txt", "w") as log:
        print(json.dumps(summary["machine"]), file=log, flush=True)
        for name in args.notebooks:
            left = args.budget_s - (time.perf_counter() - began)
            if left < 20:
                summary["notebooks"][name] = {"status": "not run", "error": f"the check's budget of {args.budget_s:.0f} s was spent"}
                continue
            timeout = min(TIMEOUT_S.get(name, DEFAULT_TIMEOUT_S), left)
            print(f"\n===== {name} (timeout {timeout:.0f} s)", file=log, flush=True)
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, __file__, "--child", name, "--out", str(executed)], env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
                record = json.loads((executed / f"{name}.json").read_text())
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the notebook and whatever it started
                proc.wait()
                record = {"status": "timeout", "error": f"stopped after {timeout:.0f} s"}
            except (OSError, ValueError) as error:
                record = {"status": "crashed", "error": f"exit {proc.returncode}: {error}"}
            record["seconds"] = round(time.perf_counter() - start, 1)
            record["skipped"] = _skips(executed / f"{name}.ipynb")
            summary["notebooks"][name] = record
            print(f"===== {name}: {record['status']} in {record['seconds']} s {record.get('error') or ''}", file=log, flush=True)
            print(f"{name:<30} {record['status']:<8} {record['seconds']:6.1f} s  {record.get('error') or ''}", flush=True)
    summary["total_s"] = round(time.perf_counter() - began, 1)
    summary["claims"] = headline(summary["notebooks"])
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    with tarfile.open(args.out / "notebooks.tar.gz", "w:gz") as tar:
        for path in sorted(executed.glob("*")):
            tar.add(path, arcname=f"notebooks/{path.name}")
    if args.tar_only:
        for path in executed.glob("*"):
            path.unlink()
        executed.rmdir()
    failed = [n for n, r in summary["notebooks"].items() if r["status"] != "ok"]
    print(f"total {summary['total_s']} s; {len(failed)} not ok: {', '.join(failed) or '-'}; summary in {args.out / 'summary.json'}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
