"""Notebook 07's checks of a plan against real runs.

- `max_micro_batch(config, target)`: the largest micro-batch the estimate says fits;
- `search_micro_batch(config, start)`: the largest that runs, found by accelerate's
  `find_executable_batch_size` with real one-step runs (real OOMs on a GPU; on a CPU the
  simulated budget `RunConfig.memory_budget_bytes`, checked on the run's exact counts);
- `Verification(plan, result, peak)`: the prediction next to what the run measured;
- `check_peak(config)`: the predicted peak against a real step's (`measure_step_peak`): on a GPU
  the CUDA allocator's (`max_memory_allocated`, reset at every step), on a CPU, which has no
  allocator counter, the peak of live tensors. From the second step on (the first creates the
  optimizer state); the data set is loaded before tracking starts (host memory, not a step's).

Example:
    >>> target = Target.this_machine(memory_budget_bytes=16 * 2**20)            # doctest: +SKIP
    >>> cfg = RunConfig(model="gpt", memory_budget_bytes=16 * 2**20)            # doctest: +SKIP
    >>> predicted = max_micro_batch(cfg, target=target)                          # doctest: +SKIP
    >>> search_micro_batch(cfg, start=predicted + 1, reduce=lambda b: b - 1)     # doctest: +SKIP
    (7, [(8, 'oom'), (7, 'ok')])
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from accelerate.utils import find_executable_batch_size

from workbench.base.report import Report, format_bytes
from workbench.core import custom
from workbench.core.config import RunConfig
from workbench.core.data import load_data
from workbench.core.engine.train import run
from workbench.core.measure.records import RunEnd, RunStart, StepRecord
from workbench.core.measure.snapshot import Lifetime, MemorySnapshot, build_snapshot, cuda_history, frame
from workbench.lessons.figures_memory import snapshot_timelines
from workbench.machine import hardware
from workbench.machine.hardware import precision_here
from workbench.planner.estimate import accelerate_estimate, estimate
from workbench.planner.fit import DoesNotFit
from workbench.planner.fit import check_fits as check_fits_here
from workbench.planner.live import CUDA_BLOCK_BYTES, LiveTensors, op_name
from workbench.planner.planning import Plan, Plans, Target, explain
from workbench.planner.predicted_snapshot import predicted_snapshot

__all__ = ["max_micro_batch", "search_micro_batch", "Verification", "accelerate_estimate", "explain",
           "precisions_here", "precision_here", "check_fits", "forecast_verdict"]


def max_micro_batch(config: RunConfig, *, target: Target, vocab_size: int | None = None) -> int:
    """The largest micro-batch whose predicted memory fits `target` (0 if none does).

    The exact counts are affine in the micro-batch, so a line through 1 and 2 samples
    solves for them; the peak is a maximum of such lines (convex), so the line overshoots
    it at most, and a bisection below the solution finds the answer.
    """
    base = dataclasses.replace(config.resolved(), epochs=None)

    def at(batch: int) -> int:
        return target.memory_of(estimate(dataclasses.replace(base, batch_size=batch), vocab_size=vocab_size,
                                         device=target.device))

    one, two = at(1), at(2)
    if one > target.usable_bytes:
        return 0
    per_sample = max(1, two - one)
    b = 1 + (target.usable_bytes - one) // per_sample
    b = min(b, custom.train_count(base.data, base.seq_len) or b)
    if at(b) <= target.usable_bytes:
        return int(b)
    fits, over = 1, b  # at(fits) fits, at(over) does not
    while over - fits > 1:
        mid = (fits + over) // 2
        fits, over = (mid, over) if at(mid) <= target.usable_bytes else (fits, mid)
    return int(fits)


def search_micro_batch(config: RunConfig, *, start: int, reduce: Callable[[int], int] | None = None,
                       runner: Callable[..., Any] | None = None) -> tuple[int, list[tuple[int, str]]]:
    """The largest micro-batch that runs, found with accelerate's `find_executable_batch_size`.

    Each try is a real `run()` of one optimizer step; a try that ends 'oom' (a CUDA OOM on a
    GPU, the simulated budget on a CPU) is raised again as torch.OutOfMemoryError, so
    accelerate shrinks the batch and tries again: by `reduce(batch)` (default: accelerate's
    own x0.9). Starting just above a prediction with `reduce=lambda b: b - 1` checks the
    prediction at its edge in two tries. Returns (batch, [(batch tried, status), ...]).
    """
    runner = runner or functools.partial(run, check_fit=check_fits_here)  # as wb.run: the fit check first
    tries: list[tuple[int, str]] = []
    base = dataclasses.replace(config.resolved(), epochs=None, steps=1, eval_samples=0, grad_accum_steps=1)

    def shrink_batch() -> int:
        last = tries[-1][0]
        return reduce(last) if reduce else int(last * 0.9)

    @find_executable_batch_size(starting_batch_size=start, reduce_batch_size_fn=shrink_batch)
    def attempt(batch_size: int) -> int:
        try:
            result = runner(dataclasses.replace(base, batch_size=batch_size), sinks=[], name=f"try b{batch_size}")
        except DoesNotFit as error:  # refused before allocating: its estimate exceeds this machine's memory
            tries.append((batch_size, "oom"))
            raise torch.OutOfMemoryError(f"Predicted out of memory. {error}") from None  # read by accelerate
        tries.append((batch_size, result.status))
        if result.status == "oom":
            raise torch.OutOfMemoryError(result.message)
        if result.status != "ok":
            raise RuntimeError(f"trial run at batch_size={batch_size} ended {result.status}: {result.message}")
        return batch_size

    return attempt(), tries


@dataclass(frozen=True, repr=False)
class Verification(Report):
    """A plan's prediction next to what its run measured."""

    header = ("part", "predicted", "measured", "measured / predicted")
    plan: Plan
    result: Any
    """The RunResult."""
    peak: Any = None
    """A PeakCheck of the same config (check_peak): on a CPU the only measured peak."""

    def rows(self) -> list[tuple[str, str, str, str]]:
        est, m, r = self.plan.estimate, self.result.memory, self.result
        pairs = [("parameters", est.parameter_bytes, m.parameter_bytes),
                 ("gradients", est.gradient_bytes, m.gradient_bytes),
                 ("optimizer state", est.optimizer_state_bytes, m.optimizer_state_bytes),
                 ("saved activations (one micro-batch)", est.activation_bytes, m.activation_bytes),
                 ("counted total", est.counted_bytes, self.measured_counted_bytes)]
        rows = [(k, format_bytes(p), format_bytes(v), f"{v / p:.3f}" if p and v is not None else "n/a")
                for k, p, v in pairs]
        rows.append(("FLOPs per optimizer step", f"{est.flops_per_step:,}", f"{r.flops_per_step:,}",
                     f"{r.flops_per_step / est.flops_per_step:.3f}" if r.flops_per_step else "n/a"))
        if r.device == "cuda" and m.peak_bytes:
            rows.append(("peak of the steps (CUDA max_memory_allocated, the run's own)", format_bytes(est.peak_bytes),
                         format_bytes(m.peak_bytes),
                         f"{m.peak_bytes / est.peak_bytes:.3f}"))
        elif self.peak is not None:
            rows.append(("peak of live tensors, steps 2 on (check_peak's own run)", format_bytes(est.peak_bytes),
                         format_bytes(self.peak.measured_bytes), f"{self.peak.measured_bytes / est.peak_bytes:.3f}"))
        else:
            rows.append(("peak", format_bytes(est.peak_bytes), "not read in a timed CPU run (check_peak tracks "
                         "live tensors)", "n/a"))
        return rows

    @property
    def measured_counted_bytes(self) -> int | None:
        m = self.result.memory
        if m is None or m.activation_bytes is None:
            return None
        return m.parameter_bytes + m.gradient_bytes + m.optimizer_state_bytes + m.activation_bytes

    def caption(self) -> str:
        return f"{self.plan.label}: run status {self.result.status}"

    def check(self) -> Verification:
        """Raise unless the run ended ok, the exact counts and FLOPs equal the prediction and a
        measured peak is within 1% of it (10% on a GPU: allocator rounding, library workspaces)."""
        rows, bound = self.rows(), 0.10 if self.result.device == "cuda" else 0.01
        off = [r[0] for r in rows[:6] if r[3] != "1.000"] + [r[0] for r in rows[6:] if r[3] != "n/a"
                                                              and abs(float(r[3]) - 1) > bound]
        if self.result.status != "ok" or off:
            raise AssertionError(f"run {self.result.status}; measured / predicted off for {off}")
        return self


