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
- checking a plan against real runs (the largest micro-batch, predicted and searched) lives in
  `lessons/planner.py`.

Speed comes from the target's speed model (`planner.roofline`), and every table says which:
on a GPU on paper a roofline **lower bound** (each op of the replayed step at the slower of
its FLOPs at the data-sheet peak and its bytes at the memory bandwidth: a small micro-batch
re-reads the weights and is bound by memory; fp32 matmuls on TF32 only where torch allows
it), on this machine **measured** step times. Ties go to fewer micro-batches.

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

from workbench.base.arguments import ArgumentError, flag, instance, listed, shown, whole_number
from workbench.base.precisions import PRECISIONS
from workbench.base.report import Report, format_bytes
from workbench.core.config import ConfigError, RunConfig, run_config
from workbench.machine import hardware
from workbench.planner.choices import choices, is_whole
from workbench.planner.estimate import Estimate, estimate
from workbench.planner.roofline import MeasuredHere, Roofline

__all__ = ["Target", "Plan", "Plans", "plan", "explain"]


@dataclass(frozen=True, slots=True)
class Target:
    """The device a plan must fit: usable memory, the precisions it trains in, and how fast."""

    name: str
    memory_bytes: int
    peak_flops: dict[str, float]
    """precision -> peak FLOP/s (the precisions this device can train in; the peak is a
    reference figure: the speed model decides the ranking)."""
    headroom: float = 0.0
    """Fraction of memory kept free (CUDA context, allocator fragmentation)."""
    simulated: bool = False
    """A simulated budget: plans fit on run()'s exact counts (no temporaries, no buffers)."""
    speed: Any = None
    """Predicts a plan's step seconds (`planner.roofline`: Roofline, MeasuredHere); None:
    FLOPs at `peak_flops`, a bound that ignores memory traffic."""
    device: str = "cpu"
    """The device whose step the estimates replay ('cpu' or 'cuda')."""

    def __post_init__(self) -> None:
        whole_number("memory_bytes", self.memory_bytes, example="memory_bytes=40 * 2**30")
        if not (isinstance(self.headroom, (int, float)) and 0 <= self.headroom < 1):
            raise ArgumentError(f"headroom={shown(self.headroom)} must be a fraction in [0, 1); pass e.g. headroom=0.05")
        if not isinstance(self.peak_flops, dict) or self.device not in ("cpu", "cuda"):
            raise ArgumentError("peak_flops must be a dict (precision -> FLOP/s) and device 'cpu' or 'cuda'; "
                                "make a Target with Target.gpu(...) or Target.this_machine(...)")

    @property
    def usable_bytes(self) -> int:
        return int(self.memory_bytes * (1 - self.headroom))

    @property
    def speed_model(self) -> Any:
        return self.speed or Roofline(self.peak_flops, None)

    @classmethod
    def gpu(cls, name: str, *, memory_bytes: int, headroom: float = 0.05, tf32: bool | None = None) -> Target:
        """A GPU from `hardware.GPU_SPECS` (a spec key such as "A100 SXM4 40GB", or the name
        nvidia-smi reports) with `memory_bytes` of memory, ranked by a roofline bound.

        `tf32`: whether fp32 matmuls run on TF32 tensor cores; default what torch does now
        (`torch.get_float32_matmul_precision()`: 'highest', no TF32, unless changed).
        The 5% default headroom stands for what the replay does not see on a GPU: on an H200
        max_memory_allocated sat 0.6-2.8% above it for every run whose peak was a training step
        (docs/gpu-reference, "Re-read offline"), plus allocator fragmentation.
        """
        key = hardware.gpu_spec_key(name) if isinstance(name, str) else None
        if key is None:
            raise ArgumentError(f"GPU {shown(name)} is not in hardware.GPU_SPECS; "
                                f"use one of {sorted(hardware.GPU_SPECS)}")
        if not is_whole(memory_bytes) or memory_bytes < 1 or not (isinstance(headroom, (int, float)) and 0 <= headroom < 1):
            raise ValueError(f"memory_bytes={memory_bytes!r} must be a whole number of bytes >= 1 and "
                             f"headroom={headroom!r} in [0, 1); pass e.g. memory_bytes=40 * 2**30")
        tf32 = hardware.tf32_enabled() if tf32 is None else flag("tf32", tf32)
        speed = _roofline(key, tf32=tf32)
        peaks = dict(speed.peaks)
        if "bf16" in peaks:  # same memory and speed as fp16 where both exist, and no loss scaling
            peaks.pop("fp16", None)
        fp32 = "fp32 on TF32" if tf32 and "tf32" in hardware.GPU_SPECS[key].tflops else "fp32 without TF32"
        return cls(f"{key} ({format_bytes(memory_bytes)}; {fp32})", memory_bytes, peaks, headroom, speed=speed,
                   device="cuda")

    @classmethod
    def this_machine(cls, *, memory_budget_bytes: int, precisions: Sequence[str] = ("fp32", "bf16")) -> Target:
        """This machine under a simulated memory budget (RunConfig.memory_budget_bytes),
        ranked by step times measured here (`speed.MeasuredHere`): each plan's micro-batch
        forward and backward and its optimizer step, timed once on first use.

        A precision this machine emulates stays in (it is slow here, and the timing shows it);
        one it cannot run is left out.
        """
        if not is_whole(memory_budget_bytes) or memory_budget_bytes < 1:
            raise ValueError(f"memory_budget_bytes={memory_budget_bytes!r} must be a whole number of bytes >= 1; "
                             "pass e.g. 16 * 2**20")
        device = hardware.resolve_device("auto")
        precisions = listed("precisions", precisions, "precisions=('fp32', 'bf16')")
        if bad := [p for p in precisions if p not in PRECISIONS]:
            raise ArgumentError(f"precisions {bad} are not known; use some of {list(PRECISIONS)}")
        usable = [p for p in precisions if hardware.precision_support(device, p) != "unsupported"]
        if not usable:
            raise ValueError(f"none of {precisions} can run on this {device}; pass e.g. precisions=('fp32',)")
        # The reference peak where there is one (an emulated dtype has none: 0 here).
        peaks = {p: hardware.peak_flops(device, p)[0] or 0.0 for p in usable}
        speed = MeasuredHere() if device == "cpu" else _gpu_roofline()
        return cls(f"this {device.upper() if device == 'cpu' else 'GPU'} (simulated budget "
                   f"{format_bytes(memory_budget_bytes)})", memory_budget_bytes, peaks, 0.0, simulated=True,
                   speed=speed, device=device)

    def fits(self, est: Estimate) -> bool:
        return self.memory_of(est) <= self.usable_bytes

    def memory_of(self, est: Estimate) -> int:
        """The estimate's figure this target is held to: exact counts if simulated, else the peak."""
        return est.counted_bytes if self.simulated else est.peak_bytes


