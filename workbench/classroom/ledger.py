"""The prediction ledger: every exercise's prediction next to what this machine then measured.

Each answered exercise check (`wb.check`, a lesson's `check_...`) appends one row, a JSON
object on one line, to the learner's ledger: `~/.workbench/ledger.jsonl`, or the file named by
WORKBENCH_LEDGER. A learner who has not answered (None) records nothing; a ledger that cannot
be written costs one warning line, never the exercise; a line that is not a row is skipped and
counted (the file's side, where it lies and how it is read and written: classroom/ledger_file.py).

A row (the format `wb.share` sends to the teacher, whose room pools them: classroom/room_view.py):

    notebook   "00_tour": the notebook's file name without .ipynb (None if it could not be told)
    exercise   "answer_a": the answer's variable name, as written in the checking cell
    predicted  the learner's answer: a number, or a string for a choice
    measured   what this machine measured (or computed from what it measured)
    kind       "ratio" | "bytes" | "count" | "seconds" | "choice": inferred from the values
               (a float is a ratio, a whole number from 1024 up bytes, below it a count, a
               string or bool a choice), or given by the caller
    unit       "x", "B", "", "s": how the numbers read
    verdict    "right" | "wrong" | "not checked: <why>" (a timing read on a busy machine)
    time       when, ISO 8601 in UTC
    session    the Python process that recorded it ("<pid>-<start>"): a notebook whose name
               could not be told claims its own session's rows
    learner    added by whoever pools rows from many learners (`wb.share`); not in one's own file

A learner's rows to send: `read_rows()` (the whole file) or `wb.calibration("00_tour").checked`
(one notebook's, its name filled in); the teacher's room pools everyone's (`calibration_table`).

Example:
    >>> rows = [{"notebook": "00_tour", "exercise": "answer_a", "predicted": 2.0, "measured": 1.2,
    ...          "kind": "ratio", "unit": "x", "verdict": "wrong", "time": ""}]
    >>> calibration(rows=rows).summary()
    ['you over-estimate ratios: predicted 2.00x, measured 1.20x (1.7x too high; 1 prediction)']
"""

from __future__ import annotations

import datetime
import html
import linecache
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.base.arguments import finite
from workbench.base.report import Report, format_bytes
from workbench.classroom.ledger_file import (
    UNITS,
    LedgerRead,
    LedgerRefused,
    append_row,
    ledger_path,
    read_ledger,
    read_rows,
    valid_row,
)

__all__ = ["UNITS", "LedgerRead", "LedgerRefused", "ledger_path", "read_ledger", "read_rows", "valid_row", "record",
           "calibration", "Calibration", "kind_of", "ratio", "direction"]

PLURAL = {"ratio": "ratios", "bytes": "byte counts", "count": "counts", "seconds": "times"}
ABOUT_RIGHT = 1.05  # a prediction within 5% of the measurement is neither over nor under
SESSION = f"{os.getpid()}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%S}"
_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep


def notebook_name() -> str | None:
    """The running notebook's name, where the front end says it: Jupyter's server sets
    JPY_SESSION_NAME (the notebook's path) for its kernels, VS Code `__vsc_ipynb_file__`;
    nbconvert and nbval set neither (None)."""
    path = os.environ.get("JPY_SESSION_NAME") or getattr(sys.modules.get("__main__"), "__vsc_ipynb_file__", None)
    return Path(path).stem if path and str(path).endswith(".ipynb") else None


