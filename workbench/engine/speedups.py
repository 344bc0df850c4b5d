"""The loop side of notebook 08's switches: torch.compile, TF32, and the profiler's phase ranges.

Each acts where `train.run` calls it (`# technique:` there): `compile_model` wraps the
prepared model the loop trains (evaluation and the result keep the plain one, which shares
its parameters); `tf32_matmuls` lets CUDA's fp32 matmuls use TF32 tensor cores for the
training loop only and restores what was set before; `LoopPhases` names the loop's phases
(data, forward, backward, optimizer, other, log) for `torch.profiler`, and costs one flag
read per phase when no profiler runs. The fused attention and fused optimizer switches act
in the model (`models.set_attention`) and the optimizer's constructor (`optim.make_optimizer`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

PHASES = ("data", "forward", "backward", "optimizer", "other", "log")
"""The loop's phases as the profiler sees them, in loop order. 'other' is the loop's own
bookkeeping (summing the loss; at a log step, reading it); 'log' is building the record and
the sinks' time, which the loop leaves out of its timings as well."""

RANGE_PREFIX = "workbench."


def compile_model(model: nn.Module, mode: str) -> nn.Module:
    """`torch.compile(model, mode=mode)`, or the model itself for mode 'none'. Lazy: the first
    forward compiles (the first, untimed, step of a run pays it).

    Example:
        >>> compile_model(nn.Linear(2, 2), "none")
        Linear(in_features=2, out_features=2, bias=True)
    """
    if mode == "none":
        return model
    return torch.compile(model, mode=mode)


@contextlib.contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """Inside: CUDA fp32 matmuls and cuDNN convolutions may use TF32 tensor cores (`enabled`);
    after: as before, so a baseline run later in the same process is full fp32 again. Does
    nothing when not enabled.

    The flags are the long-standing `allow_tf32` ones (what `set_float32_matmul_precision("high")`
    sets for CUDA), not torch 2.9's per-backend `fp32_precision`: torch raises when a program
    mixes the two APIs (measured on 2.13: `get_float32_matmul_precision()` after setting
    `fp32_precision`), and most code, inductor's included, still reads these.

    Example:
        >>> with tf32_matmuls(False):
        ...     pass
    """
    if not enabled:
        yield
        return
    flags = [torch.backends.cuda.matmul, torch.backends.cudnn]
    before = [flag.allow_tf32 for flag in flags]
    for flag in flags:
        flag.allow_tf32 = True
    try:
        yield
    finally:
        for flag, value in zip(flags, before):
            flag.allow_tf32 = value


class LoopPhases:
    """Profiler ranges over the loop's phases: `enter(phase)` ends the open range and opens the
    next, so a phase lasts until the next one starts and the ranges tile the loop with no gap
    and no nesting (one line per phase in the loop, no re-indented code).

    Without an active profiler it opens nothing: a record_function costs ~11 us to enter and
    leave even then (measured here), six times a step; the check costs ~0.3 us.

    Example:
        >>> phases = LoopPhases()
        >>> with torch.profiler.profile() as prof:
        ...     phases.enter("forward"); _ = torch.ones(2) * 2; phases.close()
        >>> [e.name for e in prof.events() if e.name.startswith(RANGE_PREFIX)]
        ['workbench.forward']
    """

    def __init__(self) -> None:
        self._open: torch.autograd.profiler.record_function | None = None

    def enter(self, phase: str) -> None:
        self.close()
        if torch.autograd._profiler_enabled():
            self._open = torch.autograd.profiler.record_function(RANGE_PREFIX + phase)
            self._open.__enter__()

    def close(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None
