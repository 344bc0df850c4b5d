"""Words a learner reads in each notebook: the core path, and the optional depth beside it.

    python scripts/course_words.py              # a table for every notebook in notebooks/
    python scripts/course_words.py --max 1000   # and exit 1 when a core path is longer

Counted: the words (whitespace-separated) of markdown cells. A section whose heading starts
with "Optional" (`## Optional: ...`) is optional down to the next heading of its level or
higher; everything else is the core path. Cells tagged `solution` are answers, read after
the exercise (they are not in the learners' copies), and are counted apart.

A learner's minutes on the core path (`minutes`, what notebook headers and docs/WORKSHOP.md quote)
are the clock of a real room, every part a learner spends time on (`MINUTES`, below): the prose
read, each core code cell run and read by its length (06's 37-line launch cell is not one minute),
the tables its saved outputs show read figure by figure (a 17-column comparison is not free), each
prediction the exercise asks for and its explanation, and each concept question. The saved outputs
are the `cpu-quick` run's: what a learner's screen shows (the default preset without a GPU).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
# Reading technical prose with code beside it: ~150 words a minute (plain prose runs 200-250).
WORDS_PER_MINUTE = 150
# The model's other rates: assumptions a facilitator can check against a room, stated once here.
MINUTES = {
    "run_a_cell": 0.5,          # press Run, see that it ran (the cpu-quick preset runs a notebook in under a minute)
    "code_lines_a_minute": 10,  # a code cell read for what each line does: ~6 s a line
    "table_figures_a_minute": 40,  # a table read to compare its rows: ~1.5 s a figure (cell)
    "a_prediction": 3,          # each answer_... an exercise asks for: reason it out from the cells above
    "an_explanation": 2,        # the exercise's **Explain:** cell: a few sentences
    "a_question": 1,            # each concept question at the end: answered to oneself, or aloud in a room
}
ANSWER = re.compile(r"^\s*(answer\w*)\s*=\s*None\b", re.M)
QUESTION = re.compile(r"^\s*\d+\.\s+\S", re.M)


def _tags(cell: dict) -> list:
    return cell.get("metadata", {}).get("tags", [])


def _section(optional_level: int | None, line: str) -> int | None:
    """The level of the "Optional" heading in force after `line` (None: the core path)."""
    heading = HEADING.match(line)
    if heading:
        level = len(heading.group(1))
        if optional_level is not None and level <= optional_level:
            optional_level = None
        if optional_level is None and heading.group(2).strip().lower().startswith("optional"):
            optional_level = level
    return optional_level


def _headings_outside_fences(text: str):
    """(line, the line as a heading candidate) for each line of a markdown cell; the candidate is
    None inside a ``` code fence: a shell comment there (`# one machine, 2 processes`) is code, not
    a heading that ends an Optional section."""
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            yield line, None
        else:
            yield line, None if fenced else line


def core_code_cells(notebook: pathlib.Path) -> list[str]:
    """The sources of the code cells on the core path that a learner's copy keeps (no solutions)."""
    found, optional_level = [], None
    for cell in json.loads(notebook.read_text())["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and "solution" not in _tags(cell):
            for _, heading in _headings_outside_fences(text):
                optional_level = _section(optional_level, heading or "")
        elif cell["cell_type"] == "code" and optional_level is None and "solution" not in _tags(cell):
            found.append(text)
    return found


def _output_text(cell: dict) -> str:
    """What a code cell's saved outputs show as text: text/plain (a table's repr) or a stream."""
    parts = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        parts.append("".join(data.get("text/plain", "")) if data else "".join(output.get("text", "")))
    return "\n".join(parts)


def tables(text: str) -> list[tuple[int, int, int]]:
    """(rows, columns, words) of each text table in `text`: two or more consecutive lines of at
    least four fields two spaces apart (how Report, pandas and the profiler print a table);
    rules of dashes are no rows."""
    found, run = [], []
    for line in text.splitlines() + [""]:
        fields = [f for f in re.split(r"\s{2,}", line.strip()) if f]
        if set(line.strip()) <= set("-+= ") and line.strip():
            continue  # a rule between the rows
        if len(fields) >= 4:
            run.append(fields)
            continue
        if len(run) >= 2:
            found.append((len(run), max(len(f) for f in run), sum(len(" ".join(f).split()) for f in run)))
        run = []
    return found


def table_minutes(found: list[tuple[int, int, int]]) -> float:
    """Reading tables: figure by figure, or word by word where the cells are sentences (a claims table)."""
    return sum(max(rows * cols / MINUTES["table_figures_a_minute"], words / WORDS_PER_MINUTE) for rows, cols, words in found)


def words(notebook: pathlib.Path) -> dict[str, float]:
    """One notebook's core path: {"core", "optional", "solution"} markdown words; the learner's
    "code_cells" and "code_lines" (core code cells, solutions excluded: the learners' copies drop
    them); "tables", "table_figures" (the tables their saved outputs show, and the figures in them);
    "exercises" (core markdown cells that start with "**Explain", one per predict-run-explain
    exercise, as docs/NOTEBOOKS.md shapes them) and "predictions" (the `answer... = None` it asks
    for); "questions" (numbered items under `## Questions`); "table_minutes" (`table_minutes`, a float);
    and "minutes" (`learner_minutes`)."""
    counts = {"core": 0, "optional": 0, "solution": 0, "code_cells": 0, "code_lines": 0, "tables": 0,
              "table_figures": 0, "exercises": 0, "predictions": 0, "questions": 0}
    table_time = 0.0
    optional_level = None  # the level of the "Optional" heading we are under, if any
    in_questions = False
    for cell in json.loads(notebook.read_text())["cells"]:
        text = "".join(cell["source"])
        if "solution" in _tags(cell):
            counts["solution"] += len(text.split()) if cell["cell_type"] == "markdown" else 0
            continue
        if cell["cell_type"] == "code":
            if optional_level is None:
                counts["code_cells"] += 1
                counts["code_lines"] += sum(1 for line in text.splitlines() if line.strip())
                counts["predictions"] += len(ANSWER.findall(text))
                found = tables(_output_text(cell))
                counts["tables"] += len(found)
                counts["table_figures"] += sum(rows * cols for rows, cols, _ in found)
                table_time += table_minutes(found)
            continue
        if cell["cell_type"] != "markdown":
            continue
        if optional_level is None and text.lstrip().startswith("**Explain"):
            counts["exercises"] += 1
        for line, heading in _headings_outside_fences(text):
            found_heading = HEADING.match(heading or "")
            if found_heading and len(found_heading.group(1)) <= 2:
                in_questions = found_heading.group(2).strip().lower().startswith("questions")
            optional_level = _section(optional_level, heading or "")
            counts["optional" if optional_level is not None else "core"] += len(line.split())
            if in_questions and optional_level is None and heading is not None and QUESTION.match(line):
                counts["questions"] += 1
    counts["table_minutes"] = table_time
    counts["minutes"] = learner_minutes(counts)
    return counts


def learner_minutes(counts: dict[str, float]) -> int:
    """A learner's minutes on the core path (`MINUTES`): reading the core words at WORDS_PER_MINUTE;
    running each core code cell and reading its lines; reading the tables its outputs show
    ("table_minutes"); each prediction the exercise asks for and its explanation;
    each concept question. An estimate, not a timing: what notebook headers and docs/WORKSHOP.md quote."""
    m = MINUTES
    return round(counts["core"] / WORDS_PER_MINUTE
                 + counts["code_cells"] * m["run_a_cell"] + counts["code_lines"] / m["code_lines_a_minute"]
                 + counts.get("table_minutes", 0.0)
                 + counts["predictions"] * m["a_prediction"] + counts["exercises"] * m["an_explanation"]
                 + counts["questions"] * m["a_question"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path, help="default: every notebooks/*.ipynb")
    parser.add_argument("--max", type=int, default=None, help="exit 1 when a core path has more words")
    args = parser.parse_args()
    paths = args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb"))
    print(f"{'notebook':<40} {'core':>6} {'optional':>9} {'solution':>9} {'code':>5} {'lines':>6} {'tables':>7} "
          f"{'figures':>8} {'ex.':>4} {'pred.':>6} {'quest.':>7} {'minutes':>8}")
    too_long = []
    for path in paths:
        counts = words(path)
        print(f"{path.stem:<40} {counts['core']:>6} {counts['optional']:>9} {counts['solution']:>9} "
              f"{counts['code_cells']:>5} {counts['code_lines']:>6} {counts['tables']:>7} {counts['table_figures']:>8} "
              f"{counts['exercises']:>4} {counts['predictions']:>6} {counts['questions']:>7} {counts['minutes']:>8}")
        if args.max is not None and counts["core"] > args.max:
            too_long.append(f"{path.stem}: {counts['core']} core words (at most {args.max})")
    for line in too_long:
        print(line, file=sys.stderr)
    return 1 if too_long else 0


if __name__ == "__main__":
    sys.exit(main())
