"""Checking cells for the notebooks' exercises.

An exercise leaves `answer = None` for the learner to fill in. `check()` then says
"not answered yet" (with a hint, never the truth) instead of failing, so a fresh notebook runs
top to bottom; a wrong answer raises, so the learner sees it in red. An answer of any numeric
kind (a Python or numpy number, a one-element tensor or array, a Fraction, a Decimal) is read as
its number; one that holds no single finite number (an array of several, nan, text for a number)
is refused in one line naming the answer and the fix, and recorded nowhere.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.base.report import Report
from workbench.classroom.ledger import _exercise_name, record
from workbench.lessons import evidence
from workbench.lessons.evidence import Evidence, kind_needed

__all__ = ["check", "as_number", "WrongAnswer", "UnreadableAnswer", "agree", "Disagree", "claims", "Claims", "evidence"]


class WrongAnswer(AssertionError):
    """An exercise answer that does not match what this machine measured."""


class UnreadableAnswer(TypeError):
    """An answer that holds no single value to compare (one line: which answer, what it is, the fix)."""


def _one_value(value: Any) -> Any:
    """A tensor's, an array's or a numpy scalar's one value (`.item()`); other values as given.
    Raises UnreadableAnswer for a container of several values or none."""
    if isinstance(value, (str, bytes, bool, int, float)) or not hasattr(value, "item"):
        return value
    size = getattr(value, "size", None)
    size = value.numel() if callable(getattr(value, "numel", None)) else size() if callable(size) else size
    if size is not None and size != 1:
        raise UnreadableAnswer(f"a {type(value).__name__} of {size} values; write one number, e.g. 1.5")
    try:
        return value.item()
    except (ValueError, RuntimeError, TypeError) as error:
        raise UnreadableAnswer(f"a {type(value).__name__} whose value could not be read ({error}); write one number") from None


def as_number(value: Any) -> int | float | None:
    """`value` as a finite Python int or float, or None where it is no number (text, a bool, None).
    Raises UnreadableAnswer for a number no float holds (nan, inf, a complex, 10**5000).

    Example:
        >>> as_number(3), as_number("3"), as_number(True)
        (3, None, None)
    """
    value = _one_value(value)
    if isinstance(value, (str, bytes, bool)) or value is None:
        return None
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        raise UnreadableAnswer(f"a complex number ({value!r}); write a real number")
    if isinstance(value, numbers.Integral):
        value = int(value)
        if value.bit_length() > 1000:
            raise UnreadableAnswer(f"a whole number of {value.bit_length():,} bits, beyond any measurement; check the formula")
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    except OverflowError:
        raise UnreadableAnswer("a number too large for a float; check the formula") from None
    if not math.isfinite(number):
        raise UnreadableAnswer(f"{number!r}; write a finite number")
    return number


def _refused(why: str) -> UnreadableAnswer:
    name = _exercise_name() or "the answer"
    return UnreadableAnswer(f"{name} is {why}")


def check(answer: Any, expected: Any, *, rel_tol: float = 0.0, hint: str = "", kind: str | None = None,
          unit: str | None = None, exercise: str | None = None) -> None:
    """Compare a learner's answer with the measured/computed value.

    Prints "Correct" or "Not answered yet" (the hint, never the truth); raises WrongAnswer when
    answered wrongly, UnreadableAnswer (one line) for an answer that holds no single value of
    the expected kind. An answer is recorded in the prediction ledger first (`kind`, `unit`,
    `exercise`: the row's, see classroom/ledger.py; inferred when not given).

    Example:
        >>> check(None, 42, hint="count the bytes")
        Not answered yet: replace None with your answer. Hint: count the bytes
        >>> check(41.9, 42, rel_tol=0.01)
        Correct: 41.9 (expected 42, within 1%)
    """
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, (int, float)) or not 0 <= rel_tol < 1:
        raise ValueError(f"check(rel_tol={rel_tol!r}): a tolerance is a fraction from 0 up to 1, e.g. 0.01 for 1%")
    if answer is None:
        print("Not answered yet: replace None with your answer." + (f" Hint: {hint}" if hint else ""))
        return
    expected = _one_value(expected)
    truth = as_number(expected)
    if truth is not None:  # a numeric exercise
        try:
            given = as_number(answer)
        except UnreadableAnswer as error:
            raise _refused(str(error)) from None
        if given is None:
            raise _refused(f"{answer!r}, not a number; write the number itself"
                           + (" (without quotes)" if isinstance(answer, str) else ""))
        answer = given
        ok = given == truth if rel_tol == 0 and isinstance(given, int) and isinstance(truth, int) \
            else math.isclose(given, truth, rel_tol=rel_tol)
        tolerance = f", within {rel_tol * 100:.2g}%" if rel_tol else ""
    else:  # a choice: one of the words (or True/False) the exercise names
        if not isinstance(answer, (str, bool)):
            try:
                answer = _one_value(answer)
            except UnreadableAnswer as error:
                raise _refused(str(error)) from None
            if not isinstance(answer, (str, bool)):
                raise _refused(f"{answer!r}; this exercise's answer is one of the words it names, in quotes")
        ok, tolerance = answer == expected, ""
    record(answer, expected, verdict="right" if ok else "wrong", kind=kind, unit=unit, exercise=exercise)
    if not ok:
        raise WrongAnswer(f"{answer!r} is not right; " + (hint or "look again at the cells above"))
    print(f"Correct: {answer!r} (expected {expected!r}{tolerance})")


class Disagree(AssertionError):
    """A loop written by hand that did not do what the same switch in `wb.run` did."""


MEMORY_PARTS = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "activation_bytes")


def agree(by_hand: Any, result: Any, *, loss_rtol: float | None = None, extra: dict[str, int] | None = None,
          flops: bool = True) -> None:
    """Check that a loop written by hand (under `wb.monitor`) and `wb.run` did the same thing.

    The same logged steps and losses (within `loss_rtol` relative: 1e-4 on a CPU, where both
    run the same kernels in the same order; 1e-2 on a GPU, whose backward kernels add in a
    different order run to run), the same FLOPs per step and the same bytes, part by part.
    `extra` names bytes the hand loop holds on purpose beyond the run's, e.g.
    `{"activation_bytes": 4}` for the GradScaler's fp32 scale, saved by `scaler.scale(loss)`.
    Prints one line when they agree; raises `Disagree` naming the first difference.

    Example:
        >>> agree(mon.result, wb.run(config))        # doctest: +SKIP
        by hand and wb.run agree: 6 logged losses within 0.0001, FLOPs and bytes exact
    """
    extra = dict(extra or {})
    unknown = set(extra) - set(MEMORY_PARTS)
    if unknown:
        raise ValueError(f"extra= names {sorted(unknown)}; choose from {list(MEMORY_PARTS)}")
    rtol = loss_rtol if loss_rtol is not None else (1e-4 if str(result.device).startswith("cpu") else 1e-2)
    if result.losses and not by_hand.losses:
        raise Disagree(f"by hand logged no loss (wb.run logged {len(result.losses)}): call mon.loss(loss) in each step")
    if by_hand.loss_steps != result.loss_steps:
        raise Disagree(f"logged at other steps: by hand {by_hand.loss_steps}, wb.run {result.loss_steps}")
    for step, a, b in zip(result.loss_steps, by_hand.losses, result.losses):
        if not abs(a - b) <= rtol * abs(b):
            raise Disagree(f"loss at step {step}: by hand {a:.6g}, wb.run {b:.6g} (more than {rtol:g} apart)")
    if flops and by_hand.flops_per_step != result.flops_per_step:
        raise Disagree(f"FLOPs per step: by hand {by_hand.flops_per_step:,}, wb.run {result.flops_per_step:,}")
    for part in MEMORY_PARTS:
        mine, theirs = getattr(by_hand.memory, part), getattr(result.memory, part)
        if theirs is not None and mine != theirs + extra.get(part, 0):
            more = f" + {extra[part]:,}" if part in extra else ""
            raise Disagree(f"{part}: by hand {mine:,}, wb.run {theirs:,}{more}")
    said = ", ".join(f"+{v:,} {k}" for k, v in extra.items())
    print(f"by hand and wb.run agree: {len(result.losses)} logged losses within {rtol:g}, "
          f"{'FLOPs and ' if flops else ''}bytes exact{f' ({said})' if said else ''}")


VERDICTS = ("holds", "holds in part", "does not hold here", "not shown here")


@dataclass(frozen=True, repr=False)  # repr: Report's text table, what a text/plain output shows
class Claims(Report):
    """A notebook's claims against what this machine measured: one row per claim."""

    notebook: str
    device: str
    checked: tuple[tuple[str, str, str, str], ...]
    header = ("claim", "source", "measured here", "verdict")

    def rows(self) -> Sequence[Sequence[Any]]:
        return self.checked

    def caption(self) -> str:
        return f"Claims checked: {self.notebook} on {self.device}"


def _judged(n: int, row: Sequence[Any]) -> tuple[str, str, str, str]:
    """One row as the table shows it: the verdict stands where its evidence meets its kind's rule
    (evidence.RULES), and says what it stood on; else it becomes "not shown here" and says why."""
    if len(row) not in (4, 5):
        raise ValueError(f"claims(): each row is (claim, source, measured here, verdict, evidence); "
                         f"got {len(row)} items: {row!r}")
    claim, source, measured, verdict = map(str, row[:4])
    if not verdict.startswith(VERDICTS):
        raise ValueError(f"claims(): the verdict {verdict!r} must start with one of {VERDICTS}")
    if len(row) == 4 or row[4] is None:
        if verdict.startswith("not shown here"):
            return claim, source, measured, verdict
        raise ValueError(f"claims(): row {n} ({claim!r}) says {verdict.split(':')[0]!r} with no evidence; give it as a "
                         "5th item: wb.evidence.count(), .accuracy(...) or .speed(...)")
    proof = row[4]
    if not isinstance(proof, Evidence):
        raise TypeError(f"claims(): row {n}'s evidence is a {type(proof).__name__}; make it with wb.evidence.count(), "
                        ".accuracy(...) or .speed(...)")
    needed = kind_needed(claim)
    if needed is not None and proof.kind != needed:
        raise ValueError(f"claims(): row {n} ({claim!r}) is a claim about {needed}: its evidence must be "
                         f"wb.evidence.{needed}(...), not {proof.kind}")
    if verdict.startswith("not shown here"):
        return claim, source, measured, verdict
    if not proof.enough:
        return claim, source, measured, f"not shown here: {proof.short}"
    return claim, source, measured, verdict + (f" ({proof.said})" if proof.said else "")


def claims(notebook: str, device: str, rows: Sequence[Sequence[Any]]) -> Claims:
    """The "claims checked" table: rows of (claim, its source, what was measured here, verdict,
    evidence), the verdict one of VERDICTS followed by an optional ": why", the evidence made by
    `wb.evidence` (count, accuracy, speed: its rule, evidence.RULES, says what a claim of that kind
    needs). A verdict whose evidence falls short of the rule is shown as "not shown here: <why>";
    one that stands says what it stood on. Only a "not shown here" row may leave the evidence out.
    docs/SUMMARY.md is generated from these tables in the executed notebooks (cells tagged `claims`).

    Example:
        >>> print(claims("01", "cpu", [("1.5-2.5x faster", "seed 000", "0.4x", "does not hold here: emulated",
        ...                             evidence.speed(0.4, 1.5, free_core=True))]))
        Claims checked: 01 on cpu
        claim            source    measured here  verdict
        1.5-2.5x faster  seed 000  0.4x           does not hold here: emulated (a free core)
    """
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
        raise TypeError(f"claims(): rows is a list of (claim, source, measured here, verdict, evidence), not {type(rows).__name__}")
    checked = [_judged(n, row) for n, row in enumerate(rows)]
    return Claims(notebook, device, tuple(checked))
