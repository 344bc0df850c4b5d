"""The prediction ledger: every exercise's prediction next to what this machine then measured.

Each answered exercise check (`wb.check`, a lesson's `check_...`) appends one row, a JSON
object on one line, to the learner's ledger: `~/.workbench/ledger.jsonl`, or the file named by
WORKBENCH_LEDGER. A learner who has not answered (None) records nothing; a ledger that cannot
be written costs one warning line, never the exercise.

A row (the format `wb.share` sends to the teacher; `room_calibration` reads a list of them):

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
(one notebook's, its name filled in); the teacher pools everyone's with `room_calibration`.

Example:
    >>> rows = [{"notebook": "00_tour", "exercise": "answer_a", "predicted": 2.0, "measured": 1.2,
    ...          "kind": "ratio", "unit": "x", "verdict": "wrong", "time": ""}]
    >>> calibration(rows=rows).summary()
    ['you over-estimate ratios: predicted 2.00x, measured 1.20x (1.7x too high; 1 prediction)']
"""

from __future__ import annotations

import datetime
import html
import json
import linecache
import math
import os
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.core.report import Report, format_bytes

UNITS = {"ratio": "x", "bytes": "B", "count": "", "seconds": "s", "choice": ""}
PLURAL = {"ratio": "ratios", "bytes": "byte counts", "count": "counts", "seconds": "times"}
ABOUT_RIGHT = 1.05  # a prediction within 5% of the measurement is neither over nor under
SESSION = f"{os.getpid()}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%S}"
_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep
_warned: set[str] = set()


def ledger_path() -> Path:
    """Where this learner's rows go: WORKBENCH_LEDGER, else ~/.workbench/ledger.jsonl."""
    return Path(os.environ.get("WORKBENCH_LEDGER") or Path.home() / ".workbench" / "ledger.jsonl")


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
    """A JSON-able number or string (a numpy or torch scalar becomes a float)."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if hasattr(value, "item"):  # a numpy or torch scalar: its Python int or float
        return value.item()
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


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
    path = "the ledger"
    try:
        path = ledger_path()  # inside: Path.home() raises where no home can be found
        path.parent.mkdir(parents=True, exist_ok=True)
        # One write() of one whole line to a file opened with O_APPEND: each write lands at the
        # file's end, so two kernels appending at once (a learner's two notebooks) add whole lines.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(row, default=str) + "\n").encode())
        finally:
            os.close(fd)
    except (OSError, RuntimeError) as error:
        if str(path) not in _warned:
            _warned.add(str(path))
            print(f"prediction ledger: could not write {path} ({getattr(error, 'strerror', None) or error}); "
                  "the exercise is unaffected (set WORKBENCH_LEDGER to a writable file)", file=sys.stderr)
    return row


def read_rows(path: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The ledger's rows, oldest first; a missing file has none, a line cut short is skipped."""
    path = Path(path) if path is not None else ledger_path()
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def ratio(row: dict[str, Any]) -> float | None:
    """predicted / measured for a numeric row with both above zero, else None."""
    p, m = row.get("predicted"), row.get("measured")
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (p, m))
    return p / m if numeric and row.get("kind") != "choice" and p > 0 and m > 0 else None


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
        return lines or ["no predictions recorded yet: answer an exercise, then run its checking cell"]

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
    rows = list(read_rows() if rows is None else rows)
    if notebook is not None:
        rows = [dict(row, notebook=notebook) for row in rows if row.get("notebook") == notebook
                or row.get("notebook") is None and row.get("session") == SESSION]
    return Calibration(tuple(rows), notebook)


@dataclass(frozen=True, repr=False)
class RoomCalibration(Report):
    """Many learners' predictions pooled, one row per exercise: how the room sees each effect."""

    pooled: tuple[tuple[Any, ...], ...]
    header = ("notebook", "exercise", "learners", "median predicted / measured", "middle half",
              "over / about right / under", "right")

    def rows(self) -> Sequence[Sequence[Any]]:
        return self.pooled

    def caption(self) -> str:
        return "The room's calibration: each learner's first prediction per exercise"


def room_calibration(rows: Sequence[dict[str, Any]]) -> RoomCalibration:
    """Pool many learners' rows (each with a "learner" id): per exercise, the median of
    predicted / measured, its middle half (25th-75th percentile), how many over- and
    under-estimate, and how many were right. A learner counts once: their first prediction.

    Example:
        >>> room = room_calibration([dict(r, learner=i) for i, r in enumerate(rows)])  # doctest: +SKIP
    """
    first: dict[tuple[Any, Any], dict[Any, dict[str, Any]]] = {}
    for n, row in enumerate(rows):
        if "learner" not in row:
            raise ValueError(f"room_calibration(): row {n} has no 'learner'; add each learner's id to their rows")
        first.setdefault((row.get("notebook"), row.get("exercise")), {}).setdefault(row["learner"], row)
    pooled = []
    for (notebook, exercise), by_learner in sorted(first.items(), key=lambda kv: tuple(map(str, kv[0]))):
        picks = list(by_learner.values())
        ratios = sorted(r for r in map(ratio, picks) if r is not None)
        ways = [direction(r) for r in ratios]
        middle = ""
        if ratios:
            q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
            middle = f"{q[0]:.2f} - {q[2]:.2f}"
        pooled.append((notebook or "?", exercise or "?", len(picks),
                       f"{statistics.median(ratios):.2f}" if ratios else "",
                       middle, f"{ways.count('over')} / {ways.count('about right')} / {ways.count('under')}" if ratios else "",
                       f"{sum(p['verdict'] == 'right' for p in picks)} of {len(picks)}"))
    return RoomCalibration(tuple(pooled))
