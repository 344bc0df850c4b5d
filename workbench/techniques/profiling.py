"""Look at a profile before guessing: torch.profiler over a real run, its time split and top ops.

`profile_run(config)` trains `config` through the same `run()` as every notebook, under
`torch.profiler.profile`, and reads what it recorded:

- the loop's phases (data, forward, backward, optimizer, other, log), which the loop names
  with record_function ranges while a profiler runs (`engine.speedups.LoopPhases`), summed
  over the timed steps (the first step, which counts exactly and compiles, is left out, as
  the run's own timings leave it out);
- the operators that took the most time inside those steps (self time: an op's own time,
  not its children's);
- a trace file for Perfetto (https://ui.perfetto.dev) or chrome://tracing.

The run's dashboard figure "waiting for data" (`RunResult.data_wait_fraction`) is the loop's
own clock around fetching a batch; the profile's data share is the profiler's clock around
the same lines. `Profile.data_fraction` is that share, to hold the two side by side.

Example:
    >>> prof = profile_run(RunConfig(model="gpt", steps=8, log_every=4, eval_samples=0))  # doctest: +SKIP
    >>> prof.data_fraction, prof.result.data_wait_fraction  # doctest: +SKIP
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from workbench.core.config import RunConfig
from workbench.core.report import Report, text_table
from workbench.engine import train
from workbench.engine.speedups import PHASES, RANGE_PREFIX
from workbench.measure.records import Sink
from workbench.measure.result import RunResult

__all__ = ["TIMED_PHASES", "Profile", "default_trace_path", "phase_times", "profile_run"]

TIMED_PHASES = ("data", "forward", "backward", "optimizer", "other")
"""The phases the loop's own timings cover ('log', the sinks' time, is left out of both)."""


def default_trace_path(name: str) -> str:
    """Where a trace goes unless told: the system's temporary folder (never the repository)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name) or "run"
    return os.path.join(tempfile.gettempdir(), "workbench-profiles", f"{safe}.json")


@dataclass(frozen=True)
class Profile(Report):
    """What the profiler saw of one run's timed steps."""

    result: RunResult
    phase_s: dict[str, float]
    """Seconds per loop phase, summed over the timed steps (first step left out)."""
    timed_steps: int
    top_ops: list[tuple[str, float, int]]
    """(op, self seconds, calls) inside the timed steps, the largest first."""
    trace_path: str
    device: str

    @property
    def timed_s(self) -> float:
        """The phases the loop times, together: what the run's step time covers."""
        return sum(self.phase_s[p] for p in TIMED_PHASES)

    @property
    def data_fraction(self) -> float:
        """The profile's share of the timed steps spent fetching data."""
        return self.phase_s["data"] / self.timed_s

    header = ("phase", "ms / step", "share")

    def rows(self) -> list[tuple[str, str, str]]:
        rows = [(p, f"{self.phase_s[p] / self.timed_steps * 1e3:.2f}", f"{self.phase_s[p] / self.timed_s:.1%}")
                for p in TIMED_PHASES]
        rows.append(("step (sum)", f"{self.timed_s / self.timed_steps * 1e3:.2f}", "100%"))
        rows.append(("log (not timed)", f"{self.phase_s['log'] / self.timed_steps * 1e3:.2f}", ""))
        return rows

    def caption(self) -> str:
        where = " (host time: the GPU runs behind it, asynchronously)" if self.device == "cuda" else ""
        return f"{self.result.name}: time per step by phase over {self.timed_steps} timed steps{where}"

    def top_ops_table(self, n: int = 10) -> str:
        """The `n` ops with the most self time in the timed steps, as text."""
        total = sum(s for _, s, _ in self.top_ops) or 1.0
        rows = [(op, f"{s / self.timed_steps * 1e3:.2f}", f"{s / total:.1%}", f"{calls // self.timed_steps}")
                for op, s, calls in self.top_ops[:n]]
        return text_table(rows, header=("op", "self ms / step", "share of op time", "calls / step"),
                          caption=f"top {n} ops by self time ({self.device} host time)")


