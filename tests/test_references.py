"""Every figure and cell reference in README.md, docs/*.md and the notebooks' markdown is tied to its
source (scripts/prose_figures.py; the syntax: docs/NOTEBOOKS.md, "Figures in prose"), and the
generated ones are current (scripts/course_facts.py). Reads the committed notebooks' JSON: ~2 s."""

import importlib.util
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


prose_figures = _load("prose_figures")
course_facts = _load("course_facts")


def _code(outputs, tags=()):
    return {"cell_type": "code", "id": "x", "metadata": {"tags": list(tags)}, "execution_count": 1, "source": "...",
            "outputs": [{"output_type": "stream", "name": "stdout", "text": text} for text in outputs]}


def _md(text):
    return {"cell_type": "markdown", "id": "m", "metadata": {}, "source": text}


def _course(tmp_path, cells, readme="", definitions=""):
    """A course of one notebook (01) and the two documents the checker reads its rules from."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "docs").mkdir()
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "notebooks" / "01_mixed_precision.ipynb").write_text(json.dumps(nb))
    (tmp_path / "docs" / "SOURCES.md").write_text("| short name | title |\n|---|---|\n| seed 000 | an article |\n")
    (tmp_path / "docs" / "NOTEBOOKS.md").write_text(f"# Notebooks\n\n```definitions\n{definitions}```\n")
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


CELLS = [_md("# 01 · Mixed precision\n\n**Time: about 23 minutes** (estimated)."),
         _md("## Every arm's budget"),
         _code(["Cut: this cpu emulates fp16 (a matmul measured 32x slower than fp32).\n"], tags=["nbval-ignore-output"]),
         _md("## Saved activations, to the byte"),
         _code(["fp16:   3,946,500 bytes saved; 0.7507 of fp32\n"], tags=["nbval-check-output"])]


def test_every_figure_in_the_course_prose_is_tied_to_its_source():
    problems = prose_figures.check(ROOT)
    assert not problems, f"{len(problems)} figure(s) not tied to their source:\n" + "\n".join(problems)


def test_a_figure_the_cited_section_prints_passes_and_a_stale_one_fails(tmp_path):
    root = _course(tmp_path, CELLS, readme="Saved activations: 0.7507 of fp32's, exact (01 § Saved activations).\n")
    assert prose_figures.check(root) == []
    (root / "README.md").write_text("Saved activations: 0.67 of fp32's, exact (01 § Saved activations).\n")
    [problem] = prose_figures.check(root)
    assert problem.startswith("README.md:1: '0.67' is not in what it cites")


@pytest.fixture(scope="module")
def ctx():
    return prose_figures.context(ROOT)


def test_a_stale_figure_planted_in_the_real_readme_fails(ctx):
    readme = (ROOT / "README.md").read_text()
    quoted = re.search(r"(\d\.\d{4}) of fp32's on the small GPT \(01 § Optional: saved activations\)", readme)
    assert quoted, "README quotes 01's exact saved-activation ratio; this test plants a stale copy of it"
    assert prose_figures.check_text(readme, "README.md", ctx) == []
    stale = "0.1234"
    problems = prose_figures.check_text(readme.replace(quoted.group(0), quoted.group(0).replace(quoted.group(1), stale)),
                                        "README.md", ctx)
    assert len(problems) == 1 and f"'{stale}' is not in what it cites" in problems[0]


def test_a_timing_is_not_quoted_from_an_output_the_next_run_changes(tmp_path):
    root = _course(tmp_path, CELLS, readme="fp16 matmuls run 32x slower here (01 § Every arm's budget).\n")
    [problem] = prose_figures.check(root)
    assert "'32x' is printed only by cells whose output changes run to run" in problem
    assert "generate it (<!-- figure ... -->)" in problem


def test_a_generated_figure_is_read_from_the_outputs_and_goes_stale_when_they_change(tmp_path):
    span = "<!-- figure 01 § Every arm's budget | measured (\\d+x) slower -->{}<!-- /figure -->"
    root = _course(tmp_path, CELLS, readme="fp16 matmuls run " + span.format("80x") + " slower here.\n")
    notebooks = prose_figures.notebooks(root)
    filled = course_facts.fill_figures((root / "README.md").read_text(), "README.md", notebooks)
    assert filled == "fp16 matmuls run " + span.format("32x") + " slower here.\n"
    assert course_facts.fill_figures(filled, "README.md", notebooks) == filled  # current now
    (root / "README.md").write_text(filled)
    assert prose_figures.check(root) == []  # the span's text is the generator's, not the checker's


def test_a_cell_number_and_a_missing_section_are_refused(tmp_path):
    root = _course(tmp_path, CELLS, readme="As cell 22 shows. Also 0.7507 (01 § Against fp32).\n")
    problems = prose_figures.check(root)
    assert any("'cell 22': a cell number moves" in p for p in problems)
    assert any("has no heading starting 'Against fp32'" in p for p in problems)


def test_a_reference_a_definition_and_a_dated_measurement_pass_an_uncited_figure_does_not(tmp_path):
    root = _course(tmp_path, CELLS, readme=(
        "AMP: 1.5-2.5x faster (seed 000).\n\n"                 # a reference: its source named
        "fp16's largest value is 65,504.\n\n"                  # a definition, listed in NOTEBOOKS.md
        "The wheels took 565 MB (measured 2026-12-01).\n\n"    # a one-off, dated
        "Training got 2.4x faster.\n"), definitions="65,504  fp16's largest value\n")  # the last: none of these
    [problem] = prose_figures.check(root)
    assert problem.startswith("README.md:7: '2.4x' cites nothing")


def test_a_definition_nothing_uses_is_reported(tmp_path):
    root = _course(tmp_path, CELLS, definitions="65,504  fp16's largest value\n7 bits  bf16's mantissa\n")
    assert prose_figures.check(root) == ["docs/NOTEBOOKS.md: the definition '65,504' is used nowhere: remove it",
                                         "docs/NOTEBOOKS.md: the definition '7 bits' is used nowhere: remove it"]


def test_a_notebook_cites_its_own_compared_outputs(tmp_path):
    cells = CELLS + [_md("The fp16 arm saves 3,946,500 bytes, 0.75 of fp32's."), _md("It ran 32x slower.")]
    problems = prose_figures.check(_course(tmp_path, cells))
    assert len(problems) == 1 and "'32x' is printed only by cells whose output changes" in problems[0]


def test_the_header_minutes_years_versions_and_names_are_not_figures():
    text = "torch 2.13 (2026-12-01), Python 3.10+, AVX-512, 8-bit, 8x8 digits, x86, seed 004 §4.1, arXiv:1712.05877"
    assert [f.token for f in prose_figures.numbers(text) if prose_figures.is_figure(text, f)] == []
    text = "0.75x, x1.36, 25%, 3.8 s, 12,288 parameters, 9.85e-07, 22.7M"
    assert [f.token for f in prose_figures.numbers(text) if prose_figures.is_figure(text, f)] == \
        ["0.75x", "x1.36", "25%", "3.8", "12,288", "9.85e-07", "22.7M"]


def test_an_h200_figure_is_held_to_the_run_its_sentence_names(ctx):
    """run2's SDPA step against run1's baseline passed while any run's records counted."""
    assert prose_figures.check_text("[H200] SDPA: 203.5 vs 242.4 ms a step (run2 08).", "x.md", ctx) == []
    [problem] = prose_figures.check_text("[H200] SDPA: 203.5 vs 241.7 ms a step (run2 08).", "x.md", ctx)
    assert "'241.7' is not in what it cites (the H200's records)" in problem
    assert prose_figures.check_text("[H200] a step took 241.7 ms (run1 08).", "x.md", ctx) == []
