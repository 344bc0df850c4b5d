"""The live dashboard, driven with synthetic records and a fake clock (no kernel, no browser)."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("bqplot")
pytest.importorskip("matplotlib")

from workbench.core.measure.records import RunEnd, RunStart, StepRecord  # noqa: E402
from workbench.core.views import dashboard as dashboard_module  # noqa: E402
from workbench.core.views.dashboard import Dashboard, default_sinks, headless_reason  # noqa: E402
from workbench.core.views.sinks import TextSink  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def start(name: str = "baseline", total: int = 100, **kw) -> RunStart:
    return RunStart(run_name=name, total_steps=total, device="cpu", precision="fp32", config={}, **kw)


def step(i: int, name: str = "baseline", total: int = 100, **kw) -> StepRecord:
    fields = dict(
        run_name=name, step=i, total_steps=total, loss=2.0 / i, elapsed_s=0.1 * i,
        step_time_s=0.1, samples_per_sec=1000.0 + i,
    )
    fields.update(kw)
    return StepRecord(**fields)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def dash(clock: FakeClock) -> Dashboard:
    """A view on a fake clock whose own work costs nothing by its timer: it draws whenever its
    intervals allow, whatever the machine's load (with the real timer, a loaded machine's slow
    draws used up the view's budget: tests that expect every update failed under a busy core)."""
    return Dashboard(auto_display=False, clock=clock, timer=FakeClock())


def widget_state(dash: Dashboard) -> dict:
    """Every value a reader sees in the view."""
    return {
        "title": dash.title.value, "status": dash.status.value, "step": dash.step_text.value,
        "numbers": dash.numbers.value, "details": dash.details.value, "history": dash.history.value,
        "bar": (dash.progress.value, dash.progress.max, dash.progress.bar_style),
        "curves": [(list(c.mark.x), list(c.mark.y)) for c in dash.plot.curves],
    }


def test_dashboard_shows_step_loss_and_throughput_of_the_current_run(dash, clock):
    dash.start(start(total=100, warnings=("bf16 is emulated on this CPU",)))
    assert "baseline" in dash.title.value and "running" in dash.status.value
    assert "emulated" in dash.warnings.value and dash.warnings.layout.display is None

    dash.log(step(1))
    assert dash.progress.value == 1 and dash.progress.max == 100
    assert "step 1 / 100" in dash.step_text.value and "ETA" in dash.step_text.value
    assert dash.values["samples_per_sec"] == "1,001"
    assert dash.values["loss"] == "2.0000"

    clock.now += 1.0
    dash.log(step(50, memory_bytes=3 << 20, memory_peak_bytes=5 << 20, memory_kind="CUDA allocated"))
    assert dash.progress.value == 50
    assert dash.values["samples_per_sec"] == "1,050"
    assert dash.values["memory"] == "3.0 MiB"
    assert 'data-k="memory_peak"' in dash.numbers.value and "CUDA allocated, peak" in dash.numbers.value


def test_numbers_say_which_are_the_last_interval_and_which_the_run_mean(dash, clock):
    dash.start(start(total=200))
    dash.log(step(50, step_time_s=0.0059, samples_per_sec=10917.0, mean_step_time_s=0.0076,
                  mean_samples_per_sec=8451.0))
    assert dash.values["step_time_s"] == "5.9" and dash.values["mean_step_time_s"] == "7.6"
    assert dash.values["samples_per_sec"] == "10,917" and dash.values["mean_samples_per_sec"] == "8,451"
    # The first interval is steps 2-50: step 1 counts bytes and FLOPs exactly and is not timed.
    assert "last interval" in dash.numbers.value and "steps 2&ndash;50" in dash.numbers.value
    assert "run mean" in dash.numbers.value and "so far" in dash.numbers.value
    clock.now += 1
    dash.log(step(60, mean_step_time_s=0.0075, mean_samples_per_sec=8500.0))
    assert "steps 51&ndash;60" in dash.numbers.value


def test_the_view_ends_on_the_figures_of_the_run_result(dash):
    dash.start(start(total=100))
    dash.log(step(100, step_time_s=0.0059, mean_step_time_s=0.00761, mean_samples_per_sec=8451.4))
    # RunEnd.summary is the RunResult's: the view shows those, as the results table writes them.
    dash.end(RunEnd("baseline", "ok", 100, summary={"step_time_s": 0.00759, "samples_per_sec": 8452.6}))
    assert dash.values["mean_step_time_s"] == "7.6" and dash.values["mean_samples_per_sec"] == "8,453"
    assert "= results table" in dash.numbers.value