def phase_times(events: Iterable[Any], *, skip_steps: int = 1, grad_accum_steps: int = 1
                ) -> tuple[dict[str, float], int, list[tuple[float, float]]]:
    """Sum the loop's phase ranges per phase, skipping the first `skip_steps` optimizer steps.

    Pure: `events` are anything with `.name` and `.time_range.start/.end` in microseconds (the
    profiler's FunctionEvents). A step's phases begin at its first 'data' range; with gradient
    accumulation a step holds `grad_accum_steps` of them. Returns (seconds per phase, timed
    steps, the (start, end) microseconds of each timed step) for ops to be attributed to.

    Example:
        >>> from types import SimpleNamespace as E
        >>> ev = lambda name, a, b: E(name="workbench." + name, time_range=E(start=a, end=b))
        >>> phase_times([ev("data", 0, 10), ev("forward", 10, 30), ev("data", 30, 31), ev("forward", 31, 41)])[:2]
        ({'data': 1e-06, 'forward': 1e-05, 'backward': 0.0, 'optimizer': 0.0, 'other': 0.0, 'log': 0.0}, 1)
    """
    ranges = sorted(((e.name[len(RANGE_PREFIX):], e.time_range.start, e.time_range.end) for e in events
                     if e.name.startswith(RANGE_PREFIX)), key=lambda r: r[1])
    seconds = dict.fromkeys(PHASES, 0.0)
    micro, steps, windows = 0, 0, []
    for phase, start, end in ranges:
        if phase == "data":
            micro += 1
            if (micro - 1) % grad_accum_steps == 0:  # the first micro-batch of a step
                steps += 1
                if steps > skip_steps:
                    windows.append([start, end])
        if steps > skip_steps:
            seconds[phase] += (end - start) / 1e6
            windows[-1][1] = max(windows[-1][1], end)
    return seconds, max(0, steps - skip_steps), [tuple(w) for w in windows]


def _top_ops(events: Iterable[Any], windows: list[tuple[float, float]]) -> list[tuple[str, float, int]]:
    """Self time and calls per aten op whose start lies inside a timed step."""
    import bisect

    starts = [w[0] for w in windows]
    totals: dict[str, list[float]] = {}
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i < 0 or e.time_range.start > windows[i][1]:
            continue
        entry = totals.setdefault(e.name, [0.0, 0])
        entry[0] += e.self_cpu_time_total / 1e6
        entry[1] += 1
    return sorted(((name, s, int(calls)) for name, (s, calls) in totals.items()), key=lambda t: -t[1])


def profile_run(config: RunConfig, *, name: str = "profiled", sinks: Iterable[Sink] = (),
                trace_path: str | None = None) -> Profile:
    """Train `config` with `run()` under torch.profiler; its phases, top ops and trace.

    The profiler adds a few microseconds to every op it records, so the profiled run is a
    little slower than an unprofiled one: compare its phases with each other (and its data
    share with the same run's `data_wait_fraction`), not its step time with another run's.

    Example:
        >>> prof = profile_run(RunConfig(model="mlp", steps=6, log_every=3, eval_samples=0))  # doctest: +SKIP
        >>> print(prof); print(prof.top_ops_table())  # doctest: +SKIP
    """
    cfg = config.resolved()
    if cfg.resume_from:
        raise ValueError("profile_run profiles a run from its first step; pass a config without resume_from")
    if cfg.steps < 2:
        raise ValueError(f"steps={cfg.steps}: the first step is not timed, so profile at least 2 (e.g. steps=8)")
    activities = [torch.profiler.ProfilerActivity.CPU]
    device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        result = train.run(cfg, sinks=sinks, name=name)
    trace_path = trace_path or default_trace_path(name)
    os.makedirs(os.path.dirname(os.path.abspath(trace_path)), exist_ok=True)
    prof.export_chrome_trace(trace_path)
    events = prof.events()
    seconds, steps, windows = phase_times(events, skip_steps=1, grad_accum_steps=cfg.grad_accum_steps)
    return Profile(result=result, phase_s=seconds, timed_steps=steps, top_ops=_top_ops(events, windows),
                   trace_path=trace_path, device=device)
