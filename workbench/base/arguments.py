"""A public function's arguments, checked as RunConfig checks its fields: before anything starts.

Every public entry point outside RunConfig (`wb.plan_parallel`, `wb.Cluster`, `wb.estimate`,
`wb.plan`, `wb.compare`, `wb.monitor`, ...) checks what it was given with these, so a wrong
type, a NaN, an infinity, a number too large to mean anything, a string where a list belongs or
a name no view can show is refused in one line that names the argument and the fix, instead of
a traceback from deep inside torch or matplotlib (or a run that never ends). `ArgumentError` is
a ConfigError (a ValueError) and a TypeError: code that catches any of them, as callers did
before, still does.

Example:
    >>> whole_number("gpus", 0, most=4096, example="gpus=8")
    Traceback (most recent call last):
    ...
    workbench.base.errors.ArgumentError: gpus=0 must be a whole number from 1 to 4,096; pass e.g. gpus=8
"""

from __future__ import annotations

import math
import numbers
import unicodedata
from collections.abc import Collection, Iterable
from typing import Any

from workbench.base.errors import ArgumentError

__all__ = ["ArgumentError", "flag", "instance", "label", "names", "number", "shown", "whole_number"]

MOST_SHOWN = 40
"""Characters of a value a message quotes: a 10,000-character name is shown by its start."""

SEED_LIMIT = 2**64
"""torch.manual_seed takes an unsigned 64-bit seed: every seed is below this."""

MOST_NAME_CHARS = 80
"""The longest run name: what a table column, a legend and a tick label can still show whole."""


def shown(value: Any) -> str:
    """`value` as a message quotes it: a 400-digit int as 1e+400, a long text or repr by its start.

    Example:
        >>> shown(10**400), shown("x" * 100)
        ('1e+400', "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (100 characters)")
    """
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**16:
        digits = str(abs(value)) if abs(value) < 10**4000 else None  # Python refuses to print 4,300+ digits
        return f"{'-' if value < 0 else ''}{digits[0]}e+{len(digits) - 1}" if digits else "a number of 4,000+ digits"
    if isinstance(value, str) and len(value) > MOST_SHOWN:
        return f"{value[:MOST_SHOWN]!r}... ({len(value):,} characters)"
    text = repr(value) if not isinstance(value, type) else value.__name__
    return text if len(text) <= MOST_SHOWN and "\n" not in text else f"a {type(value).__name__}"


def as_float(value: Any) -> float:
    """`value` as a float; an int too large for a float becomes inf (not OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _refuse(name: str, value: Any, must: str, example: str) -> ArgumentError:
    return ArgumentError(f"{name}={shown(value)} must be {must}; pass e.g. {example}")


def instance(name: str, value: Any, kind: type, example: str) -> None:
    """`value` is a `kind` (an instance: the class itself is named as such)."""
    if isinstance(value, kind):
        return
    if isinstance(value, type) and issubclass(value, kind):
        raise ArgumentError(f"{name}={value.__name__} is the class; pass an instance, e.g. {example}")
    raise ArgumentError(f"{name} must be a {kind.__name__}, got {type(value).__name__}; pass e.g. {example}")


def whole_number(name: str, value: Any, *, least: int = 1, most: int | None = None, example: str) -> int:
    """`value` is an int (not a bool, not 2.0) from `least` to `most` (None: no bound above)."""
    whole = not isinstance(value, bool) and isinstance(value, numbers.Integral)
    if not whole or value < least or most is not None and value > most:
        span = f">= {least:,}" if most is None else f"from {least:,} to {most:,}"
        raise _refuse(name, value, f"a whole number {span}", example)
    return int(value)


def _figure(x: float) -> str:
    return f"{int(x):,}" if x == int(x) else f"{x:g}"


def number(name: str, value: Any, *, most: float, least: float = 0.0, example: str, unit: str = "") -> float:
    """`value` is a real, finite number from `least` to `most` (`least` 0: above 0)."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    v = as_float(value) if real else math.nan
    if not math.isfinite(v) or not (v > 0 if least == 0 else v >= least) or v > most:
        span = f"above 0 and at most {_figure(most)}" if least == 0 else f"from {_figure(least)} to {_figure(most)}"
        raise _refuse(name, value, f"a finite number{unit} {span}", example)
    return v