def _exercise_name() -> str | None:
    """The first argument's name in the learner's call (`wb.check(answer_a, ...)` -> 'answer_a'):
    the source line of the innermost frame outside this package (a notebook cell's, which
    IPython keeps in linecache)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return None
    found = re.search(r"check\w*\(\s*([A-Za-z_]\w*)", linecache.getline(frame.f_code.co_filename, frame.f_lineno))
    return found.group(1) if found else None


def kind_of(predicted: Any, measured: Any) -> str:
    """'choice' for strings and booleans, 'bytes' for whole numbers from 1024 up, 'count' below, 'ratio' else."""
    if isinstance(measured, (str, bool)) or isinstance(predicted, (str, bool)):
        return "choice"
    if isinstance(measured, int):
        return "bytes" if abs(measured) >= 1024 else "count"
    return "ratio"


def _plain(value: Any) -> Any:
    """A JSON-able number or string (a numpy or torch scalar becomes a float). What JSON or a
    later float cannot hold (nan, inf, an integer past float's range, an array) becomes text."""
    if hasattr(value, "item") and not isinstance(value, (str, bool, int, float)):
        try:  # a numpy or torch scalar (or one-element array): its Python int or float
            value = value.item()
        except (ValueError, RuntimeError):
            return str(value)[:200]
    if isinstance(value, str):
        return value[:200]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= 1000 else f"a whole number of {value.bit_length()} bits"
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return str(value)[:200]
    return number if math.isfinite(number) else repr(number)


def record(predicted: Any, measured: Any, *, verdict: str, kind: str | None = None, unit: str | None = None,
           exercise: str | None = None, notebook: str | None = None) -> dict[str, Any] | None:
    """Append one row to the ledger and return it; None records nothing. A file that cannot be
    written prints one warning line (once per file) and the exercise goes on."""
    if predicted is None:
        return None
    if kind is not None and kind not in UNITS:
        raise ValueError(f"kind={kind!r} is not a ledger kind; choose from {list(UNITS)} or leave it out")
    predicted, measured = _plain(predicted), _plain(measured)
    kind = kind or kind_of(predicted, measured)
    row = {"notebook": notebook or notebook_name(), "exercise": exercise or _exercise_name(),
           "predicted": predicted, "measured": measured, "kind": kind, "unit": UNITS.get(kind, "") if unit is None else unit,
           "verdict": verdict, "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "session": SESSION}
    append_row(row)
    return row


def ratio(row: dict[str, Any]) -> float | None:
    """predicted / measured for a numeric row with both finite and above zero, else None."""
    p, m = row.get("predicted"), row.get("measured")
    if row.get("kind") == "choice" or not (finite(p) and finite(m)) or p <= 0 or m <= 0:
        return None
    r = float(p) / float(m)
    return r if math.isfinite(r) and r > 0 else None


def direction(r: float | None) -> str:
    """'over', 'under' or 'about right' (within 5%) for a ratio predicted / measured."""
    if r is None:
        return ""
    return "over" if r > ABOUT_RIGHT else "under" if r < 1 / ABOUT_RIGHT else "about right"


def _show(value: Any, kind: str) -> str:
    if isinstance(value, str) or kind == "choice" or value is None:
        return repr(value) if isinstance(value, str) else str(value)
    if kind == "bytes":
        return format_bytes(value)
    if kind == "ratio":
        return f"{value:.2f}x" if abs(value) >= 0.1 else f"{value:.2g}x"
    return f"{value:,.0f}" if kind == "count" and float(value).is_integer() else f"{value:.3g}{UNITS.get(kind, '')}"


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


@dataclass(frozen=True, repr=False)
class Calibration(Report):
    """A learner's predictions against the measurements, and which they over- or under-estimate."""

    checked: tuple[dict[str, Any], ...]
    notebook: str | None = None
    skipped: int = 0
    """Lines or rows that were not prediction rows (unreadable, a bare number, a missing key): not shown."""
    refused: str = ""
    """Why the ledger itself was not read (not a regular file, no home folder): one line; '' if it was."""
    header = ("notebook", "exercise", "predicted", "measured", "predicted / measured", "verdict")

    def rows(self) -> Sequence[Sequence[Any]]:
        table = []
        for row in self.checked:
            r = ratio(row)
            said = "" if r is None else f"{r:.2f} ({direction(r)})" if r >= 0.1 else f"{r:.2g} ({direction(r)})"
            table.append((row.get("notebook") or "?", row.get("exercise") or "?", _show(row["predicted"], row["kind"]),
                          _show(row["measured"], row["kind"]), said, row["verdict"]))
        return table

    def summary(self) -> list[str]:
        """One line per kind of effect the learner over- or under-estimates (geometric means), one for choices."""
        lines = []
        for kind in dict.fromkeys(row["kind"] for row in self.checked):
            mine = [row for row in self.checked if row["kind"] == kind]
            if kind == "choice":
                right = sum(row["verdict"] == "right" for row in mine)
                unchecked = sum(row["verdict"].startswith("not checked") for row in mine)
                lines.append(f"choices: {right} of {len(mine) - unchecked} right"
                             + (f" ({unchecked} not checked)" if unchecked else ""))
                continue
            for way, word in (("over", "high"), ("under", "low")):
                off = [row for row in mine if direction(ratio(row)) == way]
                if off:
                    p, m = _geomean([row["predicted"] for row in off]), _geomean([row["measured"] for row in off])
                    factor = max(p / m, m / p)
                    lines.append(f"you {way}-estimate {PLURAL.get(kind, kind)}: predicted {_show(p, kind)}, measured "
                                 f"{_show(m, kind)} ({factor:.1f}x too {word}; {len(off)} prediction{'s' * (len(off) > 1)})")
            close = sum(direction(ratio(row)) == "about right" for row in mine)
            if close:
                lines.append(f"{PLURAL.get(kind, kind)}: {close} of {len(mine)} within 5% of the measurement")
        if not lines:
            lines = [self.refused or "no predictions recorded yet: answer an exercise, then run its checking cell"]
        if self.skipped:
            lines.append(f"skipped {self.skipped} line{'s' * (self.skipped != 1)} of the ledger that "
                         f"{'are' if self.skipped != 1 else 'is'} not a prediction row (unreadable, or not written by the workbench)")
        return lines

    def caption(self) -> str:
        n = len(self.checked)
        return f"Your calibration: {self.notebook or 'every notebook'} ({n} prediction{'s' * (n != 1)})"

    def __str__(self) -> str:
        return "\n".join([super().__str__(), *self.summary()])

    def extra_html(self) -> str:
        return "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in self.summary()) + "</ul>"


def calibration(notebook: str | None = None, *, rows: Sequence[dict[str, Any]] | None = None) -> Calibration:
    """This learner's calibration, from their ledger (or `rows`): for one notebook or all.
    Rows whose notebook could not be told (nbconvert, nbval) count as this session's notebook.

    Example:
        >>> wb.calibration("00_tour")  # doctest: +SKIP
    """
    if notebook is not None and not isinstance(notebook, str):
        raise TypeError(f"calibration(notebook={notebook!r}): give the notebook's name as text, e.g. \"00_tour\", or leave it out")
    refused, skipped = "", 0
    if rows is None:
        try:
            read = read_ledger()
            rows, skipped = read.rows, read.skipped
        except LedgerRefused as error:
            rows, refused = [], str(error)
    elif isinstance(rows, (str, bytes, dict)) or not hasattr(rows, "__iter__"):
        raise TypeError(f"calibration(rows=...) takes a list of ledger rows (dicts), not {type(rows).__name__}")
    else:
        given = list(rows)
        rows = [row for row in given if valid_row(row)]
        skipped = len(given) - len(rows)
    if notebook is not None:
        rows = [dict(row, notebook=notebook) for row in rows if row.get("notebook") == notebook
                or row.get("notebook") is None and row.get("session") == SESSION]
    return Calibration(tuple(rows), notebook, skipped=skipped, refused=refused)
