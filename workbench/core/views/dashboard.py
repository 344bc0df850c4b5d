"""The live dashboard: a widget view of a training run, updated in place.

A `Dashboard` is a sink (`workbench.core.measure.records`): the loop calls `start`, `log` and
`end` with plain records; the dashboard only draws. `run()` gives every run a view of its
own (`default_sinks`), in the cell that runs it, untouched once its run has ended. Runs
share a view only when the notebook passes one view to each (`sinks=[view]`): one curve
per run, and a table of them.

Widgets are built once and only their values change. The browser draws the loss curve from
the points the kernel sends (`loss_plot`, bqplot); the numbers (`run_numbers`) say which are
the last interval's and which the run's means. Each part refreshes at most every
`numbers_interval_s` / `plot_interval_s`, within `_VIEW_BUDGET` of the run's time; `end`
draws the final state, and leaves the curve as an ordinary PNG output for readers without
a kernel (GitHub, nbviewer) while the live figure steps aside.

Example:
    >>> view = Dashboard()  # doctest: +SKIP
    >>> for batch in (32, 256):  # doctest: +SKIP
    ...     run(RunConfig(model="mlp", batch_size=batch), sinks=[view], name=f"batch {batch}")
"""

from __future__ import annotations

import html
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.base.arguments import flag, function, seconds
from workbench.base.report import format_bytes
from workbench.core.measure.records import RunEnd, RunStart, Sink, StepRecord
from workbench.core.measure.result import format_metric
from workbench.core.views import run_numbers
from workbench.core.views.loss_plot import LossPlot
from workbench.core.views.sinks import TextSink
from workbench.machine import environment

_MAX_SHOWN_ERRORS = 5
# The share of a run's wall time its view may take while it trains. Before each update the
# view checks that its time in log() so far, plus the update's typical cost, stays within
# this share of the time since the run's first log step: a slow machine draws less often
# rather than slowing the run down. In a kernel an update costs ~1-1.5 ms (~3 ms on this 2-core machine
# under load: handing the messages to the kernel's IOPub thread), so at 2 Hz about 0.3-0.6%.
_VIEW_BUDGET = 0.01
# Under a tight budget, the most curve updates in a row before the numbers get a turn.
_PLOTS_PER_NUMBERS = 2


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
    headless = environment.flag("WORKBENCH_HEADLESS")  # None: unset
    if headless:
        return "WORKBENCH_HEADLESS is set"
    # nbval's kernel is a real ipykernel that nobody watches: pytest puts
    # PYTEST_VERSION in the environment and the kernels it starts inherit it.
    under_test = "PYTEST_VERSION" in os.environ or "PYTEST_CURRENT_TEST" in os.environ
    if headless is None and (under_test or "nbval" in sys.modules):
        return "running under pytest/nbval"
    shell, zmqshell = _shell(), sys.modules.get("ipykernel.zmqshell")
    if shell is None or zmqshell is None or not isinstance(shell, zmqshell.ZMQInteractiveShell):
        return "not in a Jupyter kernel"
    return None


def default_sinks() -> list[Sink]:
    """What a run shows when given no sinks: a new dashboard of its own in a notebook,
    a throttled text printer everywhere else (CLI, scripts, CI, nbval)."""
    return [TextSink()] if headless_reason() is not None else [Dashboard()]


@dataclass(eq=False)
class _RunView:
    label: str
    start: RunStart
    curve: Any
    started_at: float
    status: str = "running"
    last: StepRecord | None = None
    interval_first_step: int | None = 1
    """The first step of the last record's interval (None: unknown)."""
    end: RunEnd | None = None
    ended_at: float | None = None
    first_log_at: float | None = None
    """When the first log step arrived: the view's budget counts from there."""


