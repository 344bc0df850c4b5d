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


def test_the_three_hour_path_fits_and_cuts_in_course_order():
    rows, left = course_facts.plan({"00": 30, "01": 40, "02": 30, "03": 50, "04": 10})
    assert [what for _, what, _ in rows] == ["welcome; pre-flight already green", "00", "01", "break", "02", "03",
                                             "wrap-up: docs/DECIDE.md, docs/SUMMARY.md"]
    end = rows[-1][0] + rows[-1][2]
    assert end == 10 + 30 + 40 + 10 + 30 + 50 + 5 == 175 and left == ["04"]  # 04 would fit alone, but follows 03
    assert sum(length for _, _, length in rows) == end  # no gap, no overlap


def test_a_day_too_short_for_any_notebook_still_has_its_break_and_lists_every_notebook_as_left():
    rows, left = course_facts.plan({"00": 200})
    assert [what for _, what, _ in rows][1] == "break" and left == ["00"]


def test_learner_minutes_count_core_words_core_code_cells_and_exercises(tmp_path):
    def md(text, tags=()):
        return {"cell_type": "markdown", "metadata": {"tags": list(tags)}, "source": text}

    def code(text, tags=()):
        return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": text, "outputs": [], "execution_count": None}

    cells = [md("# 01 · Title\n" + "word " * 298), code("a = 1"), code("b = 2"),
             md("**Explain:** why?"), code("answer = 3", tags=["solution"]), md("the answers " * 10, tags=["solution"]),
             md("## Optional: depth\n" + "deep " * 500), code("c = 3"), md("**Explain:** not core"),
             md("## Questions\n1. Why?")]
    path = tmp_path / "01_x.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    counts = course_words.words(path)
    # "#", "01", "·", "Title"; the 298 words; "**Explain:**", "why?"; "##", "Questions", "1.", "Why?"
    assert counts["core"] == 4 + 298 + 2 + 4 == 308
    assert (counts["optional"], counts["solution"]) == (3 + 500 + 3, 20)
    assert (counts["code_cells"], counts["exercises"]) == (2, 1)
    assert counts["minutes"] == round(308 / 150 + 2 + 5) == 9
    assert course_words.core_code_cells(path) == ["a = 1", "b = 2"]  # not the solution, not the optional cell


def test_a_record_without_a_label_is_named_from_its_preset(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"preset": "cpu", "isa": "avx2", "hog": True, "date": "d",
                                                 "notebooks": {"00_a": {"seconds": 8.4, "cpu_seconds": 5.6, "status": "ok"}}}))
    record = course_facts.load_record("r", tmp_path)
    assert record["label"] == "cpu, avx2, hog"
    assert course_facts._seconds(record, "00_a") == "8 (6)" and course_facts._seconds(record, "01_b") == "-"


def test_every_notebook_has_a_cpu_avx2_run_all_record_of_at_most_180_s():
    """Issue 25's limit, read from the committed record (benchmarks/notebook_times.py --preset cpu
    --isa avx2 --out benchmarks/results/cpu-avx2.json): a notebook missing from it, failed in it or
    slower than 180 s is named. The record is a measurement, so this fails until it is re-taken."""
    record = course_facts.load_record("cpu-avx2")
    misses = []
    for path in course_facts.notebooks():
        entry = record["notebooks"].get(path.stem)
        if entry is None:
            misses.append(f"{path.stem}: not in benchmarks/results/cpu-avx2.json ({record['date']})")
        elif entry.get("status", "ok") != "ok" or entry["seconds"] > 180:
            misses.append(f"{path.stem}: {entry.get('status', 'ok')}, {entry['seconds']:.0f} s")
    assert not misses, "Run All under cpu on 2 AVX2 cores, at most 180 s:\n" + "\n".join(misses)


def test_a_shell_comment_in_a_fenced_block_is_not_a_heading_that_ends_an_optional_section(tmp_path):
    """06's `## Optional: the same run from the shell` shows `# one machine, ...` inside a ```bash
    fence: read as a level-1 heading it ended the section, and its two cells counted as core."""
    def md(text):
        return {"cell_type": "markdown", "metadata": {}, "source": text}

    def code(text):
        return {"cell_type": "code", "metadata": {}, "source": text, "outputs": [], "execution_count": None}

    cells = [md("# 06 · Title\nintro"), code("a = 1"),
             md("## Optional: the shell\n```bash\n# one machine\naccelerate launch\n```\nafter"), code("b = 2"),
             md("## Questions\n1. Why?")]
    path = tmp_path / "06_x.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    counts = course_words.words(path)
    assert course_words.core_code_cells(path) == ["a = 1"]  # not the optional cell after the fence
    assert (counts["core"], counts["optional"]) == (4 + 1 + 4, 4 + 1 + 3 + 2 + 1 + 1)
