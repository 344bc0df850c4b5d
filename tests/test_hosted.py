"""docs/HOSTED.md's first cell for Colab / Kaggle, run as written with pip replaced by a recorder.

The real install (a fresh virtualenv, torch 2.14.1, the cell, a 3-step run) is
scripts/check_hosted_install.sh: minutes and gigabytes, so opt-in. Here, in seconds: what the cell
asks pip for, that it never asks for torch, that pyproject lets pip keep a hosted runtime's torch,
and the one-line error when WORKBENCH_SOURCE is not set.
"""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def hosted_cell() -> str:
    """The python block after the hosted-cell marker, as check_hosted_install.sh's awk takes it."""
    text = (ROOT / "docs" / "HOSTED.md").read_text()
    after = text.split("<!-- hosted-cell", 1)[1]
    return re.search(r"^```python\n(.*?)^```", after, re.S | re.M).group(1)


def _run_cell(monkeypatch, **env) -> list[list[str]]:
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append(list(args)))
    for name in ("WORKBENCH_SOURCE", "WORKBENCH_PRESET"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exec(compile(hosted_cell(), "HOSTED.md", "exec"), {})
    return calls


def test_the_hosted_cell_installs_the_workbench_from_the_source_and_never_torch(monkeypatch, capsys):
    source = f"file://{ROOT}"
    calls = _run_cell(monkeypatch, WORKBENCH_SOURCE=source, WORKBENCH_PRESET="cpu-quick")
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    assert calls == [pip + [f"torch-workbench[quantization] @ {source}"]]  # the distribution's name; no --no-deps
    assert not any(arg.split("[")[0] in ("torch", "torch==") or arg.startswith(("torch=", "torch>", "torch<"))
                   for call in calls for arg in call[len(pip):])  # torch-workbench is ours, not torch
    assert capsys.readouterr().out.strip().endswith("workbench preset cpu-quick")  # a preset set before is kept


def test_the_hosted_cell_says_in_one_line_that_it_needs_a_source(monkeypatch):
    with pytest.raises(SystemExit) as stop:
        _run_cell(monkeypatch)
    assert str(stop.value).startswith("WORKBENCH_SOURCE: put your copy's git URL in this cell") and "\n" not in str(stop.value)


def test_the_extras_the_cell_names_exist_and_torch_has_no_upper_bound():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = re.search(r"workbench\[([^\]]+)\]", hosted_cell()).group(1).split(",")
    assert set(extras) <= set(project["optional-dependencies"])
    torch = next(Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch")
    # No upper bound: whatever recent torch a hosted runtime has (2.14.1: the newest this machine's index serves) stays.
    assert all(torch.specifier.contains(v) for v in ("2.8.0", "2.13.0", "2.14.1", "3.0.0"))