class Dashboard:
    """Live widgets for a run (or, when passed to several, for each in turn): status,
    progress, labelled numbers, the loss curve, and a table of finished runs.

    Args:
        numbers_interval_s: least time between refreshes of the numbers.
        plot_interval_s: least time between sending the curve's points to the browser.
        auto_display: inside IPython, show the view in each cell that starts a run on it,
            and its final curve as a static PNG output when a run ends.
        clock: monotonic seconds for throttling and durations; tests pass a fake one.
        timer: what the view's own work is timed with (its budget); tests pass a fake one, so a
            budget test checks the policy, not how fast this machine draws under load.
    """

    def __init__(self, *, numbers_interval_s: float = 0.25, plot_interval_s: float = 0.5, auto_display: bool = True,
                 clock: Callable[[], float] = time.monotonic, timer: Callable[[], float] = time.perf_counter) -> None:
        numbers_interval_s = seconds("numbers_interval_s", numbers_interval_s, example="numbers_interval_s=0.25")
        plot_interval_s = seconds("plot_interval_s", plot_interval_s, example="plot_interval_s=0.5")
        flag("auto_display", auto_display)
        function("clock", clock, example="clock=time.monotonic")
        function("timer", timer, example="timer=time.perf_counter")
        import ipywidgets as w  # heavy imports only once a dashboard is made

        self.numbers_interval_s, self.plot_interval_s = numbers_interval_s, plot_interval_s
        self.auto_display, self.clock, self.timer = auto_display, clock, timer
        self.runs: list[_RunView] = []
        self.current: _RunView | None = None
        self.values: dict[str, str] = {}  # the numbers last shown, by key: for tests
        self.numbers_updates = self.plot_updates = self.errors_seen = 0
        self.busy_s = 0.0
        """Seconds spent in this view's start/log/end so far (the static PNG included)."""
        self.live_busy_s = 0.0
        """Seconds the current run's log() calls took: what `_VIEW_BUDGET` bounds."""
        self.last_png: bytes | None = None
        self._last_numbers = self._last_plot = -math.inf
        self._plots_since_numbers = 0  # curve updates since the numbers' last
        self._plot_refused = False  # since the numbers' last: the curve alone fills the budget
        self._costs: dict[str, float] = {}
        self._displayed_in: int | None = None
        self._handle: Any = None  # the display of this view in the cell that shows it
        self._static: Any = None  # the display handle of this cell's static plot
        self._static_in: int | None = None

        def part(widget: Any, name: str) -> Any:
            widget.add_class(name)  # a stable wb-* class for browser tests
            return widget

        hidden = {"display": "none"}
        self.title = part(w.HTML(layout={"flex": "1 1 auto"}), "wb-title")
        self.status = part(w.HTML("waiting for a run"), "wb-status")
        self.progress = part(w.IntProgress(min=0, max=1, bar_style="info"), "wb-progress")
        self.step_text = part(w.HTML(layout={"flex": "1 1 auto", "margin": "0 0 0 0.8em"}), "wb-step")
        self.warnings = part(w.HTML(layout=hidden), "wb-warnings")
        self.details = part(w.HTML(layout=hidden), "wb-details")
        self.numbers = part(w.HTML(), "wb-numbers")
        self.history = part(w.HTML(layout=hidden), "wb-history")
        self.errors = part(w.Output(), "wb-errors")
        self.plot = LossPlot()
        self.plot.figure.layout.display = "none"  # until the first point: never an empty frame
        part(self.plot.figure, "wb-plot")
        # The plot comes last so the static copy shown at the end lands where it was.
        self.widget = part(w.VBox([
            w.HBox([self.title, self.status], layout={"align_items": "center"}),
            w.HBox([self.progress, self.step_text], layout={"align_items": "center"}),
            self.warnings, self.details, self.numbers, self.history, self.errors, self.plot.note, self.plot.figure,
        ]), "wb-dashboard")

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        # What a reader without the widget state (GitHub) sees instead of "VBox(children=...)".
        bundle["text/plain"] = self.summary()
        self._displayed_in = _cell()
        return bundle

    def summary(self) -> str:
        """One line per run: its name, status and run-mean figures (the view's plain-text form)."""
        if not self.runs:
            return "workbench Dashboard: waiting for a run"
        lines = [run_numbers.summary_line(v.label, v.status, v.last, v.end, total_steps=v.start.total_steps)
                 for v in self.runs]
        lines += [f"note: {overlap}" for overlap in self.plot.overlaps]
        return "\n".join(lines) + "\n(live view; needs a running kernel. The final curve is the image below.)"

    # -- the Sink protocol; every piece is guarded so a view bug never stops a run --

    def start(self, record: RunStart) -> None:
        if record.rank == 0:  # other processes' records would mix into the view
            began = self.timer()
            self._guard("start", self._start, record)
            self.busy_s += self.timer() - began

    def log(self, record: StepRecord) -> None:
        if record.rank != 0:
            return
        began = self.timer()
        if self._guard("log", self._record, record):
            now = self.clock()
            # The curve first: when the budget is tight it is the part a learner watches.
            if now - self._last_plot >= self.plot_interval_s:
                if self._affordable("plot", now):
                    self._last_plot = now
                    self._plots_since_numbers += 1
                    self._guard("plot", self._timed, "plot", self._draw_plot)
                else:
                    self._plot_refused = True
            if now - self._last_numbers >= self.numbers_interval_s and self._affordable("numbers", now):
                self._last_numbers = now
                self._plots_since_numbers, self._plot_refused = 0, False
                self._guard("numbers", self._timed, "numbers", self._draw_numbers)
        spent = self.timer() - began
        self.busy_s += spent
        self.live_busy_s += spent

    def _affordable(self, part: str, now: float) -> bool:
        """Whether an update of `part` keeps the view within its budget of the time since its
        run's first log step. When the budget is tight (a loaded machine) the curve keeps its pace
        and the numbers slow down, but never stop. Each leaves room for the other in turn: the
        numbers for the next curve update, until the curve has moved `_PLOTS_PER_NUMBERS` times
        without them; then, if the curve alone fills the budget (it was refused since the numbers'
        last update), the curve for the numbers. Without the first turn, a curve dearer than the
        budget allows at 2 Hz took every bit of room as it freed (CI, a busy core); without the
        second, a curve cheaper than the numbers fitted into the freed room first, every time (make
        test beside a browser). Both times the step counter stayed at "step 20 / 3000" while the
        curve grew."""
        if (self._last_plot if part == "plot" else self._last_numbers) == -math.inf:
            return True  # each part's first update of a run goes at once
        view = self.current
        elapsed = now - view.first_log_at if view is not None and view.first_log_at is not None else 0.0
        turn = self._plots_since_numbers >= _PLOTS_PER_NUMBERS
        if part == "numbers":
            leave_room = "plot" if not turn else None
        else:
            numbers_due = now - self._last_numbers >= self.numbers_interval_s
            leave_room = "numbers" if turn and numbers_due and self._plot_refused else None
        cost = self._costs.get(part, 0.0) + (self._costs.get(leave_room, 0.0) if leave_room else 0.0)
        return self.live_busy_s + cost <= _VIEW_BUDGET * elapsed

    def _timed(self, part: str, draw: Callable[[], None]) -> None:
        """Draw, and keep a smoothed cost of the part (single updates spike to ~5 ms)."""
        began = self.timer()
        draw()
        cost, previous = self.timer() - began, self._costs.get(part)
        self._costs[part] = cost if previous is None else 0.8 * previous + 0.2 * cost

    def end(self, record: RunEnd) -> None:
        if record.rank != 0:
            return
        began = self.timer()
        self._guard("end", self._end, record)
        self._guard("final numbers", self._draw_numbers)
        self._guard("final plot", self._draw_plot)
        if self.auto_display:
            self._guard("static plot", self._show_static)
        self.busy_s += self.timer() - began

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
            self._end(RunEnd(self.current.start.run_name, "interrupted", done, "a new run started on this view"))
        taken = sum(view.start.run_name == record.run_name for view in self.runs)
        label = record.run_name if taken == 0 else f"{record.run_name} ({taken + 1})"
        curve = self.plot.add_curve(label)
        self.current = view = _RunView(label, record, curve, started_at=self.clock())
        self.runs.append(view)
        self.values = {}
        self.title.value = " &middot; ".join(
            [f"<b>{html.escape(label)}</b>", html.escape(record.device), html.escape(record.precision)])
        self.status.value = run_numbers.status_html("running")
        self.progress.max, self.progress.value = max(record.total_steps, 1), 0
        self.progress.bar_style = run_numbers.STATUS["running"][2]
        self.step_text.value = f"step 0 / {record.total_steps} &middot; starting"
        self.warnings.value = "".join(
            f'<div style="color:var(--jp-warn-color0,#e65100)">&#9888; {html.escape(text)}</div>'
            for text in record.warnings)
        self.warnings.layout.display = None if record.warnings else "none"
        self.details.value, self.details.layout.display = "", "none"
        self.numbers.value = '<span style="opacity:0.6">the numbers appear at the first log step</span>'
        self._last_numbers = self._last_plot = -math.inf  # show the first step at once
        self._plots_since_numbers, self._plot_refused = 0, False
        self.live_busy_s = 0.0  # each run's budget is its own
        if self.auto_display and _shell() is not None and self._displayed_in != _cell():
            # notebook-only: importing workbench stays free of Jupyter (tests/test_dashboard.py)
            from IPython.display import display

            self._handle = display(self, display_id=True)  # in the cell that runs, so the learner sees it

    def _record(self, record: StepRecord) -> None:
        if self.current is None or self.current.status != "running":
            # A log without a start (a sink attached mid-run): make one up.
            self._start(RunStart(record.run_name, record.total_steps, "?", "?", {}))
        view = self.current
        if view.last is not None:
            view.interval_first_step = view.last.step + 1
        elif view.start.config.get("resume_from"):
            view.interval_first_step = None  # it began where the saved run stopped
        else:  # step 1 (exact counting, warm-up) is timed alone, and left out of the run's timings
            view.interval_first_step = 1 if record.step == 1 else 2
        if record.loss is not None:  # a monitored loop that gives no loss: no point, never a made-up one
            view.curve.add(record.step, record.loss)
        view.last = record
        if view.first_log_at is None:
            view.first_log_at = self.clock()

    def _end(self, record: RunEnd) -> None:
        view = self.current
        if view is None or view.status != "running":  # an end without a start
            self._start(RunStart(record.run_name, max(record.steps_done, 1), "?", "?", {}))
            view = self.current
        view.status, view.end, view.ended_at = record.status, record, self.clock()
        word, _, bar = run_numbers.STATUS.get(record.status, (record.status, "", "danger"))
        self.status.value = run_numbers.status_html(record.status)
        self.progress.bar_style = bar
        # Once over, the bar is filled in the status's colour (green, orange, red): a bar filled to
        # where a run stopped looks empty at step 1 of 200. The step line says where it stopped.
        self.progress.value = self.progress.max
        if record.status != "ok" or record.message:  # a failure, or a note (a monitored loop measured no loss)
            self.details.value = run_numbers.details_html(record, total_steps=view.start.total_steps)
            self.details.layout.display = None
        self.plot.note_overlaps()
        if len(self.runs) > 1:
            self._draw_history()

    def _draw_history(self) -> None:
        rows = []
        for view in self.runs:
            last, final = view.last, (view.end.summary if view.end else {})
            peak = last and last.memory_peak_bytes
            rows.append([
                view.label, run_numbers.STATUS.get(view.status, (view.status,))[0],
                str(view.end.steps_done if view.end else (last.step if last else 0)),
                f"{last.loss:.4f}" if last and last.loss is not None else "-",
                format_metric("step_time_s", final.get("step_time_s", last and last.mean_step_time_s)),
                format_metric("samples_per_sec", final.get("samples_per_sec", last and last.mean_samples_per_sec)),
                f"{format_bytes(peak)} ({last.memory_kind})" if peak else "-",
            ])
        self.history.value = run_numbers.runs_table_html(rows)
        self.history.layout.display = None

    def _draw_numbers(self) -> None:
        view = self.current
        if view is None:
            return
        record, end, total = view.last, view.end, view.start.total_steps
        now = view.ended_at if view.ended_at is not None else self.clock()
        elapsed = run_numbers.duration(now - view.started_at)
        if end is None:
            per_step = (record.mean_step_time_s or record.step_time_s) if record else math.nan
            step = record.step if record else 0
            self.progress.value = min(step, self.progress.max)
            eta = run_numbers.duration((total - step) * per_step)
            self.step_text.value = f"step {step} / {total} &middot; {elapsed} elapsed &middot; ETA {eta}"
        elif end.status == "ok":
            self.step_text.value = f"step {end.steps_done} / {total} &middot; took {elapsed}"
        else:
            logged = (f" &middot; figures from step {record.step} (last log)"
                      if record and record.step != end.steps_done else "")
            self.step_text.value = f"stopped at step {end.steps_done} / {total} &middot; took {elapsed}{logged}"
        if record is None:
            if end is not None:
                self.numbers.value = '<span style="opacity:0.6">no step was logged before the run stopped</span>'
            return
        final = end.summary if end is not None else None
        rates = run_numbers.rate_rows(record, peak_source=view.start.peak_flops_source, final=final)
        figures = run_numbers.other_figures(record, memory_total_bytes=view.start.memory_total_bytes)
        self.values = {r.key: r.last for r in rates if r.last is not None}
        self.values.update({f"mean_{r.key}": r.mean for r in rates if r.mean is not None})
        self.values.update({key: text for key, _, text in figures})
        self.numbers.value = run_numbers.numbers_html(
            rates, figures, interval=(view.interval_first_step, record.step), final=end is not None)
        self.numbers_updates += 1

    def _draw_plot(self) -> None:
        view = self.current
        if view is None or not view.curve.steps:
            return
        if self.plot.figure.layout.display == "none" and view.end is None:
            # Shown before the points are sent: the two are separate messages, and a browser that
            # rendered between them (a loaded machine) showed a drawn curve still hidden.
            self.plot.figure.layout.display = None
        self.plot.draw(view.curve)  # only the current run's curve moves
        self.plot_updates += 1

    def _show_static(self) -> None:
        """Leave the final curve in the cell's outputs as a PNG a saved notebook keeps, and
        the view's plain-text form (what GitHub shows) saying how the run ended."""
        if _shell() is None:
            return
        # notebook-only: importing workbench stays free of Jupyter (tests/test_dashboard.py)
        from IPython.display import Image, display

        self.last_png = self.plot.png()
        if self.last_png is not None:
            self.plot.figure.layout.display = "none"  # the static copy just below shows the same curves
        if self._handle is not None and self._displayed_in == _cell():
            self._handle.update(self)  # re-rendered: its plain text now says how the run ended
        if self.last_png is None:
            return
        image = Image(data=self.last_png, format="png")
        if self._static is not None and self._static_in == _cell():
            self._static.update(image)  # one image per cell, showing every run so far
        else:
            self._static, self._static_in = display(image, display_id=True), _cell()
