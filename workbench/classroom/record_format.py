"""The room's record format (docs/ROOM_RECORDS.md): what `wb.share` sends, what the room's store keeps,
what the teacher's views read, and the one check all three apply.

A record is one JSON object. `check(record)` returns None when the views can show it, else the first
problem as one clause naming the field ('figures.samples_per_sec=-1.45 must be a finite number >= 0').
The learner's side refuses a bad record before sending it, the store refuses it again at its door (a
classmate can post by hand), and the views skip whatever still fails (a store written by an older
version, a file edited by hand), saying which record and why. Only the standard library: the store
runs it without torch.

Example:
    >>> check({"workbench": 1, "kind": "predictions", "learner": "Ada", "notebook": "00_tour",
    ...        "fingerprint": {"class": "CPU AVX2"}, "rows": []})
    >>> check({"workbench": 1, "kind": "run", "learner": 42})
    "learner=42 must be a non-empty string (a name, at most 64 characters); pass name='Ada'"
"""

from __future__ import annotations

import math
import re
from typing import Any

from workbench.base.arguments import finite

VERSION = 1
"""The format's version (the "workbench" field): a reader refuses versions it does not know."""
KINDS = ("run", "predictions")
LEDGER_KINDS = ("ratio", "bytes", "count", "seconds", "choice")  # classroom.ledger.UNITS' keys
MAX_NAME = 64
MAX_TEXT = 200
MAX_ROWS = 500
MAX_CONFIG_FIELDS = 200
MAX_RECORD_BYTES = 64 * 1024
"""A record's JSON at most (a run's record is about 1.5 KiB: its config and fingerprint)."""
STORE_FIELDS = ("id", "owner", "received")
"""Added by the store: the record's id, the account that sent it (checked at the door), when."""
# Printable text, no control characters: names and labels go into tables and figure labels.
_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f-\x9f]*")


def shown(value: Any, limit: int = 40) -> str:
    """repr(value), cut to `limit` (an int of over 4,300 digits has no repr: Python refuses to print it)."""
    try:
        return repr(value)[:limit]
    except ValueError:
        return "an int too long to print"


class RecordError(ValueError):
    """A record the room cannot show, with the field and the fix (one line)."""


def _text(value: Any, field: str, limit: int = MAX_TEXT, fix: str = "") -> str | None:
    if not isinstance(value, str) or not value.strip():
        return f"{field}={shown(value, 60)} must be a non-empty string{fix}"
    if len(value) > limit:
        return f"{field} is {len(value):,} characters long: at most {limit}{fix}"
    if not _PRINTABLE.fullmatch(value):
        return f"{field}={shown(value, 60)} holds control characters{fix}"
    return None


