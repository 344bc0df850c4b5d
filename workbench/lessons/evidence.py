"""What a claim needs before a notebook may say it holds, or that it does not: the rules, as data.

Every row of a "claims checked" table (`wb.claims`) carries its evidence, made by one of the
functions below; each measures what the run had against `RULES[kind]`. Where the evidence falls
short, `wb.claims` writes "not shown here: <what the rule needs, what was here>" whatever the row
said, so no notebook can call a claim settled on 3 steps at chance accuracy, on a timing from a
shared core, or against a baseline slower than the fair one.

    count      an exact count or a deterministic replay (bytes, FLOPs, steps, equal gradients):
               one run shows it.
    accuracy   a baseline that learned (at least `min_progress` of the way from chance, the most
               frequent label's share, to 100%) and enough held-out samples that the difference's
               standard error is at most `max_se_per_effect` of the smallest effect the claim is
               about (a 1-point loss needs a standard error of at most 0.5 points, two of which
               still tell 0 from 1).
    speed      a fair baseline (the fastest way of the old kind measured here, within `fair_within`)
               and a timing taken on a core the process had to itself; or, without a free core, a
               ratio at least `busy_noise` away from the claim's bound. A shared core moves a ratio
               far: at load average 11 here tests/test_checkpointing.py's tiny GPT read x7.28 for
               checkpointing every block, interleaved, against x2.3 on a free core (3.2x); notebook
               04's ceiling read outside 2x of its formula in 2 of 3 runs at load average 8.

Example:
    >>> accuracy(0.097, 0.095, samples=256, chance=0.17, effect=0.01).enough
    False
    >>> count().enough
    True
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RULES", "Evidence", "count", "accuracy", "speed", "chance", "majority_share", "kind_needed"]

RULES: dict[str, dict[str, Any]] = {
    "count": {"needs": "an exact count or a deterministic replay: one run shows it"},
    "accuracy": {"needs": "a trained baseline and enough held-out samples to resolve the effect claimed",
                 "min_progress": 0.3, "max_se_per_effect": 0.5},
    "speed": {"needs": "the fastest baseline measured here and a free core (or a ratio beyond a busy core's noise)",
              "fair_within": 1.05, "busy_noise": 4.0},
}

# A claim whose words name accuracy or speed is held to that kind's rule: declaring it a count
# does not get it past the checker.
CLAIM_WORDS = {
    "accuracy": re.compile(r"\baccura(cy|te)\b", re.I),
    "speed": re.compile(r"\b(faster|slower|speed-?ups?|speeds? up|speed forecast|accelerates|throughput|samples/s|"
                        r"latency|compute time)", re.I),
}


@dataclass(frozen=True)
class Evidence:
    """What a claim had to go on, held against its kind's rule."""

    kind: str
    enough: bool
    said: str = ""
    """What the evidence was, one clause (appended to a verdict that stands)."""
    short: str = ""
    """What the rule needs that was not here, one clause ('' when enough)."""


def kind_needed(claim: str) -> str | None:
    """The rule a claim's own words put it under ('accuracy', 'speed'), or None."""
    return next((kind for kind, words in CLAIM_WORDS.items() if words.search(claim)), None)


def count(said: str = "") -> Evidence:
    """An exact count or a deterministic replay: enough by itself."""
    return Evidence("count", True, said)


def _percent(x: float) -> str:
    return f"{100 * x:.1f}"


