"""The live dashboard, driven with synthetic records (no kernel, no browser)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from workbench.measure.records import RunEnd, RunStart, StepRecord
from workbench.views import dashboard as dashboard_module  # noqa: E402
from workbench.views.dashboard import Dashboard, default_sinks, headless_reason  # noqa: E402
from workbench.views.sinks import TextSink

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
    return Dashboard(auto_display=False, clock=clock)


def test_dashboard_shows_step_loss_and_throughput_of_the_current_run(dash, clock):
    dash.start(start(total=100, warnings=("bf16 is emulated on this CPU",)))
    assert "baseline" in dash.title.value and dash.status.value == "running"
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
    assert 'data-k="memory_peak"' in dash.numbers.value and "CUDA allocated peak" in dash.numbers.value


def test_optional_numbers_are_shown_only_when_the_record_has_them(dash):
    dash.start(start(memory_total_bytes=8 << 30))
    dash.log(step(1))
    for absent in ("tokens_per_sec", "tflops_per_sec", "mfu", "memory", "memory_reserved",
                   "activation_bytes", "data_wait"):
        assert absent not in dash.values
    dash.end(RunEnd("baseline", "ok", 1))

    dash.start(start("gpt"))
    dash.log(step(1, name="gpt", tokens_per_sec=4096.0, tflops_per_sec=0.25, mfu=0.125,
                  memory_peak_bytes=1 << 30, memory_reserved_bytes=2 << 30, activation_bytes=1536,
                  data_wait_s=0.025))
    assert dash.values["tokens_per_sec"] == "4,096"
    assert dash.values["tflops_per_sec"] == "0.25"
    assert dash.values["mfu"] == "12.5%"
    assert dash.values["memory_reserved"] == "2.0 GiB"
    assert dash.values["activation_bytes"] == "1.5 KiB"
    assert dash.values["data_wait"] == "25% of step"


def test_dashboard_redraws_rarely_when_a_thousand_records_arrive_in_one_second(dash, clock):
    dash.start(start(total=1000))
    for i in range(1, 1001):
        clock.now += 0.001
        dash.log(step(i, total=1000))
    assert dash.plot_redraws <= 2  # at most 1 Hz (+ the first step at once)
    assert dash.numbers_updates <= 5  # at most 4 Hz (+ the first)
    assert dash.progress.value < 1000  # the last step fell between updates...

    dash.end(RunEnd("baseline", "ok", 1000))
    assert dash.progress.value == 1000  # ...and end() drew the final state
    assert "step 1000 / 1000" in dash.step_text.value and "took" in dash.step_text.value
    assert list(dash.runs[0].line.get_xdata())[-1] == 1000
    assert dash.last_png is not None and dash.last_png.startswith(b"\x89PNG")


def test_failed_run_keeps_its_final_state_and_shows_the_message(dash):
    dash.start(start())
    dash.log(step(1))
    dash.log(step(2))
    dash.end(RunEnd("baseline", "failed", 2, message="loss became NaN"))
    assert "failed: loss became NaN" in dash.status.value
    assert dash.progress.bar_style == "danger"
    assert dash.progress.value == 2
    assert dash.finished[0]["status"] == "failed: loss became NaN"
    assert "loss became NaN" in dash.history.value


@pytest.mark.parametrize(
    "status, style", [("ok", "success"), ("interrupted", "warning"), ("oom", "danger")]
)
def test_every_end_status_is_shown(dash, status, style):
    dash.start(start())
    dash.log(step(1))
    dash.end(RunEnd("baseline", status, 1))
    assert ("done" if status == "ok" else status) in dash.status.value
    assert dash.progress.bar_style == style


def test_two_runs_draw_two_curves_and_a_table_of_finished_runs(dash, clock):
    for name in ("baseline", "amp"):
        dash.start(start(name, total=3))
        for i in (1, 2, 3):
            clock.now += 1
            dash.log(step(i, name=name, total=3))
        dash.end(RunEnd(name, "ok", 3))
    assert len(dash.ax.lines) == 2
    assert [t.get_text() for t in dash.ax.get_legend().get_texts()] == ["baseline", "amp"]
    assert all(len(line.get_xdata()) == 3 for line in dash.ax.lines)
    assert [row["run"] for row in dash.finished] == ["baseline", "amp"]
    assert "amp" in dash.title.value  # the numbers show the current run


def test_a_repeated_run_name_gets_its_own_legend_entry(dash):
    for _ in range(2):
        dash.start(start("baseline", total=1))
        dash.log(step(1, total=1))
        dash.end(RunEnd("baseline", "ok", 1))
    assert [t.get_text() for t in dash.ax.get_legend().get_texts()] == ["baseline", "baseline (2)"]


def test_clear_forgets_earlier_runs(dash):
    dash.start(start(total=1))
    dash.log(step(1, total=1))
    dash.end(RunEnd("baseline", "ok", 1))
    dash.clear()
    assert len(dash.ax.lines) == 0 and dash.finished == [] and dash.history.value == ""


def test_errors_in_drawing_are_shown_and_never_reach_the_run(dash, monkeypatch):
    def broken() -> None:
        raise RuntimeError("plot exploded")

    monkeypatch.setattr(dash, "_draw_plot", broken)
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
    assert dash.progress.value == 1 and dash.runs[0].steps == [1]


def test_a_log_without_start_still_shows(dash):
    dash.log(step(3))
    assert dash.progress.value == 3 and dash.runs[0].label == "baseline"


class FakeShell:
    execution_count = 5


def test_the_final_plot_is_displayed_once_per_cell_as_a_static_png(monkeypatch, clock):
    import IPython.display

    shown: list = []

    class Handle:
        def update(self, obj) -> None:
            shown.append(("update", obj))

    def fake_display(obj, display_id=False):
        shown.append(("display", obj))
        if isinstance(obj, Dashboard):
            obj._repr_mimebundle_()  # what IPython does with it
        return Handle() if display_id else None

    shell = FakeShell()
    monkeypatch.setattr(dashboard_module, "_shell", lambda: shell)
    monkeypatch.setattr(IPython.display, "display", fake_display)
    dash = Dashboard(clock=clock)
    for name in ("baseline", "amp"):  # two runs in one cell
        dash.start(start(name, total=1))
        dash.log(step(1, name=name, total=1))
        dash.end(RunEnd(name, "ok", 1))
    kinds = [(kind, type(obj).__name__) for kind, obj in shown]
    assert kinds == [("display", "Dashboard"), ("display", "Image"), ("update", "Image")]
    assert shown[-1][1].data == dash.last_png
    assert dash.plot.layout.display == "none"  # the static copy below replaces the live plot

    shell.execution_count = 6  # a run in the next cell shows the dashboard there too
    dash.start(start("qat", total=1))
    assert dash.plot.layout.display is None
    assert [kind for kind, _ in shown[3:]] == ["display"]


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


def test_default_sinks_is_the_shared_dashboard_in_a_live_notebook(monkeypatch):
    monkeypatch.setattr(dashboard_module, "headless_reason", lambda: None)
    monkeypatch.setattr(Dashboard, "_shared", None)
    first, second = default_sinks(), default_sinks()
    assert isinstance(first[0], Dashboard) and first[0] is second[0] is Dashboard.shared()


def test_importing_the_dashboard_module_stays_light():
    code = (
        "import sys, workbench.views.dashboard; "
        "heavy = [m for m in ('ipywidgets', 'matplotlib', 'IPython') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