def test_a_real_run_ends_with_the_results_tables_numbers():
    from workbench.core.config import RunConfig
    from workbench.core.engine.train import run as train_run
    from workbench.planner.fit import check_fits

    run = functools.partial(train_run, check_fit=check_fits)  # as wb.run, without its default view
    from workbench.core.measure.result import results_table

    view = Dashboard(auto_display=False)
    result = run(RunConfig(model="mlp", data="digits", dims={"hidden": (16,)}, steps=12, log_every=5,
                           eval_samples=0, preset="cpu-quick"), sinks=[view], name="tiny")
    table = results_table([result])
    row = dict(zip(table.header, table.rows[0]))
    assert view.values["mean_step_time_s"] == row["ms / step"]
    assert view.values["mean_samples_per_sec"] == row["samples / s"]
    assert view.values["loss"] == row["final train loss"]


def test_mfu_is_shown_against_a_native_peak_for_the_interval_and_the_run(dash):
    dash.start(start(peak_flops=1e12, peak_flops_source="A100 spec sheet (dense)"))
    dash.log(step(10, tflops_per_sec=0.25, mfu=0.25, mean_mfu=0.2, mean_step_time_s=0.125))
    assert dash.values["mfu"] == "25.0%" and dash.values["mean_mfu"] == "20.0%"
    assert dash.values["tflops_per_sec"] == "0.25" and dash.values["mean_tflops_per_sec"] == "0.2"


def test_mfu_is_na_with_the_reason_when_there_is_no_native_peak(dash):
    dash.start(RunStart("baseline", 100, "cpu", "bf16", {}, peak_flops=None,
                        peak_flops_source="emulated on this CPU: no native peak"))
    dash.log(step(10, tflops_per_sec=0.01))
    assert dash.values["mfu"] == "n/a (emulated on this CPU: no native peak)"
    assert "mean_mfu" not in dash.values
    dash.log(step(20))  # no FLOP count at all
    dash.end(RunEnd("baseline", "ok", 20))
    assert dash.values["mfu"] == "n/a (FLOPs not counted)"


def test_optional_numbers_are_shown_only_when_the_record_has_them(dash):
    dash.start(start(memory_total_bytes=8 << 30))
    dash.log(step(1))
    for absent in ("tokens_per_sec", "tflops_per_sec", "memory", "memory_reserved", "activation_bytes",
                   "data_wait", "mean_step_time_s"):
        assert absent not in dash.values
    dash.end(RunEnd("baseline", "ok", 1))

    gpt = Dashboard(auto_display=False)
    gpt.start(start("gpt"))
    gpt.log(step(1, name="gpt", tokens_per_sec=4096.0, mean_tokens_per_sec=4000.0, memory_peak_bytes=1 << 30,
                 memory_reserved_bytes=2 << 30, activation_bytes=1536, data_wait_s=0.025))
    assert gpt.values["tokens_per_sec"] == "4,096" and gpt.values["mean_tokens_per_sec"] == "4,000"
    assert gpt.values["memory_reserved"] == "2.0 GiB"
    assert gpt.values["activation_bytes"] == "1.5 KiB"
    assert gpt.values["data_wait"] == "25% of a step"


def test_the_curve_is_sent_at_least_once_a_second_but_not_for_every_record(timed, clock):
    dash, _ = timed  # the draws' own cost, under load, changed which record got the last update
    dash.start(start(total=1000))
    for i in range(1, 1001):  # a record every 10 ms for 10 s
        clock.now += 0.01
        dash.log(step(i, total=1000))
    assert 10 <= dash.plot_updates <= 21  # 1-2 Hz
    assert dash.numbers_updates <= 41  # at most 4 Hz
    curve = dash.plot.curves[0]
    assert len(curve.steps) == 1000 and 950 <= max(curve.mark.x) < 1000  # the last point waits for the next update

    dash.end(RunEnd("baseline", "ok", 1000))
    assert dash.progress.value == 1000  # end() drew the final state
    assert "step 1000 / 1000" in dash.step_text.value and "took" in dash.step_text.value
    assert list(curve.mark.x)[-1] == 1000


@pytest.fixture
def timed(clock: FakeClock) -> tuple[Dashboard, FakeClock]:
    """A view whose own work is timed by a fake timer: a test's slow part advances it by exactly
    its cost, so the budget's decisions do not depend on this machine's load (with real sleeps
    and draws, a loaded machine read 28 plot updates where the policy gives 30 or more)."""
    cost = FakeClock()
    return Dashboard(auto_display=False, clock=clock, timer=cost), cost


