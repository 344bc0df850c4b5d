"""Write a file whole or not at all.

A file written in place is emptied first: a write cut short (a full disk, a quota, Ctrl-C)
leaves neither the old contents nor the new. `write_whole` writes a temporary file beside the
target and renames it over the target when complete (`os.replace`: atomic on one file system),
so a failure leaves the file that was there.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_whole(path: str | os.PathLike, text: str) -> None:
    """`text` into `path`, or, if writing fails, `path` as it was (the OSError is raised).

    Example:
        >>> write_whole("result.json", "{}")  # doctest: +SKIP
    """
    target = Path(os.path.realpath(path))  # through a symlink, as open(path, "w") would
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
