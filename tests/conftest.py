"""Shared test set-up: the quick preset, headless sinks, offline hubs, one thread.

`pytest --hog` (or WORKBENCH_TEST_HOG=1) keeps one CPU core busy with another process for
the whole session, notebooks included: the suite must pass on a busy machine too (timing
claims are asserted only where the measurement had a free core; see measure/contention.py).
"""

import os

import pytest

os.environ.setdefault("WORKBENCH_PRESET", "cpu-quick")
os.environ.setdefault("WORKBENCH_HEADLESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_HOG_KEY = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--hog", action="store_true", default=os.environ.get("WORKBENCH_TEST_HOG") == "1",
                     help="keep one CPU core busy with another process for the whole session")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--hog"):
        from workbench.measure.contention import busy_core

        hog = busy_core()
        config.stash[_HOG_KEY] = (hog, hog.__enter__())


def pytest_report_header(config: pytest.Config) -> str | None:
    if _HOG_KEY in config.stash:
        return f"hog: pid {config.stash[_HOG_KEY][1].pid} keeps one CPU core busy for the whole session"
    return None


def pytest_unconfigure(config: pytest.Config) -> None:
    if _HOG_KEY in config.stash:
        hog, _ = config.stash[_HOG_KEY]
        hog.__exit__(None, None, None)