def test_a_slow_view_updates_less_often_so_it_stays_within_its_budget(timed, clock, monkeypatch):
    dash, cost = timed
    draw = dash.plot.draw

    def slow_draw(curve) -> None:  # 20 ms an update: 1% of 20 s allows ten
        cost.now += 0.02
        draw(curve)

    monkeypatch.setattr(dash.plot, "draw", slow_draw)
    dash.start(start(total=200))
    for i in range(1, 201):  # 20 s of records
        clock.now += 0.1
        dash.log(step(i, total=200))
    assert 5 <= dash.plot_updates <= 10, dash.plot_updates
    assert dash.live_busy_s <= 0.01 * clock.now + 0.02  # within 1% (give or take one update)


def test_when_the_budget_is_tight_the_curve_keeps_its_pace_and_the_numbers_wait(timed, clock, monkeypatch):
    dash, cost = timed
    draw = dash._draw_numbers

    def slow_numbers() -> None:  # 20 ms an update
        cost.now += 0.02
        draw()

    monkeypatch.setattr(dash, "_draw_numbers", slow_numbers)
    dash.start(start(total=200))
    for i in range(1, 201):  # 20 s of records
        clock.now += 0.1
        dash.log(step(i, total=200))
    assert dash.plot_updates >= 30, dash.plot_updates  # ~2 Hz, as with a cheap view
    assert 5 <= dash.numbers_updates <= 10, dash.numbers_updates
    assert dash.live_busy_s <= 0.01 * clock.now + 0.02


@pytest.mark.parametrize("plot_cost, numbers_cost", [(0.02, 0.01), (0.01, 0.03)], ids=["curve dearer", "numbers dearer"])
def test_when_the_curve_alone_fills_the_budget_the_numbers_still_move(timed, clock, monkeypatch, plot_cost, numbers_cost):
    # A busy core made each curve update cost more than 1% allows at 2 Hz: the curve took
    # every bit of room as it freed, and the step counter stayed at its first reading
    # ("step 20 / 3000") while the curve grew. With the numbers dearer than the curve, the
    # curve, checked first, fitted into the freed room before them every time (the same frozen
    # counter, a make test beside a browser): after two updates without them it waits its turn.
    dash, cost = timed
    draw, draw_numbers = dash.plot.draw, dash._draw_numbers

    def slow_draw(curve) -> None:
        cost.now += plot_cost
        draw(curve)

    def slow_numbers() -> None:
        cost.now += numbers_cost
        draw_numbers()

    monkeypatch.setattr(dash.plot, "draw", slow_draw)
    monkeypatch.setattr(dash, "_draw_numbers", slow_numbers)
    dash.start(start(total=200))
    shown = []
    for i in range(1, 201):  # 20 s of records
        clock.now += 0.1
        dash.log(step(i, total=200))
        shown.append(dash.step_text.value.split(" &middot;")[0])
    assert dash.numbers_updates >= 3, dash.numbers_updates  # one after every two curve updates
    assert len(set(shown)) >= 3, sorted(set(shown))
    assert 3 <= dash.plot_updates <= 10, dash.plot_updates  # the curve keeps what the budget gives it
    assert dash.live_busy_s <= 0.01 * clock.now + max(plot_cost, numbers_cost)  # within 1%, give or take one update


def test_the_curve_is_hidden_until_its_first_point(dash):
    dash.start(start())
    assert dash.plot.figure.layout.display == "none"  # no empty frame, no broken image
    dash.log(step(1))
    assert dash.plot.figure.layout.display is None


def test_an_interrupted_run_says_where_it_stopped_consistently(dash, clock):
    dash.start(start(total=200))
    dash.log(step(10, total=200))
    clock.now += 2
    dash.end(RunEnd("baseline", "interrupted", 17, message="stopped by the user at step 17"))
    assert "interrupted" in dash.status.value and "stopped by the user" not in dash.status.value
    assert "stopped at step 17 / 200" in dash.step_text.value and "figures from step 10" in dash.step_text.value
    assert "interrupted at step 17 of 200" in dash.details.value and "<details" in dash.details.value
    assert "last_result()" in dash.details.value and dash.details.layout.display is None
    assert dash.progress.bar_style == "warning" and dash.progress.value == dash.progress.max


@pytest.mark.parametrize("status, word", [("oom", "out of memory"), ("failed", "failed")])
def test_a_failure_shows_a_short_status_a_red_bar_and_folded_details(dash, status, word):
    message = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB " * 3
    dash.start(start(total=200))
    dash.end(RunEnd("baseline", status, 1, message=message))
    assert word in dash.status.value and "Tried to allocate" not in dash.status.value
    assert dash.progress.bar_style == "danger" and dash.progress.value == dash.progress.max
    assert f"{word} at step 1 of 200" in dash.details.value and "Tried to allocate" in dash.details.value
    assert "<details" in dash.details.value and "<details open" not in dash.details.value
    assert "no step was logged" in dash.numbers.value
    assert dash.plot.figure.layout.display == "none" and dash.plot.png() is None


