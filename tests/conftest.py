"""Shared test set-up: the quick preset, headless sinks, offline hubs, one thread.

`pytest --hog` (or WORKBENCH_TEST_HOG=1) keeps one CPU core busy with another process for
the whole session, notebooks included: the suite must pass on a busy machine too (timing
claims are asserted only where the measurement had a free core; see lessons/contention.py).

`make test` runs the suite on two pytest-xdist workers, a file to a worker (`--dist loadfile`:
a notebook's cells share one kernel, a module's fixtures are built once), then the tests marked
`serial` below alone (docs/NOTEBOOK_CI.md). Every test starts from the same random numbers,
whichever files its worker ran before.
"""

import importlib.util
import os
import random
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("WORKBENCH_PRESET", "cpu-quick")
os.environ.setdefault("WORKBENCH_HEADLESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Exercise checks append to the prediction ledger (classroom/ledger.py): the suite's, notebooks'
# kernels included, go to a file of this session's, never the tester's ~/.workbench
os.environ.setdefault("WORKBENCH_LEDGER", os.path.join(tempfile.mkdtemp(prefix="workbench-ledger-"), "ledger.jsonl"))

_HOG_KEY = pytest.StashKey()

# Tests that need the machine to themselves: `make test` runs them after the parallel pass, alone
# (`pytest -m serial`), each for the reason given.
# The dashboard in a real browser runs in the parallel pass: its own JupyterLab on a free port, and
# what it reads while a run trains only grows with the load (more readings of a slower run; its
# waits are bounds of 90 s, not expectations). Alone it took ~60 s of make test's serial pass.
SERIAL = {
    "tests/test_contention.py": "measures how much of a core this process gets",
    "tests/test_pipeline_bench.py::test_parallel_speedup": "a ratio of two timings that needs both cores",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--hog", action="store_true", default=os.environ.get("WORKBENCH_TEST_HOG") == "1",
                     help="keep one CPU core busy with another process for the whole session")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--hog") and not hasattr(config, "workerinput"):  # one hog, in xdist's controller
        from workbench.lessons.contention import busy_core

        hog = busy_core()
        config.stash[_HOG_KEY] = (hog, hog.__enter__())


# The room in four browsers (a hub, accounts, three Run Alls and the idle culler's two minutes: ~4 min
# alone) is its own target, `make test-room`, which CI runs after `make test`: with it, make test passed
# 10 minutes on this 2-core machine.
ROOM = "tests/browser/test_room.py"


# The files that take longest, slowest first, with the seconds each took in make test's xdist pass
# on the 2-core AVX2-only EPYC (measured 2026-12-07, --durations=0, summed per file). Items are
# sorted so these come first (the rest follow in collection order) and scripts/run_tests.py keeps
# the order (--no-loadscope-reorder): xdist's own order, most tests first, handed out test_cli,
# test_two_nodes and notebook 11 (~50 s each, few tests) last, and the pass ended on one worker
# running them while the other idled. Longest first, the last file handed out is a short one. The
# order changes only how long the pass takes, never what it checks. (test_cli's torchrun test, ~10 s,
# has since moved into test_two_nodes' one-machine reference.)
SLOWEST_FIRST = {
    "tests/test_estimate.py": 144,
    "tests/test_hostile.py": 131,
    "notebooks/05_quantization.ipynb": 94,
    "tests/test_examples.py": 84,
    "tests/test_two_nodes.py": 54,
    "notebooks/11_two_nodes_on_one_machine.ipynb": 52,
    "tests/test_plan_parallel.py": 50,
    "tests/browser/test_dashboard_browser.py": 60,
    "tests/test_cli.py": 47,
    "tests/test_launch.py": 45,
    "notebooks/06_multi_gpu.ipynb": 44,
    "notebooks/03_activation_checkpointing.ipynb": 42,
    "notebooks/10_tensor_and_pipeline_parallel.ipynb": 40,
    "tests/test_speed.py": 40,
    "tests/test_planner.py": 36,
    "notebooks/07_planner.ipynb": 29,
    "notebooks/04_input_pipelines.ipynb": 27,
    "notebooks/teacher/room.ipynb": 27,
    "tests/test_train.py": 24,
    "tests/test_parallelize.py": 20,
    "tests/test_snapshot.py": 19,
    "notebooks/08_speed_without_changing_the_math.ipynb": 19,
    "notebooks/01_mixed_precision.ipynb": 18,
    "notebooks/02_gradient_accumulation.ipynb": 17,
    "notebooks/09_train_fewer_bytes.ipynb": 16,
    "tests/test_fewer_bytes.py": 15,
    "tests/test_checkpointing.py": 14,
    "tests/test_share.py": 13,
    "tests/test_install.py": 11,
    "tests/test_readme_commands.py": 10,
    "tests/test_card_sizes.py": 10,
    "tests/test_pipelines.py": 10,
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.nodeid.startswith(prefix) for prefix in SERIAL):
            item.add_marker(pytest.mark.serial)
        if item.nodeid.startswith(ROOM):
            item.add_marker(pytest.mark.room)
    rank = {path: i for i, path in enumerate(sorted(SLOWEST_FIRST, key=SLOWEST_FIRST.__getitem__, reverse=True))}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: a file's tests keep their order


@pytest.fixture(autouse=True)
def _the_same_random_numbers_whatever_ran_before() -> None:
    """Seed Python's, NumPy's and torch's global generators (those already imported) before each
    test. Under xdist a worker runs files in an order of its own; a test whose model took its
    weights from the global generator (test_own_model's Tiny()) read 0.79 accuracy after another
    selection of tests (-k), against a bound of 0.8; from seed 0 it reads 0.81."""
    random.seed(0)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(0)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(0)


def off_the_lock() -> list[str]:
    """Installed packages whose version is not requirements/lock.txt's (scripts/lock.py)."""
    spec = importlib.util.spec_from_file_location("workbench_lock_script", Path(__file__).resolve().parents[1] / "scripts" / "lock.py")
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    return lock.off_the_lock()


def _versions_line() -> str:
    moved = off_the_lock()
    if not moved:
        return "versions: requirements/lock.txt's, which the exact byte counts and the notebooks' saved outputs were recorded under"
    return ("versions NOT the lock's: " + ", ".join(moved) + ". Exact byte counts and the notebooks' saved outputs were "
            "recorded under requirements/lock.txt: a difference in them may be the version's (make drift names them)")


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [_versions_line()]
    if _HOG_KEY in config.stash:
        lines.append(f"hog: pid {config.stash[_HOG_KEY][1].pid} keeps one CPU core busy for the whole session")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if exitstatus != 0 and off_the_lock():  # say it again where the failures are read
        terminalreporter.write_line(_versions_line())


def pytest_unconfigure(config: pytest.Config) -> None:
    if _HOG_KEY in config.stash:
        hog, _ = config.stash[_HOG_KEY]
        hog.__exit__(None, None, None)