def seconds(name: str, value: Any, *, example: str) -> float:
    """`value` is an interval: a finite number of seconds from 0 to a day."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not real or not 0 <= as_float(value) <= 86_400:
        raise _refuse(name, value, "a number of seconds from 0 to 86,400 (a day)", example)
    return float(value)


def function(name: str, value: Any, *, example: str) -> None:
    """`value` can be called."""
    if not callable(value):
        raise ArgumentError(f"{name} must be a function, got {type(value).__name__}; pass e.g. {example}")


def flag(name: str, value: Any) -> bool:
    """`value` is True or False (not 'no', which is true, nor 0)."""
    if not isinstance(value, bool):
        raise _refuse(name, value, "True or False", f"{name}=True")
    return value


def names(name: str, value: Any, choices: Collection[str], example: str) -> tuple[str, ...]:
    """`value` is a list, tuple or set of distinct names among `choices` (not one bare name,
    which would be read letter by letter; not a generator, which is read once). In order."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        what = "a bare name" if isinstance(value, str) else type(value).__name__
        raise ArgumentError(f"{name}={shown(value)} is {what}, not a list of names; pass e.g. {example}")
    if not value:
        raise ArgumentError(f"{name} is empty: nothing to do; pass e.g. {example}")
    for item in value:
        if not isinstance(item, str) or item not in choices:
            raise ArgumentError(f"{name}: {shown(item)} is not known; use some of {', '.join(choices)}")
    items = tuple(value) if not isinstance(value, (set, frozenset)) else tuple(c for c in choices if c in value)
    if len(set(items)) != len(items):
        raise ArgumentError(f"{name}={shown(items)} names one twice; pass each once, e.g. {example}")
    return items


def _unshowable(text: str) -> str | None:
    """The first character of `text` that breaks a one-line table or log line, or None."""
    return next((c for c in text if unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp")), None)


def label(name: str, value: Any, *, example: str) -> str:
    """`value` is a name a table, a log line and a figure can show: text of 1 to MOST_NAME_CHARS
    characters, not blank, with no control character (a newline breaks the text log's lines)."""
    if not isinstance(value, str):
        raise ArgumentError(f"{name} must be text, got {type(value).__name__} {shown(value)}; pass e.g. {example}")
    if not value.strip():
        raise ArgumentError(f"{name}={value!r} is blank; pass e.g. {example}")
    if len(value) > MOST_NAME_CHARS:
        raise ArgumentError(f"{name}={shown(value)} is longer than {MOST_NAME_CHARS} characters; pass a shorter "
                            f"one, e.g. {example}")
    if (bad := _unshowable(value)) is not None:
        raise ArgumentError(f"{name}={shown(value)} holds the control character {bad!r}; pass one line of text, "
                            f"e.g. {example}")
    return value


def finite(value: Any) -> bool:
    """A real number (not a bool) whose float is finite: not nan or inf, and no 5,000-digit integer."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def checked_device(device: Any, *, name: str = "device") -> str:
    """`device` resolved ('auto': 'cuda' where a GPU is visible, else 'cpu'); anything but 'auto',
    'cpu' or 'cuda', or 'cuda' without a GPU, refused in one line (before torch reads it)."""
    import torch  # lazy: base stays free of torch (the classroom's store and records import it)

    if not isinstance(device, str) or device not in ("auto", "cpu", "cuda"):
        raise ArgumentError(f"{name}={shown(device)} is not known; use one of: 'auto', 'cpu', 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ArgumentError(f"{name}='cuda' but no CUDA GPU is visible; use {name}='auto' or 'cpu'")
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def checked_torch_device(device: Any, *, name: str = "device") -> str:
    """What `checked_device` takes, or one device as torch names it in a launched process
    (`PartialState().device`: 'cpu:0', 'cuda:1', or a torch.device): its text. An index past the
    GPUs visible, or another kind, refused in one line."""
    import torch  # lazy: base stays free of torch (the classroom's store and records import it)

    if isinstance(device, torch.device):
        device = str(device)
    kind, _, index = device.partition(":") if isinstance(device, str) else (None, "", "")
    if not index:
        return checked_device(device, name=name)
    if kind not in ("cpu", "cuda") or not index.isascii() or not index.isdigit():
        raise ArgumentError(f"{name}={shown(device)} is not known; use one of: 'auto', 'cpu', 'cuda', 'cuda:N'")
    if kind == "cuda" and int(index) >= torch.cuda.device_count():
        raise ArgumentError(f"{name}={shown(device)} but {torch.cuda.device_count()} CUDA GPU(s) are visible; "
                            f"use {name}='auto' or 'cpu'")
    return device


def listed(name: str, value: Any, example: str) -> list[Any]:
    """`value` as a list: a list, tuple or other sequence of items (not text, not a mapping, not one item)."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
        raise ArgumentError(f"{name} must be a list, got {type(value).__name__}; pass e.g. {example}")
    return list(value)
