"""The course's times from one source: README's and WORKSHOP's tables are generated, and current."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course_facts = _load("course_facts")
course_words = _load("course_words")


def test_the_committed_times_and_the_workshop_path_are_what_the_sources_give():
    stale = course_facts.stale(ROOT)
    assert not stale, "; ".join(stale) + ": run `python scripts/course_facts.py` and commit the result"


def test_the_three_hour_path_fits_with_its_slack_and_cuts_in_course_order():
    rows, left = course_facts.plan({"00": 30, "01": 40, "02": 30, "03": 35, "04": 10})
    assert [what for _, what, _ in rows] == ["welcome; pre-flight already green", "00", "01", "break", "02", "03",
                                             "wrap-up: docs/DECIDE.md, docs/SUMMARY.md"]
    end = rows[-1][0] + rows[-1][2]
    assert end == 10 + 30 + 40 + 10 + 30 + 35 + 5 == 160 and left == ["04"]  # 04 would fit alone, but follows 03
    assert sum(length for _, _, length in rows) == end  # no gap, no overlap
    # 15 minutes more and 03 would end the day at 2:55: inside three hours, but not with 15 minutes of slack
    rows, left = course_facts.plan({"00": 30, "01": 40, "02": 30, "03": 50})
    assert left == ["03"] and 180 - (rows[-1][0] + rows[-1][2]) >= course_facts.SLACK == 15


def test_the_committed_workshop_path_keeps_fifteen_minutes_of_slack():
    text = (ROOT / "docs" / "WORKSHOP.md").read_text()
    hours, minutes = map(int, text.split("Ends at ")[1].split(" of ")[0].split(":"))
    assert 180 - (60 * hours + minutes) >= 15


def test_a_day_too_short_for_any_notebook_still_has_its_break_and_lists_every_notebook_as_left():
    rows, left = course_facts.plan({"00": 200})
    assert [what for _, what, _ in rows][1] == "break" and left == ["00"]


def test_learner_minutes_count_prose_code_lines_tables_the_exercise_and_the_questions(tmp_path):
    def md(text, tags=()):
        return {"cell_type": "markdown", "metadata": {"tags": list(tags)}, "source": text}

    def code(text, tags=(), table=""):
        outputs = [{"output_type": "execute_result", "execution_count": 1, "metadata": {},
                    "data": {"text/plain": table, "text/html": "<table/>"}}] if table else []
        return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": text, "outputs": outputs,
                "execution_count": None}

    # a 17-column comparison: a header and 3 rows (how wb.compare prints), and a claims-like table of sentences
    wide = "\n".join("  ".join(f"c{r}{i}" for i in range(17)) for r in range(4))
    cells = [md("# 01 · Title\n" + "word " * 298), code("a = 1"), code("\n".join(f"x{i} = {i}" for i in range(37)), table=wide),
             code("answer_a = None\nanswer_b = None  # predict"),
             md("**Explain:** why?"), code("answer = 3", tags=["solution"]), md("the answers " * 10, tags=["solution"]),
             md("## Questions\n1. Why?\n2. How?\n   (a second line)\n3. When?"),
             md("## Optional: depth\n" + "deep " * 500), code("c = 3", table=wide), md("**Explain:** not core")]
    path = tmp_path / "01_x.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    counts = course_words.words(path)
    # "#", "01", "·", "Title"; the 298 words; "**Explain:**", "why?"; "##", "Questions"; the questions' 9 words
    assert counts["core"] == 4 + 298 + 2 + 2 + 9 == 315
    assert (counts["optional"], counts["solution"]) == (3 + 500 + 3, 20)
    assert (counts["code_cells"], counts["code_lines"]) == (3, 1 + 37 + 2)  # not the solution, not the optional cell
    assert (counts["tables"], counts["table_figures"]) == (1, 4 * 17)  # the optional cell's table is not on the path
    assert (counts["exercises"], counts["predictions"], counts["questions"]) == (1, 2, 3)
    m = course_words.MINUTES
    assert counts["minutes"] == round(315 / 150 + 3 * m["run_a_cell"] + 40 / m["code_lines_a_minute"]
                                      + 68 / m["table_figures_a_minute"] + 2 * m["a_prediction"] + m["an_explanation"]
                                      + 3 * m["a_question"]) == 20
    assert course_words.core_code_cells(path)[:2] == ["a = 1", "\n".join(f"x{i} = {i}" for i in range(37))]
    # the 37-line cell alone costs more than four one-line cells: length counts
    assert 0.5 + 37 / 10 > 4 * (0.5 + 1 / 10)
