"""Checking cells for the notebooks' exercises.

An exercise leaves `answer = None` for the learner to fill in. `check()` then says
"not answered yet" (with a hint) instead of failing, so a fresh notebook runs top
to bottom; a wrong answer raises, so the learner sees it in red.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.core.report import Report
from workbench.lessons.ledger import record


class WrongAnswer(AssertionError):
    """An exercise answer that does not match what this machine measured."""


def check(answer: Any, expected: Any, *, rel_tol: float = 0.0, hint: str = "", kind: str | None = None,
          unit: str | None = None, exercise: str | None = None) -> None:
    """Compare a learner's answer with the measured/computed value.

    Prints "Correct" or "Not answered yet"; raises WrongAnswer when answered wrongly. An answer
    is recorded in the prediction ledger first (`kind`, `unit`, `exercise`: the row's, see
    lessons/ledger.py; inferred when not given).

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


def claims(notebook: str, device: str, rows: Sequence[Sequence[str]]) -> Claims:
    """The "claims checked" table: rows of (claim, its source, what was measured here, verdict),
    the verdict one of VERDICTS followed by an optional ": why". docs/SUMMARY.md is generated
    from these tables in the executed notebooks (cells tagged `claims`).

    Example:
        >>> print(claims("01", "cpu", [("1.5-2.5x faster", "seed 000", "0.4x", "does not hold here: emulated")]))
        Claims checked: 01 on cpu
        claim            source    measured here  verdict
        1.5-2.5x faster  seed 000  0.4x           does not hold here: emulated
    """
    checked = []
    for row in rows:
        if len(row) != 4:
            raise ValueError(f"claims(): each row is (claim, source, measured here, verdict); got {len(row)} items: {row!r}")
        if not str(row[3]).startswith(VERDICTS):
            raise ValueError(f"claims(): the verdict {row[3]!r} must start with one of {VERDICTS}")
        checked.append(tuple(map(str, row)))
    return Claims(notebook, device, tuple(checked))
