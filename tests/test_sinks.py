"""The headless views: the text log says which figures are the last interval's and which the run's."""

from __future__ import annotations

import io

from workbench.core.measure.records import RunEnd, RunStart, StepRecord
from workbench.core.views.sinks import RecordingSink, TextSink


def test_text_log_labels_interval_figures_and_ends_on_the_run_means():
    out = io.StringIO()
    sink = TextSink(out)
    sink.start(RunStart("baseline", 30, "cpu", "fp32", {}, warnings=("bf16 is emulated",)))
    sink.log(StepRecord("baseline", 30, 30, loss=0.4, elapsed_s=1.0, step_time_s=0.0059, samples_per_sec=10917.0))
    sink.end(RunEnd("baseline", "ok", 30, summary={"step_time_s": 0.0076, "samples_per_sec": 8451.0}))
    lines = out.getvalue().splitlines()
    assert lines[1] == "[baseline] note: bf16 is emulated"
    assert lines[2] == "[baseline] step 30/30 | loss 0.4000 | last interval 5.9 ms/step, 10,917 samples/s"
    assert lines[3] == "[baseline] done: 30 steps | run mean 7.6 ms/step, 8,451 samples/s"


def test_text_log_says_how_a_stopped_run_ended():
    out = io.StringIO()
    TextSink(out).end(RunEnd("baseline", "oom", 1, message="CUDA out of memory"))
    assert out.getvalue() == "[baseline] oom after 1 steps: CUDA out of memory\n"


def test_recording_sink_keeps_every_record():
    sink = RecordingSink()
    sink.start(RunStart("b", 1, "cpu", "fp32", {}))
    sink.end(RunEnd("b", "ok", 1))
    assert len(sink.starts) == 1 and sink.steps == [] and sink.ends[0].status == "ok"
