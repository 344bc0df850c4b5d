"""The prediction ledger: a check records a row, None records nothing, an unwritable ledger
costs one warning line, calibration says over/under and by how much, the room view pools."""

from __future__ import annotations

import json
import os

import pytest

from workbench.classroom import ledger
from workbench.classroom import ledger_file as the_file
from workbench.classroom.ledger import calibration, read_rows
from workbench.lessons import exercises, tour


@pytest.fixture
def ledger_file(tmp_path, monkeypatch):
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("WORKBENCH_LEDGER", str(path))
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/learner/notebooks/02_gradient_accumulation.ipynb")
    return path


def row(exercise, predicted, measured, kind="ratio", verdict="wrong", notebook="00_tour", **more):
    return {"notebook": notebook, "exercise": exercise, "predicted": predicted, "measured": measured, "kind": kind,
            "unit": ledger.UNITS[kind], "verdict": verdict, "time": "2026-12-01T20:00:00+00:00", **more}


def test_a_check_records_its_prediction_and_the_measurement(ledger_file):
    answer_a = 0.5
    exercises.check(answer_a, 0.5, rel_tol=1e-3)
    answer_b = 3_000
    with pytest.raises(exercises.WrongAnswer):
        exercises.check(answer_b, 4_096)  # a wrong answer is recorded before it raises
    first, second = [json.loads(line) for line in ledger_file.read_text().splitlines()]
    assert {k: first[k] for k in ("notebook", "exercise", "predicted", "measured", "kind", "unit", "verdict")} == {
        "notebook": "02_gradient_accumulation", "exercise": "answer_a", "predicted": 0.5, "measured": 0.5,
        "kind": "ratio", "unit": "x", "verdict": "right"}
    assert (second["exercise"], second["kind"], second["unit"], second["verdict"]) == ("answer_b", "bytes", "B", "wrong")
    assert first["time"].endswith("+00:00") and first["session"] == ledger.SESSION


def test_kind_is_inferred_or_given():
    assert [ledger.kind_of(*pair) for pair in [("up", "up"), (True, False), (2.0, 1.5), (8, 8), (1, 2048)]] == \
        ["choice", "choice", "ratio", "count", "bytes"]
    assert ledger.record(1.5, 3.0, verdict="wrong", kind="seconds", exercise="t")["unit"] == "s"


def test_an_unanswered_check_records_nothing(ledger_file, capsys):
    exercises.check(None, 42, hint="count the bytes")
    assert "Not answered yet" in capsys.readouterr().out
    assert not ledger_file.exists()


def test_an_unwritable_ledger_warns_in_one_line_and_the_check_still_works(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("WORKBENCH_LEDGER", str(blocker / "ledger.jsonl"))  # a folder that is a file
    monkeypatch.setattr(the_file, "_warned", set())
    exercises.check(41.9, 42, rel_tol=0.01)
    exercises.check(7, 7)  # the same file again: no second warning
    out, err = capsys.readouterr()
    assert out.count("Correct") == 2
    assert len(err.strip().splitlines()) == 1 and "could not write" in err and "WORKBENCH_LEDGER" in err


def test_a_timing_not_checked_on_a_busy_core_is_recorded_as_not_checked(ledger_file, monkeypatch):
    from workbench.lessons.contention import CoreShare

    busy = CoreShare(cpu_s=0.3, wall_s=1.0, threads=1)
    monkeypatch.delenv("WORKBENCH_MAX_STEPS", raising=False)
    answer_b = "down"
    tour.check_speed(answer_b, tour.BatchSpeed((64, 256), 1.5, [1.5], (1.0, 1.5), 5, "cpu", busy))
    (recorded,) = read_rows(ledger_file)
    assert (recorded["exercise"], recorded["predicted"], recorded["measured"]) == ("answer_b", "down", "up")
    assert recorded["verdict"].startswith("not checked")


def test_calibration_says_what_is_over_and_under_estimated_and_by_how_much():
    rows = [row("speed-up", 2.0, 1.25), row("saving", 3.0, 1.5), row("bytes", 1_000, 4_000, kind="bytes"),
            row("close", 1.02, 1.0, verdict="right"), row("dir", "up", "up", kind="choice", verdict="right"),
            row("dir2", "same", "up", kind="choice")]
    lines = calibration(rows=rows).summary()
    # over: geometric means of (2.0, 3.0) and (1.25, 1.5): sqrt(6) / sqrt(1.875) = sqrt(3.2) = 1.79x too high
    assert lines[0] == "you over-estimate ratios: predicted 2.45x, measured 1.37x (1.8x too high; 2 predictions)"
    assert "ratios: 1 of 3 within 5% of the measurement" in lines
    assert "you under-estimate byte counts: predicted 1000 B, measured 3.9 KiB (4.0x too low; 1 prediction)" in lines
    assert "choices: 1 of 2 right" in lines
    table = calibration(rows=rows)
    assert [r[4] for r in table.rows()][:4] == ["1.60 (over)", "2.00 (over)", "0.25 (under)", "1.02 (about right)"]
    assert "1.8x too high" in str(table) and "1.8x too high" in table._repr_html_()


def test_calibration_of_one_notebook_claims_this_sessions_unnamed_rows(ledger_file):
    rows = [row("a", 2.0, 1.0), row("b", 2.0, 1.0, notebook="01_mixed_precision"),
            row("c", 2.0, 1.0, notebook=None, session=ledger.SESSION), row("d", 2.0, 1.0, notebook=None, session="other")]
    mine = calibration("00_tour", rows=rows)
    assert [(r["exercise"], r["notebook"]) for r in mine.checked] == [("a", "00_tour"), ("c", "00_tour")]
    assert len(calibration(rows=rows).checked) == 4
    assert calibration("00_tour").summary() == ["no predictions recorded yet: answer an exercise, then run its checking cell"]


def test_each_course_notebook_shows_its_own_calibration_on_the_core_path():
    import importlib.util
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("course_words", root / "scripts" / "course_words.py")
    course_words = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course_words)
    wrong = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        shown = [m for cell in course_words.core_code_cells(path) for m in re.findall(r'wb\.calibration\("([^"]*)"\)', cell)]
        if shown != [path.stem]:
            wrong.append(f"{path.stem}: core-path calibration cells show {shown}")
    assert not wrong, wrong


def test_a_numpy_count_stays_a_count_and_an_unknown_kind_is_refused(ledger_file):
    import numpy as np

    assert ledger.record(np.int64(8), np.int64(8), verdict="right", exercise="e")["kind"] == "count"
    with pytest.raises(ValueError, match="kind='speed' is not a ledger kind"):
        ledger.record(2.0, 1.0, verdict="wrong", kind="speed")
