"""Notebook 08: speed without changing the math. What each speed switch needs, and what it buys.

The switches are RunConfig fields acting in the loop (`compile`, `attention`, `optimizer_impl`,
`tf32`; see engine/speedups.py). Here are the measurements the notebook shows beside them:

- `toolchain()`: what this machine offers (a C++ compiler for inductor on CPU, the fused
  attention kernels, fused optimizers on this device, TF32);
- `compile_payback(eager, compiled)`: the compile's one-off cost against the time it saves
  per step, from two runs' figures;
- `compile_cache()`: inductor's on-disk cache and this process's hits and misses (a second
  compile of the same graph loads it instead of compiling: honest to reuse, and to say so);
- `graph_breaks(fn, *args)`: where torch.compile had to stop a graph (torch._dynamo.explain);
- `attention_kernels(model, inputs)`: which attention kernel ran (the profiler's op names);
- `matmul_tf32_speedup()`: fp32 against TF32 matmuls on a GPU.

The interleaved timings of the switches (the optimizer step alone, whole steps) are in
`speed_bench.py`.

Example:
    >>> toolchain("cpu").cpp_compiler  # doctest: +SKIP
    '/usr/bin/g++'

Notebook 08: the speed switches timed fairly on a busy machine, in alternating rounds.

Runs trained one after another drift with whatever else the machine does; these benches run
every arm on the same data in rounds that alternate their order (as `checkpointing_dial` does),
so the ratios hold with another process on a core:

- `optimizer_bench(model)`: `optimizer.step()` alone per implementation (for-loop, foreach,
  fused), and the parameters each reaches from the same gradients;
- `step_bench(configs)`: one whole training step per RunConfig, set up as `run()` sets it up.

Example:
    >>> bench = optimizer_bench(torch.nn.Linear(64, 64), rounds=5)  # doctest: +SKIP
    >>> bench.ratio("step_time_s", "fused"), bench.point("fused").max_difference  # doctest: +SKIP

Look at a profile before guessing: torch.profiler over a real run, its time split and top ops.

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

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
import torch
from torch import nn
from workbench.core import hardware
from workbench.core.optim import make_optimizer
from workbench.core.report import Report
from workbench.measure.result import RunResult
import copy
from collections.abc import Sequence
from workbench.core.optim import IMPLEMENTATIONS, make_optimizer
from workbench.core.report import Results
from workbench.measure.probe import max_relative_difference
import tempfile
from collections.abc import Iterable
from workbench.core.config import RunConfig
from workbench.core.report import Report, text_table
from workbench.engine import train
from workbench.engine.speedups import PHASES, RANGE_PREFIX
from workbench.measure.records import Sink


__all__ = [
    "COMPILE_MODES",
    "CompileCache",
    "GraphBreaks",
    "Payback",
    "Toolchain",
    "attention_kernels",
    "compile_cache",
    "compile_payback",
    "graph_breaks",
    "inductor_vector_isa",
    "matmul_tf32_speedup",
    "toolchain",
]

COMPILE_MODES: dict[str, str] = {
    "default": "fuse elementwise ops into generated kernels (C++/OpenMP on CPU, Triton on GPU); matmuls stay library calls",
    "reduce-overhead": "default + CUDA graphs: the whole step replayed as one launch (GPU only; on a CPU = default)",
    "max-autotune": "reduce-overhead + benchmarks matmul templates and tile sizes while compiling (minutes)",
    "max-autotune-no-cudagraphs": "max-autotune without CUDA graphs",
}
"""torch.compile's modes, in words (their inductor options: torch._inductor.list_mode_options())."""


# -- what this machine offers ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Toolchain(Report):
    """What the notebook's switches need, found on this machine."""

    device: str
    torch_version: str
    cpp_compiler: str | None
    inductor_cache_dir: str
    attention_kernels: tuple[str, ...]
    fused_optimizers: tuple[str, ...]
    tf32: str

    header = ("switch", "here")

    def rows(self) -> list[tuple[str, str]]:
        compiler = self.cpp_compiler or "none found: compile on a CPU is unavailable (apt-get install g++)"
        return [
            ("device", self.device),
            ("torch", self.torch_version),
            ("compile: C++ compiler (CPU kernels)", compiler if self.device == "cpu" else (compiler + " (GPU kernels: Triton)")),
            ("compile: inductor cache", self.inductor_cache_dir),
            ("attention='sdpa': kernels", ", ".join(self.attention_kernels)),
            ("optimizer_impl='fused' works for", ", ".join(self.fused_optimizers) or "none here"),
            ("tf32", self.tf32),
        ]

    def caption(self) -> str:
        return "What this machine offers the speed switches"


