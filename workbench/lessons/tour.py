"""Notebook 00's helpers: the two batch sizes timed in turns under one free-core guard, and the
tour's claims checked (asserts and internal imports that would otherwise sit in a learner's cells).

Why in turns: the two `wb.run`s of the exercise are timed at different moments, a few cells apart.
On a 2-core machine whatever else runs meanwhile (a second notebook, CI's other test worker) can
slow one of them and not the other, and a ratio of the two can then read anything: a clean-clone
test run measured 'same' for a change that reads 1.5x on a quiet machine. `batch_speed` times a
few steps of each in alternation, round after round, and takes the median per-round ratio.

Example:
    >>> direction(2.0), direction(1.05), direction(0.5)
    ('up', 'same', 'down')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from workbench.classroom.ledger import record
from workbench.core.presets import get_preset
from workbench.lessons import evidence
from workbench.lessons.contention import CoreShare, OtherWork, interleaved_speedup, other_work
from workbench.lessons.exercises import check

__all__ = ["BatchSpeed", "batch_speed", "check_speed", "claim_rows", "direction"]


def direction(ratio: float) -> str:
    """'up', 'down' or 'same' (within 10%) for a ratio of two rates."""
    return "up" if ratio > 1.1 else "down" if ratio < 1 / 1.1 else "same"


@dataclass(frozen=True, slots=True)
class BatchSpeed:
    """Samples/s of two batch sizes, timed in alternating turns of a few training steps each."""

    batch_sizes: tuple[int, int]
    ratio: float
    """Median over rounds of (the larger batch's samples/s / the baseline's)."""
    ratios: list[float]
    samples_per_sec: tuple[float, float]
    """Each batch size's median samples/s over its turns."""
    steps: int
    """Training steps in one turn."""
    device: str
    core: CoreShare = field(default_factory=CoreShare)
    """The share of a core this process got while the turns ran."""
    others: OtherWork = field(default_factory=OtherWork)
    """What other processes took of the CPU meanwhile (shown; the guard is `core`)."""

    @property
    def counts(self) -> bool:
        """Whether the ratio may be asserted: not a capped smoke run, and a GPU or a free core."""
        return not get_preset().capped and (self.device == "cuda" or self.core.free)

    def why_not(self) -> str:
        """The measured reason the ratio is shown, not asserted ('' when it counts)."""
        if self.counts:
            return ""
        capped = get_preset().capped
        if capped:
            return f"a capped run ({capped}) times too few steps to rank two rates"
        return f"this process had {self.core.share:.0%} of a core"

    def __str__(self) -> str:
        (b, big), (rate, rate_big) = self.batch_sizes, self.samples_per_sec
        guard = ("a GPU: the process mostly waits for it" if self.device == "cuda"
                 else f"this process had {self.core.share:.0%} of a core; {self.others}")
        return (f"batch {big}: {rate_big:,.0f} samples/s, batch {b}: {rate:,.0f} samples/s -> {self.ratio:.2f}x "
                f"(median of {len(self.ratios)} rounds of {self.steps} steps each, in turns; {guard})")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython shows the sentence, not the fields
        p.text(str(self))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()  # timing steps, not training: a sync per turn is right here


