"""The course's notebooks, copied out of the installed package into a folder of yours.

    workbench-notebooks DEST            # or: python -m workbench notebooks DEST
    workbench-notebooks DEST --force    # replace copies that are there (they may hold your answers)

A wheel of the workbench carries the notebooks (setup.py maps notebooks/ to `workbench.notebooks`);
in a checkout they are notebooks/ beside the package. A copy that is there is kept unless --force:
running it again never overwrites a learner's work. Imports nothing heavy (no torch): it runs in a
bare environment too.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def notebooks_source() -> Path:
    """The folder the notebooks are in: the installed package's, else the checkout's notebooks/."""
    for candidate in (PACKAGE / "notebooks", PACKAGE.parent / "notebooks"):
        if any(candidate.glob("[0-9][0-9]_*.ipynb")):
            return candidate
    raise FileNotFoundError(f"no notebooks in {PACKAGE / 'notebooks'} nor {PACKAGE.parent / 'notebooks'}: "
                            "reinstall the workbench (pip install torch-workbench)")


def notebook_files(source: Path) -> list[Path]:
    """The course's notebooks (NN_name.ipynb) and the teacher's (teacher/*.ipynb), relative to source."""
    return sorted(p.relative_to(source) for p in [*source.glob("[0-9][0-9]_*.ipynb"), *source.glob("teacher/*.ipynb")])


def copy_notebooks(dest: Path, *, force: bool = False, source: Path | None = None) -> tuple[list[Path], list[Path]]:
    """Copies every notebook into dest (kept relative paths); returns (copied, kept because there)."""
    source = source or notebooks_source()
    if dest.exists() and not dest.is_dir():
        raise NotADirectoryError(f"{dest} is a file: name a folder for the notebooks")
    copied, kept = [], []
    for rel in notebook_files(source):
        target = dest / rel
        if target.exists() and not force:
            kept.append(rel)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, target)
        copied.append(rel)
    return copied, kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbench-notebooks", description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="the folder to copy the notebooks into (made if missing)")
    parser.add_argument("--force", action="store_true", help="replace notebooks that are there already")
    args = parser.parse_args(argv)
    try:
        copied, kept = copy_notebooks(args.dest, force=args.force)
    except (FileNotFoundError, NotADirectoryError, PermissionError) as e:
        print(f"workbench-notebooks: {e}", file=sys.stderr)
        return 1
    print(f"{len(copied)} notebooks copied to {args.dest}" + (f"; {len(kept)} kept as they were (--force replaces them)"
                                                             if kept else "")
          + f". Open them: jupyter lab {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
