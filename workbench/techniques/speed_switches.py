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
    from workbench.engine.speedups import tf32_matmuls

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
