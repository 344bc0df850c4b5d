"""The test suite as `make test` runs it, standard library only (no make, no bash: Windows too).

    python scripts/run_tests.py                 # every test and notebook, cpu-quick, two passes
    python scripts/run_tests.py --workers 4     # more pytest-xdist workers (default: 2, TEST_WORKERS)
    python scripts/run_tests.py --hog           # any other argument goes to pytest, in both passes
    python scripts/run_tests.py --room          # the room in four browsers alone (make test-room, as root)

Single-threaded BLAS and offline hubs (what CI runs; timings comparable run to run). Two passes
(docs/NOTEBOOK_CI.md): pytest-xdist workers, a file to a worker (`--dist loadfile`: a notebook's
cells share one kernel, a module's fixtures are built once), then the tests marked `serial` in
tests/conftest.py (the browser, timings that need the cores) alone. Both passes always run; the exit
status is the worse one (5, nothing selected, counts as passed). The tests marked `room` (the room in
four browsers, ~4 minutes) run only with --room.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
       "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
NOTHING_SELECTED = 5


def passes(workers: int, pytest_args: list[str], room: bool = False) -> list[list[str]]:
    """The two pytest commands (one, the room's, with room=True)."""
    pytest = [sys.executable, "-m", "pytest"]
    if room:
        return [pytest + ["-p", "no:xdist", "-m", "room", *pytest_args]]
    parallel = ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else ["-p", "no:xdist"]
    return [pytest + parallel + ["-m", "not serial and not room", *pytest_args],
            pytest + ["-p", "no:xdist", "-m", "serial and not room", *pytest_args]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=int(os.environ.get("TEST_WORKERS") or 2),
                        help="pytest-xdist workers for the first pass (1: none)")
    parser.add_argument("--room", action="store_true",
                        help="only the tests marked room: the room in four browsers (as root; ~4 min)")
    args, pytest_args = parser.parse_known_args(argv)
    if args.workers < 1:
        parser.error(f"--workers={args.workers} must be 1 or more")
    env = {**os.environ, **ENV, "WORKBENCH_PRESET": os.environ.get("WORKBENCH_PRESET") or "cpu-quick"}
    worst = 0
    for command in passes(args.workers, pytest_args, room=args.room):
        print("+", " ".join(command), flush=True)
        began = time.monotonic()
        status = subprocess.call(command, env=env)
        print(f"(exit status {status} after {time.monotonic() - began:.0f} s)", flush=True)
        if status != NOTHING_SELECTED:
            worst = max(worst, status)
    return worst


if __name__ == "__main__":
    sys.exit(main())
