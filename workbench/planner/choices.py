"""What `plan()` tries: its choices of precision, checkpointing, optimizer, micro-batch, what
trains and sharding, each checked before the first estimate (one line naming it and the fix).

A choice is a list, tuple or set of names (a bare name such as precisions='fp32' would be read
letter by letter: 'f', 'p', '3', '2'); None takes the default the config or the target gives.

Example:
    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from workbench.base.arguments import ArgumentError, listed, shown
from workbench.core import custom
from workbench.core.config import RunConfig, field_choices
from workbench.core.switches.activation_checkpointing import CHOICES as CHECKPOINTING
from workbench.core.switches.optimizer import OPTIMIZERS

__all__ = ["MAX_EFFECTIVE_BATCH", "Choices", "choices", "divisors", "is_whole"]

# Beyond this a plan is not a training run (the largest batches published are ~4M tokens,
# thousands of sequences); it also bounds the divisor search below.
MAX_EFFECTIVE_BATCH = 2**20


class Choices(NamedTuple):
    """What plan() combines, checked."""

    effective_batch: int
    precisions: list[str]
    checkpointing: list[str]
    optimizers: list[str]
    micro_batches: list[int]
    trainable: list[dict[str, Any]]
    sharding: list[str]


def is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def divisors(n: int) -> list[int]:
    """The divisors of n, found up to its square root (n up to 2**20: ~1,000 trials)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _given(name: str, value: Any, default: Any, example: str) -> list[Any]:
    """A choice as a list: the default where None (or empty), else a list of what was given."""
    return list(listed(name, value, example) or default) if value is not None else list(default)


def choices(base: RunConfig, target: Any, *, effective_batch: Any, precisions: Any, checkpointing: Any,
            optimizers: Any, micro_batches: Any, trainable: Any, sharding: Any) -> Choices:
    """plan()'s choices for the resolved config `base` on `target`, each checked."""
    eff = base.batch_size * base.grad_accum_steps if effective_batch is None else effective_batch
    if not is_whole(eff) or not 1 <= eff <= MAX_EFFECTIVE_BATCH:
        raise ArgumentError(f"effective_batch={shown(eff)} must be a whole number from 1 to {MAX_EFFECTIVE_BATCH:,}; "
                            f"pass e.g. effective_batch=32 (None: the config's batch_size x grad_accum_steps)")
    precisions = _given("precisions", precisions, target.peak_flops, "precisions=['fp32']")
    if bad := [p for p in precisions if p not in target.peak_flops]:
        raise ArgumentError(f"precisions {bad} cannot run on {target.name}; use some of {list(target.peak_flops)}")
    gpt = isinstance(base.model, str) and base.model == "gpt"
    checkpointing = _given("checkpointing", checkpointing, ("none", "every_other", "all") if gpt else ("none",),
                           "checkpointing=['none', 'all']")
    if not gpt and set(checkpointing) != {"none"}:
        raise ArgumentError(f"checkpointing {checkpointing} needs a model with blocks; model="
                            f"{custom.shown_model(base.model)} takes checkpointing=('none',)")
    if bad := [c for c in checkpointing if c not in CHECKPOINTING]:
        raise ArgumentError(f"checkpointing {bad} is not known; use some of {', '.join(map(repr, CHECKPOINTING))}")
    optimizers = _given("optimizers", optimizers, (base.optimizer,), "optimizers=['adamw', 'sgd']")
    if bad := [o for o in optimizers if o not in OPTIMIZERS]:
        raise ArgumentError(f"optimizers {bad} are not known; use some of {list(OPTIMIZERS)}")
    trainables = _given("trainable", trainable, ({},), "trainable=[{}, {'lora_rank': 8}]")
    if bad := [t for t in trainables if not isinstance(t, dict)]:
        raise ArgumentError(f"trainable {shown(bad)} must be dicts of RunConfig fields; pass e.g. "
                            "trainable=[{}, {'freeze': 'embeddings'}, {'lora_rank': 8}]")
    shardings = _given("sharding", sharding, (base.sharding,), "sharding=['none', 'full']")
    if bad := [s for s in shardings if s not in field_choices("sharding")]:
        raise ArgumentError(f"sharding {bad} is not known; use some of {list(field_choices('sharding'))}")
    micro = _given("micro_batches", micro_batches, divisors(eff), "micro_batches=[8, 16]")
    if bad := [m for m in micro if not is_whole(m) or m < 1 or eff % m]:
        raise ArgumentError(f"micro_batches {bad} do not divide effective_batch={eff}; use whole divisors of it")
    return Choices(eff, precisions, checkpointing, optimizers, sorted(set(micro)), [dict(t) for t in trainables],
                   shardings)