def precisions_here() -> tuple[str, ...]:
    """The precisions this machine runs natively: fp32, and bf16 where the CPU (AVX512-BF16, AMX)
    or a GPU has it. An emulated bf16 step is many times slower: timing it for a plan takes minutes."""
    device = hardware.resolve_device("auto")
    return ("fp32",) + (("bf16",) if hardware.precision_support(device, "bf16") == "native" else ())


def check_fits(by_hand: dict[str, bool], plans: Plans) -> None:
    """A plan written by hand (label -> fits) against wb.plan's: the same plans, the same verdicts."""
    theirs = {p.label: p.fits for p in plans.plans}
    if by_hand != theirs:
        differ = sorted(set(by_hand.items()) ^ set(theirs.items()))
        raise AssertionError(f"by hand and wb.plan differ: {differ}")
    print(f"by hand and wb.plan agree: {sum(theirs.values())} of {len(theirs)} plans fit "
          f"{format_bytes(plans.target.usable_bytes)}")


def forecast_verdict(forecast: float, measured: float) -> str:
    """A claims-table verdict for a speed forecast (x the baseline) against a measured ratio."""
    said = f"forecast {forecast:.2f}x, measured {measured:.2f}x"
    if (forecast > 1) != (measured > 1):
        return f"does not hold here: {said}; the run went the other way"
    if abs(measured / forecast - 1) <= 0.10:
        return f"holds: {said}, within 10%"
    return (f"holds in part: {said}; the direction holds, the size does not (the forecast times one "
            "micro-batch's kernels, best of two; the run pays the loop, data, logging and a busy machine)")


