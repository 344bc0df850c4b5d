"""The one recorder of a run's measurements, fed by every loop: `run()`, `monitor()`, `launch()`.

Like torchtitan's metrics processor: the loop says what happened (training began, the first
step was counted, a step ended, a log step's loss) and the recorder keeps the run's history,
emits the `Sink` records and builds the `RunResult`: every `RunStart`, `StepRecord`, `RunEnd`
and `RunResult` of a run is made here. It never syncs the device itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from workbench.core.measure.counters import gradient_bytes, optimizer_state_bytes, parameter_bytes
from workbench.core.measure.meters import IntervalMeter, MemoryMeter, mfu
from workbench.core.measure.records import RunEnd, RunStart, Sink, StepRecord
from workbench.core.measure.result import MemoryBreakdown, RunResult


class Recorder:
    """A run's measurements so far (partial results survive an interruption). Its history is
    what a resumed run carries on (`engine.resume.LOOP_FIELDS`); `timing`, the interval
    bookkeeping, is made when training begins. `meter` is None where nothing is measured
    here: `launch()`'s parent relays its children's records.

    Example:
        >>> rec = Recorder(name="tiny", total_steps=4, log_every=2, sinks=[], meter=None, device="cpu")
        >>> rec.relay("log", StepRecord(run_name="tiny", step=2, total_steps=4, loss=1.5, elapsed_s=0.2,
        ...                             step_time_s=0.1, samples_per_sec=640.0))
        >>> got = rec.result(config=None, status="interrupted", message="", wall_s=1.0)
        >>> got.steps_done, got.losses, got.interval_step_times_s, got.step_time_s
        (2, [1.5], [0.1], None)
    """

    def __init__(self, *, name: str, total_steps: int, log_every: int, sinks: Iterable[Sink],
                 meter: MemoryMeter | None, device: str, peak: float | None = None, peak_source: str = "",
                 rank: int = 0, num_processes: int = 1) -> None:
        self.name, self.total_steps, self.log_every, self.sinks = name, total_steps, log_every, list(sinks)
        self.meter, self.device, self.rank, self.num_processes = meter, device, rank, num_processes
        self.peak, self.peak_source = peak, peak_source
        self.started: list[Sink] = []  # the sinks that heard the start: they hear the end
        self.ended: RunEnd | None = None
        self.warnings: tuple[str, ...] = ()
        self.text = False  # the inputs are token ids: tokens/s is shown
        self.step = 0
        self.loss_steps: list[int] = []
        self.losses: list[float] = []
        self.activation_bytes: int | None = None
        self.flops_per_step: int | None = None
        self.skipped_steps = 0
        self.loss_scales: list[float] = []
        self.first_step_s: float | None = None
        self.start_memory: int | None = None
        self.held_before_bytes: int | None = None  # run() on a GPU: allocated before it began, not its own
        self.train_peak_bytes: int | None = None  # run(): the meter's peak when training ended, before evaluation
        self.timing: IntervalMeter | None = None
        self._counted_flops: int | None = None  # the first step's FLOPs so far, kept once the step ends

    def start(self, *, precision: str, config: dict[str, Any], warnings: tuple[str, ...] = ()) -> None:
        """The run is set up: every sink hears the start (a sink whose start fails still hears the end)."""
        self.warnings = warnings
        record = RunStart(run_name=self.name, total_steps=self.total_steps, device=self.device, precision=precision,
                          config=config, warnings=warnings, memory_total_bytes=self.meter.total_bytes(),
                          rank=self.rank, peak_flops=self.peak, peak_flops_source=self.peak_source)
        for sink in self.sinks:
            self.started.append(sink)
            sink.start(record)

    def begin(self) -> None:
        """Training begins now: the memory peak and the clock from here on are the run's."""
        self.meter.reset_peak()
        self.start_memory = self.meter.current_bytes()
        self.timing = IntervalMeter(start=time.perf_counter(), first_step=self.step + 1, processes=self.num_processes)

    def counted(self, *, flops: int, activation_bytes: int) -> None:
        """A micro-batch of the first step, counted exactly: its FLOPs add up to the step's; the
        saved activations are the first micro-batch's (a resumed run keeps its own)."""
        self._counted_flops = (self._counted_flops or 0) + flops
        if self.activation_bytes is None:
            self.activation_bytes = activation_bytes

    def end_step(self, *, sync: Callable[[], Any]) -> bool:
        """An optimizer step ended; True at a log step. The first step is shown, never timed (it
        ran the counters and one-off warm-up; with torch.compile, the compile): its seconds are
        kept and, unless it is logged, the clock restarts after `sync()` (its queued device work
        is not timed in the next interval)."""
        self.step += 1
        log = self.step % self.log_every == 0 or self.step == self.total_steps
        if self.step == 1:
            if self._counted_flops is not None:
                self.flops_per_step = self._counted_flops
            self.first_step_s = self.timing.elapsed(now=time.perf_counter())
            if not log:
                sync()
                self.timing.restart(now=time.perf_counter(), next_step=2)
        return log

    def log(self, loss: float | None, *, lr: float | None, loss_scale: float | None = None) -> None:
        """A log step's loss (the mean since the last; fp16: with the GradScaler's scale; None: the
        loop measured none, and the curve gets no point): the sinks hear the interval's rates, the
        run's so far over its timed steps, and memory now."""
        if loss is not None:
            self.losses.append(loss)
            self.loss_steps.append(self.step)
        timing, meter, flops = self.timing, self.meter, self.flops_per_step
        interval = timing.close(now=time.perf_counter(), step=self.step, flops_per_step=flops, timed=self.step != 1,
                                text=self.text)
        if loss_scale is not None:
            self.loss_scales.append(loss_scale)
        mean = timing.run_rates(flops_per_step=flops, text=self.text)
        group_peak = self.peak and self.peak * self.num_processes  # MFU of the whole group: all processes' FLOPs
        record = StepRecord(
            run_name=self.name, step=self.step, total_steps=self.total_steps, loss=loss,
            elapsed_s=timing.timed_seconds, step_time_s=interval.step_time_s,
            samples_per_sec=interval.samples_per_sec, tokens_per_sec=interval.tokens_per_sec,
            tflops_per_sec=interval.tflops_per_sec, mfu=mfu(interval.tflops_per_sec, group_peak),
            mean_step_time_s=mean and mean.step_time_s, mean_samples_per_sec=mean and mean.samples_per_sec,
            mean_tokens_per_sec=mean and mean.tokens_per_sec, mean_mfu=mean and mfu(mean.tflops_per_sec, group_peak),
            memory_bytes=meter.current_bytes(), memory_peak_bytes=meter.peak_bytes(),
            memory_reserved_bytes=meter.reserved_bytes(), memory_kind=meter.kind,
            activation_bytes=self.activation_bytes, data_wait_s=timing.last_wait_s_per_step, lr=lr, rank=self.rank,
            extra={} if loss_scale is None else {"loss_scale": loss_scale, "skipped_steps": self.skipped_steps},
        )
        for sink in self.sinks:
            sink.log(record)

    def restart_clock(self) -> None:
        """The next step's time starts now (the sinks' time, and a save's, are not a step's)."""
        self.timing.restart(now=time.perf_counter(), next_step=self.step + 1)

    def relay(self, kind: str, record: RunStart | StepRecord | RunEnd) -> None:
        """A record another process emitted (`launch()`: rank 0's), kept and passed on to the sinks.
        Nothing is timed here: the curve and the interval times as that process reported them."""
        if kind == "log":
            self.step = record.step
            self.loss_steps.append(record.step)
            self.losses.append(record.loss)
            self.timing = self.timing or IntervalMeter(start=0.0, first_step=1)
            self.timing.interval_times.append(record.step_time_s)
        elif kind == "end":
            self.ended = record
        for sink in self.sinks:
            getattr(sink, kind)(record)

    def end(self, status: str, message: str = "", *, summary: dict[str, Any] | None = None,
            sinks: Iterable[Sink] | None = None) -> None:
        """How the run ended, told to the sinks that heard its start (or to `sinks`)."""
        self.ended = RunEnd(run_name=self.name, status=status, steps_done=self.step, message=message,
                            summary=summary or {}, rank=self.rank)
        for sink in self.started if sinks is None else sinks:
            sink.end(self.ended)

    def result(self, *, config: Any, status: str, message: str, model: Any = None, optimizer: Any = None,
               wall_s: float, eval_loss: float | None = None, accuracy: float | None = None,
               extra: dict[str, Any] | None = None) -> RunResult:
        """The RunResult so far: rates over the timed steps (the first left out), the exact byte
        counts of `model` and `optimizer` (no model: None; no optimizer: 0) and the peak."""
        timing = self.timing
        # An interrupt (the kernel's KeyboardInterrupt lands between any two bytecodes) can keep a
        # step without its loss or a loss without its step: the result holds whole points only.
        if len(self.loss_steps) != len(self.losses):
            whole = min(len(self.loss_steps), len(self.losses))
            self.loss_steps, self.losses = self.loss_steps[:whole], self.losses[:whole]
        rates = timing.run_rates(flops_per_step=self.flops_per_step, text=self.text) if timing else None
        rate = {f: getattr(rates, f) if rates else None for f in ("step_time_s", "samples_per_sec", "tokens_per_sec")}
        return RunResult(
            name=self.name, config=config, status=status, message=message, steps_done=self.step,
            loss_steps=self.loss_steps, losses=self.losses, **rate,
            interval_step_times_s=list(timing.interval_times) if timing else [], flops_per_step=self.flops_per_step,
            tflops_per_sec=rates.tflops_per_sec if rates else None,
            mfu=mfu(rates.tflops_per_sec, self.peak and self.peak * self.num_processes) if rates else None,
            peak_flops_source=self.peak_source, data_wait_fraction=timing.data_wait_fraction() if timing else None,
            memory=None if model is None else self._memory(model, optimizer), eval_loss=eval_loss,
            accuracy=accuracy, device=self.device, warnings=self.warnings, wall_s=wall_s,
            num_processes=self.num_processes, extra=extra or {}, loss_scales=self.loss_scales,
            skipped_steps=self.skipped_steps, peak_flops=self.peak, first_step_s=self.first_step_s,
        )

    def _memory(self, model: Any, optimizer: Any) -> MemoryBreakdown:
        # The training steps' peak: read when training ended (evaluation comes after, at its own batch).
        raw_peak = self.train_peak_bytes if self.train_peak_bytes is not None else self.meter.peak_bytes()
        held = self.held_before_bytes  # a GPU's allocator counts every tensor: what was there before is not this run's
        return MemoryBreakdown(
            parameter_bytes=parameter_bytes(model), gradient_bytes=gradient_bytes(model, expected=True),
            optimizer_state_bytes=optimizer_state_bytes(optimizer) if optimizer is not None else 0,
            activation_bytes=self.activation_bytes,
            peak_bytes=raw_peak if raw_peak is None or held is None else max(0, raw_peak - held),
            peak_increase_bytes=None if raw_peak is None or self.start_memory is None
            else max(0, raw_peak - self.start_memory),
            held_before_bytes=held, peak_kind=self.meter.peak_kind,
        )