def _roofline(key: str, *, tf32: bool) -> Any:
    """A roofline from GPU_SPECS[key]: its dense peaks (fp32 matmuls on TF32 if `tf32` and the
    card has it) and its memory bandwidth."""
    spec = hardware.GPU_SPECS[key]
    peaks = {p: t * 1e12 for p, t in spec.tflops.items() if p != "tf32"}
    if tf32 and "tf32" in spec.tflops:
        peaks["fp32"] = spec.tflops["tf32"] * 1e12
    return Roofline(peaks, spec.memory_bandwidth, note=spec.source)


def _gpu_roofline() -> Any:
    """This GPU's roofline from its data sheet, or None (FLOPs at peak) for a card not in it."""
    info = hardware.gpu_info()
    key = info and hardware.gpu_spec_key(info.name)
    return _roofline(key, tf32=hardware.tf32_enabled()) if key else None


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
    """Predicted seconds of one optimizer step, by the target's speed model: a roofline lower
    bound on a GPU target, a measurement on this machine (`Plans.speed_label` says which)."""
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

    @property
    def speed_label(self) -> str:
        """What the speed figures are: 'roofline bound', 'measured here', ..."""
        return self.target.speed_model.label

    def rows(self, top: int | None = 10) -> list[list[str]]:
        base = self.baseline.step_time_s
        shown = self.plans if top is None else self.plans[:top]
        return [[str(i + 1), p.label, format_bytes(p.memory_bytes), "yes" if p.fits else "no",
                 f"{base / p.step_time_s:.2f}" if p.fits else "-", p.cost, p.why] for i, p in enumerate(shown)]

    @property
    def header(self) -> list[str]:  # type: ignore[override]
        return ["rank", "plan (precision, checkpointing, micro-batch x accumulation, optimizer)",
                "predicted memory", "fits", f"speed x baseline ({self.speed_label})", "cost", "why"]

    def caption(self) -> str:
        return (f"plans for effective batch {self.effective_batch} on {self.target.name}, usable "
                f"{format_bytes(self.target.usable_bytes)}; {len(self.fitting)} of {len(self.plans)} fit; "
                f"speed: {self.speed_label}")

    def __len__(self) -> int:
        return len(self.plans)


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
    spare = f"{format_bytes(target.usable_bytes - memory)} to spare"
    describe = getattr(target.speed_model, "describe", None)
    return f"{spare}; {est.flops_per_step:.3g} FLOPs a step" + (f", {describe(est.config.precision)}" if describe
                                                                else "")


