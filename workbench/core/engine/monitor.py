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
Like `run()`, it syncs the device only at log steps (the losses are read there), so a GPU keeps
its queue full; its own cost is a few clock reads per step. Like `run()`, a loss that stops
being finite ends the loop at that log step as 'diverged', naming the step; a loop that never
calls `mon.loss` has no loss curve (its result says so), never one of invented zeros.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from workbench.base.arguments import ArgumentError, flag, label, whole_number
from workbench.base.precisions import PRECISIONS
from workbench.core.engine.ending import Diverged, RunInterrupted, non_finite_loss, remember
from workbench.core.engine.state import LossWindow
from workbench.core.measure.counters import SavedActivationCounter
from workbench.core.measure.flops import FlopCounter
from workbench.core.measure.heap import frozen_heap
from workbench.core.measure.meters import MemoryMeter
from workbench.core.measure.recorder import Recorder
from workbench.core.measure.records import Sink, checked_sinks
from workbench.core.measure.result import LoopDescription, RunResult
from workbench.core.switches.precision import stops_on
from workbench.machine import hardware
from workbench.machine.compile_cache import damaged_cache

NO_LOSS_NOTE = "no loss measured: the loop never called mon.loss(loss), so the result has no loss curve"


def _check(model: Any, optimizer: Any, *, name: Any, numbers: dict[str, Any], precision: Any, checkpointing: Any,
           flags: dict[str, Any], accelerator: Any) -> None:
    """monitor()'s arguments, before it starts (one line naming the argument and the fix)."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}; pass the model you train")
    if optimizer is not None and not hasattr(optimizer, "param_groups"):
        raise ArgumentError(f"optimizer must be a torch optimizer or None, got {type(optimizer).__name__}; "
                            "pass the optimizer your loop steps, e.g. torch.optim.AdamW(model.parameters())")
    label("name", name, example="name='fp16 by hand'")
    for field, value in numbers.items():
        if value is not None or field != "batch_size":  # an unknown batch size is allowed
            whole_number(field, value, example=f"{field}=10")
    if precision not in PRECISIONS:
        raise ArgumentError(f"precision={precision!r} labels the run: use one of {', '.join(map(repr, PRECISIONS))}")
    label("checkpointing", checkpointing, example="checkpointing='none'")
    for field, value in flags.items():
        flag(field, value)
    if accelerator is not None and not hasattr(accelerator, "num_processes"):
        raise ArgumentError(f"accelerator must be an accelerate Accelerator or None, got {type(accelerator).__name__}; "
                            "pass the Accelerator your loop prepared with")


class Monitor:
    """Measure a hand-written loop of `steps` optimizer steps as `run()` measures its own
    (see the module docstring); `monitor(...)` makes one.

    Args:
        model, optimizer: what the loop trains (the optimizer's state is counted; None: no optimizer).
        steps: optimizer steps the loop will take (for progress; stopping early is fine).
        sinks: where the records go (`wb.monitor` defaults them to the live view).
        log_every: steps between log records, the only device syncs; default about 10 logs a run.
        precision, batch_size, grad_accum_steps, checkpointing: what the loop does, for the
            results table and the right peak FLOP/s (labels: the monitor does not change the loop).
        text: the loop passes `tokens=` per step (tokens/s).
        count_first_step: count the first step's saved activations and FLOPs exactly.
        accelerator: under accelerate with several processes, for the rank and the group size (the
            logged loss is then the mean over the processes, as run() logs it).

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

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, steps: int,
                 name: str = "hand-written loop", sinks: Iterable[Sink] = (), log_every: int | None = None,
                 precision: str = "fp32", batch_size: int | None = None, grad_accum_steps: int = 1,
                 checkpointing: str = "none", text: bool = False, count_first_step: bool = True,
                 accelerator: Any = None) -> None:
        if isinstance(steps, int) and not isinstance(steps, bool) and log_every is None:
            log_every = max(1, steps // 10)  # about ten log records (and device syncs) a run
        _check(model, optimizer, name=name, numbers={"steps": steps, "log_every": log_every, "grad_accum_steps":
               grad_accum_steps, "batch_size": batch_size}, precision=precision, checkpointing=checkpointing,
               flags={"text": text, "count_first_step": count_first_step}, accelerator=accelerator)
        sinks = checked_sinks(sinks)
        self.model, self.optimizer, self.count_first_step = model, optimizer, count_first_step
        param = next(model.parameters(), None)
        self.device = param.device if param is not None else torch.device("cpu")
        self.description = LoopDescription(
            model=type(model).__name__, precision=precision, batch_size=batch_size, grad_accum_steps=grad_accum_steps,
            activation_checkpointing=checkpointing, device=self.device.type)
        peak, peak_source = hardware.peak_flops(self.device.type, precision)
        rank, processes = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
        self.recorder = Recorder(name=name, total_steps=steps, log_every=log_every, sinks=sinks,
                                 meter=MemoryMeter(self.device), device=self.device.type, peak=peak,
                                 peak_source=peak_source, rank=rank, num_processes=processes)
        self.recorder.text = text
        self.result: RunResult | None = None
        """The RunResult, once the `with` block has ended (however it ended)."""
        self._window = LossWindow(self.device)  # this interval's losses, on the device: no sync per step
        # Several processes: every log step joins their figures (as run() does), so a loss that went
        # non-finite in one stops them all at once; one stopping alone would leave the rest waiting
        # in their next all-reduce.
        self._gather = accelerator.gather if processes > 1 else None
        self._window_ends: list[int] = []  # losses given by the end of each step of the window
        self._window_start = 1  # the step of the window's first loss
        self._losses_given = 0  # since the window began
        self._wall_start = time.perf_counter()
        self._sync_device = (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)

    # -- the with-block: start, and end however it ends --

    def __enter__(self) -> Monitor:
        precision = self.description.precision
        self.recorder.start(precision=precision, config={"loop": "hand-written", **dataclasses.asdict(self.description)},
                            warnings=tuple(w for w in [hardware.emulation_warning(self.device.type, precision)] if w))
        self.recorder.begin()
        self._heap = frozen_heap()  # a kernel's whole heap is not scanned inside a timed step (measure/heap.py)
        self._heap.__enter__()
        self._outside_since = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> bool:
        self._heap.__exit__(None, None, None)
        status, message, damaged = "ok", "", None
        if kind is None and self._losses_given:  # the loop stopped between log steps: its last losses are read
            try:
                self._read_window(gather=False)  # the others may have stopped otherwise: no collective here
            except Diverged as diverged:
                kind, error = Diverged, diverged
        if kind is not None and issubclass(kind, Diverged):
            status, message = "diverged", str(error)
        elif kind is not None and issubclass(kind, KeyboardInterrupt):
            status, message = "interrupted", f"stopped by the user at step {self.recorder.step}"
        elif kind is not None and issubclass(kind, torch.OutOfMemoryError):
            status, message = "oom", str(error).splitlines()[0]
        elif kind is not None:
            damaged = damaged_cache(error)  # a torch.compile cache file swapped or corrupted: the folder, the fix
            status, message = "failed", str(damaged) if damaged else f"{kind.__name__}: {error}".splitlines()[0]
        elif not self.recorder.losses and self.recorder.step:
            message = NO_LOSS_NOTE
        self.result = self.recorder.result(config=self.description, status=status, message=message, model=self.model,
                                           optimizer=self.optimizer, wall_s=time.perf_counter() - self._wall_start)
        remember(self.result)
        self.recorder.end(status, message, summary=self.result.summary())
        if status == "interrupted":
            raise RunInterrupted(self.result) from error
        if damaged is not None:
            raise damaged from error
        return status in ("oom", "diverged")  # like run(): these end the run with a result, not a traceback

    # -- inside the loop --

    @contextlib.contextmanager
    def step(self, *, samples: int, tokens: int | None = None) -> Iterator[None]:
        """One optimizer step of `samples` samples (all micro-batches of a window). The first
        is counted exactly (saved activations of its forward, FLOPs) and not timed."""
        recorder = self.recorder
        if recorder.timing is None:
            raise RuntimeError("monitor.step() runs inside `with wb.monitor(...) as mon:`; enter the monitor first")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples={samples!r} must be the whole number of samples this step trained on")
        recorder.timing.add(samples=samples, tokens=tokens, wait_s=time.perf_counter() - self._outside_since)
        counted = recorder.step == 0 and self.count_first_step
        with FlopCounter() if counted else contextlib.nullcontext() as flops:
            with SavedActivationCounter(self.model) if counted else contextlib.nullcontext() as saved:
                yield
        if self.description.batch_size is None:  # not given: what the first step trained on, per micro-batch
            per_micro = max(1, samples // self.description.grad_accum_steps)
            self.description = dataclasses.replace(self.description, batch_size=per_micro)
        if counted:
            # One micro-batch's saved activations, as run() reports them: a window of K equal
            # micro-batches saves K times one's (the counter sums them; one is alive at a time).
            k = self.description.grad_accum_steps
            recorder.counted(flops=flops.total, activation_bytes=saved.bytes // k if saved.bytes % k == 0 else saved.bytes)
        self._window_ends.append(self._losses_given)
        if recorder.end_step(sync=self._sync_device):  # the first step: kept, and not timed
            loss = self._read_window()  # the log step's sync; raises Diverged
            recorder.log(loss, lr=self._lr())  # None: the loop gave no loss this interval
            recorder.restart_clock()  # the sinks' time is not a step's
        self._outside_since = time.perf_counter()  # from here until the next step: the wait for data

    def _lr(self) -> float | None:
        return self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else None

    def _read_window(self, *, gather: bool = True) -> float | None:
        """The window's mean loss (None: none given; several processes: over them all), which then
        starts afresh. A non-finite loss has poisoned the weights (fp16: only a window of no finite
        loss, as run() decides): Diverged, naming the step it first appeared at."""
        given, ends, start = self._losses_given, self._window_ends, self._window_start
        self._losses_given, self._window_ends, self._window_start = 0, [], self.recorder.step + 1
        if not given:
            return None
        loss, finite, first_bad = self._window.close(self._gather if gather else None)
        if first_bad is not None and stops_on(self.description.precision, finite):
            raise Diverged(self._diverged(start + bisect.bisect_right(ends, first_bad)))
        return loss

    def _diverged(self, first_bad: int) -> str:
        lr = self._lr()
        lower = "lower lr" + (f" (now {lr:g})" if isinstance(lr, (int, float)) else "")
        fix = (f"autocast to torch.bfloat16 (fp32's range) or {lower}" if self.description.precision == "fp16"
               else f"{lower} or clip the gradients (torch.nn.utils.clip_grad_norm_)")
        what = non_finite_loss(self.description.precision, first_bad)
        return f"{what}; stopped the loop at step {self.recorder.step}; {fix}"

    def loss(self, loss: torch.Tensor) -> None:
        """The loss of a micro-batch, one number (a tensor: kept on the device, read at log steps only)."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"mon.loss takes the loss tensor, got {type(loss).__name__}; "
                            "pass mon.loss(loss), not loss.item()")
        if loss.numel() != 1 or loss.is_complex() or loss.dtype == torch.bool:
            what = f"shape {tuple(loss.shape)}" if loss.numel() != 1 else f"dtype {loss.dtype}"
            raise ValueError(f"mon.loss takes the micro-batch's loss as one real number, got a tensor of {what}; "
                             "pass the scalar you call backward() on, e.g. mon.loss(loss.mean())")
        self._window.add(loss.detach().reshape(()).to(self.device))
        self._losses_given += 1


monitor = Monitor  # wb.monitor(model, optimizer, steps=...): a Monitor, documented above
