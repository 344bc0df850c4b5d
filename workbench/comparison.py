"""compare(results): runs side by side, as a table and a figure, with ratios to the first.

In Jupyter the Comparison renders as an HTML table with the figure under it (a
PNG, so a saved notebook shows it on the web); elsewhere as text. Ratios are
taken within one set of runs measured together: that is the only honest way to
compare noisy timings.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .result import RunResult
from .sinks import format_bytes

# metric -> (column title, formatter); ratios are shown for the starred ones.
_COLUMNS: dict[str, tuple[str, Any]] = {
    "step_time_s": ("ms / step", lambda v: f"{v * 1e3:.1f}"),
    "samples_per_sec": ("samples / s", lambda v: f"{v:,.0f}"),
    "tokens_per_sec": ("tokens / s", lambda v: f"{v:,.0f}"),
    "activation_bytes": ("saved activations", format_bytes),
    "peak_increase_bytes": ("peak increase", format_bytes),
    "final_loss": ("final train loss", lambda v: f"{v:.4f}"),
    "accuracy": ("held-out accuracy", lambda v: f"{v:.3f}"),
}
_RATIO_METRICS = ("step_time_s", "samples_per_sec", "activation_bytes", "peak_increase_bytes")


def metric(result: RunResult, name: str) -> float | None:
    """One figure of a result by name (memory figures included)."""
    if name in ("activation_bytes", "peak_bytes", "peak_increase_bytes", "parameter_bytes",
                "gradient_bytes", "optimizer_state_bytes"):
        return getattr(result.memory, name) if result.memory else None
    if name == "final_loss":
        return result.final_loss
    return getattr(result, name)


def figure_html(figure, *, tight: bool = True) -> str:
    """A matplotlib figure as an inline <img>: a saved notebook shows it on the web."""
    buf = io.BytesIO()
    figure.savefig(buf, format="png", dpi=90, bbox_inches="tight" if tight else None)
    return f"<img src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'/>"


def html_table(rows: Sequence[Sequence[Any]], *, header: Sequence[str] = (), caption: str = "") -> str:
    esc = lambda v: html.escape(str(v))  # noqa: E731
    parts = ["<table>"]
    if caption:
        parts.append(f"<caption style='text-align:left'><b>{esc(caption)}</b></caption>")
    if header:
        parts.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>")
    parts.append("</table>")
    return "".join(parts)


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]

    def to_html(self) -> str:
        return html_table(self.rows, header=self.header)

    def __str__(self) -> str:
        widths = [max(len(str(r[i])) for r in [self.header, *self.rows]) for i in range(len(self.header))]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in [self.header, *self.rows]]
        return "\n".join(lines)


def compare_table(results: Sequence[RunResult]) -> Table:
    """The comparison as rows of formatted text, first run as the baseline."""
    base = results[0]
    shown = [m for m in _COLUMNS if any(metric(r, m) is not None for r in results)]
    header = ["run", "status", "precision", "batch x accum", "checkpointing"]
    for m in shown:
        header.append(_COLUMNS[m][0])
        if m in _RATIO_METRICS and len(results) > 1:
            header.append("x first")
    rows = []
    for r in results:
        c = r.config
        row = [r.name, r.status, c.precision, f"{c.batch_size} x {c.grad_accum_steps}", c.activation_checkpointing]
        for m in shown:
            value = metric(r, m)
            row.append("n/a" if value is None else _COLUMNS[m][1](value))
            if m in _RATIO_METRICS and len(results) > 1:
                b = metric(base, m)
                row.append("n/a" if value is None or not b else f"{value / b:.2f}")
        rows.append(row)
    return Table(header, rows)


class Comparison:
    """Several results measured together. Example:

        >>> cmp = compare([baseline, bf16])      # doctest: +SKIP
        >>> cmp.ratio("activation_bytes", "bf16")  # bf16 over baseline  # doctest: +SKIP
        0.5
    """

    def __init__(self, results: Sequence[RunResult]) -> None:
        if not results:
            raise ValueError("compare() needs at least one RunResult; pass [baseline, other, ...]")
        names = [r.name for r in results]
        if len(set(names)) != len(names):
            raise ValueError(f"run names must differ to compare them, got {names}; pass name= to run()")
        self.results = list(results)
        self.table = compare_table(self.results)
        self._figure = None

    def result(self, name: str) -> RunResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no run named {name!r}; runs: {[r.name for r in self.results]}")

    def ratio(self, name_of_metric: str, run: str, *, to: str | None = None) -> float:
        """metric(run) / metric(to, default the first run)."""
        base = self.result(to) if to else self.results[0]
        num, den = metric(self.result(run), name_of_metric), metric(base, name_of_metric)
        if num is None or not den:
            raise ValueError(f"{name_of_metric} was not measured for {run!r} and {base.name!r}")
        return num / den

    @property
    def figure(self):
        if self._figure is None:
            self._figure = comparison_figure(self.results)
        return self._figure

    def _repr_html_(self) -> str:
        return self.table.to_html() + figure_html(self.figure)

    def __str__(self) -> str:
        return str(self.table)

    __repr__ = __str__


def comparison_figure(results: Sequence[RunResult]):
    """Loss curves plus bars of time per step, activations and peak memory."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    fig = Figure(figsize=(13, 3.2))
    axes = fig.subplots(1, 4)
    names = [r.name for r in results]
    for r in results:
        axes[0].plot(r.loss_steps, r.losses, marker=".", label=r.name)
    axes[0].set(title="training loss", xlabel="optimizer step")
    axes[0].legend(fontsize=8)
    bars = [("step_time_s", "ms / step", 1e3), ("activation_bytes", "saved activations (MiB)", 2**-20),
            ("peak_increase_bytes", "peak increase (MiB)", 2**-20)]
    for ax, (m, title, scale) in zip(axes[1:], bars):
        values = [(metric(r, m) or 0) * scale for r in results]
        ax.bar(range(len(results)), values, color=[f"C{i}" for i in range(len(results))])
        ax.set_xticks(range(len(results)), names, rotation=20, ha="right", fontsize=8)
        ax.set_title(title)
    fig.tight_layout()
    return fig


def compare(results: Sequence[RunResult]) -> Comparison:
    """Lay runs side by side; the first is the baseline for ratios.

    Example:
        >>> cmp = compare([run(base_cfg, name="fp32"), run(bf16_cfg, name="bf16")])  # doctest: +SKIP
        >>> cmp                                       # table and figure in Jupyter  # doctest: +SKIP
    """
    return Comparison(results)
