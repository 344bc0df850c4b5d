"""The live dashboard: a widget view of training runs, updated in place.

A `Dashboard` is a sink (see `sinks.py`): the loop calls `start`, `log` and `end`
with plain records; the dashboard only draws. Its widgets are built once and only
their values change. Numbers refresh at most every 0.25 s, the loss plot at most
every second (a redraw costs ~20 ms, a trait update ~0.5 ms); `end` always draws
the final state. Runs sharing a dashboard are drawn over each other (one curve per
run), the numbers show the current run, a table lists the finished runs.
`Dashboard.shared()` is the one per kernel that `run()` uses when given no sinks.

The plot is an `Image` widget holding PNG bytes, not an `Output` widget that
re-displays a figure: a redraw is one trait update (a binary buffer), so it does
not flicker or depend on output capture, and the bytes belong to the widget state
when a notebook saves it. The figure is a bare `matplotlib.figure.Figure` drawn by
Agg; pyplot is never touched, so the inline backend cannot show a stray copy at the
end of the cell and no global figure list leaks (what `plt.ioff()` is for, without
the global state). Widget state is not saved by default, so when a run ends the
final plot is also displayed as an ordinary PNG output that nbviewer shows.

Example:
    >>> dash = Dashboard.shared()  # doctest: +SKIP
    >>> baseline = run(RunConfig(model="mlp"), sinks=[dash])  # doctest: +SKIP
"""

from __future__ import annotations

import html
import io
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from workbench.core.report import format_bytes
from workbench.measure.records import RunEnd, RunStart, Sink, StepRecord
from workbench.views.sinks import TextSink

_BAR_STYLE = {"running": "info", "ok": "success", "interrupted": "warning"}  # others: danger
_MAX_SHOWN_ERRORS = 5
# The share of the run's wall time each part of the view may take: after each update
# the next waits at least (its cost / budget), so a redraw of 20 ms waits 2 s. The
# intervals given to Dashboard() are the floor (the fastest it ever updates).
_VIEW_BUDGET = 0.01