def accuracy(baseline: float, others: float | list[float], *, samples: int | None, chance: float | None, effect: float,
             disagree: float | None = None) -> Evidence:
    """Evidence for an accuracy claim: the baseline's held-out accuracy, the other arms', the
    held-out `samples` each was scored on, `chance` (the most frequent label's share: `chance()`),
    and `effect`, the smallest difference the claim is about (0.01: a 1-point loss). With
    `disagree` (the share of samples on which two arms' predictions differ, for arms scored on the
    same samples) the paired standard error sqrt(disagree / n) is used; else the independent one,
    sqrt(p1(1-p1)/n + p2(1-p2)/n), an upper bound."""
    rule = RULES["accuracy"]
    others = [others] if isinstance(others, (int, float)) else list(others)
    if not others or not samples or samples < 1 or effect <= 0:
        return Evidence("accuracy", False, short=f"no held-out accuracy to compare ({samples or 0} samples)")
    if chance is None or not 0 <= chance < 1:
        return Evidence("accuracy", False, short="chance (the most frequent label's share) is not known for this data")
    progress = (baseline - chance) / (1 - chance)
    if disagree is not None:
        se = math.sqrt(max(disagree, 1 / samples) / samples)
    else:
        se = max(math.sqrt(baseline * (1 - baseline) / samples + p * (1 - p) / samples) for p in others)
    allowed = rule["max_se_per_effect"] * effect
    short = []
    if progress < rule["min_progress"]:
        short.append(f"the baseline's accuracy {baseline:.1%} is {max(progress, 0):.0%} of the way from chance "
                     f"({chance:.1%}, the most frequent label) to 100%: an accuracy claim needs a trained baseline "
                     f"(at least {rule['min_progress']:.0%} of the way)")
    if se > allowed:
        needed = math.ceil(samples * (se / allowed) ** 2)
        short.append(f"{samples:,} held-out samples give the difference a standard error of {_percent(se)} points, "
                     f"the claim is about {_percent(effect)}: it needs about {needed:,} samples")
    said = (f"{samples:,} held-out samples, standard error {_percent(se)} points; baseline {baseline:.1%} "
            f"(chance {chance:.1%})")
    return Evidence("accuracy", not short, said, "; ".join(short))


def _slowest(others: Mapping[str, float]) -> str:
    name = max(others, key=others.get)
    return f"{name} ran {others[name]:.2f}x the baseline"


def speed(ratios: float | Mapping[str, float], claimed: float, *, free_core: bool | None,
          others: Mapping[str, float] | None = None, why_busy: str = "") -> Evidence:
    """Evidence for a speed claim: `ratios`, the technique's measured speed (or time) over its
    baseline's (one figure, or one per arm); `claimed`, the claim's bound in the same terms (1.5
    for "1.5-2.5x faster", 1.3 for "~30% more time"); `free_core`, whether the timing had a core
    to itself (None: not measured); `others`, the speeds of the old way's other variants measured
    here over the baseline's (a 2-worker DataLoader against the 0-worker one): the baseline is fair
    only if none is faster (within `fair_within`). `why_busy`: the measured reason a core was not free."""
    rule = RULES["speed"]
    ratios = {"": ratios} if isinstance(ratios, (int, float)) else dict(ratios)
    faster = {k: v for k, v in (others or {}).items() if v > rule["fair_within"]}
    short = []
    if faster:
        short.append(f"the baseline is not the fastest of its kind measured here ({_slowest(faster)}): "
                     "a speed claim needs the fair baseline")
    if not free_core:
        near = {arm: r for arm, r in ratios.items() if r > 0 and max(r / claimed, claimed / r) < rule["busy_noise"]}
        if near or not ratios:
            figures = ", ".join(f"{arm} {r:.2f}x".strip() for arm, r in near.items())
            short.append((why_busy or "timed without a free-core check")
                         + f"; {figures} is within {rule['busy_noise']:.0f}x of the claim's {claimed:.3g}x, less than a "
                         "shared core can move a ratio (rerun on a quiet machine)")
    said = "a free core" if free_core else f"beyond a busy core's {rule['busy_noise']:.0f}x of the claim's {claimed:.3g}x"
    return Evidence("speed", not short, said, "; ".join(short))


def majority_share(labels: Any) -> float:
    """The most frequent label's share among `labels` (a tensor or a list): chance accuracy.

    Example:
        >>> majority_share([1, 1, 2, 0])
        0.5
    """
    import torch  # lazy: the exercises import this module; checking an answer needs no torch

    labels = torch.as_tensor(labels).flatten().long()
    return labels.bincount().max().item() / labels.numel()


def chance(result: Any) -> float | None:
    """The held-out labels' most frequent share for a run (its data, sequence length, seed and
    evaluation size): the accuracy of always guessing that label, what "trained" is measured from.
    None for data given as a dataset object (its labels are the learner's)."""
    # lazy: the exercises import this module; checking an answer needs no torch
    import torch

    from workbench.core.data import load_data  # (it imports torch)

    cfg = result.config
    if not isinstance(cfg.data, str) or not cfg.eval_samples:
        return None
    data = load_data(cfg.data, seq_len=cfg.seq_len or 128, max_test=cfg.eval_samples or None, seed=cfg.seed)
    labels = data.test.labels if hasattr(data.test, "labels") else [data.test[i]["labels"] for i in range(len(data.test))]
    return majority_share(labels if isinstance(labels, torch.Tensor) else torch.stack([torch.as_tensor(x) for x in labels]))
