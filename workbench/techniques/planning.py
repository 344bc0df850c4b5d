"""Plan a run that fits: rank precision x checkpointing x accumulation x micro-batch (and
optimizer) by predicted speed among the plans whose predicted memory fits a device.

The measured, deterministic version of "ask an LLM which techniques to combine" (seed 000):

- `Target`: the device (its memory, and its peak FLOP/s per precision); `Target.gpu("A100",
  memory_bytes=report.total_bytes)` for a GPU on paper, `Target.this_machine(budget)` for
  this CPU under a *simulated* memory budget (checked by `run()` on its exact counts);
- `plan(config, target=..., effective_batch=...)`: every combination estimated
  (`estimate.py`, fake tensors), the fitting ones ranked by predicted step time, each with
  its predicted memory, its cost and a reason;
- `explain(plans, llm=None)`: the ranking in words; pass `llm` (a function from a prompt to
  text, e.g. a local model) to have it explain instead; the ranking stays deterministic;
- checking a plan against real runs lives in `plancheck.py`.

Speed is predicted as FLOPs per step (counted, recompute included) over the device's peak
FLOP/s for the precision: a lower bound on step time that ranks plans fairly when they
differ in FLOPs (checkpointing) and precision (peak). Ties go to fewer micro-batches.

Example:
    >>> plans = plan(RunConfig(model="gpt", batch_size=32), effective_batch=32,
    ...              target=Target.this_machine(memory_budget_bytes=16 * 2**20))  # doctest: +SKIP
    >>> plans.best.config.precision, plans.best.config.grad_accum_steps          # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.core.config import ConfigError, RunConfig
from workbench.core.report import Report, format_bytes
from workbench.measure.estimate import Estimate, estimate

__all__ = ["Target", "Plan", "Plans", "plan", "explain"]


@dataclass(frozen=True, slots=True)
class Target:
    """The device a plan must fit: usable memory and peak FLOP/s per precision it runs."""

    name: str
    memory_bytes: int
    peak_flops: dict[str, float]
    """precision -> FLOP/s (the precisions this device can train in)."""
    headroom: float = 0.0
    """Fraction of memory kept free (CUDA context, allocator fragmentation)."""
    simulated: bool = False
    """A simulated budget: plans fit on run()'s exact counts (no temporaries, no buffers)."""

    @property
    def usable_bytes(self) -> int:
        return int(self.memory_bytes * (1 - self.headroom))

    @classmethod
    def gpu(cls, name: str, *, memory_bytes: int, headroom: float = 0.05) -> Target:
        """A GPU from `hardware.GPU_PEAK_TFLOPS` (spec-sheet peaks) with `memory_bytes` of memory.

        The 5% default headroom stands for the CUDA context and allocator fragmentation.
        """
        from workbench.core.hardware import GPU_PEAK_TFLOPS

        if name not in GPU_PEAK_TFLOPS:
            raise ValueError(f"GPU {name!r} is not in hardware.GPU_PEAK_TFLOPS; use one of {sorted(GPU_PEAK_TFLOPS)}")
        if memory_bytes < 1 or not 0 <= headroom < 1:
            raise ValueError(f"memory_bytes={memory_bytes} must be positive and headroom={headroom} in [0, 1)")
        peaks = {p: t * 1e12 for p, t in GPU_PEAK_TFLOPS[name].items()}
        if "bf16" in peaks:  # same memory and speed as fp16 where both exist, and no loss scaling
            peaks.pop("fp16", None)
        return cls(f"{name} ({format_bytes(memory_bytes)})", memory_bytes, peaks, headroom)

    @classmethod
    def this_machine(cls, *, memory_budget_bytes: int, precisions: Sequence[str] = ("fp32", "bf16")) -> Target:
        """This machine under a simulated memory budget (RunConfig.memory_budget_bytes).

        Peaks: on a GPU its spec sheet (hardware.peak_flops); on a CPU measured here, the
        fp32 matmul rate over each precision's measured slowdown (below 1 where 16-bit is
        native and faster, 25-55 where it is emulated).
        """
        from workbench.core.hardware import (
            peak_flops,
            precision_support,
            resolve_device,
        )

        if memory_budget_bytes < 1:
            raise ValueError(f"memory_budget_bytes={memory_budget_bytes} must be positive; pass e.g. 16 * 2**20")
        device = resolve_device("auto")
        usable = [p for p in precisions if precision_support(device, p) != "unsupported"]
        peaks = {p: v for p in usable if (v := peak_flops(device, p)[0])}
        if not peaks:
            raise ValueError(f"no peak FLOP/s known for {precisions} on this {device}; build a Target by hand")
        return cls(f"this {device.upper() if device == 'cpu' else 'GPU'} (simulated budget "
                   f"{format_bytes(memory_budget_bytes)})", memory_budget_bytes, peaks, 0.0, simulated=True)

    def fits(self, est: Estimate) -> bool:
        return self.memory_of(est) <= self.usable_bytes

    def memory_of(self, est: Estimate) -> int:
        """The estimate's figure this target is held to: exact counts if simulated, else the peak."""
        return est.counted_bytes if self.simulated else est.peak_bytes


