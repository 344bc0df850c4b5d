"""The GPU check: every notebook under the `gpu` preset, its executed copy, and a summary of
the GPU claims (AMP speed-up and peak memory against fp32, checkpointing memory and time, MFU,
the planner's estimate against `torch.cuda.max_memory_allocated`, the predicted and measured
memory snapshots), with the best recipe's MFU measured first (scripts/gpu_recipe.py).

    make gpu-check                                            # = the next line
    python scripts/gpu_check.py --out docs/gpu-reference      # on a machine with a CUDA GPU
    python scripts/gpu_check.py --preset cpu-quick --out /tmp/dry   # CPU dry run, same code path

Each notebook runs in a fresh Python process (as in a fresh kernel) through IPython's
InteractiveShell (scripts/nbrun.py: no Jupyter kernel stack needed), with a timeout; a failing
or timed-out notebook is recorded and the check goes on. Whatever happens, OUT gets
`summary.json`, `log.txt`, `notebooks.tar.gz` (the executed notebooks; also as files in
OUT/notebooks unless --tar-only), `recipe.json` and `viewers.tar.gz` (the files the notebooks
wrote for PyTorch's viewers: 07's predicted and measured memory snapshots, 08's profiler trace).
Figures only a GPU can give are null, with the reason, on a CPU dry run.

Without a CUDA GPU the `gpu` preset has nothing to check: the check says so in one line, writes
nothing and exits 0. Not a failure: `make gpu-check` on a laptop or in CPU CI is a question
answered ("no GPU here"), and a non-zero status would make every CPU machine's run of the
documented command look broken; the line names what to run instead (the CPU dry run).

Sizing: the whole check must fit ten minutes on one H100/H200, whose lease also pays its start
(--budget-s 560 by default, the recipe first with up to 170 s of it). The first GPU run (run1 in
docs/gpu-reference, 30 steps, one notebook at a time) took 14-75 s a notebook that ran through
(00 14, 01 40, 02 49, 03 66, 04 42, 07 75 s), 08 over 120 s (two inductor compiles of the 12-layer
GPT, 34 s each) and 06 over 90 s; 05, 09, 10 and 11 have not run through on a GPU, so one at a
time is estimated, not measured, at ~650 s. So: steps capped
at 20 (WORKBENCH_MAX_STEPS; the shapes stay the gpu preset's: the timing, memory and MFU claims
need a few timed steps, not a trained model), evaluations at 256 samples (WORKBENCH_MAX_EVAL_SAMPLES:
the gpu preset evaluates up to 100,000), and two lanes (--lanes 2 on a GPU): the notebooks whose
GPU timings make claims (01, 03, 07, 08, 02) one after another in the first, the rest (mostly
CPU-side: input pipelines, int8, processes over gloo) beside them in the second; the recipe runs
alone before both. The summary records the lanes: a claim timed beside another notebook is read so.
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
# The notebooks whose GPU timings the claims read run in the first lane, in this order; every
# other notebook runs in the second (with --lanes 1, all in NOTEBOOKS' order).
TIMED_LANE = ("01_mixed_precision", "03_activation_checkpointing", "07_planner", "08_speed_without_changing_the_math",
              "02_gradient_accumulation")
VIEWER_FILES_MAX_BYTES = 15 * 2**20  # what one file the GPU machine sends back may hold (16 MiB), less room
# A dry run's notebooks on a CPU take minutes, not the GPU's seconds (00 ran past its 45 s on this
# project's busy 2-core machine): each gets this, the budget still bounding the whole.
DRY_RUN_TIMEOUT_S = 900
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
    from workbench.core.measure.result import RunResult

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
            snapshots = {k: ns[k] for k in ("predicted", "measured") if hasattr(ns.get(k), "peak_bytes")}
            if len(snapshots) == 2:  # its Optional section: both steps in memory_viz's format
                p, m = snapshots["predicted"], snapshots["measured"]
                claims["memory_snapshots"] = {
                    "predicted_peak_bytes": p.peak_bytes, "measured_peak_bytes": m.peak_bytes,
                    "measured_over_predicted": _ratio(m.peak_bytes, p.peak_bytes),
                    "predicted": p.source, "measured": m.source,
                    "files": ["runs/07_predicted_step.pickle", "runs/07_measured_step.pickle"]}
        elif name == "08_speed_without_changing_the_math" and "TRACE" in ns:
            from workbench.lessons.speed import trace_ranges

            trace = pathlib.Path(ns["TRACE"])  # relative to notebooks/, where the child runs
            claims["profiler_trace"] = {"file": str(trace), "bytes": trace.stat().st_size, "ranges": trace_ranges(trace)}
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
            "estimate_vs_max_memory_allocated": plan,
            "memory_snapshots": claims("07_planner").get("memory_snapshots"),
            "profiler_trace": claims("08_speed_without_changing_the_math").get("profiler_trace")}


def lanes_for(names: list[str], lanes: int) -> list[list[str]]:
    """The notebooks each lane runs, in order: with two, TIMED_LANE's first, the rest second."""
    if lanes <= 1:
        return [list(names)]
    timed = [n for n in TIMED_LANE if n in names]
    return [timed, [n for n in names if n not in timed]]


