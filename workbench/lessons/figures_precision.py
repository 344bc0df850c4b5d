"""Pictures for notebook 01: the bit layouts of fp32, fp16 and bf16.

Every figure on the picture is read from `torch.finfo` (bits, mantissa bits from `eps`, the
largest value, the smallest normal and subnormal), not typed in, so the bars and labels are
what this torch build reports.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.base.precisions import DTYPES

__all__ = ["FormatLayout", "format_layout", "bit_layout_figure", "Picture"]


@dataclass(frozen=True)
class FormatLayout:
    """One floating-point format's bit fields and limits."""

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    largest: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float
    """The step between 1.0 and the next value: the relative precision."""

    @property
    def digits(self) -> float:
        """Decimal digits of precision, log10(2^(mantissa bits + 1))."""
        return (self.mantissa_bits + 1) * math.log10(2)


def format_layout(name: str) -> FormatLayout:
    """The bit layout of `name` ('fp32', 'fp16' or 'bf16'), from `torch.finfo`.

    Example:
        >>> f = format_layout("bf16"); (f.bits, f.exponent_bits, f.mantissa_bits)
        (16, 8, 7)
    """
    if name not in DTYPES:
        raise ValueError(f"name={name!r} is not a format here; use one of {sorted(DTYPES)}")
    info = torch.finfo(DTYPES[name])
    mantissa = round(-math.log2(info.eps))  # eps = 2^-mantissa bits
    return FormatLayout(name=name, bits=info.bits, exponent_bits=info.bits - 1 - mantissa, mantissa_bits=mantissa,
                        largest=float(info.max), smallest_normal=float(info.tiny),
                        smallest_subnormal=float(info.tiny * info.eps), eps=float(info.eps))


@dataclass
class Picture:
    """A matplotlib Figure that shows itself as a PNG in Jupyter (no pyplot state)."""

    figure: Any

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
        return buffer.getvalue()


_COLOURS = {"sign": "#d62728", "exponent": "#1f77b4", "mantissa": "#2ca02c"}


def bit_layout_figure(names: Sequence[str] = ("fp32", "fp16", "bf16"), *, width: float = 11.0) -> Picture:
    """Sign / exponent / mantissa bars, one row per format, drawn to scale (one unit a bit),
    labelled with the bit counts, the range and the precision.

    Example:
        >>> bit_layout_figure(["fp16", "bf16"])  # doctest: +SKIP
    """
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    layouts = [format_layout(n) for n in names]
    fig = Figure(figsize=(width, 0.9 * len(layouts) + 0.8))
    ax = fig.subplots()
    widest = max(f.bits for f in layouts)
    for row, f in enumerate(layouts):
        y = len(layouts) - 1 - row
        start = 0
        for field, n in (("sign", 1), ("exponent", f.exponent_bits), ("mantissa", f.mantissa_bits)):
            ax.barh(y, n, left=start, height=0.6, color=_COLOURS[field], edgecolor="white")
            ax.text(start + n / 2, y, f"{n}" if n < 3 else f"{field} {n}", ha="center", va="center", color="white",
                    fontsize=8, fontweight="bold")
            start += n
        ax.text(-0.6, y, f.name, ha="right", va="center", fontsize=10, fontweight="bold")
        ax.text(widest + 0.6, y, f"max {f.largest:.3g}, smallest normal {f.smallest_normal:.3g}, subnormal "
                f"{f.smallest_subnormal:.3g}\nstep at 1.0: {f.eps:.3g} (~{f.digits:.1f} decimal digits)",
                ha="left", va="center", fontsize=8)
    ax.set_xlim(-4, widest + 22)
    ax.set_ylim(-0.6, len(layouts) - 0.4)
    ax.axis("off")
    ax.set_title("bits of each format, to scale: exponent bits set the range, mantissa bits the precision", fontsize=10)
    fig.tight_layout()
    return Picture(fig)
