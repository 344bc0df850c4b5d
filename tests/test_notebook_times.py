"""benchmarks/notebook_times.py, the presets pass's runner: a kernel that did not start its processes
with the method asked for fails its notebook (make test-presets asks for spawn)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("notebook_times", ROOT / "benchmarks" / "notebook_times.py")
notebook_times = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebook_times)


def test_a_kernel_with_another_start_method_fails_the_pass_that_asked_for_one(tmp_path, monkeypatch):
    notebook = tmp_path / "one_cell.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), notebook)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p and ".ci/spawn" not in p))  # the platform's default
    default = multiprocessing.get_context().get_start_method()  # fork on Linux (3.11-3.13), spawn on macOS, Windows
    asked = "spawn" if default != "spawn" else "fork"
    result = notebook_times.run_notebook(notebook, timeout_s=60, save_to=None, start_method=asked)
    assert (result["status"], result["start_method"]) == ("error", default)
    assert result["error"] == f"the kernel's start method was {default!r}, not {asked!r}"
    assert result["cpu_seconds"] > 0 and list(result["cells"]) == ["0"]  # the measuring cell is not counted
