"""compare(): tables, ratios to the first run, and the figure."""

import pytest

from workbench.core.config import RunConfig
from workbench.core.measure.result import MemoryBreakdown, RunResult
from workbench.core.views.compare import compare


def _result(name, *, step_time, activations, precision="fp32"):
    memory = MemoryBreakdown(parameter_bytes=400, gradient_bytes=400, optimizer_state_bytes=800,
                             activation_bytes=activations, peak_bytes=10_000, peak_increase_bytes=2_000,
                             peak_kind="process VmHWM")
    return RunResult(
        name=name, config=RunConfig(model="mlp", precision=precision).resolved(), status="ok", message="",
        steps_done=10, loss_steps=[5, 10], losses=[1.0, 0.5], step_time_s=step_time,
        interval_step_times_s=[step_time], samples_per_sec=64 / step_time, tokens_per_sec=None,
        flops_per_step=1000, tflops_per_sec=None, mfu=None, peak_flops_source="", data_wait_fraction=0.1,
        memory=memory, eval_loss=0.4, accuracy=0.9, device="cpu",
    )


def test_ratios_are_taken_against_the_first_run():
    cmp = compare([_result("fp32", step_time=0.02, activations=4096), _result("bf16", step_time=0.5, activations=2048, precision="bf16")])
    assert cmp.ratio("activation_bytes", "bf16") == 0.5
    assert cmp.ratio("step_time_s", "bf16") == 25.0
    assert cmp.ratio("step_time_s", "fp32", to="bf16") == pytest.approx(0.04)


def test_table_shows_each_run_and_its_ratio():
    cmp = compare([_result("a", step_time=0.01, activations=1024), _result("b", step_time=0.02, activations=1024)])
    text = str(cmp)
    assert "ms / step" in text and "x first" in text
    row_b = cmp.table.rows[1]
    assert row_b[0] == "b" and "2.00" in row_b
    assert "<table>" in cmp._repr_html_() and "data:image/png;base64," in cmp._repr_html_()


def test_figure_has_loss_and_three_bar_panels():
    cmp = compare([_result("a", step_time=0.01, activations=1024)])
    assert len(cmp.figure.axes) == 4


def test_compare_refuses_duplicate_names_and_no_runs():
    with pytest.raises(ValueError, match="run names must differ"):
        compare([_result("a", step_time=0.01, activations=1), _result("a", step_time=0.01, activations=1)])
    with pytest.raises(ValueError, match="at least one RunResult"):
        compare([])


def test_unknown_run_name_is_a_clear_key_error():
    cmp = compare([_result("a", step_time=0.01, activations=1)])
    with pytest.raises(KeyError, match="no run named 'z'"):
        cmp.ratio("step_time_s", "z")