def plan(config: RunConfig, *, target: Target, effective_batch: int | None = None,
         precisions: Iterable[str] | None = None, checkpointing: Iterable[str] | None = None,
         optimizers: Iterable[str] | None = None, micro_batches: Iterable[int] | None = None,
         vocab_size: int | None = None, trainable: Iterable[dict[str, Any]] | None = None,
         sharding: Iterable[str] | None = None, processes: int = 1) -> Plans:
    """Estimate every combination and rank them: fitting plans fastest first.

    Args:
        config: the baseline run (model, dims, seq_len, data, optimizer); the model may be your
            own module (replayed whole on fake tensors, see estimate()).
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
            sharded plan splits its model state over; default: the config's setting. (The speed
            models time or bound full training: they neither credit freezing nor charge sharding's
            communication; the cost column says what each plan gives up.)
    """
    base = run_config(config)
    instance("target", target, Target, "target=wb.Target.this_machine(memory_budget_bytes=2**30)")
    eff, precisions, checkpointing, optimizers, micro, trainables, shardings = choices(
        base, target, effective_batch=effective_batch, precisions=precisions, checkpointing=checkpointing,
        optimizers=optimizers, micro_batches=micro_batches, trainable=trainable, sharding=sharding)

    def make(**changes: Any) -> tuple[RunConfig, Estimate]:
        cfg = dataclasses.replace(base, epochs=None, **changes)
        return cfg, estimate(cfg, vocab_size=vocab_size, device=target.device, processes=processes)

    speed = target.speed_model
    base_cfg, base_est = make(batch_size=eff, grad_accum_steps=1)
    baseline_mem = target.memory_of(base_est)
    baseline = Plan(base_cfg, base_est, target.fits(base_est), baseline_mem, speed.step_time(base_est),
                    "none", _why(target, base_est, baseline_mem, target.fits(base_est)))
    plans = []
    combinations = itertools.product(precisions, checkpointing, optimizers, micro, trainables, shardings)
    for precision, ckpt, opt, m, trains, shards in combinations:
        try:
            cfg, est = make(precision=precision, activation_checkpointing=ckpt, optimizer=opt,
                            batch_size=m, grad_accum_steps=eff // m, sharding=shards, **trains)
        except ConfigError:
            continue  # e.g. a micro-batch larger than the data set; sharding in a precision it lacks
        fits, memory = target.fits(est), target.memory_of(est)
        # Only fitting plans are ranked by speed (and only they are timed on this machine).
        step_time = speed.step_time(est) if fits else float("inf")
        plans.append(Plan(cfg, est, fits, memory, step_time,
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
                     f"{base.step_time_s / best.step_time_s:.2f}x the baseline's speed ({plans.speed_label}); "
                     f"cost: {best.cost}.")
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