def batch_speed(parts: Any, larger: Any, *, rounds: int = 9, steps: int = 5) -> BatchSpeed:
    """Time the training steps of two `wb.training_parts` (the baseline's and the same run's at a
    larger batch) in turns: one warm-up turn each, then `rounds` rounds of `steps` steps of each,
    alternating which goes first. A step is `wb.run`'s: forward, cross-entropy, backward, the
    optimizer's step, zero_grad (`contention.interleaved_speedup` alternates them). A capped smoke run
    (WORKBENCH_MAX_STEPS) times one round of one step: enough to run the code, not to rank."""
    if get_preset().capped:
        rounds, steps = 1, 1
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds={rounds} and steps={steps} must both be >= 1")
    parts = [parts, larger]
    device = next(parts[0].model.parameters()).device.type

    def turn(i: int) -> None:
        _, model, optimizer, batches = parts[i]
        _sync(device)  # the other side's queued work is not this turn's
        for _ in range(steps):
            batch = next(batches)
            F.cross_entropy(model(batch["inputs"]), batch["labels"]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        _sync(device)

    sizes = tuple(p.config.batch_size for p in parts)
    with other_work() as others:  # turns alternate, one warm-up each, under one core_share()
        timed = interleaved_speedup(lambda: turn(0), lambda: turn(1), rounds=rounds)
    scale = sizes[1] / sizes[0]  # per round: samples/s over samples/s = this x (baseline seconds / larger's)
    return BatchSpeed(batch_sizes=sizes, ratio=scale * timed.ratio, ratios=[scale * r for r in timed.ratios],
                      samples_per_sec=(sizes[0] * steps / timed.baseline_s, sizes[1] * steps / timed.seconds),
                      steps=steps, device=device, core=timed.core, others=others)


def check_speed(answer: str | None, speed: BatchSpeed) -> None:
    """Check a predicted direction of samples/s ('up', 'down', 'same') against the measured ratio;
    on a shared core, where a timing can read anything, a different answer is explained, not failed.
    Unanswered, it prints the hint only: the measured direction is the exercise's answer."""
    measured = direction(speed.ratio)
    why_not = speed.why_not() + ("" if get_preset().capped else " (rerun on a quiet machine)")
    if not isinstance(answer, str) or answer == measured or speed.counts:  # None, or check() refuses it
        check(answer, measured, hint="how big is each matmul now, and who pays the per-step Python overhead?")
    else:
        print(f"measured: {speed.ratio:.2f}x the samples per second -> {measured!r}; you predicted {answer!r}; "
              f"not checked: {why_not}")
        record(answer, measured, verdict=f"not checked: {why_not}")


def claim_rows(baseline: Any, larger: Any, speed: BatchSpeed) -> list[tuple[Any, ...]]:
    """The tour's claims against its runs (the baseline MLP and the same run at a larger batch)
    and `speed`, the two batch sizes timed in turns.

    Asserts what holds exactly (saved activations linear in the batch: the same bytes a
    sample at both sizes, plus the loss's one 4-byte scalar; FLOPs 6 per weight per sample
    but the first layer's input gradient) and the timing only on a free core.
    """
    b, big = baseline.config.batch_size, larger.config.batch_size
    act, act_big = baseline.memory.activation_bytes, larger.memory.activation_bytes
    per_sample, remainder = divmod(act_big - act, big - b)
    constant = act - b * per_sample
    assert remainder == 0 and constant == 4, (act, act_big)  # linear: a whole number of bytes a sample, + the loss scalar

    h1, h2 = baseline.config.dims["hidden"]
    weights = 784 * h1 + h1 * h2 + h2 * 10  # the MLP's matmul weights (MNIST's 784 pixels in, 10 classes out)
    assert baseline.flops_per_step == b * (6 * weights - 2 * 784 * h1)  # nobody needs the pixels' gradient

    ratio = speed.ratio
    # How much better depends on the model's size and the CPU. On a free core a larger batch must
    # not be slower per sample; the verdict grades the rest.
    if speed.counts:
        assert ratio > 1.0, f"batch {big} ran {ratio:.2f}x the samples/s of batch {b}: a larger batch should not be slower"
    timing = "asserted > 1x" if speed.counts else "not asserted"
    verdict = "holds" if ratio > 1.5 else f"holds in part: {ratio:.2f}x, the matmuls were already large"
    return [
        ("a larger batch uses the hardware better (more samples/s)", "PyTorch performance tuning guide",
         f"batch {big}: {ratio:.2f}x the samples/s of batch {b}, timed in turns ({timing})", verdict,
         evidence.speed(ratio, 1.0, free_core=speed.counts, why_busy=speed.why_not())),
        ("saved activations grow linearly with the batch", "Korthikanti et al. 2022",
         f"{per_sample:,} bytes a sample at batch {b} and {big}, + {constant} (the loss), exact", "holds: to the byte",
         evidence.count()),
        ("a training step costs 6 FLOPs per weight per sample", "Chowdhery et al. 2022 (PaLM), App. B",
         f"{baseline.flops_per_step / (6 * weights * b):.3f} of 6N, counted exactly",
         "holds in part: the first layer's input gradient (the pixels') is never computed", evidence.count()),
    ]