__all__ += ["PeakCheck", "StepPeaks", "check_peak", "measure_step_peak"]


class StepPeaks(NamedTuple):
    """Per optimizer step (index 0 is step 1): the peak of live tensors and, on a GPU, the
    allocator's peak (None on a CPU)."""

    tensor_bytes: list[int]
    allocator_bytes: list[int] | None
    device: str

    @property
    def steady_bytes(self) -> int:
        """The largest peak from step 2 on: the allocator's on a GPU, else the tensors'."""
        peaks = self.allocator_bytes if self.allocator_bytes is not None else self.tensor_bytes
        return max(peaks[1:] or peaks)


class _PeakPerStep:
    """A sink that closes a step's peak at each log step and starts the next one."""

    def __init__(self, live: LiveTensors, cuda: bool) -> None:
        self.live, self.cuda = live, cuda
        self.tensor: list[int] = []
        self.allocator: list[int] = []

    def start(self, record: RunStart) -> None:
        pass

    def log(self, record: StepRecord) -> None:
        self.tensor.append(self.live.peak_bytes)
        self.live.reset_peak()
        if self.cuda:
            torch.cuda.synchronize()  # a measurement, not training: the sync is fine here
            self.allocator.append(int(torch.cuda.max_memory_allocated()))
            torch.cuda.reset_peak_memory_stats()

    def end(self, record: RunEnd) -> None:
        pass


def _tracked_run(config: RunConfig, steps: int, live: LiveTensors | None, sink: Any, name: str) -> RunConfig:
    """Run `config` for `steps` optimizer steps (logging every step, no evaluation) under `live`
    (None: untracked), `sink` hearing every step. The data set is loaded first, outside it."""
    if steps < 2:
        raise ValueError(f"steps={steps} must be at least 2: the first step creates the optimizer state")
    cfg = dataclasses.replace(config.resolved(), steps=steps, log_every=1, eval_samples=0, epochs=None)
    load_data(cfg.data, seq_len=cfg.seq_len or 128, max_test=None, seed=cfg.seed)  # cached: run() reuses it
    # The hardware probes run() makes once per process (a timed matmul for the peak FLOP/s):
    # made here, outside the tracking, so the first run in a process is measured like any other
    # (inside it, the tracker kept the probe's 2 MiB on its books for the whole run).
    hardware.peak_flops(hardware.resolve_device(cfg.device), cfg.precision)
    # Collection held off: tensors are then freed by reference counts alone, as in the replay
    # (a collection landing mid-step at a moment that depends on the whole process's history
    # could only free cyclic garbage earlier; a step makes none, so the peak is the same).
    gc.collect()
    gc.disable()
    try:
        with live if live is not None else contextlib.nullcontext():
            result = run(cfg, sinks=[sink], name=name, check_fit=check_fits_here)
    finally:
        gc.enable()
    if result.status != "ok":
        raise RuntimeError(f"the run ended {result.status}: {result.message}")
    return cfg


def _on_cuda(config: RunConfig) -> bool:
    device = config.resolved().device
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def measure_step_peak(config: RunConfig, *, steps: int = 3) -> StepPeaks:
    """Run `config` for `steps` optimizer steps (logging every step, no evaluation) and
    return each step's peak. The data set is loaded first, outside the tracking."""
    cuda = _on_cuda(config)
    live = LiveTensors(round_to=CUDA_BLOCK_BYTES if cuda else 1)
    sink = _PeakPerStep(live, cuda)
    _tracked_run(config, steps, live, sink, "peak check")
    return StepPeaks(sink.tensor, sink.allocator if cuda else None, "cuda" if cuda else "cpu")