def _inductor_cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def toolchain(device: str = "auto") -> Toolchain:
    """What this machine offers each switch (builds nothing large; no CUDA work on a CPU).

    Example:
        >>> toolchain("cpu").device
        'cpu'
    """
    device = hardware.resolve_device(device)
    if device == "cuda":
        backends = torch.backends.cuda
        kernels = tuple(name for name, on in (("flash", backends.flash_sdp_enabled()),
                                              ("memory-efficient", backends.mem_efficient_sdp_enabled()),
                                              ("cuDNN", backends.cudnn_sdp_enabled()),
                                              ("math", backends.math_sdp_enabled())) if on)
        info = hardware.gpu_info()
        cc = info.compute_capability if info else (0, 0)
        tf32 = (f"available ({info.name}, compute capability {cc[0]}.{cc[1]})" if cc >= (8, 0)
                else f"not on {info.name if info else 'this GPU'} (needs compute capability 8.0+)")
    else:
        kernels = ("flash (CPU)", "math") if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu") else ("math",)
        tf32 = "not on a CPU (a CUDA tensor-core format)"
    param = nn.Parameter(torch.zeros(1, device=device))
    param.grad = torch.zeros(1, device=device)
    fused = []
    for name in ("adamw", "adam", "sgd"):
        try:
            holder = nn.Module()
            holder.p = param
            make_optimizer(holder, SimpleNamespace(optimizer=name, optimizer_impl="fused", lr=1e-3, weight_decay=0.0)).step()
            fused.append(name)
        except (RuntimeError, TypeError, ValueError):
            pass
    return Toolchain(device=device, torch_version=torch.__version__, cpp_compiler=hardware.cpp_compiler(),
                     inductor_cache_dir=_inductor_cache_dir(), attention_kernels=kernels,
                     fused_optimizers=tuple(fused), tf32=tf32)


# -- torch.compile -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Payback(Report):
    """A compile's one-off cost against the time it saves per step (two runs' figures)."""

    first_step_extra_s: float
    """Compiled first step minus eager first step: the compile, mostly."""
    step_saving_s: float
    """Eager steady step time minus compiled (negative: compiled is slower)."""
    eager_step_s: float
    compiled_step_s: float

    @property
    def steps_to_pay_back(self) -> int | None:
        """Steps after which the compiled run is ahead in total time (0: at once, the compile cost
        nothing here); None: never (no step is faster)."""
        if self.step_saving_s <= 0:
            return None
        return max(0, math.ceil(self.first_step_extra_s / self.step_saving_s))

    header = ("figure", "value")

    def rows(self) -> list[tuple[str, str]]:
        pays = self.steps_to_pay_back
        return [
            ("compile (first step, extra)", f"{self.first_step_extra_s:.1f} s"),
            ("steady step: eager -> compiled", (f"{self.eager_step_s * 1e3:.1f} -> {self.compiled_step_s * 1e3:.1f} ms "
                                                f"(x{self.compiled_step_s / self.eager_step_s:.2f})")),
            ("pays back after", "never at this size (no step is faster)" if pays is None
             else "at once (this run compiled nothing: the code was reused)" if pays == 0 else f"{pays:,} steps"),
        ]

    def caption(self) -> str:
        return "torch.compile: one-off cost against per-step saving"


def compile_payback(eager: RunResult, compiled: RunResult, *, eager_step_s: float | None = None,
                    compiled_step_s: float | None = None) -> Payback:
    """How many steps the compiled run needs before its compile has paid for itself.

    The compile's cost is the difference of the two runs' first steps; the saving per step is
    the difference of their step times, or of `eager_step_s` and `compiled_step_s` when given
    (steps timed in alternating rounds, `speed_bench.step_bench`: fairer on a busy machine than
    two runs trained one after the other).

    Example:
        >>> compile_payback(baseline, compiled).steps_to_pay_back  # doctest: +SKIP
    """
    for result in (eager, compiled):
        if result.first_step_s is None or result.step_time_s is None:
            raise ValueError(f"{result.name!r} has no first-step or step time (a resumed or unfinished run); "
                             "pass two runs that started from step 0")
    eager_step_s = eager.step_time_s if eager_step_s is None else eager_step_s
    compiled_step_s = compiled.step_time_s if compiled_step_s is None else compiled_step_s
    return Payback(first_step_extra_s=compiled.first_step_s - eager.first_step_s,
                   step_saving_s=eager_step_s - compiled_step_s,
                   eager_step_s=eager_step_s, compiled_step_s=compiled_step_s)


