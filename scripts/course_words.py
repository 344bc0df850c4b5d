"""Words a learner reads in each notebook: the core path, and the optional depth beside it.

    python scripts/course_words.py              # a table for every notebook in notebooks/
    python scripts/course_words.py --max 1000   # and exit 1 when a core path is longer

Counted: the words (whitespace-separated) of markdown cells. A section whose heading starts
with "Optional" (`## Optional: ...`) is optional down to the next heading of its level or
higher; everything else is the core path. Cells tagged `solution` are answers, read after
the exercise (they are not in the learners' copies), and are counted apart. A learner's
minutes on the core path are estimated from the core words, the core code cells and the
exercises (`learner_minutes`: words / 150 + 1 a code cell + 5 an exercise).
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


def words(notebook: pathlib.Path) -> dict[str, int]:
    """One notebook's core path: {"core", "optional", "solution"} markdown words, and the
    learner's "code_cells" (core code cells, solutions excluded: the learners' copies drop
    them) and "exercises" (core markdown cells that start with "**Explain", one per
    predict-run-explain exercise, as docs/NOTEBOOKS.md shapes them)."""
    counts = {"core": 0, "optional": 0, "solution": 0, "code_cells": 0, "exercises": 0}
    optional_level = None  # the level of the "Optional" heading we are under, if any
    for cell in json.loads(notebook.read_text())["cells"]:
        text = "".join(cell["source"])
        if "solution" in _tags(cell):
            counts["solution"] += len(text.split()) if cell["cell_type"] == "markdown" else 0
            continue
        if cell["cell_type"] == "code":
            counts["code_cells"] += optional_level is None
            continue
        if cell["cell_type"] != "markdown":
            continue
        if optional_level is None and text.lstrip().startswith("**Explain"):
            counts["exercises"] += 1
        for line, heading in _headings_outside_fences(text):
            optional_level = _section(optional_level, heading or "")
            counts["optional" if optional_level is not None else "core"] += len(line.split())
    counts["minutes"] = learner_minutes(counts["core"], counts["code_cells"], counts["exercises"])
    return counts


def learner_minutes(core_words: int, code_cells: int, exercises: int) -> int:
    """A learner's minutes on the core path: reading at WORDS_PER_MINUTE, plus a minute to read
    and run each code cell, plus five minutes for each exercise (predict, run, explain). An
    estimate, not a timing: it is what notebook headers and docs/WORKSHOP.md quote."""
    return round(core_words / WORDS_PER_MINUTE + code_cells + 5 * exercises)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path, help="default: every notebooks/*.ipynb")
    parser.add_argument("--max", type=int, default=None, help="exit 1 when a core path has more words")
    args = parser.parse_args()
    paths = args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb"))
    print(f"{'notebook':<40} {'core':>6} {'optional':>9} {'solution':>9} {'code':>5} {'ex.':>4} {'minutes':>8}")
    too_long = []
    for path in paths:
        counts = words(path)
        print(f"{path.stem:<40} {counts['core']:>6} {counts['optional']:>9} {counts['solution']:>9} "
              f"{counts['code_cells']:>5} {counts['exercises']:>4} {counts['minutes']:>8}")
        if args.max is not None and counts["core"] > args.max:
            too_long.append(f"{path.stem}: {counts['core']} core words (at most {args.max})")
    for line in too_long:
        print(line, file=sys.stderr)
    return 1 if too_long else 0


if __name__ == "__main__":
    sys.exit(main())