def _number(value: Any, field: str, *, low: float = 0.0, optional: bool = True, whole: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not finite(value) or value < low or (whole and not isinstance(value, int)):
        kind = "a whole number" if whole else "a finite number"
        return f"{field}={shown(value)} must be {kind} >= {low:g}" + (" or None" if optional else "")
    return None


def _plain_value(value: Any, field: str, depth: int = 0) -> str | None:
    """Config and fingerprint values: JSON scalars, short strings, small lists and dicts of them.
    (Scalars are checked inline: 10,000 records pass through here at every view.)"""
    if depth >= 3 or not isinstance(value, (list, dict)) or len(value) > 64:
        return _scalar(value, field) if depth else f"{field} must be a dict"
    is_dict = isinstance(value, dict)
    for key, item in (value.items() if is_dict else enumerate(value)):
        kind = type(item)
        if kind is str:
            if len(item) > MAX_TEXT:
                return f"{field}{f'.{key}' if is_dict else f'[{key}]'} is {len(item):,} characters long: at most {MAX_TEXT}"
        elif kind is float:
            if not math.isfinite(item):
                return f"{field}{f'.{key}' if is_dict else f'[{key}]'}={item!r} must be a finite number"
        elif item is None or kind is bool or kind is int and -2**1023 < item < 2**1023:
            continue
        else:
            if is_dict and not isinstance(key, str):
                return f"{field} has a key {shown(key)} that is not a string"
            problem = (_plain_value(item, f"{field}.{key}" if is_dict else f"{field}[{key}]", depth + 1)
                       if isinstance(item, (list, dict)) else _scalar(item, f"{field}.{key}" if is_dict else f"{field}[{key}]"))
            if problem:
                return problem
        if is_dict and type(key) is not str:
            return f"{field} has a key {shown(key)} that is not a string"
    return None


def _scalar(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, (bool, str)) and (not isinstance(value, str) or len(value) <= MAX_TEXT):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if finite(value) else f"{field}={shown(value)} must be a finite number"
    if isinstance(value, str):
        return f"{field} is {len(value):,} characters long: at most {MAX_TEXT}"
    if isinstance(value, (list, dict)):
        return f"{field} nests too deep or holds too many items: a number, a short string, or a small list or dict of them"
    return f"{field} must be a number, a short string, or a small list or dict of them"


def _fingerprint(fp: Any) -> str | None:
    if not isinstance(fp, dict):
        return f"fingerprint={shown(fp)} must be a dict (workbench.classroom.fingerprint.fingerprint()'s)"
    return _text(fp.get("class"), "fingerprint.class", 100) or _plain_value(fp, "fingerprint")


def _figures(figures: Any) -> str | None:
    if not isinstance(figures, dict):
        return f"figures={shown(figures)} must be a dict of the run's figures"
    problem = _text(figures.get("status"), "figures.status", 40)
    for field in ("samples_per_sec", "tokens_per_sec", "step_time_s", "final_loss"):
        problem = problem or _number(figures.get(field), f"figures.{field}",
                                     low=-math.inf if field == "final_loss" else 0.0)
    for field in ("steps", "peak_bytes"):
        problem = problem or _number(figures.get(field), f"figures.{field}", whole=True)
    if problem is None and figures.get("device") is not None:
        problem = _text(figures["device"], "figures.device", 40)
    return problem


def _answer(value: Any, field: str) -> str | None:
    if isinstance(value, (str, bool)):
        return _text(value, field) if isinstance(value, str) else None
    return None if finite(value) else f"{field}={shown(value)} must be a finite number, a string or a bool"


def check_name(name: Any) -> str | None:
    """None for a name a learner may share under, else why not (the field is `name=`)."""
    return _text(name, "name", MAX_NAME, fix=" (at most 64 characters); pass name='Ada' or leave it out")


def check_row(row: Any, where: str = "rows[0]") -> str | None:
    """One prediction-ledger row (classroom/ledger.py's format, with its verdict)."""
    if not isinstance(row, dict):
        return f"{where}={shown(row)} must be a dict (a prediction-ledger row)"
    for field in ("notebook", "exercise", "verdict"):
        problem = _text(row.get(field), f"{where}.{field}",
                        fix="; share wb.calibration('NN_name') (its rows carry the notebook)" if field == "notebook" else "")
        if problem:
            return problem
    if row.get("kind") not in LEDGER_KINDS:
        return f"{where}.kind={shown(row.get('kind'))} must be one of {', '.join(LEDGER_KINDS)}"
    unit = row.get("unit", "")
    if not isinstance(unit, str) or len(unit) > 8:
        return f"{where}.unit={shown(unit)} must be a short string ('x', 'B', 's' or '')"
    return _answer(row.get("predicted"), f"{where}.predicted") or _answer(row.get("measured"), f"{where}.measured")


def check(record: Any) -> str | None:
    """None if the room's views can show `record`, else the first problem, naming its field."""
    if not isinstance(record, dict):
        return f"a record must be a dict, not {type(record).__name__}"
    if record.get("workbench") != VERSION:
        return f"workbench={shown(record.get('workbench'))}: not a version-{VERSION} room record (docs/ROOM_RECORDS.md)"
    if record.get("kind") not in KINDS:
        return f"kind={shown(record.get('kind'))} must be 'run' or 'predictions'"
    problem = (_text(record.get("learner"), "learner", MAX_NAME, fix=" (a name, at most 64 characters); pass name='Ada'")
               or _text(record.get("notebook"), "notebook", 100, fix="; pass notebook='00_tour'")
               or _fingerprint(record.get("fingerprint")))
    if problem:
        return problem
    if record["kind"] == "run":
        config = record.get("config")
        if not isinstance(config, dict) or len(config) > MAX_CONFIG_FIELDS:
            return f"config={shown(config)} must be a dict of the run's settings (RunConfig.to_dict())"
        return (_text(record.get("run"), "run", MAX_TEXT) or _plain_value(config, "config")
                or _figures(record.get("figures")))
    rows = record.get("rows")
    if not isinstance(rows, list) or len(rows) > MAX_ROWS:
        return f"rows must be a list of at most {MAX_ROWS} prediction-ledger rows"
    for i, row in enumerate(rows):
        problem = check_row(row, f"rows[{i}]")
        if problem:
            return problem
    return None


def require(record: Any, label: str = "record") -> dict[str, Any]:
    """`record` itself, or RecordError naming the record and its field."""
    problem = check(record)
    if problem:
        raise RecordError(f"{label}: {problem}")
    return record
