"""Make the learners' copies of the notebooks: no outputs, no solutions.

The notebooks in `notebooks/` are the teacher's: they hold the outputs of a real run (what a
reader on the web sees) and, for each exercise and the concept questions, worked answers in
cells tagged `solution`. A learner should meet neither: the point of an exercise is to predict
before running. This writes a copy of every notebook through nbconvert's own preprocessors:
`TagRemovePreprocessor` drops the `solution` cells, `ClearOutputPreprocessor` the outputs and
execution counts, `ClearMetadataPreprocessor` every metadata key but the cells' `tags` and the
notebook's kernel and language (so the saved widget state goes too). Run All on a copy then
measures the learner's own machine from scratch.

It never loses work: it refuses to write into `notebooks/` (or the folder of a notebook it
copies), refuses to replace an existing copy unless `--force` (a learner's copy holds their
answers), and with `--missing` writes only the copies that do not exist yet (`make learn`). A
file that is not a notebook (broken JSON, no "cells", a `tags` value that is not a list) is
named on stderr and skipped; the others are still written, and the exit status is 1.

    python scripts/learner_copies.py                 # -> learners/NN_*.ipynb (make learner-copies)
    python scripts/learner_copies.py --missing       # only the copies not there yet (make learn)
    python scripts/learner_copies.py --force         # replace existing copies
    python scripts/learner_copies.py --out /tmp/class --notebooks notebooks/01_mixed_precision.ipynb
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import nbformat
from nbconvert.preprocessors import ClearMetadataPreprocessor, ClearOutputPreprocessor, TagRemovePreprocessor

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOLUTION_TAG = "solution"


class NotANotebook(ValueError):
    """A file this script cannot copy; the message names the file and what is wrong."""


def read_notebook(path: pathlib.Path) -> nbformat.NotebookNode:
    """The notebook at `path`, or NotANotebook naming the file and the fault."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise NotANotebook(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except OSError as e:
        raise NotANotebook(f"{path}: cannot be read ({e.strerror})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise NotANotebook(f'{path}: not a notebook (no "cells" list)')
    for index, cell in enumerate(data["cells"]):
        tags = cell.get("metadata", {}).get("tags", []) if isinstance(cell, dict) else None
        if not isinstance(tags, list):
            # nbconvert would test `"solution" in "solution"`-like strings character by character
            # and keep the cell: a string here would leak an answer into the learner's copy.
            raise NotANotebook(f"{path}: cell {index}'s tags is {tags!r}, not a list; "
                               f'write it as ["{tags}"]' if isinstance(tags, str) else
                               f"{path}: cell {index}'s tags is {tags!r}, not a list of strings")
    return nbformat.from_dict(data)


def learner_copy(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook without solution cells, outputs, execution counts or metadata but tags,
    through nbconvert's preprocessors. The notebook passed in is not changed."""
    copy = nbformat.from_dict(json.loads(json.dumps(notebook)))
    resources: dict = {}
    for preprocessor in (
        TagRemovePreprocessor(remove_cell_tags={SOLUTION_TAG}, enabled=True),
        ClearOutputPreprocessor(enabled=True),
        ClearMetadataPreprocessor(preserve_cell_metadata_mask={"tags"},
                                  preserve_nb_metadata_mask={"kernelspec", "language_info"}, enabled=True),
    ):
        copy, resources = preprocessor(copy, resources)  # each is off unless enabled=True
    return copy


def _refuse_folder(out: pathlib.Path, sources: list[pathlib.Path]) -> str | None:
    """Why `out` must not receive copies (it holds the originals), or None."""
    out = out.resolve()
    originals = {(ROOT / "notebooks").resolve()} | {p.resolve().parent for p in sources}
    if out in originals:
        return f"{out} holds the teachers' notebooks: write the copies elsewhere (--out learners)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "learners")
    parser.add_argument("--notebooks", nargs="*", type=pathlib.Path,
                        default=sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--force", action="store_true", help="replace copies that exist (their answers are lost)")
    mode.add_argument("--missing", action="store_true", help="write only the copies that do not exist yet")
    args = parser.parse_args(argv)
    refused = _refuse_folder(args.out, args.notebooks)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    failed = []
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.notebooks:
        target = args.out / path.name
        if target.exists() and not args.force:
            if args.missing:
                print(f"{target}: kept (it exists: it may hold your answers)")
                continue
            failed.append(f"{target} exists: pass --force to replace it (its answers are lost), "
                          "or --missing to write only the copies not there yet")
            continue
        try:
            notebook = read_notebook(path)
        except NotANotebook as e:
            failed.append(str(e))
            continue
        copy = learner_copy(notebook)
        target.write_text(nbformat.writes(copy), encoding="utf-8")
        removed = len(notebook.cells) - len(copy.cells)
        print(f"{target}: {len(copy.cells)} cells, {removed} solution cell(s) removed, outputs cleared")
    for line in failed:
        print(f"error: {line}", file=sys.stderr)
    print(f"learners' copies in {args.out}" + (f"; {len(failed)} not written (above)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
