"""The WORKBENCH_* environment variables, read one way: a value that cannot work is one line.

Each reader returns None where the variable is unset or blank, the value where it can work,
and otherwise raises ValueError naming the variable, what it holds (its start, if long) and
the fix. Numbers are read in ASCII digits only: Python's int() and float() also take other
scripts' digits, superscripts ('²' passes str.isdigit, then int() raises) and '1_5', and
float() takes 'inf' and '1e400'; none of these is a step count or a card's memory.

The package reads: WORKBENCH_PRESET (core.presets), WORKBENCH_MAX_STEPS and
WORKBENCH_MAX_EVAL_SAMPLES (core.presets), WORKBENCH_GPU_MEMORY_GIB (machine.hardware),
WORKBENCH_HEADLESS (views.dashboard), WORKBENCH_CPU_CLASS (machine.cpu_class), WORKBENCH_DATA_CACHE
(machine.data_cache: a folder, or off); WORKBENCH_INDUCTOR_CACHE_DIR (machine.compile_cache) is
only compared with a folder workbench chose itself; WORKBENCH_ROOM, WORKBENCH_ROOM_KEY and
WORKBENCH_ROOM_CA (classroom.sharing) and WORKBENCH_LEDGER are read by the room and the prediction ledger;
WORKBENCH_LEARNER is only set, for the teacher notebook's simulated learners (lessons.room.as_learner).

Example:
    >>> import os; os.environ["WORKBENCH_MAX_STEPS"] = "²"
    >>> whole("WORKBENCH_MAX_STEPS", fix="unset it for no cap")
    Traceback (most recent call last):
    ...
    ValueError: WORKBENCH_MAX_STEPS='²' must be a whole number of at least 1 in digits 0-9; unset it for no cap
    >>> del os.environ["WORKBENCH_MAX_STEPS"]
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection

from workbench.base.arguments import shown

__all__ = ["choice", "decimal", "flag", "text", "whole"]

_WHOLE = re.compile(r"[0-9]{1,18}")  # up to 10**18 - 1: no step count is longer, and int() never meets 4,300 digits
_DECIMAL = re.compile(r"(?:[0-9]{1,9}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})")  # at most 9 digits before the point
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def text(var: str) -> str | None:
    """The variable's text, stripped; None where it is unset or blank."""
    return os.environ.get(var, "").strip() or None


def _refused(var: str, value: str, must: str, fix: str) -> ValueError:
    return ValueError(f"{var}={shown(value)} {must}; {fix}")


def whole(var: str, *, fix: str) -> int | None:
    """A whole number of at least 1 in ASCII digits."""
    value = text(var)
    if value is None:
        return None
    if not _WHOLE.fullmatch(value) or int(value) < 1:
        raise _refused(var, value, "must be a whole number of at least 1 in digits 0-9", fix)
    return int(value)


def decimal(var: str, *, least: float, most: float, must: str, fix: str) -> float | None:
    """A decimal number (digits 0-9 and one point) from `least` to `most`."""
    value = text(var)
    if value is None:
        return None
    if not _DECIMAL.fullmatch(value) or not least <= float(value) <= most:
        raise _refused(var, value, must, fix)
    return float(value)


def choice(var: str, choices: Collection[str], *, must: str, fix: str) -> str | None:
    """One of `choices`, exactly."""
    value = text(var)
    if value is not None and value not in choices:
        raise _refused(var, value, must, fix)
    return value


def flag(var: str) -> bool | None:
    """1/true/yes/on or 0/false/no/off, any case."""
    value = text(var)
    if value is None:
        return None
    if value.lower() not in _TRUE + _FALSE:
        raise _refused(var, value, f"must be one of {', '.join(_TRUE)} or {', '.join(_FALSE)}",
                       f"unset it for the default")
    return value.lower() in _TRUE
