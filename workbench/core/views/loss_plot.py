"""The loss curves of a run view: drawn live in the browser by bqplot, and once as a PNG.

The kernel sends points; the browser draws them. Why bqplot: measured in a real ipykernel on
this 2-core machine (`benchmarks/plot_widgets.py`, medians of 100 updates; two runs, at a load
average of ~2 and of ~5 from other work, as ranges):

| kernel side                 | bqplot 0.13.1                 | plotly 7.1 FigureWidget           | matplotlib PNG |
|-----------------------------|-------------------------------|-----------------------------------|----------------|
| import                      | 0.3-0.9 s                     | 2.2-5.0 s                         | 0.2-0.7 s      |
| create one figure           | 5-23 ms, 10 msgs, 7.2 kB      | 0.35-0.85 s, 8 msgs, 5.1 MB       | 5-19 ms        |
| update, 1,000 points        | 0.06 ms, 1 msg, 8 kB          | 0.3-0.46 ms, 4 msgs, 9 kB         | 60-100 ms      |
| update, 10,000 points       | 0.06-0.07 ms, 1 msg, 81 kB    | 0.35-0.5 ms, 4 msgs, 82 kB        | 60-90 ms       |

Both update far under the 1% budget at 1-2 Hz. plotly's FigureWidget is an anywidget that
ships its 5 MB JavaScript bundle with every figure (the `_esm` trait): a view per run would
cost up to a second and 5 MB each, in the browser and in every saved notebook's widget
state, and it needs anywidget's lab extension besides. bqplot's JupyterLab 4 extension is
prebuilt inside its wheel (bqscales' inside its own), found by JupyterLab with no
build step. Inside a training loop an update costs more than in these tight loops (~1 ms
quiet, ~2-4 ms at a load of 5: handing each message to the kernel's IOPub thread), which
the dashboard's budget accounts for (`benchmarks/overhead.py`).

Readers without a kernel (GitHub, nbviewer) get `png()`: the same curves drawn once, by
matplotlib's Agg into a bare `Figure` (pyplot is never touched, so the inline backend
shows no stray copy and no global figure list grows).

Example:
    >>> plot = LossPlot()  # doctest: +SKIP
    >>> curve = plot.add_curve("baseline")  # doctest: +SKIP
    >>> curve.add(10, 2.1); plot.draw(curve)  # doctest: +SKIP
"""

from __future__ import annotations

import html
import io
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.base.report import plain_label

# The i-th curve's look. Later curves get dashes and markers, so a curve drawn exactly on
# an earlier one (fp32/fp16/bf16 on the same seed often agree to the 4th digit) still shows.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
STYLES = (("solid", None), ("dashed", "circle"), ("dotted", "square"), ("dash_dotted", "triangle-up"),
          ("dashed", "diamond"), ("dotted", "cross"))
_MPL_LINE = {"solid": "-", "dashed": "--", "dotted": ":", "dash_dotted": "-."}
_MPL_MARKER = {None: None, "circle": "o", "square": "s", "triangle-up": "^", "diamond": "D", "cross": "x"}
# Points sent per curve: the browser draws an SVG path, smooth up to a few thousand points;
# longer curves are thinned evenly (the last point always kept). The PNG draws them all.
MAX_POINTS = 1000
WIDTH_PX, HEIGHT_PX = 700, 260


def thin(steps: list[int], losses: list[float], max_points: int = MAX_POINTS) -> tuple[list[int], list[float]]:
    """At most `max_points` evenly spaced points of a curve, its last point included.

    Example:
        >>> thin(list(range(10)), [float(i) for i in range(10)], max_points=4)
        ([0, 3, 6, 9], [0.0, 3.0, 6.0, 9.0])
    """
    if len(steps) <= max_points:
        return steps, losses
    stride = math.ceil((len(steps) - 1) / (max_points - 1))
    keep = list(range(0, len(steps) - 1, stride)) + [len(steps) - 1]
    return [steps[i] for i in keep], [losses[i] for i in keep]