@dataclass(frozen=True, slots=True)
class Plan:
    """One candidate: a config (micro-batch x accumulation = the effective batch), its estimate,
    whether it fits, its predicted step time, what it costs against the baseline and why."""

    config: RunConfig
    estimate: Estimate
    fits: bool
    memory_bytes: int
    """Predicted memory held against the target (see Target.memory_of)."""
    step_time_s: float
    """Predicted time of one optimizer step at the device's peak FLOP/s (a lower bound)."""
    cost: str
    why: str

    @property
    def samples_per_sec(self) -> float:
        return self.config.batch_size * self.config.grad_accum_steps / self.step_time_s

    @property
    def label(self) -> str:
        c = self.config
        return (f"{c.precision}, checkpointing {c.activation_checkpointing}, {c.batch_size} x {c.grad_accum_steps}"
                f", {c.optimizer}{_fewer_bytes_label(c, self.estimate.processes)}")


def _trade_offs(c: RunConfig, base: RunConfig) -> int:
    """How many of notebook 09's memory levers a plan pulls beyond the baseline's."""
    return sum((c.optimizer != base.optimizer, (c.freeze, c.freeze_layers, c.lora_rank) !=
                (base.freeze, base.freeze_layers, base.lora_rank), c.sharding != base.sharding))


def _fewer_bytes_label(c: RunConfig, processes: int) -> str:
    """What a plan trains and where its model state lives, when not the default (notebook 09)."""
    parts = []
    if c.lora_rank:
        parts.append(f"LoRA rank {c.lora_rank} on {c.lora_targets}")
    if c.freeze != "none":
        parts.append(f"freeze {c.freeze}")
    if c.freeze_layers:
        parts.append(f"freeze {c.freeze_layers} blocks")
    if c.sharding != "none":
        parts.append(f"sharded over {processes} processes")
    return "".join(f", {p}" for p in parts)


class Plans(Report):
    """Plans ranked: fitting ones fastest first, then the rest by memory. Renders as a table
    (the first ten; `rows(top=None)` lists them all)."""

    def __init__(self, plans: Sequence[Plan], *, target: Target, baseline: Plan, effective_batch: int) -> None:
        self.plans, self.target, self.baseline, self.effective_batch = list(plans), target, baseline, effective_batch

    @property
    def fitting(self) -> list[Plan]:
        return [p for p in self.plans if p.fits]

    @property
    def best(self) -> Plan | None:
        return self.fitting[0] if self.fitting else None

    def where(self, **fields: Any) -> list[Plan]:
        """Plans whose config has these values, e.g. where(precision='bf16')."""
        return [p for p in self.plans if all(getattr(p.config, k) == v for k, v in fields.items())]

    def rows(self, top: int | None = 10) -> list[list[str]]:
        base = self.baseline.step_time_s
        shown = self.plans if top is None else self.plans[:top]
        return [[str(i + 1), p.label, format_bytes(p.memory_bytes), "yes" if p.fits else "no",
                 f"{base / p.step_time_s:.2f}", p.cost, p.why] for i, p in enumerate(shown)]

    header = ["rank", "plan (precision, checkpointing, micro-batch x accumulation, optimizer)",
              "predicted memory", "fits", "predicted speed x baseline", "cost", "why"]

    def caption(self) -> str:
        return (f"plans for effective batch {self.effective_batch} on {self.target.name}, usable "
                f"{format_bytes(self.target.usable_bytes)}; {len(self.fitting)} of {len(self.plans)} fit")

    def __len__(self) -> int:
        return len(self.plans)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _cost(p: RunConfig, est: Estimate, base: RunConfig, base_est: Estimate) -> str:
    costs = []
    if est.flops_per_step > base_est.flops_per_step:
        costs.append(f"+{est.flops_per_step / base_est.flops_per_step - 1:.0%} FLOPs (recompute)")
    if p.grad_accum_steps > 1:
        costs.append(f"{p.grad_accum_steps} micro-batches per step")
    if p.precision != "fp32":
        costs.append(f"{p.precision} rounding (check accuracy)")
    if p.optimizer != base.optimizer:
        costs.append(f"{p.optimizer} instead of {base.optimizer} (different convergence)")
    if est.trainable_parameter_count is not None and est.trainable_parameter_count < est.parameter_count:
        costs.append(f"trains {est.trainable_parameter_count / est.parameter_count:.1%} of the parameters (check accuracy)")
    if p.sharding != "none":
        costs.append(f"{est.processes} processes gather parameters every step (~1.5x data parallel's communication)")
    return "; ".join(costs) or "none"


