"""The meters of `run()` around a loop the learner wrote: `monitor`.

A hand-written PyTorch (or accelerate) loop gets what `wb.run` gives its own loop, in three
added lines: the live view, exact saved-activation bytes and FLOPs of a step (the first is
counted), throughput, memory, the loss curve, a status on interrupt or out-of-memory, and a
`RunResult` that `wb.compare` lays beside `wb.run`'s:

    with wb.monitor(model, optimizer, steps=100, name="fp16 by hand") as mon:   # + 1
        for x, y in batches:
            with mon.step(samples=len(y)):                                        # + 2
                loss = loss_fn(model(x), y)
                loss.backward(); optimizer.step(); optimizer.zero_grad()
                mon.loss(loss)                                                    # + 3
    mon.result

It assumes nothing about the model or the batch: the loop says how many samples (and
tokens) a step took. A step is one optimizer step; with gradient accumulation, wrap the
whole window and call `mon.loss` per micro-batch (the logged loss is their mean). Time
outside `mon.step()` (fetching the next batch, logging) is reported as the wait for data.
Like `run()`, it syncs the device only at log steps (`loss.item()` there), so a GPU keeps
its queue full; its own cost is a few clock reads per step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from workbench.core import hardware
from workbench.core.precisions import PRECISIONS
from workbench.engine.ending import RunInterrupted, remember
from workbench.measure.counters import (
    SavedActivationCounter,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
)
from workbench.measure.flops import FlopCounter
from workbench.measure.meters import IntervalMeter, MemoryMeter, mfu
from workbench.measure.records import RunEnd, RunStart, Sink, StepRecord
from workbench.measure.result import LoopDescription, MemoryBreakdown, RunResult


class Monitor:
    """Watches a hand-written training loop; see the module docstring. Made by `monitor()`."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *, steps: int,
                 name: str, sinks: Iterable[Sink], log_every: int | None, precision: str, batch_size: int | None,
                 grad_accum_steps: int, checkpointing: str, text: bool, count_first_step: bool,
                 rank: int = 0, num_processes: int = 1) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}; pass the model you train")
        if isinstance(steps, int) and not isinstance(steps, bool) and log_every is None:
            log_every = max(1, steps // 10)  # about ten log records (and device syncs) a run
        for field, value in (("steps", steps), ("log_every", log_every), ("grad_accum_steps", grad_accum_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field}={value!r} must be a whole number >= 1; pass e.g. {field}=10")
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r} labels the run: use one of {', '.join(map(repr, PRECISIONS))}")
        self.model, self.optimizer, self.name = model, optimizer, name
        self.total_steps, self.log_every, self.sinks = steps, log_every, list(sinks)
        self.text, self.count_first_step = text, count_first_step
        self.rank, self.num_processes = rank, num_processes
        param = next(model.parameters(), None)
        self.device = param.device if param is not None else torch.device("cpu")
        self.description = LoopDescription(
            model=type(model).__name__, precision=precision, batch_size=batch_size, grad_accum_steps=grad_accum_steps,
            activation_checkpointing=checkpointing, device=self.device.type)
        self.meter = MemoryMeter(self.device)
        self.peak, self.peak_source = hardware.peak_flops(self.device.type, precision)
        self.steps_done = 0
        self.loss_steps: list[int] = []
        self.losses: list[float] = []
        self.activation_bytes: int | None = None
        self.flops_per_step: int | None = None
        self.first_step_s: float | None = None
        self.status, self.message = "running", ""
        self.result: RunResult | None = None
        """The RunResult, once the `with` block has ended (however it ended)."""
        self._loss_sum = torch.zeros((), device=self.device)  # summed on the device: no sync per step
        self._loss_count = 0
        self._timing: IntervalMeter | None = None
        self._wall_start = time.perf_counter()
        self._start_memory: int | None = None

    # -- the with-block: start, and end however it ends --

    def __enter__(self) -> Monitor:
        warnings = tuple(w for w in [hardware.emulation_warning(self.device.type, self.description.precision)] if w)
        self._warnings = warnings
        start = RunStart(run_name=self.name, total_steps=self.total_steps, device=self.device.type,
                         precision=self.description.precision, config={"loop": "hand-written", **dataclasses.asdict(self.description)},
                         warnings=warnings, memory_total_bytes=self.meter.total_bytes(), rank=self.rank,
                         peak_flops=self.peak, peak_flops_source=self.peak_source)
        for sink in self.sinks:
            sink.start(start)
        self.meter.reset_peak()
        self._start_memory = self.meter.current_bytes()
        self._timing = IntervalMeter(start=time.perf_counter(), first_step=1, processes=self.num_processes)
        self._outside_since = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> bool:
        if kind is None:
            self.status = "ok"
        elif issubclass(kind, KeyboardInterrupt):
            self.status, self.message = "interrupted", f"stopped by the user at step {self.steps_done}"
        elif issubclass(kind, torch.OutOfMemoryError):
            self.status, self.message = "oom", str(error).splitlines()[0]
        else:
            self.status, self.message = "failed", f"{kind.__name__}: {error}".splitlines()[0]
        self.result = self._build_result()
        remember(self.result)
        for sink in self.sinks:
            sink.end(RunEnd(run_name=self.name, status=self.status, steps_done=self.steps_done, message=self.message,
                            summary=self.result.summary(), rank=self.rank))
        if self.status == "interrupted":
            raise RunInterrupted(self.result) from error
        return self.status == "oom"  # like run(): an out-of-memory ends the run with a result, not a traceback

    # -- inside the loop --

    @contextlib.contextmanager
    def step(self, *, samples: int, tokens: int | None = None) -> Iterator[None]:
        """One optimizer step of `samples` samples (all micro-batches of a window). The first
        is counted exactly (saved activations of its forward, FLOPs) and not timed."""
        if self._timing is None:
            raise RuntimeError("monitor.step() runs inside `with wb.monitor(...) as mon:`; enter the monitor first")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples={samples!r} must be the whole number of samples this step trained on")
        timing = self._timing
        timing.add(samples=samples, tokens=tokens, wait_s=time.perf_counter() - self._outside_since)
        probe = self.steps_done == 0 and self.count_first_step
        with FlopCounter() if probe else contextlib.nullcontext() as flops:
            with SavedActivationCounter(self.model) if probe else contextlib.nullcontext() as saved:
                yield
        self.steps_done += 1
        if self.description.batch_size is None:  # not given: what the first step trained on, per micro-batch
            per_micro = max(1, samples // self.description.grad_accum_steps)
            self.description = dataclasses.replace(self.description, batch_size=per_micro)
        if probe:
            self.flops_per_step, self.activation_bytes = flops.total, saved.bytes
        if self.steps_done == 1:
            self.first_step_s = timing.elapsed(now=time.perf_counter())  # with torch.compile: the compile too
        step = self.steps_done
        if step % self.log_every and step != self.total_steps:
            if step == 1:  # restart the clock after the counted step, as run() does
                self._sync()
                timing.restart(now=time.perf_counter(), next_step=2)
        else:
            self._log(step, timed=step != 1)
        self._outside_since = time.perf_counter()  # from here until the next step: the wait for data

    def loss(self, loss: torch.Tensor) -> None:
        """The loss of a micro-batch (a tensor: summed on the device, read at log steps only)."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss must be the loss tensor, got {type(loss).__name__}; pass mon.loss(loss), not loss.item()")
        self._loss_sum += loss.detach().float().to(self._loss_sum.device)
        self._loss_count += 1

    # -- what it measures --

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _log(self, step: int, *, timed: bool) -> None:
        timing = self._timing
        loss = (self._loss_sum / max(self._loss_count, 1)).item()  # the log step's sync
        self._loss_sum.zero_()
        self._loss_count = 0
        self.loss_steps.append(step)
        self.losses.append(loss)
        rates = timing.close(now=time.perf_counter(), step=step, flops_per_step=self.flops_per_step, timed=timed,
                             text=self.text)
        mean = timing.run_rates(flops_per_step=self.flops_per_step, text=self.text)
        group_peak = self.peak and self.peak * self.num_processes
        record = StepRecord(
            run_name=self.name, step=step, total_steps=self.total_steps, loss=loss, elapsed_s=timing.timed_seconds,
            step_time_s=rates.step_time_s, samples_per_sec=rates.samples_per_sec, tokens_per_sec=rates.tokens_per_sec,
            tflops_per_sec=rates.tflops_per_sec, mfu=mfu(rates.tflops_per_sec, group_peak),
            mean_step_time_s=mean and mean.step_time_s, mean_samples_per_sec=mean and mean.samples_per_sec,
            mean_tokens_per_sec=mean and mean.tokens_per_sec, mean_mfu=mean and mfu(mean.tflops_per_sec, group_peak),
            memory_bytes=self.meter.current_bytes(), memory_peak_bytes=self.meter.peak_bytes(),
            memory_reserved_bytes=self.meter.reserved_bytes(), memory_kind=self.meter.kind,
            activation_bytes=self.activation_bytes, data_wait_s=timing.last_wait_s_per_step,
            lr=self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else None, rank=self.rank,
        )
        for sink in self.sinks:
            sink.log(record)
        timing.restart(now=time.perf_counter(), next_step=step + 1)  # the sinks' time is not a step's

    def _build_result(self) -> RunResult:
        timing = self._timing
        rates = timing.run_rates(flops_per_step=self.flops_per_step, text=self.text) if timing else None
        peak_bytes = self.meter.peak_bytes()
        optimizer_bytes = optimizer_state_bytes(self.optimizer) if self.optimizer is not None else 0
        memory = MemoryBreakdown(
            parameter_bytes=parameter_bytes(self.model), gradient_bytes=gradient_bytes(self.model, expected=True),
            optimizer_state_bytes=optimizer_bytes, activation_bytes=self.activation_bytes, peak_bytes=peak_bytes,
            peak_increase_bytes=None if peak_bytes is None or self._start_memory is None
            else max(0, peak_bytes - self._start_memory),
            peak_kind="CUDA allocator peak" if self.meter.on_cuda else "process VmHWM")
        group_peak = self.peak and self.peak * self.num_processes
        return RunResult(
            name=self.name, config=self.description, status=self.status, message=self.message,
            steps_done=self.steps_done, loss_steps=self.loss_steps, losses=self.losses,
            step_time_s=rates.step_time_s if rates else None,
            interval_step_times_s=list(timing.interval_times) if timing else [],
            samples_per_sec=rates.samples_per_sec if rates else None,
            tokens_per_sec=rates.tokens_per_sec if rates else None, flops_per_step=self.flops_per_step,
            tflops_per_sec=rates.tflops_per_sec if rates else None,
            mfu=mfu(rates.tflops_per_sec, group_peak) if rates else None, peak_flops_source=self.peak_source,
            data_wait_fraction=timing.data_wait_fraction() if timing else None, memory=memory, eval_loss=None,
            accuracy=None, device=self.device.type, warnings=self._warnings,
            wall_s=time.perf_counter() - self._wall_start, num_processes=self.num_processes,
            first_step_s=self.first_step_s,
        )


def monitor(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, steps: int,
            name: str = "hand-written loop", sinks: Iterable[Sink] = (), log_every: int | None = None,
            precision: str = "fp32", batch_size: int | None = None, grad_accum_steps: int = 1,
            checkpointing: str = "none", text: bool = False, count_first_step: bool = True,
            accelerator: Any = None) -> Monitor:
    """Measure a hand-written loop of `steps` optimizer steps as `run()` measures its own.

    Args:
        model, optimizer: what the loop trains (the optimizer's state is counted; None: no optimizer).
        steps: optimizer steps the loop will take (for progress; stopping early is fine).
        sinks: where the records go (`wb.monitor` defaults them to the live view).
        log_every: steps between log records, the only device syncs; default about 10 logs a run.
        precision, batch_size, grad_accum_steps, checkpointing: what the loop does, for the
            results table and the right peak FLOP/s (labels: the monitor does not change the loop).
        text: the loop passes `tokens=` per step (tokens/s).
        count_first_step: count the first step's saved activations and FLOPs exactly.
        accelerator: under accelerate with several processes, for the rank and the group size.

    Example:
        >>> model = torch.nn.Linear(4, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> with monitor(model, opt, steps=3, name="tiny") as mon:
        ...     for _ in range(3):
        ...         with mon.step(samples=8):
        ...             loss = model(torch.ones(8, 4)).square().mean(); loss.backward(); opt.step(); opt.zero_grad()
        ...             mon.loss(loss)
        >>> mon.result.status, mon.result.steps_done, mon.result.flops_per_step  # forward 128 + weight gradient 128
        ('ok', 3, 256)
    """
    rank, processes = 0, 1
    if accelerator is not None:
        rank, processes = accelerator.process_index, accelerator.num_processes
    return Monitor(model, optimizer, steps=steps, name=name, sinks=sinks,
                   log_every=log_every, precision=precision, batch_size=batch_size,
                   grad_accum_steps=grad_accum_steps, checkpointing=checkpointing, text=text,
                   count_first_step=count_first_step, rank=rank, num_processes=processes)
