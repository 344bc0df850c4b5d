"""The records a run emits, and the Sink protocol that receives them.

The training loop never draws anything. It calls every sink with plain records
(`RunStart`, `StepRecord`, `RunEnd`); views (the text printer and the live dashboard in
`workbench.core.views`, the recorder tests use) decide what to show. Records are plain frozen
dataclasses so they pickle across processes (the multi-process launch, launching/launch.py, sends
children's records to the parent).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from workbench.base.arguments import ArgumentError, listed


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
    peak_flops: float | None = None
    """The device's peak FLOP/s in this precision, MFU's denominator; None where there is no
    honest one (an emulated dtype, an unknown GPU): `peak_flops_source` says why."""
    peak_flops_source: str = ""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """Sent at every log step (the only place the loop syncs the device)."""

    run_name: str
    step: int
    """Optimizer steps done so far (1-based)."""
    total_steps: int
    loss: float | None
    """Mean training loss over the micro-batches since the last log step (None: the loop measured
    none, a monitored loop that never calls mon.loss)."""
    elapsed_s: float
    """Seconds since the run started (set-up excluded)."""
    step_time_s: float
    """Mean seconds per optimizer step over the last interval (since the previous log step)."""
    samples_per_sec: float
    """Over the last interval, every process's samples."""
    tokens_per_sec: float | None = None
    """Over the last interval (text models)."""
    tflops_per_sec: float | None = None
    """Over the last interval, every process's FLOPs."""
    mfu: float | None = None
    """Model FLOP utilisation over the last interval: achieved / peak FLOP/s of this device and
    dtype; None where the dtype is emulated (no native peak to hold it against)."""
    mean_step_time_s: float | None = None
    """Mean seconds per step over the run's timed steps so far (the first step is not timed):
    at the last step, the RunResult's step_time_s."""
    mean_samples_per_sec: float | None = None
    """Over the run's timed steps so far: at the last step, the RunResult's samples_per_sec."""
    mean_tokens_per_sec: float | None = None
    mean_mfu: float | None = None
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
    """'ok'; 'oom' (out of memory: a real allocation failure or the simulated budget);
    'diverged' (the loss stopped being finite: the message names the step); 'interrupted'
    (Ctrl-C); 'failed' (an error, raised to the caller too). Views treat any status but
    'ok' and 'interrupted' as a failure, so a status added later still shows as one."""
    steps_done: int
    message: str = ""
    """What happened, in one line (for 'ok', empty or a note such as that no loss was measured)."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Headline figures of the finished run (see RunResult.summary())."""
    rank: int = 0


@runtime_checkable
class Sink(Protocol):
    """Anything with these three methods can watch a run."""

    def start(self, record: RunStart) -> None: ...

    def log(self, record: StepRecord) -> None: ...

    def end(self, record: RunEnd) -> None: ...


def checked_sinks(sinks: Any) -> list[Sink]:
    """`sinks` as a list, each able to hear a run (run() and monitor() check them before starting)."""
    if isinstance(sinks, (str, bytes, dict)) or not isinstance(sinks, Iterable):
        raise ArgumentError(f"sinks must be a list of sinks, got {type(sinks).__name__}; pass e.g. sinks=[TextSink()]")
    sinks = listed("sinks", sinks, "sinks=[TextSink()]")
    for i, sink in enumerate(sinks):
        if missing := [m for m in ("start", "log", "end") if not callable(getattr(sink, m, None))]:
            raise ArgumentError(f"sinks[{i}] ({type(sink).__name__}) has no {', '.join(missing)} method; a sink needs "
                                "start(), log() and end() (see workbench.core.measure.records.Sink)")
    return sinks
