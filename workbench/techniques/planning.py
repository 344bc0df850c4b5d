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
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.core.config import ConfigError, RunConfig
from workbench.core.optim import OPTIMIZERS
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
        if not _whole(memory_bytes) or memory_bytes < 1 or not (isinstance(headroom, (int, float)) and 0 <= headroom < 1):
            raise ValueError(f"memory_bytes={memory_bytes!r} must be a whole number of bytes >= 1 and "
                             f"headroom={headroom!r} in [0, 1); pass e.g. memory_bytes=40 * 2**30")
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

        if not _whole(memory_budget_bytes) or memory_budget_bytes < 1:
            raise ValueError(f"memory_budget_bytes={memory_budget_bytes!r} must be a whole number of bytes >= 1; "
                             "pass e.g. 16 * 2**20")
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
                f", {c.optimizer}")


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


# Beyond this a plan is not a training run (the largest batches published are ~4M tokens,
# thousands of sequences); it also bounds the divisor search below.
_MAX_EFFECTIVE_BATCH = 2**20


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _divisors(n: int) -> list[int]:
    """The divisors of n, found up to its square root (n up to 2**20: ~1,000 trials)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


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
         vocab_size: int | None = None) -> Plans:
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
    """
    base = config.resolved()
    eff = base.batch_size * base.grad_accum_steps if effective_batch is None else effective_batch
    if not _whole(eff) or not 1 <= eff <= _MAX_EFFECTIVE_BATCH:
        raise ValueError(f"effective_batch={eff!r} must be a whole number from 1 to {_MAX_EFFECTIVE_BATCH:,}; "
                         f"pass e.g. effective_batch=32 (None: the config's batch_size x grad_accum_steps)")
    precisions = list(precisions or target.peak_flops)
    if bad := [p for p in precisions if p not in target.peak_flops]:
        raise ValueError(f"precisions {bad} cannot run on {target.name}; use some of {list(target.peak_flops)}")
    checkpointing = list(checkpointing or (("none", "every_other", "all") if base.model == "gpt" else ("none",)))
    if base.model != "gpt" and set(checkpointing) != {"none"}:
        raise ValueError(f"checkpointing {checkpointing} needs a model with blocks; model={base.model!r} "
                         f"takes checkpointing=('none',)")
    if bad := [c for c in checkpointing if c not in ("none", "every_other", "all")]:
        raise ValueError(f"checkpointing {bad} is not known; use some of 'none', 'every_other', 'all'")
    optimizers = list(optimizers or (base.optimizer,))
    if bad := [o for o in optimizers if o not in OPTIMIZERS]:
        raise ValueError(f"optimizers {bad} are not known; use some of {list(OPTIMIZERS)}")
    micro = sorted(set(micro_batches or _divisors(eff)))
    if bad := [m for m in micro if not _whole(m) or m < 1 or eff % m]:
        raise ValueError(f"micro_batches {bad} do not divide effective_batch={eff}; use whole divisors of it")

    def make(**changes: Any) -> tuple[RunConfig, Estimate]:
        cfg = dataclasses.replace(base, epochs=None, **changes)
        return cfg, estimate(cfg, vocab_size=vocab_size)

    base_cfg, base_est = make(batch_size=eff, grad_accum_steps=1)
    peak = target.peak_flops.get(base.precision) or max(target.peak_flops.values())
    baseline_mem = target.memory_of(base_est)
    baseline = Plan(base_cfg, base_est, target.fits(base_est), baseline_mem, base_est.flops_per_step / peak,
                    "none", _why(target, base_est, baseline_mem, target.fits(base_est)))
    plans = []
    for precision in precisions:
        for ckpt in checkpointing:
            for opt in optimizers:
                for m in micro:
                    try:
                        cfg, est = make(precision=precision, activation_checkpointing=ckpt, optimizer=opt,
                                        batch_size=m, grad_accum_steps=eff // m)
                    except ConfigError:
                        continue  # e.g. a micro-batch larger than the data set
                    fits, memory = target.fits(est), target.memory_of(est)
                    plans.append(Plan(cfg, est, fits, memory, est.flops_per_step / target.peak_flops[precision],
                                      _cost(cfg, est, base_cfg, base_est), _why(target, est, memory, fits)))
    # Fitting plans first, fastest first; ties (same FLOPs, same peak) to fewer micro-batches,
    # then to less memory. Plans that do not fit follow, smallest first.
    plans.sort(key=lambda p: (not p.fits, p.step_time_s if p.fits else p.memory_bytes,
                              p.config.grad_accum_steps, p.memory_bytes))
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
                     f"({smallest.why}). Shard or offload the model state (FSDP/ZeRO), use a lighter optimizer, "
                     f"or train fewer parameters.")
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
