"""The prediction ledger's file: where it lies, appending a row, reading rows back, safely.

The ledger never costs the exercise. A path that is not a regular file (a FIFO, a device, a
folder) is refused in one line, and every open is non-blocking, so a FIFO cannot hang a check (a
plain open() of a FIFO waits for a peer forever). HOME set but empty or relative is refused,
not read as the file-system root (os.path.expanduser turns HOME='' into '/'). A line that is not
a row the ledger wrote (bytes that are not UTF-8, a bare number, a missing key, a number no float
holds: json reads a 5,000-digit integer only to fail converting it) is skipped and counted.
The row format is classroom/ledger.py's.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.base.arguments import finite

UNITS = {"ratio": "x", "bytes": "B", "count": "", "seconds": "s", "choice": ""}
# A row the ledger writes is ~300 bytes; a learner's ledger after the whole course ~40 rows. A line
# or a file far beyond that was not written by the ledger: skipped (a line) or refused (the file).
MAX_LINE_BYTES = 16 * 1024
MAX_LEDGER_BYTES = 16 * 2**20
_warned: set[str] = set()


class LedgerRefused(ValueError):
    """A ledger path the workbench will not read or write (one line: the path, why, the fix)."""


def ledger_path() -> Path:
    """Where this learner's rows go: WORKBENCH_LEDGER, else ~/.workbench/ledger.jsonl. A HOME that
    is set but empty or relative is refused: os.path.expanduser reads HOME='' as '/', which would
    put every learner's ledger at the file-system root."""
    given = os.environ.get("WORKBENCH_LEDGER")
    if given:
        return Path(given)
    home = os.environ.get("HOME")
    if home is not None and not os.path.isabs(home):
        raise LedgerRefused(f"prediction ledger: HOME={home!r} is no home folder; set HOME, or WORKBENCH_LEDGER to a file")
    return Path.home() / ".workbench" / "ledger.jsonl"


def _file_kind(mode: int) -> str:
    return next((name for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISDIR, "folder"), (stat.S_ISCHR, "device"),
                                         (stat.S_ISBLK, "device"), (stat.S_ISSOCK, "socket")) if test(mode)), "special file")


def _refuse_unless_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise LedgerRefused(f"prediction ledger: {path} is a {_file_kind(mode)}, not a regular file; "
                            "set WORKBENCH_LEDGER to a file")


def _open_regular(path: Path, flags: int) -> int:
    """A descriptor of `path` opened non-blocking (a FIFO's open would otherwise wait for a
    peer forever), refused unless it is a regular file."""
    fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        _refuse_unless_regular(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_row(row: dict[str, Any]) -> None:
    """Append one row to the ledger; a ledger that cannot be written prints one warning line
    (once per file) and returns: the exercise goes on."""
    path = "the ledger"
    try:
        path = ledger_path()  # inside: Path.home() raises where no home can be found
        if path.exists() or path.is_symlink():  # lstat/stat only: nothing that could block
            _refuse_unless_regular(path, path.stat().st_mode)
        path.parent.mkdir(parents=True, exist_ok=True)
        # One write() of one whole line to a file opened with O_APPEND: each write lands at the
        # file's end, so two kernels appending at once (a learner's two notebooks) add whole lines.
        fd = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (json.dumps(row, default=str, allow_nan=False) + "\n").encode())
        finally:
            os.close(fd)
    except LedgerRefused as error:
        _warn_once(str(path), f"{error} (the exercise is unaffected)")
    except (OSError, RuntimeError, ValueError) as error:
        _warn_once(str(path), f"prediction ledger: could not write {path} ({getattr(error, 'strerror', None) or error}); "
                              "the exercise is unaffected (set WORKBENCH_LEDGER to a writable file)")


def _warn_once(key: str, line: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(line, file=sys.stderr)


def valid_row(row: Any) -> bool:
    """Whether `row` is one the ledger wrote: a dict with a known kind, a text verdict, and a
    predicted and measured value that are both finite numbers (a choice: text or a bool)."""
    if not isinstance(row, dict) or row.get("kind") not in UNITS or not isinstance(row.get("verdict"), str):
        return False
    if any(not isinstance(row.get(key), (str, type(None))) for key in ("notebook", "exercise", "session")):
        return False
    values = (row.get("predicted", ...), row.get("measured", ...))
    if row["kind"] == "choice":
        return all(isinstance(v, (str, bool)) or finite(v) for v in values)
    return all(finite(v) for v in values)


@dataclass(frozen=True)
class LedgerRead:
    """A ledger's readable rows, oldest first, and how many lines were skipped as not rows."""

    rows: list[dict[str, Any]]
    skipped: int = 0


def read_ledger(path: str | os.PathLike | None = None) -> LedgerRead:
    """The ledger's rows and a count of the lines skipped (not UTF-8, not JSON, not a row the
    ledger writes: `valid_row`); a missing file has none. Raises LedgerRefused, one line, for a
    path that is not a regular file or is far larger than a ledger grows."""
    path = Path(path) if path is not None else ledger_path()
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return LedgerRead([])
    except OSError as error:
        raise LedgerRefused(f"prediction ledger: could not read {path} ({error.strerror or error}); "
                            "set WORKBENCH_LEDGER to a readable file") from None
    with open(fd, "rb") as file:
        if os.fstat(fd).st_size > MAX_LEDGER_BYTES:
            raise LedgerRefused(f"prediction ledger: {path} holds {os.fstat(fd).st_size:,} bytes, not a ledger "
                                f"(at most {MAX_LEDGER_BYTES:,}); move it aside or set WORKBENCH_LEDGER")
        data = file.read(MAX_LEDGER_BYTES + 1)
    rows, skipped = [], 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_LINE_BYTES else None
        except (UnicodeDecodeError, ValueError, RecursionError):  # ValueError: bad JSON, a 5,000-digit int
            row = None
        if valid_row(row):
            rows.append(row)
        else:
            skipped += 1
    return LedgerRead(rows, skipped)


def read_rows(path: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The ledger's rows, oldest first; a missing file has none, a line that is not a row is skipped."""
    return read_ledger(path).rows


