"""How long does each notebook take to Run All, under a preset, on this CPU (or GPU)?

Executes every notebook (or those named) in a fresh kernel, as a learner's Run All
does, and records the wall time of each notebook and of each cell. The times are a
record, not a test: a regression shows as a larger figure beside the previous run's
(`--compare` prints the two side by side). Each notebook runs in its own kernel with
the environment `make test` uses (one BLAS thread, offline hubs); `--isa avx2` caps
oneDNN, ATen and FBGEMM (torch's int8 kernels, which honour only their own switch) at
AVX2, which is what a CPU without AVX-512 (no VNNI, no AVX512-BF16) runs. `--hog` keeps
one core busy with another process throughout, as a shared machine would. `--start-method spawn`
makes every process of a kernel (the kernel, its DataLoader workers, launched ranks) start its
children with spawn, macOS's and Windows' default, on Linux too (.ci/spawn/sitecustomize.py), and
fails a notebook whose kernel did not use it.

    python benchmarks/notebook_times.py --preset cpu-quick --isa avx2 --out benchmarks/results/cpu-quick-avx2.json
    python benchmarks/notebook_times.py --preset cpu --isa avx2 --out benchmarks/results/cpu-avx2.json
    python benchmarks/notebook_times.py --preset cpu --isa avx2 --compare benchmarks/results/cpu-avx2.json
    python benchmarks/notebook_times.py --preset cpu-quick --isa avx2 --hog
    python benchmarks/notebook_times.py --preset cpu --start-method spawn --notebooks 04_input_pipelines 06_multi_gpu
    python benchmarks/notebook_times.py --table benchmarks/results/cpu-quick-avx2.json benchmarks/results/cpu-avx2.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
# FBGEMM ignores the first two: capped by them alone, torch.ao's int8 Linear still ran 5.3x
# fp32 here (VNNI); with FBGEMM_ENABLE_INSTRUCTIONS=AVX2 as well, 2.3x.
ISA_ENV = {"native": {}, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                                  "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}}


def _cell_seconds(cell: dict) -> float | None:
    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = lambda s: dt.datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


# Appended to each notebook while it runs (and removed before it is saved): the CPU seconds the
# kernel and its finished children (DataLoader workers, launched processes) used, and the peak
# resident memory of the kernel and of its largest child (what sizes a room: docs/WORKSHOP.md).
# On a machine shared with other work the wall time grows with the load; the CPU seconds hardly
# do, so the record keeps both, and the load average around each notebook.
_CPU_CELL = """import json as _j, multiprocessing as _m, resource as _r, sys as _sys
_s, _c = _r.getrusage(_r.RUSAGE_SELF), _r.getrusage(_r.RUSAGE_CHILDREN)
_k = 1 if _sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
print("__cpu_seconds__" + _j.dumps([_s.ru_utime + _s.ru_stime, _c.ru_utime + _c.ru_stime,
                                    _s.ru_maxrss * _k, _c.ru_maxrss * _k, _m.get_start_method()]))"""


def _cpu_seconds(cell: dict) -> tuple[float | str | None, ...]:
    """(kernel CPU s, children's CPU s, kernel peak RSS MiB, largest child's peak RSS MiB, the kernel's
    start method)."""
    for output in cell.get("outputs", []):
        for line in output.get("text", "").splitlines():
            if line.startswith("__cpu_seconds__"):
                own, children, peak, child_peak, method = json.loads(line.removeprefix("__cpu_seconds__"))
                return round(own, 1), round(children, 1), round(peak / 2**20), round(child_peak / 2**20), method
    return None, None, None, None, None


def run_notebook(path: pathlib.Path, *, timeout_s: int, save_to: pathlib.Path | None,
                 start_method: str | None = None) -> dict:
    """Execute one notebook in a fresh kernel; its time, its cells' times, and how it ended. With
    `start_method`, a kernel that started its processes with another one ends as an error."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import (
        CellExecutionError,
        CellTimeoutError,
        DeadKernelError,
    )

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(_CPU_CELL))
    load_before = os.getloadavg()[0]
    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            store_widget_state=True)
    began = time.perf_counter()
    status, error = "ok", None
    try:
        client.execute()
    except CellExecutionError as exc:
        status, error = "error", str(exc).strip().splitlines()[-1][:400]
    except (CellTimeoutError, DeadKernelError) as exc:
        status, error = "timeout" if isinstance(exc, CellTimeoutError) else "dead kernel", str(exc)[:400]
    seconds = time.perf_counter() - began
    cpu_s, children_cpu_s, peak_mib, child_peak_mib, method = _cpu_seconds(nb.cells.pop())
    if status == "ok" and start_method and method != start_method:
        status, error = "error", f"the kernel's start method was {method!r}, not {start_method!r}"
    if save_to is not None:
        save_to.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, save_to / path.name)
    cells = [(i, _cell_seconds(c)) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    slowest = sorted(((s, i) for i, s in cells if s is not None), reverse=True)[:5]
    return {"seconds": round(seconds, 1), "status": status, "error": error, "cpu_seconds": cpu_s,
            "children_cpu_seconds": children_cpu_s, "peak_rss_mib": peak_mib, "largest_child_peak_rss_mib": child_peak_mib,
            "start_method": method, "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "slowest_cells": [{"cell": i, "seconds": round(s, 1)} for s, i in slowest],
            "cells": {str(i): round(s, 1) for i, s in cells if s is not None}}


def machine() -> dict:
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    name = platform.processor()
    try:
        name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": name, "cores": os.cpu_count(), "avx512_bf16": "avx512_bf16" in flags,
            "avx512_vnni": "avx512_vnni" in flags, "amx": any(f.startswith("amx") for f in flags)}


