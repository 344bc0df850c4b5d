"""Notebook 00's helpers: the free-core guard for its one timing, and its claims checked
(asserts and internal imports that would otherwise sit in a learner's cells).

Example:
    >>> direction(2.0), direction(1.05), direction(0.5)
    ('up', 'same', 'down')
"""

from __future__ import annotations

from typing import Any

from workbench.classroom.ledger import record
from workbench.core.presets import get_preset
from workbench.lessons import evidence
from workbench.lessons.contention import CoreShare, core_share
from workbench.lessons.exercises import check

__all__ = ["check_speed", "claim_rows", "core_share", "direction"]


def direction(ratio: float) -> str:
    """'up', 'down' or 'same' (within 10%) for a ratio of two rates."""
    return "up" if ratio > 1.1 else "down" if ratio < 1 / 1.1 else "same"


def _timing_counts(share: CoreShare, device: str) -> bool:
    # A capped smoke run (WORKBENCH_MAX_STEPS) times two or three steps: too few to rank two rates
    # (CI's gpu-shapes pass on a CPU measured 'same' for a batch-size change that is 'up' uncapped).
    # A GPU run's process mostly waits for the GPU (an H200 read 5% of a core): the guard is for CPUs.
    return not get_preset().capped and (device == "cuda" or share.free)


def _why_not_timed(share: CoreShare) -> str:
    return _busy(share) + ("" if get_preset().capped else " (rerun on a quiet machine)")


def _busy(share: CoreShare) -> str:
    capped = get_preset().capped
    return (f"a capped run ({capped}) times too few steps to rank two rates" if capped
            else f"this process had {share.share:.0%} of a core")


def check_speed(answer: str | None, ratio: float, share: CoreShare, *, device: str) -> None:
    """Check a predicted direction of samples/s ('up', 'down', 'same') against the measured ratio;
    on a shared core, where a timing can read anything, a different answer is explained, not failed.
    Unanswered, it prints the hint only: the measured direction is the exercise's answer."""
    measured = direction(ratio)
    if not isinstance(answer, str) or answer == measured or _timing_counts(share, device):  # None, or check() refuses it
        check(answer, measured, hint="how big is each matmul now, and who pays the per-step Python overhead?")
    else:
        print(f"measured: {ratio:.2f}x the samples per second -> {measured!r}; you predicted {answer!r}; "
              f"not checked: {_why_not_timed(share)}")
        record(answer, measured, verdict=f"not checked: {_why_not_timed(share)}")


def claim_rows(baseline: Any, larger: Any, share: CoreShare) -> list[tuple[Any, ...]]:
    """The tour's claims against its runs: the baseline MLP and the same run at a larger batch.

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

    speedup = larger.samples_per_sec / baseline.samples_per_sec
    asserted = _timing_counts(share, baseline.device)
    # How much better depends on the model's size and the CPU: under the cpu preset on an AVX2 CPU
    # (MLP 512-512, batch 128 -> 512) it measured 1.28x, under cpu-quick ~2x. On a free core a
    # larger batch must not be slower per sample; the verdict grades the rest.
    if asserted:
        assert speedup > 1.0, f"batch {big} ran {speedup:.2f}x the samples/s of batch {b}: a larger batch should not be slower"
    timing = "asserted > 1x" if asserted else "not asserted"
    verdict = "holds" if speedup > 1.5 else f"holds in part: {speedup:.2f}x, the matmuls were already large"
    return [
        ("a larger batch uses the hardware better (more samples/s)", "PyTorch performance tuning guide",
         f"batch {big}: {speedup:.2f}x the samples/s of batch {b} ({timing})", verdict,
         evidence.speed(speedup, 1.0, free_core=asserted, why_busy="" if asserted else _busy(share))),
        ("saved activations grow linearly with the batch", "Korthikanti et al. 2022",
         f"{per_sample:,} bytes a sample at batch {b} and {big}, + {constant} (the loss), exact", "holds: to the byte",
         evidence.count()),
        ("a training step costs 6 FLOPs per weight per sample", "Chowdhery et al. 2022 (PaLM), App. B",
         f"{baseline.flops_per_step / (6 * weights * b):.3f} of 6N, counted exactly",
         "holds in part: the first layer's input gradient (the pixels') is never computed", evidence.count()),
    ]
