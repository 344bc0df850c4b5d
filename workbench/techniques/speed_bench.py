"""Notebook 08: the speed switches timed fairly on a busy machine, in alternating rounds.

Runs trained one after another drift with whatever else the machine does; these benches run
every arm on the same data in rounds that alternate their order (as `checkpointing_dial` does),
so the ratios hold with another process on a core:

- `optimizer_bench(model)`: `optimizer.step()` alone per implementation (for-loop, foreach,
  fused), and the parameters each reaches from the same gradients;
- `step_bench(configs)`: one whole training step per RunConfig, set up as `run()` sets it up.

Example:
    >>> bench = optimizer_bench(torch.nn.Linear(64, 64), rounds=5)  # doctest: +SKIP
    >>> bench.ratio("step_time_s", "fused"), bench.point("fused").max_difference  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from workbench.core.optim import IMPLEMENTATIONS, make_optimizer
from workbench.core.report import Results
from workbench.measure.probe import max_relative_difference

__all__ = ["OptimizerBench", "OptimizerPoint", "StepBench", "StepPoint", "optimizer_bench", "step_bench"]


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
    from workbench.core.models import (
        build_model,
        loss_fn,
        set_activation_checkpointing,
        set_attention,
    )
    from workbench.engine.speedups import compile_model, tf32_matmuls
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
