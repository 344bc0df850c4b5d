"""Where metric records go: the sink protocol and the headless sinks.

The training loop never draws anything. It calls every sink with plain records
(`RunStart`, `StepRecord`, `RunEnd`); views (the text printer here, the live
widget dashboard in `dashboard.py`, the recorder tests use) decide what to show.
Records are plain frozen dataclasses so they pickle across processes (the
multi-process launcher sends children's records to the parent).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO, runtime_checkable


@dataclass(frozen=True, slots=True)
class RunStart:
    """Sent once before the first step."""

    run_name: str
    total_steps: int
    """Optimizer steps the run will take."""
    device: str
    precision: str
    config: dict[str, Any]
    warnings: tuple[str, ...] = ()
    """Things the learner must know, e.g. that this CPU emulates bf16."""
    memory_total_bytes: int | None = None
    """The device's total memory (a GPU's), or the machine's RAM on CPU."""
    rank: int = 0


@dataclass(frozen=True, slots=True)
class StepRecord:
    """Sent at every log step (the only place the loop syncs the device)."""

    run_name: str
    step: int
    """Optimizer steps done so far (1-based)."""
    total_steps: int
    loss: float
    """Mean training loss over the micro-batches since the last log step."""
    elapsed_s: float
    """Seconds since the run started (set-up excluded)."""
    step_time_s: float
    """Mean seconds per optimizer step since the last log step."""
    samples_per_sec: float
    tokens_per_sec: float | None = None
    tflops_per_sec: float | None = None
    mfu: float | None = None
    """Model FLOP utilisation: achieved / peak FLOP/s of this device and dtype."""
    memory_bytes: int | None = None
    """Live memory now: CUDA allocated bytes, or process RSS on CPU."""
    memory_peak_bytes: int | None = None
    """Peak since the run started: CUDA allocator peak, or VmHWM on CPU."""
    memory_reserved_bytes: int | None = None
    """CUDA caching allocator reserved bytes (None on CPU)."""
    memory_kind: str = "process RSS"
    activation_bytes: int | None = None
    """Exact saved-activation bytes of one micro-batch step (measured at step 1)."""
    data_wait_s: float | None = None
    """Mean seconds per step spent waiting for the next batch."""
    lr: float | None = None
    rank: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunEnd:
    """Sent once when the run stops, however it stops."""

    run_name: str
    status: str
    """'ok', 'failed', 'interrupted' or 'oom'."""
    steps_done: int
    message: str = ""
    """What happened, in one line (empty when status is 'ok')."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Headline figures of the finished run (see RunResult.summary())."""
    rank: int = 0


@runtime_checkable
class Sink(Protocol):
    """Anything with these three methods can watch a run."""

    def start(self, record: RunStart) -> None: ...

    def log(self, record: StepRecord) -> None: ...

    def end(self, record: RunEnd) -> None: ...


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


def format_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'; None -> 'n/a'."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class TextSink:
    """Prints a progress line per log step: the headless view (CLI, CI, nbval).

    Lines are throttled to at most one every `min_interval_s` (the last step is
    always printed) so a long run does not flood a notebook's output.
    """

    def __init__(self, stream: TextIO | None = None, *, min_interval_s: float = 1.0) -> None:
        self.stream = stream
        self.min_interval_s = min_interval_s
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
        parts = [
            f"[{record.run_name}] step {record.step}/{record.total_steps}",
            f"loss {record.loss:.4f}",
            f"{record.step_time_s * 1e3:.1f} ms/step",
            f"{record.samples_per_sec:,.0f} samples/s",
        ]
        if record.tokens_per_sec is not None:
            parts.append(f"{record.tokens_per_sec:,.0f} tokens/s")
        if record.memory_bytes is not None:
            parts.append(f"{record.memory_kind} {format_bytes(record.memory_bytes)}")
        self._print(" | ".join(parts))

    def end(self, record: RunEnd) -> None:
        if record.status == "ok":
            self._print(f"[{record.run_name}] done: {record.steps_done} steps")
        else:
            self._print(
                f"[{record.run_name}] {record.status} after {record.steps_done} steps: {record.message}"
            )
