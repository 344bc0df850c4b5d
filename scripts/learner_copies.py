"""Make the learners' copies of the notebooks: no outputs, no solutions.

The notebooks in `notebooks/` are the teacher's: they hold the outputs of a real run (what a
reader on the web sees) and, for each exercise, a worked solution in a cell tagged
`solution`. A learner should meet neither: the point of an exercise is to predict before
running. This writes a copy of every notebook with every `solution` cell removed, every
output and execution count cleared and the saved widget state dropped, so Run All on a
learner's copy measures that learner's machine from scratch.

Why a small script and not nbgrader or jupytext: nbgrader brings a course database, a
formgrader server and its own cell metadata, more machinery than a workshop of eight
notebooks needs; jupytext pairs notebooks with text files, which does not remove anything.
A cell tag is what nbval and JupyterLab already show and edit (the property inspector),
so the teacher marks a solution in the same place the notebooks' test markers live.

    python scripts/learner_copies.py                 # -> learners/NN_*.ipynb
    python scripts/learner_copies.py --out /tmp/class --notebooks notebooks/01_mixed_precision.ipynb
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOLUTION_TAG = "solution"


def learner_copy(notebook: dict) -> dict:
    """The notebook without solution cells, outputs, execution counts or widget state."""
    cells = []
    for cell in notebook["cells"]:
        if SOLUTION_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        cell = {**cell, "metadata": {k: v for k, v in cell.get("metadata", {}).items() if k != "execution"}}
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        cells.append(cell)
    metadata = {k: v for k, v in notebook.get("metadata", {}).items() if k != "widgets"}
    return {**notebook, "cells": cells, "metadata": metadata}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "learners")
    parser.add_argument("--notebooks", nargs="*", type=pathlib.Path,
                        default=sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.notebooks:
        notebook = json.loads(path.read_text())
        copy = learner_copy(notebook)
        removed = len(notebook["cells"]) - len(copy["cells"])
        (args.out / path.name).write_text(json.dumps(copy, indent=1, ensure_ascii=False) + "\n")
        print(f"{path.name}: {len(copy['cells'])} cells, {removed} solution cell(s) removed, outputs cleared")
    print(f"learners' copies in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