def y_axis_range(low: float, high: float, *, count: int = 6) -> tuple[float, float, list[float]]:
    """The y axis for losses in [low, high]: round ticks (1, 2, 2.5 or 5 times a power of ten
    apart, about `count` intervals) and bounds on the tick grid around the data. bqplot's own
    ticks are ~10, crowded at 260 px (or, with num_ticks, not round); bounds on the grid move
    only when the curve crosses a grid line, so most updates send the curve and nothing else.

    Example:
        >>> y_axis_range(0.013, 1.37)
        (0.0, 1.5, [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5])
    """
    if high <= low:  # a flat curve: a range around its value (10% of it), the curve in the middle
        half = (abs(high) or 10.0) * 0.05
        low, high = low - half, high + half
    span = high - low
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    bottom = math.floor(low / step + 1e-9) * step
    top = max(math.ceil(high / step - 1e-9) * step, bottom + step)
    ticks = [round(bottom + i * step, 12) for i in range(round((top - bottom) / step) + 1)]
    return round(bottom, 12), round(top, 12), ticks


def tick_decimals(ticks: list[float]) -> int:
    """The fewest decimals that write every tick exactly: [0.0, 0.25, 0.5] -> 2.

    Example:
        >>> tick_decimals([0.0, 0.25, 0.5]), tick_decimals([0, 1000, 2000]), tick_decimals([2.26, 2.28])
        (2, 0, 2)
    """
    return next((d for d in range(10) if all(abs(round(t, d) - t) < 1e-9 * max(1.0, abs(t)) for t in ticks)), 10)


def coincides(a: Curve, b: Curve, *, rel_tol: float = 1e-3) -> bool:
    """Whether two curves lie on each other: the same loss (to rel_tol) at every shared step."""
    theirs = dict(zip(b.steps, b.losses))
    shared = [(loss, theirs[s]) for s, loss in zip(a.steps, a.losses) if s in theirs]
    return len(shared) >= 2 and all(
        math.isfinite(x) and math.isfinite(y) and abs(x - y) <= rel_tol * max(abs(y), 1e-12) for x, y in shared)


@dataclass(eq=False)
class Curve:
    """One run's loss curve: every logged point (the browser gets at most MAX_POINTS)."""

    label: str
    index: int
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    mark: Any = None
    low: float = math.inf
    """The smallest finite loss so far (kept as points come: the y axis needs no pass over them)."""
    high: float = -math.inf

    def add(self, step: int, loss: float) -> None:
        finite = math.isfinite(loss)
        self.steps.append(step)
        self.losses.append(loss if finite else math.nan)  # NaN: a gap, not a broken axis
        if finite:
            self.low, self.high = min(self.low, loss), max(self.high, loss)

    def points(self) -> tuple[list[int], list[float]]:
        """The whole points: steps and losses of one length. An interrupt (the kernel's KeyboardInterrupt,
        raised between any two bytecodes of `add`) can leave a step without its loss; the view drawn
        as the run stops must not fail on it."""
        n = min(len(self.steps), len(self.losses))
        return self.steps[:n], self.losses[:n]

    @property
    def style(self) -> tuple[str, str | None, str]:
        line, marker = STYLES[self.index % len(STYLES)]
        return line, marker, COLORS[self.index % len(COLORS)]


