"""Shared test set-up: the quick preset, headless sinks, offline hubs, one thread.

`pytest --hog` (or WORKBENCH_TEST_HOG=1) keeps one CPU core busy with another process for
the whole session, notebooks included: the suite must pass on a busy machine too (timing
claims are asserted only where the measurement had a free core; see measure/contention.py).
"""

import importlib.util
import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("WORKBENCH_PRESET", "cpu-quick")
os.environ.setdefault("WORKBENCH_HEADLESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Exercise checks append to the prediction ledger (lessons/ledger.py): the suite's, notebooks'
# kernels included, go to a file of this session's, never the tester's ~/.workbench
os.environ.setdefault("WORKBENCH_LEDGER", os.path.join(tempfile.mkdtemp(prefix="workbench-ledger-"), "ledger.jsonl"))

_HOG_KEY = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--hog", action="store_true", default=os.environ.get("WORKBENCH_TEST_HOG") == "1",
                     help="keep one CPU core busy with another process for the whole session")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--hog"):
        from workbench.measure.contention import busy_core

        hog = busy_core()
        config.stash[_HOG_KEY] = (hog, hog.__enter__())


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