def table(paths: list[pathlib.Path]) -> str:
    """Records side by side: wall seconds (kernel CPU seconds) per notebook, one column each."""
    records = [json.loads(p.read_text()) for p in paths]
    names = sorted({n for r in records for n in r["notebooks"]})
    heads = [f"{r['preset']}{', ' + r['isa'] if r['isa'] != 'native' else ''}{', hog' if r.get('hog') else ''}"
             for r in records]

    def cell(r: dict, name: str) -> str:
        nb = r["notebooks"].get(name)
        if nb is None:
            return "-"
        cpu = f" ({nb['cpu_seconds']:.0f})" if nb.get("cpu_seconds") is not None else ""
        return f"{nb['seconds']:.0f}{cpu}" + ("" if nb["status"] == "ok" else f" {nb['status']}")

    lines = ["| notebook | " + " | ".join(heads) + " |", "|---|" + "---|" * len(records)]
    lines += [f"| `{n}` | " + " | ".join(cell(r, n) for r in records) + " |" for n in names]
    totals = [f"{r['total_seconds']:.0f}" + (f" ({sum(nb.get('cpu_seconds') or 0 for nb in r['notebooks'].values()):.0f})")
              for r in records]
    lines.append("| total | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-quick", choices=("cpu-quick", "cpu", "gpu"))
    parser.add_argument("--isa", default="native", choices=tuple(ISA_ENV))
    parser.add_argument("--notebooks", nargs="*", help="names or paths (default: every notebooks/*.ipynb)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell before it counts as a timeout")
    parser.add_argument("--out", type=pathlib.Path, help="write the record here (JSON)")
    parser.add_argument("--compare", type=pathlib.Path, help="a previous record to print beside this one")
    parser.add_argument("--save-executed", type=pathlib.Path, help="save the executed notebooks in this folder")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra environment for the kernels")
    parser.add_argument("--hog", action="store_true", help="keep one core busy with another process throughout")
    parser.add_argument("--start-method", choices=("spawn",), help="every process in the kernels starts its "
                        "children with this method (macOS's and Windows' default), checked at the end of each notebook")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks run side by side, each in its own kernel "
                        "(the longest first, by --compare's record; each then shares the CPU with the others)")
    parser.add_argument("--table", nargs="+", type=pathlib.Path, help="print records as a Markdown table, then exit")
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if args.hog:
        sys.path.insert(0, str(ROOT))
        from workbench.lessons.contention import busy_core

        with busy_core():
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    env = {"WORKBENCH_PRESET": args.preset, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", **ISA_ENV[args.isa]}
    env.update(item.split("=", 1) for item in args.env)
    if args.start_method == "spawn":  # first on the kernels' path: sets spawn in every Python process they start
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / ".ci" / "spawn"), os.environ.get("PYTHONPATH")]))
    os.environ.update(env)  # the kernels nbclient starts inherit this environment

    names = args.notebooks or [p.name for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    paths = [pathlib.Path(n) if pathlib.Path(n).exists() else
             ROOT / "notebooks" / pathlib.Path(n).with_suffix(".ipynb").name for n in names]
    previous = json.loads(args.compare.read_text())["notebooks"] if args.compare else {}
    record = {"preset": args.preset, "isa": args.isa, "hog": args.hog, "start_method": args.start_method,
              "machine": machine(), "env": env,
              "date": dt.date.today().isoformat(), "notebooks": {}}
    began = time.perf_counter()
    record["jobs"] = args.jobs
    for path, result in _results(paths, args, previous):
        record["notebooks"][path.stem] = result
        before = previous.get(path.stem, {}).get("seconds")
        note = f" (before: {before:.0f} s)" if before else ""
        tail = "" if result["status"] == "ok" else f"  {result['status']}: {result['error']}"
        cpu = (f" (CPU {result['cpu_seconds']} s + children {result['children_cpu_seconds']} s; "
               f"peak {result['peak_rss_mib']} MiB, child {result['largest_child_peak_rss_mib']} MiB; load {result['load_average']})")
        print(f"{path.stem:<28} {result['seconds']:7.1f} s{note}{cpu}{tail}", flush=True)
    total = sum(r["seconds"] for r in record["notebooks"].values())
    record["total_seconds"] = round(total, 1)
    record["wall_seconds"] = round(time.perf_counter() - began, 1)
    print(f"{'total':<28} {total:7.1f} s (wall {record['wall_seconds']:.0f} s, {args.jobs} at a time)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if all(r["status"] == "ok" for r in record["notebooks"].values()) else 1


def _results(paths: list[pathlib.Path], args: argparse.Namespace, previous: dict):
    """(path, result) for each notebook as it finishes: one after another, or `--jobs` at a time,
    each in a process of its own (spawned: nothing inherited from this one)."""
    if args.jobs <= 1:
        for path in paths:
            yield path, run_notebook(path, timeout_s=args.timeout, save_to=args.save_executed,
                                     start_method=args.start_method)
        return
    import concurrent.futures
    import multiprocessing

    longest_first = sorted(paths, key=lambda p: -(previous.get(p.stem, {}).get("seconds") or 0))
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_notebook, path, timeout_s=args.timeout, save_to=args.save_executed,
                               start_method=args.start_method): path
                   for path in longest_first}
        for future in concurrent.futures.as_completed(futures):
            yield futures[future], future.result()


if __name__ == "__main__":
    sys.exit(main())