class _Notebook:
    """One notebook's child process, its log and its deadline."""

    def __init__(self, name: str, executed: pathlib.Path, env: dict[str, str], timeout: float) -> None:
        self.name, self.executed, self.timeout = name, executed, timeout
        self.log_path = executed / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.began = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", name, "--out", str(executed)], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def record(self) -> dict[str, Any] | None:
        """Its record once it has ended (killed at its deadline), else None."""
        if self.proc.poll() is None and time.perf_counter() - self.began < self.timeout:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the notebook and whatever it started
            self.proc.wait()
            record = {"status": "timeout", "error": f"stopped after {self.timeout:.0f} s"}
        else:
            try:
                record = json.loads((self.executed / f"{self.name}.json").read_text())
            except (OSError, ValueError) as error:
                record = {"status": "crashed", "error": f"exit {self.proc.returncode}: {error}"}
        self.log.close()
        record["seconds"] = round(time.perf_counter() - self.began, 1)
        record["skipped"] = _skips(self.executed / f"{self.name}.ipynb")
        return record


def run_notebooks(lanes: list[list[str]], executed: pathlib.Path, env: dict[str, str], *, deadline: float,
                  log: Any, timeouts: dict[str, float] | None = None, default_timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Every lane's notebooks, one at a time in each lane, the lanes side by side, until `deadline`
    (time.perf_counter()); a notebook not started by then is 'not run'."""
    records: dict[str, Any] = {}
    queues = [list(lane) for lane in lanes]
    running: list[_Notebook | None] = [None] * len(queues)
    while any(queues) or any(running):
        for i, queue in enumerate(queues):
            job = running[i]
            if job is not None and (record := job.record()) is not None:
                records[job.name] = record
                print(f"\n===== {job.name} (lane {i + 1}): {record['status']} in {record['seconds']} s "
                      f"{record.get('error') or ''}\n{job.log_path.read_text()}", file=log, flush=True)
                job.log_path.unlink()
                print(f"{job.name:<36} {record['status']:<8} {record['seconds']:6.1f} s  {record.get('error') or ''}",
                      flush=True)
                running[i] = job = None
            if job is None and queue:
                name = queue.pop(0)
                left = deadline - time.perf_counter()
                if left < 20:
                    records[name] = {"status": "not run", "error": "the check's budget was spent"}
                    continue
                timeout = (TIMEOUT_S if timeouts is None else timeouts).get(name, default_timeout)
                running[i] = _Notebook(name, executed, env, min(timeout, left))
        time.sleep(0.2)
    return records


def _pack_viewer_files(since: float, out: pathlib.Path) -> dict[str, Any]:
    """The files the notebooks wrote for PyTorch's viewers in this check (notebooks/runs/, newer than
    `since`) into out/viewers.tar.gz, largest left out first while over what one file may carry back."""
    found = sorted((p for p in (ROOT / "notebooks" / "runs").glob("*") if p.is_file() and p.stat().st_mtime >= since),
                   key=lambda p: p.stat().st_size)
    kept, left_out, total = [], [], 0
    for path in found:
        if total + path.stat().st_size <= VIEWER_FILES_MAX_BYTES:
            kept.append(path)
            total += path.stat().st_size
        else:
            left_out.append(f"{path.name} ({path.stat().st_size:,} B)")
    with tarfile.open(out / "viewers.tar.gz", "w:gz") as tar:
        for path in kept:
            tar.add(path, arcname=f"runs/{path.name}")
    return {"files": {p.name: p.stat().st_size for p in kept}, "left_out": left_out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "gpu-reference")
    parser.add_argument("--preset", default="gpu", choices=("gpu", "cpu", "cpu-quick"),
                        help="gpu on a GPU; cpu-quick for a CPU dry run of the same code path")
    parser.add_argument("--max-steps", type=int, default=20, help="WORKBENCH_MAX_STEPS for every run (0: no cap)")
    parser.add_argument("--max-eval-samples", type=int, default=256,
                        help="WORKBENCH_MAX_EVAL_SAMPLES for every run (0: the preset's)")
    parser.add_argument("--budget-s", type=float, default=560, help="stop starting anything after this many seconds")
    parser.add_argument("--recipe-budget-s", type=float, default=170,
                        help="seconds of the budget for the best recipe's MFU arms, run first (0: none)")
    parser.add_argument("--lanes", type=int, choices=(1, 2), default=None,
                        help="notebooks side by side (default: 2 on a GPU, 1 on a CPU)")
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
    cuda = _cuda_available()
    if args.preset == "gpu" and not cuda:
        print(NO_CUDA_LINE.format(out=args.out))
        return 0
    lanes = args.lanes or (2 if cuda else 1)
    args.out.mkdir(parents=True, exist_ok=True)
    executed.mkdir(exist_ok=True)
    env = {**os.environ, "WORKBENCH_PRESET": args.preset, "WORKBENCH_HEADLESS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.max_steps:
        env["WORKBENCH_MAX_STEPS"] = str(args.max_steps)
    if args.max_eval_samples:
        env["WORKBENCH_MAX_EVAL_SAMPLES"] = str(args.max_eval_samples)
    plan = lanes_for(args.notebooks, lanes)
    summary: dict[str, Any] = {"preset": args.preset, "max_steps": args.max_steps or None,
                               "max_eval_samples": args.max_eval_samples or None, "budget_s": args.budget_s,
                               "lanes": plan, "machine": machine(), "notebooks": {}}
    began, wall_began = time.perf_counter(), time.time()
    deadline = began + args.budget_s
    with open(args.out / "log.txt", "w") as log:
        print(json.dumps(summary["machine"]), file=log, flush=True)
        if args.recipe_budget_s > 0:
            sys.path.insert(0, str(ROOT / "scripts"))
            import gpu_recipe

            summary["recipe"] = gpu_recipe.run_arms(args.out, budget_s=min(args.recipe_budget_s, args.budget_s),
                                                    steps=args.max_steps or 20, env=env, log=log)
        dry = {} if args.preset == "gpu" else {"timeouts": {}, "default_timeout": DRY_RUN_TIMEOUT_S}
        summary["notebooks"] = run_notebooks(plan, executed, env, deadline=deadline, log=log, **dry)
    summary["total_s"] = round(time.perf_counter() - began, 1)
    summary["claims"] = headline(summary["notebooks"])
    summary["claims"]["best_recipe_mfu"] = (summary.get("recipe") or {}).get("best_mfu")
    summary["viewer_files"] = _pack_viewer_files(wall_began, args.out)
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
