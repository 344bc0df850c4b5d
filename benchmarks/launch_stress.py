"""Launch many times in a row and count the launches that hang: the check behind launching/processes.py.

A launch whose child inherits a held lock hangs until its timeout (timed out, counted as hung);
every other launch forms its process group, all-reduces once and returns (`--target rank_only`:
returns its rank with no collective, as the tests' children do; a rank that left while its peer was
still forming the group failed the peer's init, counted as failed). Run it under a busy core (the
default; `--no-hog` for none) with the machine otherwise as loaded as CI is:

    .venv/bin/python benchmarks/launch_stress.py --launches 300 --processes 4
    .venv/bin/python benchmarks/launch_stress.py --launches 100 --how notebook_launcher
    .venv/bin/python benchmarks/launch_stress.py --launches 500 --processes 2 --target rank_only
    .venv/bin/python benchmarks/launch_stress.py --launches 50 --start-method fork   # the old way, for comparison

`--how notebook_launcher` launches with accelerate's notebook_launcher as notebook 06's cell does
(inside `lessons.multi_gpu.bounded_launch`: the children wait for their siblings before connecting).
`--kernel` runs the launches inside a Jupyter kernel (ipykernel's threads in the parent, as a
learner's notebook has them). Writes a JSON summary (`--out`): counts, times, load averages.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def _all_reduce_once() -> int:
    import torch
    import torch.distributed as dist
    from accelerate import PartialState

    state = PartialState(cpu=True)
    value = torch.ones(1)
    dist.all_reduce(value)
    assert int(value.item()) == state.num_processes
    return state.process_index


def _rank_only() -> int:
    """The tests' target: form the group, touch no collective, return at once. A rank that
    returns while another is still connecting is what closed the other's connection."""
    from accelerate import PartialState

    return PartialState(cpu=True).process_index


TARGETS = {"all_reduce": _all_reduce_once, "rank_only": _rank_only}


def _notebook_launch(fn, num_processes: int, timeout_s: float) -> list:
    """Notebook 06's launch cell: notebook_launcher inside bounded_launch, each child's value collected."""
    from accelerate import notebook_launcher

    from workbench.lessons.multi_gpu import bounded_launch

    with bounded_launch(timeout_s=timeout_s, num_processes=num_processes) as launch:
        notebook_launcher(launch.reporting(fn), num_processes=num_processes, use_port=launch.port)
    return launch.collect()


def stress(launches: int, processes: int, how: str, start_method: str, timeout_s: float,
           fresh_server: bool = False, target: str = "all_reduce") -> dict:
    """Launch `launches` times; the outcome and wall time of each. `fresh_server`: each launch from a
    newly started fork server (as a test process's or a kernel's first launch is). `target`: what
    each child runs (`TARGETS`)."""
    from multiprocessing import forkserver

    from workbench.launching.launch import LaunchError, launch_function
    from workbench.lessons.multi_gpu import LaunchHung

    outcomes, walls, first_failure = {"ok": 0, "hung": 0, "failed": 0}, [], None
    began = time.monotonic()
    for number in range(launches):
        if fresh_server and forkserver._forkserver._forkserver_pid is not None:
            forkserver._forkserver._stop()
        start = time.monotonic()
        try:
            if how == "notebook_launcher":
                ranks = sorted(_notebook_launch(TARGETS[target], processes, timeout_s))
            else:
                ranks = launch_function(TARGETS[target], num_processes=processes, device="cpu", timeout_s=timeout_s,
                                        start_method=start_method)
            outcome = "ok" if ranks == list(range(processes)) else "failed"
        except LaunchHung:
            outcome = "hung"
        except LaunchError as error:
            outcome = "hung" if str(error).startswith("timed out") else "failed"
            first_failure = first_failure or str(error)[:4000]
        outcomes[outcome] += 1
        walls.append(time.monotonic() - start)
        if outcome != "ok" or (number + 1) % 25 == 0:
            print(f"launch {number + 1}/{launches}: {outcome} in {walls[-1]:.1f} s; so far {outcomes}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    walls_sorted = sorted(walls)
    return {"outcomes": outcomes, "total_s": round(time.monotonic() - began, 1),
            "median_s": round(statistics.median(walls), 3), "p95_s": round(walls_sorted[int(0.95 * (len(walls) - 1))], 3),
            "max_s": round(max(walls), 3), "first_failure": first_failure}


def _in_a_kernel(args: argparse.Namespace) -> dict:
    """The same loop, executed in a fresh Jupyter kernel (its threads in the launching process)."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", cwd=str(Path(__file__).resolve().parents[1]))
    try:
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
                "import launch_stress, json\n"
                f"print('RESULT' + json.dumps(launch_stress.stress({args.launches}, {args.processes}, {args.how!r}, "
                f"{args.start_method!r}, {args.timeout}, target={args.target!r})))")
        lines: list[str] = []
        reply = client.execute_interactive(code, timeout=None, output_hook=lambda msg: lines.append(
            msg["content"].get("text", "")) if msg["msg_type"] == "stream" else None)
        text = "".join(lines)
        print(text.replace("RESULT", "").splitlines()[-1] if "RESULT" not in text else "", flush=True)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the kernel failed: {reply['content'].get('evalue')}")
        return json.loads(text.split("RESULT", 1)[1].splitlines()[0])
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--launches", type=int, default=300)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--how", choices=("launch_function", "notebook_launcher"), default="launch_function")
    parser.add_argument("--start-method", default="auto", help="launch_function's start_method (auto, fork, ...)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a launch counts as hung")
    parser.add_argument("--fresh-server", action="store_true",
                        help="stop the fork server after each launch: every launch starts a new one")
    parser.add_argument("--target", choices=sorted(TARGETS), default="all_reduce",
                        help="what each child runs: all_reduce once, or rank_only (no collective, as the tests' targets)")
    parser.add_argument("--no-hog", action="store_true", help="do not keep a core busy meanwhile")
    parser.add_argument("--kernel", action="store_true", help="launch from inside a Jupyter kernel")
    parser.add_argument("--out", type=Path, help="write the summary here (JSON)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from workbench.lessons.contention import busy_core

    load_before = os.getloadavg()
    hog = None if args.no_hog else busy_core()
    if hog is not None:
        hog.__enter__()
    try:
        summary = _in_a_kernel(args) if args.kernel else stress(args.launches, args.processes, args.how,
                                                                 args.start_method, args.timeout, args.fresh_server,
                                                                 args.target)
    finally:
        if hog is not None:
            hog.__exit__(None, None, None)
    summary.update(vars(args), out=str(args.out) if args.out else None, hog=not args.no_hog,
                   load_before=[round(x, 2) for x in load_before], load_after=[round(x, 2) for x in os.getloadavg()],
                   python=sys.version.split()[0])
    text = json.dumps(summary, indent=1, default=str)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if summary["outcomes"]["hung"] == 0 and summary["outcomes"]["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