def _why(target: Target, est: Estimate, memory: int, fits: bool) -> str:
    if not fits:
        state = est.model_state_bytes + (0 if target.simulated else est.buffer_bytes)
        if state > target.usable_bytes:
            return f"model state alone ({format_bytes(state)}) exceeds {format_bytes(target.usable_bytes)}"
        return f"over by {format_bytes(memory - target.usable_bytes)}"
    precision, spare = est.config.precision, f"{format_bytes(target.usable_bytes - memory)} to spare"
    if precision not in target.peak_flops:
        return spare
    peak_tflops = target.peak_flops[precision] / 1e12
    return f"{spare}; {est.flops_per_step:.3g} FLOPs a step at {precision}'s {peak_tflops:.3g} TFLOP/s peak"


def plan(config: RunConfig, *, target: Target, effective_batch: int | None = None,
         precisions: Iterable[str] | None = None, checkpointing: Iterable[str] | None = None,
         optimizers: Iterable[str] | None = None, micro_batches: Iterable[int] | None = None,
         vocab_size: int | None = None, trainable: Iterable[dict[str, Any]] | None = None,
         sharding: Iterable[str] | None = None, processes: int = 1) -> Plans:
    """Estimate every combination and rank them: fitting plans fastest first.

    Args:
        config: the baseline run (model, dims, seq_len, data, optimizer).
        target: the device to fit (Target.gpu or Target.this_machine).
        effective_batch: samples per optimizer step every plan keeps (micro-batch x
            accumulation); default: the config's batch_size x grad_accum_steps.
        precisions / checkpointing / optimizers / micro_batches: the choices to try;
            defaults: the target's precisions, every checkpointing setting the model has,
            the config's optimizer, every divisor of effective_batch.
        vocab_size: GPT only, to size a model on paper (see estimate()).
        trainable: what trains, as RunConfig fields per choice, e.g. [{}, {"freeze": "embeddings"},
            {"lora_rank": 8}]; default: the config's own.
        sharding / processes: the sharding settings to try ('none', 'full') and the processes a
            sharded plan splits its model state over; default: the config's setting.
    """
    base = config.resolved()
    eff = effective_batch or base.batch_size * base.grad_accum_steps
    if eff < 1:
        raise ValueError(f"effective_batch={eff} must be at least 1; pass e.g. effective_batch=32")
    precisions = list(precisions or target.peak_flops)
    if bad := [p for p in precisions if p not in target.peak_flops]:
        raise ValueError(f"precisions {bad} cannot run on {target.name}; use some of {list(target.peak_flops)}")
    checkpointing = list(checkpointing or (("none", "every_other", "all") if base.model == "gpt" else ("none",)))
    if base.model != "gpt" and set(checkpointing) != {"none"}:
        raise ValueError(f"checkpointing {checkpointing} needs a model with blocks; model={base.model!r} "
                         f"takes checkpointing=('none',)")
    optimizers = list(optimizers or (base.optimizer,))
    trainables = [dict(t) for t in (trainable or ({},))]
    shardings = list(sharding or (base.sharding,))
    micro = sorted(set(micro_batches or _divisors(eff)))
    if bad := [m for m in micro if m < 1 or eff % m]:
        raise ValueError(f"micro_batches {bad} do not divide effective_batch={eff}; use divisors of it")

    def make(**changes: Any) -> tuple[RunConfig, Estimate]:
        cfg = dataclasses.replace(base, epochs=None, **changes)
        return cfg, estimate(cfg, vocab_size=vocab_size, processes=processes)

    base_cfg, base_est = make(batch_size=eff, grad_accum_steps=1)
    peak = target.peak_flops.get(base.precision) or max(target.peak_flops.values())
    baseline_mem = target.memory_of(base_est)
    baseline = Plan(base_cfg, base_est, target.fits(base_est), baseline_mem, base_est.flops_per_step / peak,
                    "none", _why(target, base_est, baseline_mem, target.fits(base_est)))
    plans = []
    choices = itertools.product(precisions, checkpointing, optimizers, micro, trainables, shardings)
    for precision, ckpt, opt, m, trains, shards in choices:
        try:
            cfg, est = make(precision=precision, activation_checkpointing=ckpt, optimizer=opt,
                            batch_size=m, grad_accum_steps=eff // m, sharding=shards, **trains)
        except ConfigError:
            continue  # e.g. a micro-batch larger than the data set; sharding in a precision it lacks
        fits, memory = target.fits(est), target.memory_of(est)
        plans.append(Plan(cfg, est, fits, memory, est.flops_per_step / target.peak_flops[precision],
                          _cost(cfg, est, base_cfg, base_est), _why(target, est, memory, fits)))
    # Fitting plans first, fastest first; ties (same FLOPs, same peak) to fewer micro-batches,
    # then to fewer changes of what trains and where the state lives (notebook 09's switches:
    # each trades accuracy or communication for memory), then to less memory. Plans that do
    # not fit follow, smallest first.
    plans.sort(key=lambda p: (not p.fits, p.step_time_s if p.fits else p.memory_bytes,
                              p.config.grad_accum_steps, _trade_offs(p.config, base), p.memory_bytes))
    return Plans(plans, target=target, baseline=baseline, effective_batch=eff)


def explain(plans: Plans, *, llm: Callable[[str], str] | None = None, top: int = 5) -> str:
    """The ranking in words. With `llm` (prompt -> text, e.g. a local model) it writes instead.

    The plans, their numbers and their order stay the deterministic planner's; an LLM only
    explains them (the prompt carries the measured table and asks it not to change it).
    """
    best, base, target = plans.best, plans.baseline, plans.target
    lines = [f"Target: {target.name}, {format_bytes(target.usable_bytes)} usable"
             + (" (simulated budget on exact counts)." if target.simulated else "."),
             f"Baseline ({base.label}, effective batch {plans.effective_batch}): predicted "
             f"{format_bytes(base.memory_bytes)}: {'fits' if base.fits else 'does not fit'} ({base.why})."]
    if best is None:
        smallest = min(plans.plans, key=lambda p: p.memory_bytes)
        lines.append(f"No plan fits. The smallest, {smallest.label}, needs {format_bytes(smallest.memory_bytes)} "
                     f"({smallest.why}). Shard the model state (sharding=['full'], processes=N), use a lighter "
                     f"optimizer (optimizers=['adafactor']), or train fewer parameters "
                     f"(trainable=[{{'lora_rank': 8}}]).")
    else:
        lines.append(f"Recommended: {best.label}: {format_bytes(best.memory_bytes)} predicted, "
                     f"{base.step_time_s / best.step_time_s:.2f}x the baseline's predicted speed; cost: {best.cost}.")
        for p in plans.fitting[1:top]:
            lines.append(f"  then {p.label}: {format_bytes(p.memory_bytes)}, "
                         f"{base.step_time_s / p.step_time_s:.2f}x; cost: {p.cost}.")
    text = "\n".join(lines)
    if llm is None:
        return text
    prompt = ("You advise on PyTorch training memory. A deterministic planner measured these plans on fake "
              "tensors; do not change their numbers or their order. Explain to an engineer, in a short "
              "paragraph, why the first plan is recommended and what it costs.\n\n" + text + "\n\n"
              + str(plans))
    return llm(prompt)
