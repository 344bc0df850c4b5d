"""Notebook 08: speed without changing the math. The measurements beside the learner's own lines.

The learner writes the techniques (`torch.profiler.profile` with `record_function` ranges,
`torch.compile`, `F.scaled_dot_product_attention`, `AdamW(fused=True)` / `foreach=True`, TF32);
these helpers measure what those lines did:

- `phase_ms(prof, steps)`: the learner's `record_function` ranges, milliseconds per step;
- `trace_ranges(path)`: the trace `prof.export_chrome_trace(path)` wrote, read back: its named
  ranges and how often each ran (the file Perfetto opens);
- `saved_bytes(fn, *args)`: the bytes autograd keeps for backward while `fn` runs (each
  storage once), e.g. explicit attention against SDPA;
- `optimizer_bench(optimizers)`: `optimizer.step()` alone per optimizer, in alternating rounds,
  and the parameters each reaches from the same gradients;
- `compile_payback(eager, compiled)`: the compile's one-off cost against the time it saves;
- `graph_breaks(fn, *args)`: where torch.compile had to stop a graph (torch._dynamo.explain);
- `matmul_seconds(n)`: a median n x n fp32 matmul on the GPU (with TF32 on or off, as set);
- `missing_here(device, "tf32")`: why this device has no TF32 (a CPU; a GPU below compute
  capability 8.0), None on an Ampere or newer GPU.

Example:
    >>> saved_bytes(lambda x: (x * x).sum(), torch.ones(4, requires_grad=True))  # x kept for backward
    16
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.base.report import Report, Results
from workbench.core.measure.counters import SavedActivationCounter
from workbench.core.measure.result import RunResult
from workbench.lessons.probe import max_relative_difference
from workbench.machine import hardware
from workbench.machine.hardware import missing_here

__all__ = ["Payback", "GraphBreaks", "OptimizerBench", "compile_problem", "phase_ms", "trace_ranges", "saved_bytes",
           "optimizer_bench", "compile_payback", "graph_breaks", "matmul_seconds", "missing_here"]

# Kineto (the profiler's C++ core) writes "USDT: ... profiler_start/profiler_stop" to stderr at every
# profile on torch 2.13: red lines in a notebook that say nothing. Level 6 is above all of kineto's
# log levels; it is read at the first profile, so setting it here (before any) is enough. Profiler
# errors still raise in Python.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def compile_problem(model: torch.nn.Module) -> str | None:
    """Why torch.compile cannot build kernels for `model`'s device here (None: it can), printed when
    there is one: inductor writes C++ for a CPU, which needs a C++ compiler."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    if on_cpu and hardware.cpp_compiler() is None:
        problem = "no C++ compiler (g++ or $CXX): torch.compile cannot build CPU kernels here; the model stays eager"
        print(problem)
        return problem
    return None


def phase_ms(prof: Any, steps: int, names: Sequence[str] = ("forward", "backward", "optimizer")) -> dict[str, float]:
    """Milliseconds per step of each named `record_function` range in a finished profile.

    Example:
        >>> phase_ms(prof, steps=5)  # doctest: +SKIP
        {'forward': 18.2, 'backward': 29.9, 'optimizer': 4.8}
    """
    totals = {e.key: e.cpu_time_total for e in prof.key_averages() if e.key in names}
    if missing := [n for n in names if n not in totals]:
        raise ValueError(f"the profile has no range named {missing}; wrap those lines in "
                         f"torch.profiler.record_function({missing[0]!r})")
    return {n: totals[n] / 1e3 / steps for n in names}


def trace_ranges(path: str | os.PathLike, names: Sequence[str] = ("forward", "backward", "optimizer")) -> dict[str, int]:
    """How many times each named `record_function` range ran, in a trace file: the file
    `prof.export_chrome_trace(path)` wrote, read back as the Chrome trace format's JSON (a
    "traceEvents" list; a range is a complete event, "ph" X, of category "user_annotation"; torch
    adds ranges of its own, such as its optimizers' steps, which `names` leaves out).
    Raises ValueError, naming the file, when it is not such a trace.

    Example:
        >>> trace_ranges("runs/08_profile_trace.json")  # doctest: +SKIP
        {'forward': 5, 'backward': 5, 'optimizer': 5}
    """
    try:
        events = json.loads(open(path, encoding="utf-8").read())["traceEvents"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a Chrome trace (JSON with a 'traceEvents' list): {error}; "
                         "write one with prof.export_chrome_trace(path)") from None
    counts = dict.fromkeys(names, 0)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") in counts:
            counts[e["name"]] += 1
    return counts