def test_a_done_run_has_a_full_green_bar_and_no_details(dash):
    dash.start(start(total=3))
    dash.log(step(3, total=3))
    dash.end(RunEnd("baseline", "ok", 3))
    assert "done" in dash.status.value and dash.progress.bar_style == "success"
    assert dash.details.layout.display == "none"


def test_each_run_gets_a_view_of_its_own_that_never_changes_after_it_ends(monkeypatch, clock):
    monkeypatch.setattr(dashboard_module, "headless_reason", lambda: None)
    first_sinks, second_sinks = default_sinks(), default_sinks()
    first, second = first_sinks[0], second_sinks[0]
    assert isinstance(first, Dashboard) and isinstance(second, Dashboard) and first is not second
    for view in (first, second):
        view.auto_display = False
    first.start(start("batch 32"))
    first.log(step(1, name="batch 32"))
    first.end(RunEnd("batch 32", "ok", 1))
    before = widget_state(first)
    second.start(start("batch 256"))
    second.log(step(1, name="batch 256", loss=9.0))
    second.end(RunEnd("batch 256", "failed", 1, message="boom"))
    assert widget_state(first) == before
    assert "batch 256" not in str(before)


def test_runs_share_a_view_only_when_it_is_passed_to_each(dash, clock):
    for name in ("baseline", "amp"):
        dash.start(start(name, total=3))
        for i in (1, 2, 3):
            clock.now += 1
            dash.log(step(i, name=name, total=3, loss=1.0 / i if name == "baseline" else 2.0 / i))
        dash.end(RunEnd(name, "ok", 3))
    assert [c.label for c in dash.plot.curves] == ["baseline", "amp"]
    assert all(c.mark.display_legend for c in dash.plot.curves)
    assert all(len(c.mark.x) == 3 for c in dash.plot.curves)
    assert dash.history.layout.display is None and "amp" in dash.history.value
    assert "amp" in dash.title.value  # the numbers show the current run
    assert dash.plot.overlaps == []


def test_a_single_run_view_has_no_legend_and_no_table(dash):
    dash.start(start(total=1))
    dash.log(step(1, total=1))
    dash.end(RunEnd("baseline", "ok", 1))
    assert not dash.plot.curves[0].mark.display_legend
    assert dash.history.layout.display == "none"


def test_curves_that_lie_on_each_other_stay_visible_and_are_named(dash, clock):
    for name in ("fp32", "fp16", "bf16"):
        dash.start(start(name, total=3))
        for i in (1, 2, 3):
            clock.now += 1
            dash.log(step(i, name=name, total=3))  # the same losses
        dash.end(RunEnd(name, "ok", 3))
    styles = [c.style[:2] for c in dash.plot.curves]
    assert len(set(styles)) == 3  # each its own dashes and markers
    assert dash.plot.overlaps == ["fp16 (dashed, circle markers) lies on fp32",
                                  "bf16 (dotted, square markers) lies on fp32"]
    assert dash.plot.note.layout.display is None and "lies on" in dash.plot.note.value
    assert "note: bf16 (dotted, square markers) lies on fp32" in dash.summary()  # what GitHub shows


def test_a_repeated_run_name_gets_its_own_curve_label(dash):
    for _ in range(2):
        dash.start(start("baseline", total=1))
        dash.log(step(1, total=1))
        dash.end(RunEnd("baseline", "ok", 1))
    assert [c.label for c in dash.plot.curves] == ["baseline", "baseline (2)"]


def test_errors_in_drawing_are_shown_and_never_reach_the_run(dash, monkeypatch):
    def broken(curve) -> None:
        raise RuntimeError("plot exploded")

    monkeypatch.setattr(dash.plot, "draw", broken)
    dash.start(start())
    dash.log(step(1))  # must not raise
    dash.log(step(2, loss=None))  # a malformed record must not raise either
    dash.end(RunEnd("baseline", "ok", 2))
    assert dash.errors_seen >= 2
    shown = "".join(output["text"] for output in dash.errors.outputs)
    assert "plot exploded" in shown and "the run goes on" in shown
    assert "done" in dash.status.value  # the rest of the view still works


def test_a_flood_of_dashboard_errors_is_capped(dash, monkeypatch):
    monkeypatch.setattr(dash, "_draw_numbers", lambda: 1 / 0)
    dash.start(start())
    for i in range(1, 20):
        dash.clock.now += 1
        dash.log(step(i))
    assert dash.errors_seen == 19
    assert len(dash.errors.outputs) <= 6


