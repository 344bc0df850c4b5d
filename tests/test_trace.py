"""Notebook 08's profiler trace: `prof.export_chrome_trace(path)` writes a file Perfetto and
chrome://tracing open (the Chrome trace format's JSON), and `lesson.trace_ranges` reads it back."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from workbench.lessons import speed as lesson

NOTEBOOK = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "08_speed_without_changing_the_math.ipynb"


def test_the_exported_trace_is_chrome_trace_json_with_the_loops_ranges(tmp_path):
    model = torch.nn.Linear(16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("forward"):
                loss = model(torch.randn(4, 16)).sum()
            with record_function("backward"):
                loss.backward()
    path = tmp_path / "runs" / "trace.json"
    path.parent.mkdir()
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())  # valid JSON, as a viewer parses it
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete and all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and e["name"] for e in complete)
    assert {e["cat"] for e in complete} >= {"cpu_op", "user_annotation"}  # operators and the named ranges
    assert lesson.trace_ranges(path) == {"forward": 3, "backward": 3, "optimizer": 0}
    assert lesson.trace_ranges(path, names=("backward",)) == {"backward": 3}


def test_a_file_that_is_not_a_trace_says_so(tmp_path):
    path = tmp_path / "not.json"
    path.write_text('{"events": []}')
    with pytest.raises(ValueError, match="not a Chrome trace.*export_chrome_trace"):
        lesson.trace_ranges(path)


def test_notebook_08_writes_its_trace_to_a_named_file_and_reads_it_back():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    writes = [c for c in cells if c["cell_type"] == "code" and "prof.export_chrome_trace(" in "".join(c["source"])]
    assert len(writes) == 1
    cell = writes[0]
    assert "nbval-check-output" in cell["metadata"].get("tags", [])  # nbval re-runs it and compares the ranges
    shown = "".join("".join(o.get("text", "")) for o in cell["outputs"])
    assert "runs/08_profile_trace.json" in shown and "{'forward': 5, 'backward': 5, 'optimizer': 5}" in shown
    prose = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "ui.perfetto.dev" in prose and "chrome://tracing" in prose
