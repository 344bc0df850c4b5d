"""Pictures for notebooks 03, 05 and 07: what each block keeps for backward, with and without
checkpointing, and a step's live bytes moment by moment; memory snapshots' timelines side by
side; and a Linear layer's weights against the int8 grid they are rounded to.

The numbers come from the caller (exact counts from `measure.counters`, the quantized
layer's own scale and zero point): this module only draws. Each function returns a
`Picture`, which Jupyter shows as a PNG (matplotlib's Agg into a bare `Figure`: pyplot's
global state is never touched) and whose `.figure` a test can read.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

MIB = 2**20


class Picture:
    """A matplotlib Figure that Jupyter renders as a PNG."""

    def __init__(self, figure: Any) -> None:
        self.figure = figure

    def __repr__(self) -> str:  # stable text (no address), for notebooks whose outputs are compared
        titles = "; ".join(ax.get_title() for ax in self.figure.axes if ax.get_title())
        return f"Picture({titles!r})"

    def _repr_png_(self) -> bytes:
        # matplotlib only when a figure is drawn: importing this module stays light
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        buffer = io.BytesIO()
        FigureCanvasAgg(self.figure).print_png(buffer)
        return buffer.getvalue()


def stored_vs_recomputed(blocks: Sequence[str], stored: Sequence[int], kept: Sequence[int]) -> Picture:
    """Per block: bytes saved for backward without checkpointing, and with it the bytes kept
    (the block's input) and rebuilt in backward (the rest). All three in MiB.

    Args:
        blocks: a label per block.
        stored: bytes each block saves for backward, not checkpointed (exact counts).
        kept: bytes each block keeps when checkpointed (exact counts), each <= its `stored`.

    Example:
        >>> pic = stored_vs_recomputed(["block 0"], stored=[4 * MIB], kept=[MIB])
        >>> [float(round(b.get_height(), 2)) for b in pic.figure.axes[0].patches]
        [4.0, 1.0, 3.0]
    """
    if not (len(blocks) == len(stored) == len(kept)) or not blocks:
        raise ValueError(f"blocks, stored and kept must be equally long and not empty: got {len(blocks)}, "
                         f"{len(stored)}, {len(kept)}; pass one figure per block")
    if any(k > s for s, k in zip(stored, kept)):
        raise ValueError("a checkpointed block cannot keep more than it saves uncheckpointed: check stored and kept")
    # matplotlib only when a figure is drawn: importing this module stays light
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    x = range(len(blocks))
    width = 0.38
    ax.bar([i - width / 2 for i in x], [s / MIB for s in stored], width, color="C0",
           label="not checkpointed: saved for backward")
    ax.bar([i + width / 2 for i in x], [k / MIB for k in kept], width, color="C1",
           label="checkpointed: kept (the block's input)")
    ax.bar([i + width / 2 for i in x], [(s - k) / MIB for s, k in zip(stored, kept)], width,
           bottom=[k / MIB for k in kept], color="none", edgecolor="C1", hatch="//",
           label="checkpointed: rebuilt in backward")
    ax.set_xticks(list(x), list(blocks))
    ax.set_ylabel("MiB per step")
    ax.set_title("What each block keeps for backward (exact counts)")
    ax.set_ylim(0, max(stored) / MIB * 1.4)  # room for the legend above the bars
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    return Picture(fig)


def step_timeline_figure(timelines: Mapping[str, Any]) -> Picture:
    """Live bytes through one training step, one line per setting, in MiB: the forward climbs as
    activations are saved, the backward gives them back (with checkpointing, rebuilding one
    block at a time: a tooth per block). x is the share of the step's allocations made.

    Args:
        timelines: label -> a `planner.timeline.StepTimeline` (levels, forward_end, resident_bytes).

    Example:
        >>> from types import SimpleNamespace as T
        >>> pic = step_timeline_figure({"a": T(levels=(2 * MIB, 4 * MIB, 3 * MIB), forward_end=2, resident_bytes=MIB)})
        >>> [round(float(y), 1) for y in pic.figure.axes[0].lines[0].get_ydata()]
        [2.0, 4.0, 3.0]
    """
    if not timelines or any(not t.levels for t in timelines.values()):
        raise ValueError("pass at least one timeline with levels, e.g. {'none': step_timeline(config)}")
    # matplotlib only when a figure is drawn: importing this module stays light
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.4))
    ax = fig.subplots()
    for i, (label, t) in enumerate(timelines.items()):
        n = len(t.levels)
        xs = [k / max(1, n - 1) for k in range(n)]
        color = f"C{i}"
        ax.plot(xs, [v / MIB for v in t.levels], color=color, lw=1.2,
                label=f"{label}: peak {max(t.levels) / MIB:.1f} MiB")
        ax.axvline(xs[max(0, t.forward_end - 1)], color=color, ls=":", lw=1)
    resident = min(t.resident_bytes for t in timelines.values())
    ax.axhline(resident / MIB, color="0.5", ls="--", lw=1, label=f"model state {resident / MIB:.1f} MiB")
    ax.set_xlabel("share of the step's allocations (dotted: the forward ends, the backward begins)")
    ax.set_ylabel("MiB live")
    ax.set_ylim(0, max(max(t.levels) for t in timelines.values()) / MIB * 1.15)
    ax.set_title("One training step, live bytes (replayed on fake tensors)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return Picture(fig)


def snapshot_timelines(snapshots: Mapping[str, Any]) -> Picture:
    """Memory snapshots' timelines side by side, one panel each, in MiB: the live bytes before
    the first event and after each alloc and free (`MemorySnapshot.levels()`, the curve
    memory_viz's Active Memory Timeline stacks), with each one's peak and source.

    Args:
        snapshots: label -> a `measure.snapshot.MemorySnapshot` (levels(), peak_bytes, source).

    Example:
        >>> from types import SimpleNamespace as S
        >>> snap = S(levels=lambda: [MIB, 3 * MIB, 2 * MIB], peak_bytes=3 * MIB, source="made up")
        >>> pic = snapshot_timelines({"a": snap, "b": snap})
        >>> len(pic.figure.axes), [round(float(y), 1) for y in pic.figure.axes[0].lines[0].get_ydata()]
        (2, [1.0, 3.0, 2.0])
    """
    if not snapshots:
        raise ValueError("pass at least one snapshot, e.g. {'predicted': lesson.predicted_snapshot(config)}")

    # matplotlib only when a figure is drawn: importing this module stays light
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.6))
    axes = fig.subplots(1, len(snapshots), sharey=True, squeeze=False)[0]
    top = max(s.peak_bytes for s in snapshots.values()) / MIB
    for i, (ax, (label, snap)) in enumerate(zip(axes, snapshots.items())):
        levels = snap.levels()
        ax.plot(range(len(levels)), [v / MIB for v in levels], color=f"C{i}", lw=1.2)
        ax.axhline(snap.peak_bytes / MIB, color="0.5", ls=":", lw=1)
        ax.set_title(f"{label}: peak {snap.peak_bytes:,} B", fontsize=10)
        ax.set_xlabel(textwrap.fill(snap.source, 60) + "\n\nevents (allocations and frees), in order", fontsize=8)
        ax.set_ylim(0, top * 1.15)
    axes[0].set_ylabel("MiB live")
    fig.tight_layout()
    return Picture(fig)


def weight_grid(weights: Sequence[float], *, scale: float, zero_point: int, qmin: int = -128, qmax: int = 127,
                zoom_steps: int = 6) -> Picture:
    """Histogram of a layer's fp32 weights with the integer grid `scale * (q - zero_point)`,
    q in [qmin, qmax], that quantization rounds them to: the whole range (its ends, where
    values would be clipped, marked) and a zoom on `zoom_steps` grid steps either side of 0.

    Example:
        >>> pic = weight_grid([-0.5, 0.0, 0.25, 0.5], scale=0.5 / 127, zero_point=0)
        >>> len(pic.figure.axes)
        2
    """
    if not scale > 0:
        raise ValueError(f"scale={scale!r} must be > 0: pass the quantized layer's q_scale()")
    if not qmin < qmax:
        raise ValueError(f"qmin={qmin} must be below qmax={qmax}")
    # matplotlib only when a figure is drawn: importing this module stays light
    from matplotlib.figure import Figure

    values = [float(w) for w in weights]
    low, high = scale * (qmin - zero_point), scale * (qmax - zero_point)
    fig = Figure(figsize=(11, 3.2))
    whole, zoom = fig.subplots(1, 2)
    whole.hist(values, bins=200, color="C0")
    for end in (low, high):
        whole.axvline(end, color="C3", linewidth=1)
    whole.set_title(f"{len(values):,} weights; int8 range {low:.3g} .. {high:.3g} (red)", fontsize=9)
    whole.set_xlabel("weight value")
    span = zoom_steps * scale
    near = [v for v in values if -span <= v <= span]
    zoom.hist(near, bins=zoom_steps * 2 * 8, range=(-span, span), color="C0")
    for q in range(-zoom_steps, zoom_steps + 1):
        zoom.axvline(q * scale, color="C3", linewidth=0.8, alpha=0.7)
    zoom.set_title(f"zoom: the grid, one line per integer (scale {scale:.3g}, zero point {zero_point})", fontsize=9)
    zoom.set_xlabel("weight value")
    fig.tight_layout()
    return Picture(fig)
