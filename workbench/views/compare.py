"""compare(results): runs side by side, as a table and a figure, with ratios to the first.

In Jupyter the Comparison renders as an HTML table with the figure under it (a
PNG, so a saved notebook shows it on the web); elsewhere as text. Ratios are
taken within one set of runs measured together: that is the only honest way to
compare noisy timings.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from workbench.measure.result import RunResult, metric, results_table


def figure_html(figure, *, tight: bool = True) -> str:
    """A matplotlib figure as an inline <img>: a saved notebook shows it on the web."""
    buf = io.BytesIO()
    figure.savefig(buf, format="png", dpi=90, bbox_inches="tight" if tight else None)
    return f"<img src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'/>"


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
        self.table = results_table(self.results)
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