class PeakCheck(NamedTuple):
    """`estimate()`'s predicted peak next to the measured steady-state peak of a real step."""

    predicted_bytes: int
    measured_bytes: int
    """max_memory_allocated on a GPU, the peak of live tensors on a CPU (steps 2 on)."""
    tensor_bytes: int
    """The peak of live tensors from step 2 on (on a GPU: below the allocator's by its
    rounding and what cuBLAS and cuDNN allocate outside tensors)."""
    device: str

    @property
    def ratio(self) -> float:
        return self.measured_bytes / self.predicted_bytes


def check_peak(config: RunConfig, *, steps: int = 3) -> PeakCheck:
    """Estimate `config`'s peak, run it on this device, and return both (a `PeakCheck`,
    which unpacks as (predicted, measured, tensor peak, device)).

    Example:
        >>> predicted, measured, *_ = check_peak(RunConfig(model="mlp", preset="cpu-quick"))  # doctest: +SKIP
        >>> abs(measured / predicted - 1) < 0.05                                             # doctest: +SKIP
        True
    """
    peaks = measure_step_peak(config, steps=steps)
    predicted = estimate(config, device=peaks.device).peak_bytes
    return PeakCheck(predicted, peaks.steady_bytes, max(peaks.tensor_bytes[1:]), peaks.device)


__all__ += ["measured_snapshot", "predicted_snapshot", "snapshot_figure"]


class _StepRecord:
    """A sink that records optimizer step `at` of a run for a snapshot: on a GPU the CUDA
    allocator's own record (started at step at-1's log, taken at step at's); on a CPU it marks
    the tensor tracker's clock at every log step."""

    def __init__(self, live: LiveTensors | None, at: int) -> None:
        self.live, self.at = live, at
        self.recording = contextlib.ExitStack()
        self.taken: dict[str, Any] = {}

    def start(self, record: RunStart) -> None:
        pass

    def log(self, record: StepRecord) -> None:
        if self.live is not None:
            self.live.mark(f"step {record.step}")
        elif record.step == self.at - 1:
            self.taken = self.recording.enter_context(cuda_history())
        elif record.step == self.at:
            self.recording.close()  # takes torch.cuda.memory._snapshot(), then stops the record

    def end(self, record: RunEnd) -> None:
        self.recording.close()  # a run that ended early stops the record too


def measured_snapshot(config: RunConfig, *, steps: int = 3) -> MemorySnapshot:
    """Run `config` for `steps` steps and return its last step as a memory snapshot, measured.

    On a GPU: the CUDA caching allocator's record of that step (`torch.cuda.memory.
    _record_memory_history`, then `_snapshot()`), what memory_viz is made for. On a CPU, which has
    no such record: every tensor storage the step made and freed, tracked one by one
    (`LiveTensors`), in the same format; tensors only, exact bytes, no allocator.
    """
    if _on_cuda(config):
        sink = _StepRecord(None, steps)
        _tracked_run(config, steps, None, sink, "snapshot")
        if "snapshot" not in sink.taken:
            raise RuntimeError(f"the CUDA record of step {steps} was not taken: did the run reach it?")
        return MemorySnapshot(sink.taken["snapshot"], f"measured: the CUDA caching allocator's record of step {steps} "
                                                      "(torch.cuda.memory._record_memory_history); its blocks from "
                                                      "before the record are all this process holds on the GPU")
    live = LiveTensors(levels=True)
    _tracked_run(config, steps, live, _StepRecord(live, steps), "snapshot")
    clock = {label: at for label, _, _, at in live.marks}

    def made(born: int) -> tuple[dict[str, Any], ...]:
        return (frame(f"step {steps} on this CPU", op_name(live.made_by.get(born)) or "(made before tracking)"),)

    lifetimes = [Lifetime(born, freed, size, size, made(born)) for born, size, freed in live.released]
    lifetimes += [Lifetime(live._born[key], None, size, size, made(live._born[key])) for key, size in live._live.items()]
    data = build_snapshot(lifetimes, start=clock[f"step {steps - 1}"], stop=clock[f"step {steps}"])
    return MemorySnapshot(data, f"measured: the tensors step {steps} made on this CPU, tracked one by one "
                                "(LiveTensors; a CPU has no allocator record)")


def snapshot_figure(predicted: MemorySnapshot, measured: MemorySnapshot) -> Any:
    """The two timelines side by side (what memory_viz's Active Memory Timeline stacks)."""
    return snapshot_timelines({"predicted": predicted, "measured": measured})
