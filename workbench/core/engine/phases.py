"""The profiler's phase ranges over the loop: `LoopPhases` names the loop's phases (data,
forward, backward, optimizer, other, log) for `torch.profiler`, and costs one flag read per
phase when no profiler runs. (Notebook 08's switches themselves, compile, TF32, attention and
the fused optimizer, are in `workbench/core/switches/`.)
"""

from __future__ import annotations

import torch

PHASES = ("data", "forward", "backward", "optimizer", "other", "log")
"""The loop's phases as the profiler sees them, in loop order. 'other' is the loop's own
bookkeeping (summing the loss; at a log step, reading it); 'log' is building the record and
the sinks' time, which the loop leaves out of its timings as well."""

RANGE_PREFIX = "workbench."


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
