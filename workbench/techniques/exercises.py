"""Checking cells for the notebooks' exercises.

An exercise leaves `answer = None` for the learner to fill in. `check()` then says
"not answered yet" (with a hint) instead of failing, so a fresh notebook runs top
to bottom; a wrong answer raises, so the learner sees it in red.
"""

from __future__ import annotations

import math
from typing import Any


class WrongAnswer(AssertionError):
    """An exercise answer that does not match what this machine measured."""


def check(answer: Any, expected: Any, *, rel_tol: float = 0.0, hint: str = "") -> None:
    """Compare a learner's answer with the measured/computed value.

    Prints "Correct" or "Not answered yet"; raises WrongAnswer when answered wrongly.

    Example:
        >>> check(None, 42, hint="count the bytes")
        Not answered yet: replace None with your answer. Hint: count the bytes
        >>> check(41.9, 42, rel_tol=0.01)
        Correct: 41.9 (expected 42, within 1%)
    """
    if answer is None:
        print("Not answered yet: replace None with your answer." + (f" Hint: {hint}" if hint else ""))
        return
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        ok = isinstance(answer, (int, float)) and math.isclose(answer, expected, rel_tol=rel_tol)
        tolerance = f", within {rel_tol:.0%}" if rel_tol else ""
    else:
        ok, tolerance = answer == expected, ""
    if not ok:
        raise WrongAnswer(f"{answer!r} is not right; " + (hint or "look again at the cells above"))
    print(f"Correct: {answer!r} (expected {expected!r}{tolerance})")
