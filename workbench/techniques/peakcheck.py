"""The predicted peak of a step against the peak of a real one, on this device.

`measure_step_peak(config)` runs `run()` for a few optimizer steps and reads the peak of
each one: on a GPU the CUDA allocator's (`max_memory_allocated`, reset at every step) and
the peak of live tensors (`measure.live.LiveTensors`); on a CPU, which has no allocator
counter, the live tensors only. `check_peak(config)` lays it next to `estimate()`.

The steady state is what a plan must fit: from the second step on, when the optimizer
state exists (the first step creates it, and is counted, not timed). The data set is
loaded before tracking starts: it is host memory the estimate does not model, not part
of a step.

Example:
    >>> check = check_peak(RunConfig(model="gpt", preset="cpu-quick"))   # doctest: +SKIP
    >>> check.predicted_bytes, check.measured_bytes                     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import gc
from typing import NamedTuple

import torch

from workbench.core.config import RunConfig
from workbench.measure.live import CUDA_BLOCK_BYTES, LiveTensors
from workbench.measure.records import RunEnd, RunStart, StepRecord

__all__ = ["PeakCheck", "StepPeaks", "check_peak", "measure_step_peak"]


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


def measure_step_peak(config: RunConfig, *, steps: int = 3) -> StepPeaks:
    """Run `config` for `steps` optimizer steps (logging every step, no evaluation) and
    return each step's peak. The data set is loaded first, outside the tracking."""
    from workbench.core.data import load_data
    from workbench.engine.train import run

    if steps < 2:
        raise ValueError(f"steps={steps} must be at least 2: the first step creates the optimizer state")
    cfg = dataclasses.replace(config.resolved(), steps=steps, log_every=1, eval_samples=0, epochs=None)
    load_data(cfg.data, seq_len=cfg.seq_len or 128, max_test=None, seed=cfg.seed)  # cached: run() reuses it
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    live = LiveTensors(round_to=CUDA_BLOCK_BYTES if cuda else 1)
    sink = _PeakPerStep(live, cuda)
    # Collection held off: tensors are then freed by reference counts alone, as in the replay
    # (a collection landing mid-step at a moment that depends on the whole process's history
    # could only free cyclic garbage earlier; a step makes none, so the peak is the same).
    gc.collect()
    gc.disable()
    try:
        with live:
            result = run(cfg, sinks=[sink], name="peak check")
    finally:
        gc.enable()
    if result.status != "ok":
        raise RuntimeError(f"the run ended {result.status}: {result.message}")
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
    from workbench.measure.estimate import estimate

    peaks = measure_step_peak(config, steps=steps)
    predicted = estimate(config, device=peaks.device).peak_bytes
    return PeakCheck(predicted, peaks.steady_bytes, max(peaks.tensor_bytes[1:]), peaks.device)
