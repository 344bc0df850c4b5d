"""pytest's settings for any run from this checkout, notebooks alone included (tests/conftest.py holds the
suite's own; this file is the one both notebooks/ and tests/ sit under).

A notebook's cells share one kernel: cell 5 uses what cell 2 defined. pytest-xdist's default (`-n 2`
alone is `--dist load`) hands a file's items to whichever worker is free, so a notebook's later cells
can land in another worker's fresh kernel and fail with a NameError that no change caused (seen here:
`pytest -n 2 tests/test_launching.py notebooks/06_multi_gpu.ipynb` failed 18 of 06's cells so; the same
kind of command once failed 05's cell 20 in six runs). Here `-n` without `--dist` means a file to a
worker; an explicit `--dist` is kept.
"""

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns "no --dist" into "load"
def pytest_cmdline_main(config: pytest.Config) -> None:
    option = config.option
    if getattr(option, "numprocesses", None) and getattr(option, "dist", "no") == "no":
        option.dist = "loadfile"
