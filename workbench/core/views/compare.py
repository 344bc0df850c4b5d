"""compare(results): runs side by side, as a table and a figure, with ratios to the first.

In Jupyter the Comparison renders as an HTML table with the figure under it (a
PNG, so a saved notebook shows it on the web); elsewhere as text. Ratios are
taken within one set of runs measured together: that is the only honest way to
compare noisy timings.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.base.report import Results, plain_label
from workbench.core.measure.result import RunResult, metric, results_table


class Comparison(Results):
    """Several runs measured together, the first the baseline. Example:

        >>> cmp = compare([baseline, bf16])      # doctest: +SKIP
        >>> cmp.ratio("activation_bytes", "bf16")  # bf16 over baseline  # doctest: +SKIP
        0.5
    """

    kind = "run"
    item_type = RunResult
    argument, example = "results", "compare([baseline, other])"
    empty_message = "compare() needs at least one RunResult"
    name_hint = "pass name= to run()"

    def __init__(self, results: Sequence[RunResult]) -> None:
        super().__init__(results)
        self.table = results_table(self.items)

    @property
    def results(self) -> list[RunResult]:
        return self.items

    def result(self, name: str) -> RunResult:
        return self.item(name)

    def value(self, item: RunResult, name_of_metric: str) -> float | None:
        return metric(item, name_of_metric)

    @property
    def header(self) -> list[str]:  # type: ignore[override]
        return self.table.header

    def rows(self) -> list[list[str]]:
        return self.table.rows

    def make_figure(self):
        return comparison_figure(self.items)


def comparison_figure(results: Sequence[RunResult]):
    """Loss curves plus bars of time per step, activations and peak memory."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    fig = Figure(figsize=(13, 3.2))
    axes = fig.subplots(1, 4)
    names = [plain_label(r.name) for r in results]
    for r, name in zip(results, names):
        axes[0].plot(r.loss_steps, r.losses, marker=".", label=name)
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