class LossPlot:
    """A bqplot figure of training loss against step, one line per run; x runs from 0 to the
    last step logged, so a curve fills the width however long its run (the progress bar shows
    how far along it is).

    `figure` is the bqplot Figure; `note` a line naming curves that lie on each other.
    """

    def __init__(self) -> None:
        # notebook-only: importing workbench stays free of Jupyter (tests/test_dashboard.py)
        import bqplot
        import ipywidgets as w

        self._bqplot = bqplot
        self.curves: list[Curve] = []
        self._y_ticks: list[float] = []
        self.overlaps: list[str] = []
        """'b (dashed, circle markers) lies on a', for each curve on an earlier one."""
        self.x_scale = bqplot.LinearScale(min=0.0)  # to the last step logged: the curve fills the width
        self.y_scale = bqplot.LinearScale()
        self.y_axis = bqplot.Axis(scale=self.y_scale, side="left", label="training loss",
                                  tick_format=".3g", label_offset="45px")
        self.figure = bqplot.Figure(
            marks=[], axes=[bqplot.Axis(scale=self.x_scale, label="step", tick_format="d"),
                            self.y_axis],
            fig_margin={"top": 12, "bottom": 42, "left": 62, "right": 16}, animation_duration=0,
            legend_location="top-right", min_aspect_ratio=0.0, max_aspect_ratio=100.0,
            layout=w.Layout(width=f"{WIDTH_PX}px", max_width="100%", height=f"{HEIGHT_PX}px"),
        )
        self.figure.add_class("wb-plot-figure")
        self.note = w.HTML(layout={"display": "none"})  # stays when the figure steps aside for its PNG
        self.note.add_class("wb-plot-note")

    def add_curve(self, label: str) -> Curve:
        line, marker, color = (curve := Curve(label, len(self.curves))).style
        curve.mark = self._bqplot.Lines(
            x=[], y=[], scales={"x": self.x_scale, "y": self.y_scale}, colors=[color], line_style=line,
            marker=marker, marker_size=14, stroke_width=1.6, labels=[label])
        self.curves.append(curve)
        many = len(self.curves) > 1  # one curve needs no legend: the view's title names the run
        with self.figure.hold_sync():
            self.figure.marks = [c.mark for c in self.curves]
            for c in self.curves:
                c.mark.display_legend = many
        return curve

    def draw(self, curve: Curve) -> None:
        """Send the curve's points (one message: x and y together)."""
        steps, losses = thin(*curve.points())
        with curve.mark.hold_sync():
            curve.mark.x = np.asarray(steps, dtype=np.float64)
            curve.mark.y = np.asarray(losses, dtype=np.float64)
        low, high = min(c.low for c in self.curves), max(c.high for c in self.curves)
        if low <= high:  # some finite loss to show
            low, high, ticks = y_axis_range(low, high)
            if ticks != self._y_ticks or (low, high) != (self.y_scale.min, self.y_scale.max):
                with self.y_scale.hold_sync():  # messages only when the axis changes
                    self.y_scale.min, self.y_scale.max = low, high
                if ticks != self._y_ticks:
                    with self.y_axis.hold_sync():
                        self._y_ticks = self.y_axis.tick_values = ticks
                        self.y_axis.tick_format = f".{tick_decimals(ticks)}f"  # 0.25, 0.50, not 0.25, 0.5

    def note_overlaps(self) -> None:
        """Say which curves lie on an earlier one (their dashes and markers tell them apart)."""
        self.overlaps = []
        for curve in self.curves[1:]:
            twin = next((c for c in self.curves[:curve.index] if coincides(curve, c)), None)
            if twin is not None:
                line, marker, _ = curve.style
                self.overlaps.append(f"{curve.label} ({line.replace('_', '-')}, {marker} markers) lies on {twin.label}")
        text = "; ".join(self.overlaps) + (": the same loss at every logged step" if self.overlaps else "")
        self.note.value = f'<span style="font-size:90%">Note: {html.escape(text)}.</span>' if text else ""
        self.note.layout.display = None if text else "none"

    def png(self) -> bytes | None:
        """All curves as a PNG (matplotlib Agg, no pyplot); None while no curve has a point."""
        if not any(c.steps for c in self.curves):
            return None
        # matplotlib only when a figure is drawn: importing this module stays light
        from matplotlib.figure import Figure

        # Fixed margins, not layout="constrained": 80 ms a figure instead of 110 here, at every run's end.
        fig = Figure(figsize=(WIDTH_PX / 100, HEIGHT_PX / 100), dpi=100)
        fig.subplots_adjust(left=0.1, right=0.98, top=0.95, bottom=0.19)
        ax = fig.add_subplot(xlabel="step", ylabel="training loss")
        ax.grid(alpha=0.3)
        for curve in self.curves:
            line, marker, color = curve.style
            steps, losses = curve.points()
            ax.plot(steps, losses, label=plain_label(curve.label), color=color, linestyle=_MPL_LINE[line],
                    marker=_MPL_MARKER[marker], markersize=3, markevery=max(1, len(steps) // 40), lw=1.6)
        ax.set_xlim(0, max(max(c.steps, default=1) for c in self.curves))
        if len(self.curves) > 1:
            ax.legend(loc="upper right", fontsize="small")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()