@dataclass(frozen=True, slots=True)
class CompileCache:
    """Inductor's FX graph cache: where it lives, and this process's hits and misses so far."""

    directory: str
    hits: int
    misses: int

    def since(self, before: CompileCache) -> CompileCache:
        return CompileCache(self.directory, self.hits - before.hits, self.misses - before.misses)

    def __str__(self) -> str:
        return f"inductor cache {self.directory}: {self.hits} graph(s) loaded, {self.misses} compiled"


def compile_cache() -> CompileCache:
    """The FX graph cache's counters (torch._dynamo.utils.counters: private, so read defensively).

    A miss compiles C++ (or Triton) from scratch: tens of seconds on 2 cores for the small GPT's
    forward and backward (measured here: 25-60 s with the machine busy). A hit loads the kernels
    another compile of the same graph, shapes and settings wrote earlier (this process, or any
    earlier one: the cache is on disk): a few seconds of tracing remain.
    """
    from torch._dynamo.utils import counters

    inductor = counters.get("inductor", {})
    return CompileCache(_inductor_cache_dir(), int(inductor.get("fxgraph_cache_hit", 0)),
                        int(inductor.get("fxgraph_cache_miss", 0)))


def inductor_vector_isa() -> tuple[str, float]:
    """(the vector instructions inductor writes CPU kernels for, seconds it took to find out).

    The first compile on a machine probes the C++ compiler: it builds and loads a test program per
    instruction set (AVX-512, AVX2...), ~5-20 s on 2 cores, then caches the answer on disk. Calling
    this first keeps that one-off out of a model's measured compile. It honours
    ATEN_CPU_CAPABILITY (e.g. avx2), as inductor does.

    Example:
        >>> inductor_vector_isa()  # doctest: +SKIP
        ('avx512', 6.2)
    """
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    start = time.perf_counter()
    isa = pick_vec_isa()
    return (str(isa) if isa else "none (scalar C++)"), time.perf_counter() - start


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

    Example:
        >>> graph_breaks(lambda x: (x * 2).sum(), torch.ones(3)).breaks
        0
    """
    explained = torch._dynamo.explain(fn)(*args)
    reasons = []
    for reason in explained.break_reasons:
        text = " ".join(str(reason.reason).split())
        where = reason.user_stack[-1] if reason.user_stack else None
        place = f" (at {os.path.basename(where.filename)}:{where.lineno}: {where.line.strip()})" if where else ""
        reasons.append(text[:160] + place)
    return GraphBreaks(graphs=explained.graph_count, breaks=explained.graph_break_count, reasons=tuple(reasons))


# -- attention -----------------------------------------------------------------------------------

def attention_kernels(model: nn.Module, inputs: torch.Tensor) -> list[str]:
    """The attention kernels one forward of `model` runs (the profiler's aten op names, the
    dispatcher's `aten::scaled_dot_product_attention` entry left out), in order of first use.

    Example:
        >>> attention_kernels(set_attention(gpt, "sdpa"), x)  # doctest: +SKIP
        ['aten::_scaled_dot_product_flash_attention_for_cpu']
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.no_grad(), torch.profiler.profile(activities=activities) as prof:
        model(inputs)
    names: list[str] = []
    for event in prof.events():
        fused = ("attention" in event.name or "sdpa" in event.name) and event.name != "aten::scaled_dot_product_attention"
        if fused and event.name not in names:
            names.append(event.name)
    return names


# -- TF32 ----------------------------------------------------------------------------------------

def matmul_tf32_speedup(*, n: int = 4096, repeats: int = 10) -> float:
    """fp32 matmul time over the same matmul with TF32 allowed, on this process's GPU (medians).

    Example:
        >>> matmul_tf32_speedup() > 2  # doctest: +SKIP  (an A100/H100: about 4-8)
        True
    """
    from workbench.switches.compiling import tf32_matmuls

    if not torch.cuda.is_available():
        raise RuntimeError("matmul_tf32_speedup needs a CUDA GPU; TF32 is a tensor-core format")
    a, b = (torch.randn(n, n, device="cuda") for _ in range(2))

    def median_time() -> float:
        a @ b
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    fp32 = median_time()
    with tf32_matmuls(True):
        tf32 = median_time()
    return fp32 / tf32

__all__ += ["OptimizerBench", "OptimizerPoint", "StepBench", "StepPoint", "optimizer_bench", "step_bench"]


# -- optimizers ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OptimizerPoint:
    name: str
    """The implementation: 'for-loop', 'foreach', 'fused' (or 'default')."""
    step_time_s: float
    """Median seconds of optimizer.step() alone."""
    max_difference: float
    """Largest relative difference of the parameters from the first implementation's, after the
    same gradients (max over tensors of max|diff| / max|reference|)."""


class OptimizerBench(Results):
    """optimizer.step() per implementation, measured together; ratios to the first."""

    kind = "implementation"
    header = ("implementation", "step() ms", "x first", "parameters: max relative difference")

    def __init__(self, points: Sequence[OptimizerPoint], *, optimizer: str, rounds: int, steps: int,
                 parameters: int, tensors: int) -> None:
        super().__init__(points)
        self.optimizer, self.rounds, self.steps = optimizer, rounds, steps
        self.parameters, self.tensors = parameters, tensors

    @property
    def points(self) -> list[OptimizerPoint]:
        return self.items

    def point(self, name: str) -> OptimizerPoint:
        return self.item(name)

    def rows(self) -> list[list[str]]:
        base = self.items[0]
        return [[p.name, f"{p.step_time_s * 1e3:.2f}", f"{p.step_time_s / base.step_time_s:.2f}",
                 f"{p.max_difference:.1e}"] for p in self.items]

    def caption(self) -> str:
        return (f"{self.optimizer}.step() over {self.parameters:,} parameters in {self.tensors} tensors: medians of "
                f"{self.rounds} interleaved rounds; parameters compared after {self.steps} steps from the same gradients")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def optimizer_bench(model: nn.Module, *, optimizer: str = "adamw", impls: Sequence[str] = ("for-loop", "foreach", "fused"),
                    lr: float = 1e-3, weight_decay: float = 0.0, rounds: int = 20, steps: int = 5,
                    seed: int = 0) -> OptimizerBench:
    """Time `optimizer.step()` alone for each implementation on copies of `model`'s parameters,
    and compare the parameters they reach after `steps` updates from the same gradients.

    Gradients are drawn once per step from a seeded generator (the same for every copy), so
    any difference in the parameters is the implementations' rounding alone. Timed rounds
    alternate the order of the implementations, so a busy machine slows them alike.

    Example:
        >>> bench = optimizer_bench(nn.Linear(16, 16), rounds=3, steps=2)
        >>> [p.name for p in bench.points], bench.point("fused").max_difference < 1e-5
        (['for-loop', 'foreach', 'fused'], True)
    """
    if unknown := [i for i in impls if i not in IMPLEMENTATIONS]:
        raise ValueError(f"impls {unknown} are not known; use some of {list(IMPLEMENTATIONS)}")
    for name, value in (("rounds", rounds), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a whole number >= 1")
    copies = {impl: copy.deepcopy(model) for impl in impls}
    device = next(model.parameters()).device
    optimizers = {impl: make_optimizer(copies[impl], SimpleNamespace(optimizer=optimizer, optimizer_impl=impl, lr=lr,
                                                                     weight_decay=weight_decay)) for impl in impls}
    generator = torch.Generator().manual_seed(seed)
    shapes = [p.shape for p in model.parameters() if p.requires_grad]
    for _ in range(steps):  # the same gradients for every copy; then the parameters reached
        grads = [torch.randn(shape, generator=generator).to(device) for shape in shapes]
        for impl in impls:
            for p, g in zip((p for p in copies[impl].parameters() if p.requires_grad), grads):
                p.grad = g.clone()
            optimizers[impl].step()
    reached = {impl: [p.detach() for p in copies[impl].parameters() if p.requires_grad] for impl in impls}
    times: dict[str, list[float]] = {impl: [] for impl in impls}
    for r in range(rounds):
        for impl in (impls if r % 2 == 0 else list(reversed(impls))):
            _sync(device)
            start = time.perf_counter()
            optimizers[impl].step()
            _sync(device)
            times[impl].append(time.perf_counter() - start)
    first = impls[0]
    points = [OptimizerPoint(impl, statistics.median(times[impl]), max_relative_difference(reached[impl], reached[first]))
              for impl in impls]
    return OptimizerBench(points, optimizer=optimizer, rounds=rounds, steps=steps,
                          parameters=sum(math.prod(s) for s in shapes), tensors=len(shapes))


# -- whole steps, interleaved ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StepPoint:
    name: str
    step_time_s: float
    """Median seconds of one training step: forward, loss, backward, optimizer step, zero_grad."""
    spread_s: tuple[float, float]
    """The fastest and the slowest round."""


class StepBench(Results):
    """Training steps of several configs, measured in alternating rounds; ratios to the first."""

    kind = "config"
    header = ("config", "ms / step (median)", "x first", "fastest - slowest ms")

    def __init__(self, points: Sequence[StepPoint], *, rounds: int) -> None:
        super().__init__(points)
        self.rounds = rounds

    @property
    def points(self) -> list[StepPoint]:
        return self.items

    def point(self, name: str) -> StepPoint:
        return self.item(name)

    def rows(self) -> list[list[str]]:
        base = self.items[0]
        return [[p.name, f"{p.step_time_s * 1e3:.1f}", f"{p.step_time_s / base.step_time_s:.2f}",
                 f"{p.spread_s[0] * 1e3:.1f} - {p.spread_s[1] * 1e3:.1f}"] for p in self.items]

    def caption(self) -> str:
        return (f"one training step per config, medians of {self.rounds} rounds that alternate the configs "
                "(a busy machine slows them alike)")


def step_bench(configs: dict[str, Any], *, rounds: int = 6) -> StepBench:
    """Time one training step of each config on the same batch, in alternating rounds.

    Each config's model, attention, compile, optimizer and TF32 are set up as `run()` sets them
    up (same seed, so the same weights), on the first config's batch; the first step of each is
    warm-up (with `compile`, the compile: reused from memory when this process compiled the same
    model already). Runs trained one after another drift with the machine's load; these rounds
    do not, so their ratios are the fair comparison of the switches on a busy machine.

    Example:
        >>> bench = step_bench({"eager": RunConfig(model="gpt"), "sdpa": RunConfig(model="gpt", attention="sdpa")})  # doctest: +SKIP
        >>> bench.ratio("step_time_s", "sdpa")  # doctest: +SKIP
    """
    from workbench.core.models import build_model, loss_fn, set_attention
    from workbench.switches.checkpointing import set_activation_checkpointing
    from workbench.switches.compiling import compile_model, tf32_matmuls
    from workbench.measure.probe import make_probe

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} must be a whole number >= 1")
    resolved = {name: cfg.resolved() for name, cfg in configs.items()}
    first = next(iter(resolved.values()))
    probe = make_probe(first, samples=first.batch_size)
    device = probe.inputs.device
    arms = {}
    for name, cfg in resolved.items():
        model = build_model(cfg.model, data=probe.data, dims=cfg.dims, seed=cfg.seed).to(device).train()
        set_activation_checkpointing(model, cfg.activation_checkpointing)
        set_attention(model, cfg.attention)
        arms[name] = (compile_model(model, cfg.compile), make_optimizer(model, cfg), cfg.tf32)

    def one_step(name: str) -> float:
        model, optimizer, tf32 = arms[name]
        with tf32_matmuls(tf32):
            _sync(device)
            start = time.perf_counter()
            loss_fn(model(probe.inputs), probe.labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            _sync(device)
            return time.perf_counter() - start

    for name in arms:  # warm-up: first calls, compiles, optimizer state
        one_step(name)
    names = list(arms)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else list(reversed(names))):
            times[name].append(one_step(name))
    points = [StepPoint(name, statistics.median(t), (min(t), max(t))) for name, t in times.items()]
    return StepBench(points, rounds=rounds)

__all__ += ["TIMED_PHASES", "Profile", "default_trace_path", "phase_times", "profile_run"]

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