def test_records_from_other_ranks_are_ignored(dash):
    dash.start(start())
    dash.log(step(1))
    dash.log(step(7, rank=1))
    assert dash.progress.value == 1 and dash.plot.curves[0].steps == [1]


def test_a_log_without_start_still_shows(dash):
    dash.log(step(3))
    assert dash.progress.value == 3 and dash.plot.curves[0].label == "baseline"


def test_the_view_counts_its_own_time(clock):
    dash = Dashboard(auto_display=False, clock=clock)  # the real timer: what the view's own time is
    dash.start(start())
    dash.log(step(1))
    dash.end(RunEnd("baseline", "ok", 1))
    assert 0 < dash.busy_s < 5


class FakeShell:
    execution_count = 5


@pytest.fixture
def shown(monkeypatch) -> list:
    """What the dashboard displays, in a fake IPython cell 5."""
    import IPython.display

    shown: list = []

    class Handle:
        def update(self, obj) -> None:
            shown.append(("update", obj))
            if isinstance(obj, Dashboard):
                shown.append(("text", obj._repr_mimebundle_()["text/plain"]))

    def fake_display(obj, display_id=False):
        shown.append(("display", obj))
        if isinstance(obj, Dashboard):
            obj._repr_mimebundle_()  # what IPython does with it
        return Handle() if display_id else None

    monkeypatch.setattr(dashboard_module, "_shell", lambda: FakeShell)
    monkeypatch.setattr(IPython.display, "display", fake_display)
    return shown


def test_a_finished_run_leaves_its_curve_as_a_static_png_and_a_text_summary(shown, clock):
    dash = Dashboard(clock=clock)
    dash.start(start("baseline", total=2))
    dash.log(step(1, total=2))
    dash.log(step(2, total=2, mean_step_time_s=0.0076))
    dash.end(RunEnd("baseline", "ok", 2, summary={"step_time_s": 0.0076}))
    kinds = [(kind, type(obj).__name__) for kind, obj in shown]
    assert kinds == [("display", "Dashboard"), ("update", "Dashboard"), ("text", "str"), ("display", "Image")]
    assert shown[2][1].startswith("baseline: done, step 2 / 2, 7.6 ms/step (run mean), final loss 1.0000")
    assert shown[-1][1].data == dash.last_png and dash.last_png.startswith(b"\x89PNG")
    assert dash.plot.figure.layout.display == "none"  # the static copy below replaces the live plot


def test_a_shared_view_keeps_one_static_png_per_cell(shown, clock):
    dash = Dashboard(clock=clock)
    for name in ("baseline", "amp"):  # two runs in one cell
        dash.start(start(name, total=1))
        dash.log(step(1, name=name, total=1))
        dash.end(RunEnd(name, "ok", 1))
    images = [kind for kind, obj in shown if type(obj).__name__ == "Image"]
    assert images == ["display", "update"]

    FakeShell.execution_count = 6  # a run in the next cell shows the view there too
    try:
        dash.start(start("qat", total=1))
        assert shown[-1][0] == "display" and shown[-1][1] is dash
    finally:
        FakeShell.execution_count = 5


def test_a_run_that_logged_nothing_displays_no_image(shown):
    dash = Dashboard()
    dash.start(start(total=30))
    dash.end(RunEnd("baseline", "oom", 1, message="out of memory"))
    assert "Image" not in [type(obj).__name__ for _, obj in shown]


def test_dashboard_text_form_explains_itself():
    bundle = Dashboard(auto_display=False)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("workbench Dashboard")


def test_default_sinks_is_text_when_workbench_headless_is_set(monkeypatch):
    monkeypatch.setenv("WORKBENCH_HEADLESS", "1")
    sinks = default_sinks()
    assert len(sinks) == 1 and isinstance(sinks[0], TextSink)


def test_default_sinks_is_text_under_pytest_and_outside_a_kernel(monkeypatch):
    monkeypatch.delenv("WORKBENCH_HEADLESS", raising=False)
    assert headless_reason() == "running under pytest/nbval"
    monkeypatch.setenv("WORKBENCH_HEADLESS", "0")
    assert headless_reason() == "not in a Jupyter kernel"
    assert isinstance(default_sinks()[0], TextSink)


def test_importing_the_dashboard_module_stays_light():
    code = (
        "import sys, workbench.core.views.dashboard; "
        "heavy = [m for m in ('ipywidgets', 'bqplot', 'matplotlib', 'IPython') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)

