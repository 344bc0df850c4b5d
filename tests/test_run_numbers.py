"""What a run view writes: labelled numbers, the status line and its folded details."""

from __future__ import annotations

from workbench.core.measure.records import RunEnd, StepRecord
from workbench.core.measure.result import format_metric
from workbench.core.views.run_numbers import (
    details_html,
    duration,
    interval_label,
    numbers_html,
    other_figures,
    rate_rows,
    status_html,
)


def record(**kw) -> StepRecord:
    fields = dict(run_name="b", step=50, total_steps=100, loss=1.5, elapsed_s=1.0, step_time_s=0.0059,
                  samples_per_sec=10917.0, mean_step_time_s=0.0076, mean_samples_per_sec=8451.0)
    fields.update(kw)
    return StepRecord(**fields)


def test_rates_pair_the_last_interval_with_the_run_mean_in_the_results_tables_format():
    rows = {r.key: r for r in rate_rows(record(), peak_source="")}
    assert (rows["step_time_s"].last, rows["step_time_s"].mean) == ("5.9", "7.6")
    assert (rows["samples_per_sec"].last, rows["samples_per_sec"].mean) == ("10,917", "8,451")
    assert rows["samples_per_sec"].mean == format_metric("samples_per_sec", 8451.0)


def test_the_final_summary_replaces_the_means():
    rows = {r.key: r for r in rate_rows(record(), peak_source="", final={"step_time_s": 0.0081,
                                                                          "samples_per_sec": 7900.0})}
    assert rows["step_time_s"].mean == "8.1" and rows["samples_per_sec"].mean == "7,900"


def test_the_mean_tflops_follow_from_the_mean_step_time():
    rows = {r.key: r for r in rate_rows(record(step_time_s=0.1, tflops_per_sec=0.3, mean_step_time_s=0.2),
                                        peak_source="")}
    assert (rows["tflops_per_sec"].last, rows["tflops_per_sec"].mean) == ("0.3", "0.15")


def test_mfu_without_a_native_peak_says_why():
    rows = {r.key: r for r in rate_rows(record(tflops_per_sec=0.01), peak_source="bf16 emulated here")}
    assert rows["mfu"].last == "n/a (bf16 emulated here)" and rows["mfu"].mean is None
    html = numbers_html(list(rows.values()), [], interval=(2, 50), final=False)
    assert 'colspan="2"' in html and "n/a (bf16 emulated here)" in html


def test_other_figures_are_labelled_with_what_they_measure():
    figures = {key: (label, value) for key, label, value in other_figures(
        record(memory_bytes=3 << 20, memory_peak_bytes=5 << 20, data_wait_s=0.00118),
        memory_total_bytes=8 << 30)}
    assert figures["loss"] == ("training loss, last interval", "1.5000")
    assert figures["memory_peak"] == ("process RSS, peak", "5.0 MiB of 8.0 GiB")
    assert figures["data_wait"] == ("waiting for data, last interval", "20% of a step")


def test_interval_labels():
    assert interval_label(2, 50) == "steps 2&ndash;50"
    assert interval_label(1, 1) == "step 1"
    assert interval_label(None, 40) == "to step 40"


def test_status_is_one_word_and_details_fold_the_message():
    assert ">out of memory<" in status_html("oom") and "#c62828" in status_html("oom")
    details = details_html(RunEnd("b", "oom", 1, message="Tried to allocate <2 GiB>"), total_steps=30)
    assert details.startswith("<details") and "out of memory at step 1 of 30" in details
    assert "Tried to allocate &lt;2 GiB&gt;" in details


def test_durations_read_naturally():
    assert [duration(s) for s in (3.25, 42, 125, 7300, float("inf"))] == [
        "3.2 s", "42 s", "2 min 05 s", "2 h 01 min", "?"]