def saved_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """Bytes autograd saves for backward while `fn(*args)` runs (each storage once, at full size).

    Example:
        >>> q = torch.ones(2, 8, 4, requires_grad=True)
        >>> saved_bytes(lambda q: q @ q.transpose(-2, -1), q)  # q, once (its transpose is a view)
        256
    """
    with SavedActivationCounter() as saved:
        fn(*args)
    return saved.bytes


# -- fused and foreach optimizers ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OptimizerPoint:
    name: str
    step_time_s: float
    """Median seconds of optimizer.step() alone."""
    max_difference: float
    """Largest relative difference of its parameters from the first optimizer's, after the same gradients."""


class OptimizerBench(Results):
    """optimizer.step() per optimizer, measured together; ratios to the first."""

    kind = "optimizer"
    header = ("optimizer", "step() ms", "x first", "parameters: max relative difference")

    def __init__(self, points: Sequence[OptimizerPoint], *, rounds: int, steps: int) -> None:
        super().__init__(points)
        self.rounds, self.steps = rounds, steps

    def point(self, name: str) -> OptimizerPoint:
        return self.item(name)

    def rows(self) -> list[list[str]]:
        base = self.items[0]
        return [[p.name, f"{p.step_time_s * 1e3:.2f}", f"{p.step_time_s / base.step_time_s:.2f}",
                 f"{p.max_difference:.1e}"] for p in self.items]

    def caption(self) -> str:
        return (f"optimizer.step() alone: medians of {self.rounds} alternating rounds; parameters compared "
                f"after {self.steps} steps from the same gradients")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def optimizer_bench(optimizers: dict[str, torch.optim.Optimizer], *, rounds: int = 20, steps: int = 5,
                    seed: int = 0) -> OptimizerBench:
    """Time `step()` of each optimizer (each over its own copy of the same parameters), and compare
    the parameters they reach after `steps` updates from the same seeded gradients.

    Timed rounds alternate the order, so a busy machine slows every arm alike.

    Example:
        >>> import copy
        >>> layer = torch.nn.Linear(16, 16)
        >>> make = lambda **kw: torch.optim.AdamW(copy.deepcopy(layer).parameters(), **kw)
        >>> bench = optimizer_bench({"for-loop": make(foreach=False), "fused": make(fused=True)}, rounds=3, steps=2)
        >>> bench.point("fused").max_difference < 1e-5
        True
    """
    params = {name: [p for g in opt.param_groups for p in g["params"]] for name, opt in optimizers.items()}
    first = next(iter(optimizers))
    shapes = {name: [p.shape for p in ps] for name, ps in params.items()}
    if any(s != shapes[first] or max_relative_difference(params[n], params[first]) > 0 for n, s in shapes.items()):
        raise ValueError("optimizer_bench: each optimizer must hold a copy of the same parameters "
                         "(build each over copy.deepcopy(model).parameters())")
    device = params[first][0].device
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):  # the same gradients for every copy: any difference is the optimizers' rounding
        grads = [torch.randn(shape, generator=generator).to(device) for shape in shapes[first]]
        for name, opt in optimizers.items():
            for p, g in zip(params[name], grads):
                p.grad = g.clone()
            opt.step()
    reached = {name: [p.detach().clone() for p in ps] for name, ps in params.items()}
    names = list(optimizers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            _sync(device)
            start = time.perf_counter()
            optimizers[name].step()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    points = [OptimizerPoint(n, statistics.median(times[n]), max_relative_difference(reached[n], reached[first]))
              for n in names]
    return OptimizerBench(points, rounds=rounds, steps=steps)


# -- torch.compile -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Payback(Report):
    """A compile's one-off cost against the time it saves per step."""

    first_step_extra_s: float
    """Compiled first step minus eager first step: the compile, mostly."""
    eager_step_s: float
    compiled_step_s: float

    @property
    def steps_to_pay_back(self) -> int | None:
        """Steps after which the compiled run is ahead in total time; None: never (no step is faster)."""
        saving = self.eager_step_s - self.compiled_step_s
        return None if saving <= 0 else max(0, math.ceil(self.first_step_extra_s / saving))

    header = ("figure", "value")

    def rows(self) -> list[tuple[str, str]]:
        pays = self.steps_to_pay_back
        return [
            ("compile (first step, extra)", f"{self.first_step_extra_s:.1f} s"),
            ("steady step: eager -> compiled", (f"{self.eager_step_s * 1e3:.1f} -> {self.compiled_step_s * 1e3:.1f} ms "
                                                f"(x{self.compiled_step_s / self.eager_step_s:.2f})")),
            ("pays back after", "never at this size (no step is faster)" if pays is None else f"{pays:,} steps"),
        ]

    def caption(self) -> str:
        return "torch.compile: one-off cost against per-step saving"


def compile_payback(eager: RunResult, compiled: RunResult) -> Payback:
    """How many steps the compiled run needs before its compile has paid for itself: the difference
    of the two runs' first steps against the difference of their step times.

    Example:
        >>> compile_payback(baseline, compiled).steps_to_pay_back  # doctest: +SKIP
    """
    for result in (eager, compiled):
        if result.first_step_s is None or result.step_time_s is None:
            raise ValueError(f"{result.name!r} has no first-step or step time (a resumed or unfinished run); "
                             "pass two runs that started from step 0")
    return Payback(first_step_extra_s=compiled.first_step_s - eager.first_step_s,
                   eager_step_s=eager.step_time_s, compiled_step_s=compiled.step_time_s)


@dataclass(frozen=True, slots=True)
class GraphBreaks(Report):
    """What torch._dynamo.explain found: graphs, breaks, and why each break happened."""

    graphs: int
    breaks: int
    reasons: tuple[str, ...]

    header = ("graphs", "breaks", "why")

    def rows(self) -> list[tuple[str, str, str]]:
        return [(str(self.graphs), str(self.breaks), "; ".join(self.reasons) or "none: one whole graph")]


def graph_breaks(fn: Callable[..., Any], *args: Any) -> GraphBreaks:
    """Trace `fn(*args)` with torch._dynamo.explain (no code generation: seconds, not a compile).

    Dynamo also logs each break as a multi-line warning on stderr; the table says the same, so
    that logger is quiet while tracing here (and only here).

    Example:
        >>> graph_breaks(lambda x: (x * 2).sum(), torch.ones(3)).breaks
        0
    """
    logger = logging.getLogger("torch._dynamo")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        explained = torch._dynamo.explain(fn)(*args)
    finally:
        logger.setLevel(level)
    reasons = []
    for reason in explained.break_reasons:
        text = " ".join(str(reason.reason).split())
        where = reason.user_stack[-1] if reason.user_stack else None
        place = f" (at line {where.lineno}: {where.line.strip()})" if where else ""
        reasons.append(text[:100] + place)
    return GraphBreaks(graphs=explained.graph_count, breaks=explained.graph_break_count, reasons=tuple(reasons))


# -- TF32 ----------------------------------------------------------------------------------------

def matmul_seconds(n: int = 4096, *, repeats: int = 10) -> float:
    """Median seconds of an n x n fp32 matmul on the GPU, under whatever TF32 setting is in force.

    Example:
        >>> torch.backends.cuda.matmul.allow_tf32 = True; matmul_seconds()  # doctest: +SKIP
    """
    if not torch.cuda.is_available():
        raise RuntimeError("matmul_seconds needs a CUDA GPU; TF32 is a tensor-core format")
    a, b = (torch.randn(n, n, device="cuda") for _ in range(2))
    a @ b  # warm-up: cuBLAS picks its kernel for the setting in force
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)