def _shell() -> Any:
    """The running IPython shell, or None; never imports IPython itself."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def _cell() -> int | None:
    """Which cell execution we are in (None outside IPython)."""
    return getattr(_shell(), "execution_count", None)


def headless_reason() -> str | None:
    """Why runs here get the text view instead of the dashboard; None in a live notebook.

    WORKBENCH_HEADLESS=1 forces text; WORKBENCH_HEADLESS=0 lifts the pytest/nbval
    check (for a browser test that drives a JupyterLab started from pytest).
    """
    flag = os.environ.get("WORKBENCH_HEADLESS", "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return "WORKBENCH_HEADLESS is set"
    # nbval's kernel is a real ipykernel that nobody watches: pytest puts
    # PYTEST_VERSION in the environment and the kernels it starts inherit it.
    under_test = "PYTEST_VERSION" in os.environ or "PYTEST_CURRENT_TEST" in os.environ
    if flag not in ("0", "false", "no", "off") and (under_test or "nbval" in sys.modules):
        return "running under pytest/nbval"
    shell, zmqshell = _shell(), sys.modules.get("ipykernel.zmqshell")
    if shell is None or zmqshell is None or not isinstance(shell, zmqshell.ZMQInteractiveShell):
        return "not in a Jupyter kernel"
    return None


def default_sinks() -> list[Sink]:
    """What a run shows when given no sinks: the shared dashboard in a notebook,
    a throttled text printer everywhere else (CLI, scripts, CI, nbval)."""
    return [TextSink()] if headless_reason() is not None else [Dashboard.shared()]


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _opt(value: Any, fmt: Callable[[Any], str]) -> str | None:
    return None if value is None else fmt(value)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


@dataclass(slots=True)
class _RunView:
    label: str
    start: RunStart
    status: str = "running"
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    last: StepRecord | None = None
    line: Any = None


class Dashboard:
    """Live widgets for one or more runs: progress, numbers, loss plot, finished runs.

    Args:
        numbers_interval_s: least time between refreshes of the numbers.
        plot_interval_s: least time between plot redraws (raised by itself when a
            redraw is slow, so drawing stays under ~5% of the run).
        auto_display: inside IPython, show the widget in each cell that starts a
            run, and the final plot as a static PNG output when a run ends.
        clock: monotonic seconds; tests pass a fake one.
    """

    _shared: ClassVar[Dashboard | None] = None

    def __init__(
        self,
        *,
        numbers_interval_s: float = 0.25,
        plot_interval_s: float = 1.0,
        auto_display: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import ipywidgets as w  # heavy imports only once a dashboard is made
        from matplotlib.figure import Figure

        self.numbers_interval_s, self.plot_interval_s = numbers_interval_s, plot_interval_s
        self.auto_display, self.clock = auto_display, clock
        self.runs: list[_RunView] = []
        self.current: _RunView | None = None
        self.finished: list[dict[str, str]] = []
        self.values: dict[str, str] = {}  # the numbers last shown, by key: for tests
        self.numbers_updates = self.plot_redraws = self.errors_seen = 0
        self.last_png: bytes | None = None
        self._plot_every, self._numbers_every = plot_interval_s, numbers_interval_s
        self._last_numbers = self._last_plot = -math.inf
        self._displayed_in: int | None = None
        self._static: Any = None  # the display handle of this cell's static plot
        self._static_in: int | None = None

        self.fig = Figure(figsize=(7, 2.8), dpi=100, layout="constrained")
        self.ax = self.fig.add_subplot(xlabel="step", ylabel="training loss")
        self.ax.grid(alpha=0.3)

        def part(widget: Any, name: str) -> Any:
            widget.add_class(name)  # a stable wb-* class for browser tests
            return widget

        hidden = {"display": "none"}
        self.title = part(w.HTML(), "wb-title")
        self.status = part(w.HTML("waiting for a run"), "wb-status")
        self.progress = part(w.IntProgress(min=0, max=1, bar_style="info"), "wb-progress")
        self.step_text = part(w.HTML(), "wb-step")
        self.warnings = part(w.HTML(layout=hidden), "wb-warnings")
        self.numbers = part(w.HTML(), "wb-numbers")
        self.history = part(w.HTML(), "wb-history")
        self.errors = part(w.Output(), "wb-errors")
        # At its natural pixel size, as the static copy will be: no jump when swapped.
        width = f"{self.fig.get_figwidth() * self.fig.dpi:.0f}px"
        plot_layout = {"width": width, "max_width": "100%", **hidden}
        self.plot = part(w.Image(format="png", layout=plot_layout), "wb-plot")
        # The plot comes last so the static copy shown at the end lands where it was.
        self.widget = part(w.VBox([
            w.HBox([self.title, self.status]), w.HBox([self.progress, self.step_text]),
            self.warnings, self.numbers, self.history, self.errors, self.plot,
        ]), "wb-dashboard")

    @classmethod
    def shared(cls) -> Dashboard:
        """The dashboard that runs in this kernel draw on by default (made on first use)."""
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def clear(self) -> None:
        """Forget all runs: the next run starts a fresh plot and table."""
        for view in self.runs:
            view.line.remove()
        if self.ax.get_legend() is not None:
            self.ax.get_legend().remove()
        self.runs, self.finished, self.current, self.values = [], [], None, {}
        self.history.value = self.numbers.value = self.step_text.value = self.title.value = ""
        self.status.value, self.progress.value = "waiting for a run", 0
        self.warnings.layout.display = self.plot.layout.display = "none"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        # What a reader without the widget state sees instead of "VBox(children=...)".
        bundle["text/plain"] = "workbench Dashboard (live view; the final plot is shown below it)"
        self._displayed_in = _cell()
        return bundle

    # -- the Sink protocol; every piece is guarded so a view bug never stops a run --

    def start(self, record: RunStart) -> None:
        if record.rank == 0:  # other processes' records would mix into the view
            self._guard("start", self._start, record)

    def log(self, record: StepRecord) -> None:
        if record.rank != 0 or not self._guard("log", self._record, record):
            return
        now = self.clock()
        if now - self._last_numbers >= self._numbers_every:
            self._last_numbers = now
            self._guard("numbers", self._draw_numbers)
        if now - self._last_plot >= self._plot_every:
            self._last_plot = now
            self._guard("plot", self._draw_plot)

    def end(self, record: RunEnd) -> None:
        if record.rank != 0:
            return
        self._guard("end", self._end, record)
        self._guard("final numbers", self._draw_numbers)
        self._guard("final plot", self._draw_plot)
        if self.auto_display:
            self._guard("static plot", self._show_static)

    def _guard(self, what: str, fn: Callable[..., None], *args: Any) -> bool:
        try:
            fn(*args)
            return True
        except Exception:  # a broken view must never stop the training run
            self.errors_seen += 1
            if self.errors_seen <= _MAX_SHOWN_ERRORS + 1:
                text = f"dashboard error in {what} (the run goes on):\n{traceback.format_exc()}"
                if self.errors_seen > _MAX_SHOWN_ERRORS:
                    text = "further dashboard errors are not shown\n"
                try:
                    self.errors.append_stderr(text)
                except Exception:
                    pass
            return False

    # -- the drawing --

    def _start(self, record: RunStart) -> None:
        if self.current is not None and self.current.status == "running":
            done = self.current.last.step if self.current.last else 0
            self._end(RunEnd(self.current.start.run_name, "interrupted", done, "a new run started"))
        taken = sum(view.start.run_name == record.run_name for view in self.runs)
        label = record.run_name if taken == 0 else f"{record.run_name} ({taken + 1})"
        self.current = view = _RunView(label, record)
        (view.line,) = self.ax.plot([], [], label=label, lw=1.6)
        self.ax.legend(loc="upper right", fontsize="small")
        self.runs.append(view)
        self.values = {}
        self.title.value = " &middot; ".join(
            [f"<b>{html.escape(label)}</b>", html.escape(record.device), html.escape(record.precision), ""]
        )
        self.status.value = "running"
        self.progress.max, self.progress.value = max(record.total_steps, 1), 0
        self.progress.bar_style = _BAR_STYLE["running"]
        self.step_text.value = f"step 0 / {record.total_steps}"
        self.warnings.value = "".join(
            f'<div style="color:var(--jp-warn-color0,#e65100)">&#9888; {html.escape(text)}</div>'
            for text in record.warnings
        )
        self.warnings.layout.display = None if record.warnings else "none"
        self.plot.layout.display = None
        self._last_numbers = self._last_plot = -math.inf  # show the first step at once
        if self.auto_display and _shell() is not None and self._displayed_in != _cell():
            from IPython.display import display

            display(self)  # in every cell that runs, so the learner sees it there

    def _record(self, record: StepRecord) -> None:
        if self.current is None or self.current.status != "running":
            # A log without a start (a sink attached mid-run): make one up.
            self._start(RunStart(record.run_name, record.total_steps, "?", "?", {}))
        view = self.current
        view.steps.append(record.step)
        view.losses.append(record.loss if math.isfinite(record.loss) else math.nan)
        view.last = record

    def _end(self, record: RunEnd) -> None:
        view = self.current
        if view is None or view.status != "running":  # an end without a start
            view = _RunView(record.run_name, RunStart(record.run_name, 0, "?", "?", {}))
        view.status = record.status
        text = "done" if record.status == "ok" else record.status
        text += f": {record.message}" if record.message else ""
        self.status.value = f"<b>{html.escape(text)}</b>"
        self.progress.bar_style = _BAR_STYLE.get(record.status, "danger")
        last = view.last
        peak = last and _opt(last.memory_peak_bytes, format_bytes)
        self.finished.append({
            "run": view.label,
            "status": text,
            "steps": str(record.steps_done),
            "final loss": f"{last.loss:.4f}" if last else "-",
            "ms/step": f"{last.step_time_s * 1e3:.1f}" if last else "-",
            "samples/s": _rate(last.samples_per_sec) if last else "-",
            "memory peak": f"{peak} ({last.memory_kind})" if peak else "-",
        })
        rows = [list(self.finished[0])] + [list(row.values()) for row in self.finished]
        cells = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
        )
        self.history.value = (
            '<table style="font-size:90%" cellpadding="3">'
            f'<caption style="text-align:left">finished runs</caption>{cells}</table>'
        )

    def _draw_numbers(self) -> None:
        view = self.current
        record = view.last if view is not None else None
        if record is None:
            return
        began = time.perf_counter()
        self.progress.value = min(record.step, self.progress.max)
        if view.status == "running":
            # The run's mean is steadier than the last interval; the first log step
            # may have no timed seconds yet (its probe step is left out of timings).
            per_step = record.elapsed_s / record.step if record.elapsed_s > 0 else record.step_time_s
            eta = _duration((record.total_steps - record.step) * per_step)
            timing = f"{_duration(record.elapsed_s)} elapsed &middot; ETA {eta}"
        else:
            timing = f"took {_duration(record.elapsed_s)}"
        self.step_text.value = f"step {record.step} / {record.total_steps} &middot; {timing}"
        kind, total = record.memory_kind, view.start.memory_total_bytes
        peak = _opt(record.memory_peak_bytes, format_bytes)
        if peak and total:
            peak += f" of {format_bytes(total)}"
        wait = record.data_wait_s
        rows: list[tuple[str, str, str | None]] = [
            ("loss", "loss", f"{record.loss:.4f}"),
            ("ms_per_step", "ms/step", f"{record.step_time_s * 1e3:.1f}"),
            ("samples_per_sec", "samples/s", _rate(record.samples_per_sec)),
            ("tokens_per_sec", "tokens/s", _opt(record.tokens_per_sec, _rate)),
            ("tflops_per_sec", "TFLOP/s", _opt(record.tflops_per_sec, "{:.3g}".format)),
            ("mfu", "MFU", _opt(record.mfu, "{:.1%}".format)),
            ("memory", f"{kind} now", _opt(record.memory_bytes, format_bytes)),
            ("memory_peak", f"{kind} peak", peak),
            ("memory_reserved", "CUDA reserved", _opt(record.memory_reserved_bytes, format_bytes)),
            ("activation_bytes", "saved activations (exact)", _opt(record.activation_bytes, format_bytes)),
            ("data_wait", "waiting for data",
             None if wait is None or record.step_time_s <= 0 else f"{wait / record.step_time_s:.0%} of step"),
            ("lr", "learning rate", _opt(record.lr, "{:.3g}".format)),
        ]
        rows += [(key, key, f"{value:.4g}") for key, value in record.extra.items()]
        self.values = {key: value for key, _, value in rows if value is not None}
        self.numbers.value = '<div style="display:flex;flex-wrap:wrap">' + "".join(
            '<div style="min-width:9em;margin:0 1.2em 0.3em 0">'
            f'<div style="font-size:85%;opacity:0.7">{html.escape(label)}</div>'
            f'<b class="wb-v" data-k="{key}">{html.escape(value)}</b></div>'
            for key, label, value in rows if value is not None
        ) + "</div>"
        self.numbers_updates += 1
        self._numbers_every = max(self.numbers_interval_s, (time.perf_counter() - began) / _VIEW_BUDGET)

    def _draw_plot(self) -> None:
        view = self.current
        if view is None or not view.steps:
            return
        began = time.perf_counter()
        view.line.set_data(view.steps, view.losses)  # only the current run's curve moves
        self.ax.relim()
        self.ax.autoscale_view()
        buffer = io.BytesIO()
        self.fig.savefig(buffer, format="png")
        self.last_png = self.plot.value = buffer.getvalue()
        self.plot_redraws += 1
        # A slow machine draws less often rather than slowing the run down.
        self._plot_every = max(self.plot_interval_s, (time.perf_counter() - began) / _VIEW_BUDGET)

    def _show_static(self) -> None:
        """Leave the final plot in the cell's outputs as a PNG a saved notebook keeps."""
        if self.last_png is None or _shell() is None:
            return
        from IPython.display import Image, display

        image = Image(data=self.last_png, format="png")
        if self._static is not None and self._static_in == _cell():
            self._static.update(image)  # one image per cell, showing every run so far
        else:
            self._static, self._static_in = display(image, display_id=True), _cell()
        self.plot.layout.display = "none"  # the static copy just below shows the same figure
