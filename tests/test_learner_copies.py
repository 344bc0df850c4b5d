"""The learners' copies: solutions and outputs gone, everything else kept, no work ever lost."""

import importlib.util
import json
import pathlib

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("learner_copies", ROOT / "scripts" / "learner_copies.py")
learner_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learner_copies)


def _cell(kind, source, tags=(), outputs=()):
    cell = {"cell_type": kind, "metadata": {"tags": list(tags), "execution": {"x": 1}}, "source": source}
    if kind == "code":
        cell |= {"outputs": list(outputs), "execution_count": 3}
    return cell


def _notebook(*cells):
    return {"cells": list(cells), "metadata": {"widgets": {"state": "..."}, "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 4}


EXERCISE = _notebook(
    _cell("markdown", "# Exercise"),
    _cell("code", "answer = None", outputs=[{"output_type": "stream", "name": "stdout", "text": "x"}]),
    _cell("code", "answer = 42", tags=["solution"]),
    _cell("code", "wb.check(answer, truth)", tags=["nbval-ignore-output"]),
    _cell("markdown", "**Answers**", tags=["solution"]),
)


def test_a_learner_copy_drops_solutions_outputs_and_widget_state():
    notebook = nbformat.from_dict(EXERCISE)
    copy = learner_copies.learner_copy(notebook)
    assert [c.source for c in copy.cells] == ["# Exercise", "answer = None", "wb.check(answer, truth)"]
    assert all(c.outputs == [] and c.execution_count is None for c in copy.cells if c.cell_type == "code")
    assert copy.cells[2].metadata == {"tags": ["nbval-ignore-output"]}  # other tags stay, "execution" goes
    assert "widgets" not in copy.metadata and copy.metadata["kernelspec"]["name"] == "python3"
    assert len(notebook.cells) == 5 and notebook.metadata["widgets"]  # the teacher's notebook is untouched


def test_the_script_writes_a_copy_of_every_notebook(tmp_path):
    assert learner_copies.main(["--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.glob("*.ipynb"))
    assert written == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for path in tmp_path.glob("*.ipynb"):
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)
        assert not any("solution" in c.metadata.get("tags", []) for c in notebook.cells)
        assert all(not c.get("outputs") for c in notebook.cells)
        assert "widgets" not in notebook.metadata


def _write(folder, name, data):
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_it_refuses_to_write_over_the_teachers_notebooks(tmp_path, capsys):
    source = _write(tmp_path, "01_x.ipynb", EXERCISE)
    before = source.read_text()
    for out in (tmp_path, ROOT / "notebooks"):
        assert learner_copies.main(["--out", str(out), "--force", "--notebooks", str(source)]) == 2
        assert "holds the teachers' notebooks" in capsys.readouterr().err
    assert source.read_text() == before


def test_an_existing_copy_is_kept_without_force_and_replaced_with_it(tmp_path, capsys):
    source = _write(tmp_path, "01_x.ipynb", EXERCISE)
    out = tmp_path / "learners"
    out.mkdir()
    mine = _write(out, "01_x.ipynb", "my answers")
    assert learner_copies.main(["--out", str(out), "--notebooks", str(source)]) == 1
    assert "01_x.ipynb exists: pass --force" in capsys.readouterr().err
    assert learner_copies.main(["--out", str(out), "--missing", "--notebooks", str(source)]) == 0
    assert "kept" in capsys.readouterr().out and mine.read_text() == "my answers"
    assert learner_copies.main(["--out", str(out), "--force", "--notebooks", str(source)]) == 0
    assert len(json.loads(mine.read_text())["cells"]) == 3


def test_a_broken_file_is_named_and_the_others_are_still_written(tmp_path, capsys):
    good = _write(tmp_path, "00_good.ipynb", EXERCISE)
    broken = _write(tmp_path, "01_broken.ipynb", '{"cells": [')
    no_cells = _write(tmp_path, "02_nocells.ipynb", {"metadata": {}})
    string_tags = _write(tmp_path, "03_tags.ipynb", _notebook(_cell("code", "answer = 42") | {"metadata": {"tags": "solution"}}))
    out = tmp_path / "out"
    assert learner_copies.main(["--out", str(out), "--notebooks", *map(str, (broken, good, no_cells, string_tags))]) == 1
    err = capsys.readouterr().err
    assert f"{broken}: not valid JSON (line 1" in err
    assert f'{no_cells}: not a notebook (no "cells" list)' in err
    assert f"{string_tags}: cell 0's tags is 'solution', not a list; write it as [\"solution\"]" in err
    assert sorted(p.name for p in out.iterdir()) == ["00_good.ipynb"]


def test_make_learner_copies_and_make_learn_name_this_script():
    makefile = (ROOT / "Makefile").read_text()
    assert "scripts/learner_copies.py $(LEARNER_COPIES_ARGS)" in makefile
    assert "scripts/learner_copies.py --missing --out $(LEARNERS)" in makefile


def test_no_notebook_schema_names_the_iri_formats_the_script_lets_jsonschema_skip():
    # scripts/learner_copies.py keeps jsonschema from importing rfc3987-syntax (2.5 s a start): safe
    # only while no schema nbformat validates with asks for the "iri" formats that package checks.
    def formats(node):
        if isinstance(node, dict):
            if isinstance(node.get("format"), str):
                yield node["format"]
            for value in node.values():
                yield from formats(value)
        elif isinstance(node, list):
            for value in node:
                yield from formats(value)

    schemas = sorted(pathlib.Path(nbformat.__file__).parent.glob("v*/nbformat.v*.schema.json"))
    assert len(schemas) >= 6, schemas  # v3 and v4's minor versions: a moved folder must not pass empty
    named = {name for path in schemas for name in formats(json.loads(path.read_text()))}
    assert not named & {"iri", "iri-reference"}, named
