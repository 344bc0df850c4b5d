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
file that is not a notebook (not UTF-8, broken JSON, no "cells", a cell without a type or
source, metadata that is not an object, a `tags` value that is not a list of strings) is named on
stderr in one line and skipped; the others are still written (each copy stands alone: one broken
notebook must not keep a class from the rest), and the exit status is 1. Each copy is written to
a temporary file and renamed over the old one when whole, so a failed write (a full disk) leaves
the learner's copy as it was.

    python scripts/learner_copies.py                 # -> learners/NN_*.ipynb (make learner-copies)
    python scripts/learner_copies.py --missing       # only the copies not there yet (make learn)
    python scripts/learner_copies.py --force         # replace existing copies
    python scripts/learner_copies.py --out /tmp/class --notebooks notebooks/01_mixed_precision.ipynb
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

# Where rfc3987-syntax is installed (jupyter-events asks for it), jsonschema, under nbformat, builds
# some thirty Earley parsers at import for the "iri" string format: 2.5 s of this script's 3.7 s
# start on a 2-core AVX2 EPYC, 7 s against 2 s with make test beside it (measured 2026-12-07), in
# every `make learn`. No notebook schema names that format (tests/test_learner_copies.py), so
# jsonschema going without it changes no check made here.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
import nbformat  # noqa: E402
from nbconvert.preprocessors import (  # noqa: E402
    ClearMetadataPreprocessor, ClearOutputPreprocessor, TagRemovePreprocessor)

from workbench.base.atomic_write import write_whole  # noqa: E402  whole or not at all: keeps a learner's answers

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
    except UnicodeDecodeError as e:
        raise NotANotebook(f"{path}: not UTF-8 text (byte {e.start}); save it again from Jupyter") from None
    except OSError as e:
        raise NotANotebook(f"{path}: cannot be read ({e.strerror})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise NotANotebook(f'{path}: not a notebook (no "cells" list)')
    if data.get("nbformat") != 4:
        raise NotANotebook(f'{path}: not an nbformat 4 notebook ("nbformat" is {data.get("nbformat")!r}); '
                           "open it in Jupyter and save it")
    if not isinstance(data.get("metadata", {}), dict):
        raise NotANotebook(f'{path}: its "metadata" is {data["metadata"]!r}, not an object')
    for index, cell in enumerate(data["cells"]):
        problem = _cell_problem(cell)
        if problem:
            raise NotANotebook(f"{path}: cell {index}{problem}")
    return nbformat.from_dict(data)


def _cell_problem(cell: object) -> str | None:
    """What the copy cannot handle in a cell (the rest of nbformat's schema is not asked for: Jupyter
    opens notebooks with odd metadata, and so does this), or None."""
    if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str) or "source" not in cell:
        return ' is not a cell (it needs "cell_type" and "source")'
    metadata = cell.get("metadata", {})
    if not isinstance(metadata, dict):
        return f"'s metadata is {metadata!r}, not an object"
    tags = metadata.get("tags", [])
    if isinstance(tags, str):
        # nbconvert would test `"solution" in "nosolution"`-like strings as substrings: a string
        # here would drop a cell that is no answer, or leak one that is.
        return f"'s tags is {tags!r}, not a list; write it as [\"{tags}\"]"
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        return f"'s tags is {tags!r}, not a list of strings"
    return None


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
    originals = {(ROOT / "notebooks").resolve()} | {p.resolve().parent for p in sources}
    for folder in originals:
        # The same folder by its device and inode: a path compare misses a bind mount, or
        # `Notebooks` on a case-insensitive disk (macOS, Windows).
        if out.is_dir() and folder.is_dir() and os.path.samefile(out, folder):
            return f"{folder} holds the teachers' notebooks: write the copies elsewhere (--out learners)"
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
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        what = "is a file, not a folder" if args.out.is_file() else f"cannot be made a folder ({e.strerror})"
        print(f"error: --out {args.out} {what}; pass a folder such as --out learners", file=sys.stderr)
        return 2
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
        try:
            copy = learner_copy(notebook)
            text = nbformat.writes(copy)
        except Exception as e:  # noqa: BLE001: a shape the checks did not foresee is named, not a traceback half way
            failed.append(f"{path}: cannot be copied ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})")
            continue
        try:
            write_whole(target, text)
        except OSError as e:
            failed.append(f"{target}: cannot be written ({e.strerror or e}); the file there, if any, is unchanged")
            continue
        removed = len(notebook.cells) - len(copy.cells)
        print(f"{target}: {len(copy.cells)} cells, {removed} solution cell(s) removed, outputs cleared")
    for line in failed:
        print(f"error: {line}", file=sys.stderr)
    print(f"learners' copies in {args.out}" + (f"; {len(failed)} not written (above)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
