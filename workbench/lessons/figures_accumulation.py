"""Pictures for notebook 02: what one optimizer step holds in memory, phase by phase.

Counted, not sampled: sampling a CPU process's memory during a step is too coarse to show a few
MiB (the C allocator keeps freed blocks), so the timeline stacks the exact counts a run measured
(parameters, gradients, optimizer state, one micro-batch's saved activations) as they are alive
at the end of each phase of a step in steady state (after the first step, when AdamW's state
exists). Temporaries and allocator slack are not in it: a measured peak is higher.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.base.report import plain_label
from workbench.core.measure.result import RunResult
from workbench.lessons.figures_precision import Picture

__all__ = ["PARTS", "phase_bytes", "memory_timeline_figure"]

PARTS = ("parameters", "optimizer state", "gradients", "saved activations")


def phase_bytes(*, parameter_bytes: int, gradient_bytes: int, optimizer_state_bytes: int, activation_bytes: int,
                accum_steps: int) -> list[tuple[str, dict[str, int]]]:
    """(phase, bytes per part) at the end of each phase of one optimizer step of `accum_steps`
    micro-batches: forward i keeps its saved activations (and the gradients summed so far),
    backward i frees them and leaves the gradients, the step updates in place.

    Example:
        >>> [name for name, _ in phase_bytes(parameter_bytes=4, gradient_bytes=4, optimizer_state_bytes=8,
        ...                                  activation_bytes=10, accum_steps=2)]
        ['fwd 1', 'bwd 1', 'fwd 2', 'bwd 2', 'step']
    """
    if isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1:
        raise ValueError(f"accum_steps={accum_steps!r} must be a whole number >= 1")
    state = {"parameters": parameter_bytes, "optimizer state": optimizer_state_bytes}
    phases = []
    for i in range(1, accum_steps + 1):
        held = gradient_bytes if i > 1 else 0  # set_to_none: no gradient before the first backward
        label = "" if accum_steps == 1 else f" {i}"
        phases.append((f"fwd{label}", {**state, "gradients": held, "saved activations": activation_bytes}))
        phases.append((f"bwd{label}", {**state, "gradients": gradient_bytes, "saved activations": 0}))
    phases.append(("step", {**state, "gradients": gradient_bytes, "saved activations": 0}))
    return phases


def memory_timeline_figure(results: Sequence[RunResult]) -> Picture:
    """One panel per run: stacked bars of the counted bytes over the phases of one step.

    Example:
        >>> memory_timeline_figure([baseline, accumulated])  # doctest: +SKIP
    """
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    timelines = []
    for r in results:
        m = r.memory
        if m.activation_bytes is None:
            raise ValueError(f"run {r.name!r} has no counted activations (count_first_step was off); rerun counting them")
        timelines.append((r, phase_bytes(parameter_bytes=m.parameter_bytes, gradient_bytes=m.gradient_bytes,
                                         optimizer_state_bytes=m.optimizer_state_bytes,
                                         activation_bytes=m.activation_bytes, accum_steps=r.config.grad_accum_steps)))
    widths = [len(p) for _, p in timelines]
    fig = Figure(figsize=(3 + 0.9 * sum(widths), 3.6))
    axes = fig.subplots(1, len(timelines), sharey=True, width_ratios=widths, squeeze=False)[0]
    for ax, (r, phases) in zip(axes, timelines):
        bottom = [0.0] * len(phases)
        for i, part in enumerate(PARTS):
            values = [p[part] / 2**20 for _, p in phases]
            ax.bar(range(len(phases)), values, bottom=bottom, color=f"C{i}", label=part)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_xticks(range(len(phases)), [name for name, _ in phases], fontsize=8)
        ax.set_title(f"{plain_label(r.name)} ({r.config.batch_size} x {r.config.grad_accum_steps})", fontsize=9)
    axes[0].set_ylabel("MiB alive at the end of the phase")
    axes[-1].legend(fontsize=8, loc="upper right")
    fig.suptitle("one optimizer step, counted (exact bytes; temporaries not shown)", fontsize=10)
    fig.tight_layout()
    return Picture(fig)
