"""The headless sinks: a text progress log, and a recorder for tests and replays.

The live widget dashboard is the other view (`dashboard.py`); all receive the records
of `workbench.core.measure.records`.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from workbench.base.arguments import ArgumentError, seconds
from workbench.base.report import format_bytes
from workbench.core.measure.records import RunEnd, RunStart, StepRecord
from workbench.core.measure.result import format_metric


class RecordingSink:
    """Keeps every record in memory: for tests and for replaying a run."""

    def __init__(self) -> None:
        self.starts: list[RunStart] = []
        self.steps: list[StepRecord] = []
        self.ends: list[RunEnd] = []

    def start(self, record: RunStart) -> None:
        self.starts.append(record)

    def log(self, record: StepRecord) -> None:
        self.steps.append(record)

    def end(self, record: RunEnd) -> None:
        self.ends.append(record)


class TextSink:
    """Prints a progress line per log step: the headless view (CLI, CI, nbval).

    Lines are throttled to at most one every `min_interval_s` (the last step is
    always printed) so a long run does not flood a notebook's output.
    """

    def __init__(self, stream: TextIO | None = None, *, min_interval_s: float = 1.0) -> None:
        if stream is not None and not callable(getattr(stream, "write", None)):
            raise ArgumentError(f"stream must be an open text stream or None, got {type(stream).__name__}; pass e.g. "
                                "stream=sys.stdout, or open('log.txt', 'w')")
        self.stream = stream
        self.min_interval_s = seconds("min_interval_s", min_interval_s, example="min_interval_s=1.0")
        self._last_print = 0.0

    def _print(self, text: str) -> None:
        print(text, file=self.stream or sys.stdout, flush=True)

    def start(self, record: RunStart) -> None:
        self._last_print = 0.0
        self._print(
            f"[{record.run_name}] {record.total_steps} steps on {record.device}, {record.precision}"
        )
        for warning in record.warnings:
            self._print(f"[{record.run_name}] note: {warning}")

    def log(self, record: StepRecord) -> None:
        now = time.monotonic()
        last = record.step >= record.total_steps
        if not last and now - self._last_print < self.min_interval_s:
            return
        self._last_print = now
        rates = f"last interval {record.step_time_s * 1e3:.1f} ms/step, {record.samples_per_sec:,.0f} samples/s"
        if record.tokens_per_sec is not None:
            rates += f", {record.tokens_per_sec:,.0f} tokens/s"
        loss = "no loss measured" if record.loss is None else f"loss {record.loss:.4f}"
        parts = [f"[{record.run_name}] step {record.step}/{record.total_steps}", loss, rates]
        if record.memory_bytes is not None:
            parts.append(f"{record.memory_kind} {format_bytes(record.memory_bytes)}")
        self._print(" | ".join(parts))

    def end(self, record: RunEnd) -> None:
        """'ok' as done; every other status (oom, diverged, interrupted, failed, or one added
        later) as that status, the steps done and the message, which says what to change."""
        if record.status == "ok":
            line = f"[{record.run_name}] done: {record.steps_done} steps"
            line += f"; {record.message}" if record.message else ""  # 'ok' with a note
        else:
            line = f"[{record.run_name}] {record.status} after {record.steps_done} steps: {record.message}"
        step_time, samples = record.summary.get("step_time_s"), record.summary.get("samples_per_sec")
        if step_time is not None and samples is not None:  # the RunResult's figures, as the results table writes them
            line += (f" | run mean {format_metric('step_time_s', step_time)} ms/step, "
                     f"{format_metric('samples_per_sec', samples)} samples/s")
        self._print(line)
