"""docs/FACILITATOR.md's figures, from the committed notebooks: each notebook's clock and what its
exercise's checks measured in the saved outputs (what the projector shows).

    python scripts/course_facts.py            # rewrites this table with README's and WORKSHOP's
    python scripts/course_facts.py --check    # exit 1 when it is stale (tests/test_course_facts.py)

The clock is `scripts/course_words.py`'s learner minutes, split into its parts (`course_words.MINUTES`):
prose, code cells (by length), the tables the saved outputs show, the exercise (each prediction and
its explanation), the concept questions. The measured answers are the `expected` figures the
solution cells' own checks printed ("Correct: 1.0 (expected 1.0)") in the saved `cpu-quick` run:
what a learner with the default preset measures too (workbench/core/presets.py), up to timing noise.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("course_words", ROOT / "scripts" / "course_words.py")
course_words = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(course_words)

EXPECTED = re.compile(r"^Correct: .*?\(expected (.+?)(?:, within [^)]*)?\)\s*$", re.M)


def _figure(text: str) -> str:
    """A measured answer as a room reads it: a float to 3 significant digits, an int with separators."""
    try:
        value = float(text)
    except ValueError:
        return text
    if value.is_integer() and "." not in text:
        return f"{int(value):,}"
    return f"{value:.3g}"


def measured_answers(notebook: pathlib.Path) -> list[str]:
    """The figures the core path's solution cells' checks printed as expected, in order (the
    Optional sections' exercises are not the room's)."""
    found, optional_level = [], None
    for cell in json.loads(notebook.read_text())["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "markdown" and "solution" not in tags:
            for _, heading in course_words._headings_outside_fences("".join(cell["source"])):
                optional_level = course_words._section(optional_level, heading or "")
        elif cell["cell_type"] == "code" and "solution" in tags and optional_level is None:
            text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
            found += [_figure(m) for m in EXPECTED.findall(text)]
    return found


def clock(notebook: pathlib.Path) -> dict[str, float]:
    """The learner minutes of one notebook's core path, by part (they sum, before rounding, to `minutes`)."""
    counts = course_words.words(notebook)
    m = course_words.MINUTES
    return {"minutes": counts["minutes"], "prose": counts["core"] / course_words.WORDS_PER_MINUTE,
            "code": counts["code_cells"] * m["run_a_cell"] + counts["code_lines"] / m["code_lines_a_minute"],
            "tables": counts["table_minutes"],
            "exercise": counts["predictions"] * m["a_prediction"] + counts["exercises"] * m["an_explanation"],
            "questions": counts["questions"] * m["a_question"],
            "code_cells": counts["code_cells"], "code_lines": counts["code_lines"], "table_figures": counts["table_figures"],
            "predictions": counts["predictions"], "question_count": counts["questions"]}


def clock_table(paths: list[pathlib.Path], results: pathlib.Path | None = None) -> str:
    """FACILITATOR's table: per notebook its clock by part and its exercise's measured answers."""
    m = course_words.MINUTES
    lines = [f"Rates: prose {course_words.WORDS_PER_MINUTE} words a minute; a code cell {m['run_a_cell']:g} minute to run, "
             f"plus {m['code_lines_a_minute']} lines a minute; tables {m['table_figures_a_minute']} figures a minute; "
             f"a prediction {m['a_prediction']} minutes, an explanation {m['an_explanation']}, a question {m['a_question']}.",
             "",
             "| notebook | minutes | prose | code cells (lines) | tables (figures) | exercise (predictions) "
             "| questions | the exercise's answers, measured (saved cpu-quick run) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for path in paths:
        c = clock(path)
        lines.append(f"| `{path.stem}` | {c['minutes']} | {c['prose']:.0f} | {c['code']:.0f} ({c['code_cells']} cells, "
                     f"{c['code_lines']} lines) | {c['tables']:.0f} ({c['table_figures']}) | {c['exercise']:.0f} "
                     f"({c['predictions']}) | {c['questions']:.0f} ({c['question_count']}) | "
                     + (", ".join(measured_answers(path)) or "none saved") + " |")
    return "\n".join(lines)
