"""The test suite as `make test` runs it, standard library only (no make, no bash: Windows too).

    python scripts/run_tests.py                 # every test and notebook, cpu-quick, two passes
    python scripts/run_tests.py --workers 4     # more pytest-xdist workers (default: 2, TEST_WORKERS)
    python scripts/run_tests.py --hog           # any other argument goes to pytest, in both passes
    python scripts/run_tests.py --room          # the room in four browsers alone (make test-room, as root)

Single-threaded BLAS and offline hubs (what CI runs; timings comparable run to run). Two passes
(docs/NOTEBOOK_CI.md): pytest-xdist workers, a file to a worker (`--dist loadfile`: a notebook's
cells share one kernel, a module's fixtures are built once), then the tests marked `serial` in
tests/conftest.py (timings that need the cores) alone, collected from the files that
conftest marks only. Both passes always run; the exit
status is the worse one (5, nothing selected, counts as passed). The tests marked `room` (the room in
four browsers, ~4 minutes) run only with --room.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time
from pathlib import Path

ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
       "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
NOTHING_SELECTED = 5
CONFTEST = Path(__file__).resolve().parent.parent / "tests" / "conftest.py"


def marked_paths(name: str, conftest: Path = CONFTEST) -> list[str]:
    """The files and folders tests/conftest.py marks with `name` ('SERIAL': its dict's keys; 'ROOM': its
    string), read from its source (this script imports nothing of the project). The serial and room
    passes collect only these: collecting the whole suite to select the serial dozen took 14 s on the
    2-core CI machine (AMD EPYC), the marked files alone 7.5 s."""
    for node in ast.parse(conftest.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            value = ast.literal_eval(node.value)
            root = conftest.parent.parent
            here = Path.cwd().resolve() == root  # `make test`: short paths; from elsewhere, whole ones
            return list(dict.fromkeys(key.split("::")[0] if here else str(root / key.split("::")[0])
                                      for key in ([value] if isinstance(value, str) else value)))
    raise LookupError(f"{conftest} defines no {name}")


def _names_paths(pytest_args: list[str]) -> bool:
    """Whether the arguments name tests to run (a file, folder or node id): then they choose, not us."""
    return any(not arg.startswith("-") and Path(arg.split("::")[0]).exists() for arg in pytest_args)


def passes(workers: int, pytest_args: list[str], room: bool = False) -> list[list[str]]:
    """The two pytest commands (one, the room's, with room=True)."""
    pytest = [sys.executable, "-m", "pytest"]
    only = (lambda name: []) if _names_paths(pytest_args) else marked_paths
    if room:
        return [pytest + ["-p", "no:xdist", "-m", "room", *pytest_args, *only("ROOM")]]
    # --no-loadscope-reorder: files handed out in the order tests/conftest.py sorts them, slowest first
    parallel = (["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"] if workers > 1
                else ["-p", "no:xdist"])
    return [pytest + parallel + ["-m", "not serial and not room", *pytest_args],
            pytest + ["-p", "no:xdist", "-m", "serial and not room", *pytest_args, *only("SERIAL")]]


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
