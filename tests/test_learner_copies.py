"""The learners' copies: solutions and outputs gone, everything else kept."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("learner_copies", ROOT / "scripts" / "learner_copies.py")
learner_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learner_copies)


def _cell(kind, source, tags=(), outputs=()):
    cell = {"cell_type": kind, "metadata": {"tags": list(tags)}, "source": source}
    if kind == "code":
        cell |= {"outputs": list(outputs), "execution_count": 3}
    return cell


def test_a_learner_copy_drops_solutions_outputs_and_widget_state():
    notebook = {"cells": [_cell("markdown", "# Exercise"), _cell("code", "answer = None", outputs=[{"x": 1}]),
                          _cell("code", "answer = 42", tags=["solution"]),
                          _cell("code", "wb.check(answer, truth)", tags=["nbval-ignore-output"])],
                "metadata": {"widgets": {"state": "..."}, "kernelspec": {"name": "python3"}},
                "nbformat": 4, "nbformat_minor": 5}
    copy = learner_copies.learner_copy(notebook)
    assert [c["source"] for c in copy["cells"]] == ["# Exercise", "answer = None", "wb.check(answer, truth)"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in copy["cells"] if c["cell_type"] == "code")
    assert copy["cells"][2]["metadata"]["tags"] == ["nbval-ignore-output"]  # other tags stay
    assert "widgets" not in copy["metadata"] and copy["metadata"]["kernelspec"] == {"name": "python3"}
    assert len(notebook["cells"]) == 4  # the teacher's notebook is untouched


def test_the_script_writes_a_copy_of_every_notebook(tmp_path):
    assert learner_copies.main(["--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.glob("*.ipynb"))
    assert written == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for path in tmp_path.glob("*.ipynb"):
        cells = json.loads(path.read_text())["cells"]
        assert not any("solution" in c["metadata"].get("tags", []) for c in cells)
        assert all(not c.get("outputs") for c in cells)
