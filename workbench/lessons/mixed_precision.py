"""Notebook 01's helpers: each arm's budget, the claims checked, and the depth behind them.

The technique's own lines (autocast, the GradScaler, `Accelerator(mixed_precision=...)`) run in
the notebook. Here: `arm_budget`, `precision_here` (bf16, or fp16 on a card without it), `claim_rows`,
the exact saved bytes of `models.GPT` under autocast, and what autocast does to a forward, op by
op. From the engine: `enable_fp16_on_cpu` (accelerate 1.x sets up no fp16 autocast or GradScaler
on a CPU) and `reset_accelerate_state` (accelerate allows one mixed precision a process).

Example:
    >>> gpt_activation_bytes_autocast(s=4, b=1, h=8, a=2, L=1, low_bytes=2, softmax_fp32=False)
    2816
    >>> autocast_policy("cpu", "bf16")["cross_entropy"]  # losses stay fp32
    torch.float32
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from workbench.base.precisions import DTYPES
from workbench.base.report import format_bytes as wb_bytes
from workbench.base.report import html_table, text_table
from workbench.core.engine.accelerator import reset_accelerate_state
from workbench.core.measure.counters import SavedActivationCounter, gpt_activation_bytes_formula
from workbench.core.models import loss_fn
from workbench.core.presets import get_preset
from workbench.core.switches.precision import enable_fp16_on_cpu
from workbench.lessons import evidence
from workbench.lessons.figures_precision import bit_layout_figure
from workbench.machine import hardware
from workbench.machine.hardware import precision_here

__all__ = ["arm_budget", "autocast_policy", "bit_layout_figure", "claim_rows", "enable_fp16_on_cpu",
           "gpt_activation_bytes_autocast", "gpt_activation_bytes_formula", "inspect_model", "loss_saved_bytes",
           "precision_here", "reset_accelerate_state"]

# Held-out samples an arm evaluates where 16 bits are emulated: fewer, so Run All keeps to its budget.
EMULATED_EVAL_SAMPLES = 200


def arm_budget(precisions: tuple[str, ...] = ("fp32", "fp16", "bf16"), *, model: str = "gpt",
               device: str = "auto") -> dict[str, int]:
    """RunConfig fields every arm gets on this device (printing why): {} where all are native.

    An emulated step costs 15-160x an fp32 one. The notebook trains four emulated arms (fp16 and
    bf16, by hand and through `wb.run`): each gets half the preset's budget for an emulated run
    (at least 2 steps: one counted, one timed), every arm the same (the losses compare step by
    step), logged each step, with a smaller fp32 evaluation. The batch is the preset's on every
    CPU: the notebook's exact counts (saved bytes, checked by nbval) are taken at it, so they are
    the same where 16 bits are emulated and where they are native (issue 35: at half the batch
    where emulated, they failed on an AVX512-FP16 CPU).
    """
    device, preset = hardware.resolve_device(device), get_preset()
    emulated = [p for p in precisions if hardware.precision_support(device, p) == "emulated"]
    presented = f" ({note})" if device == "cpu" and (note := hardware.presented_note()) else ""
    if not emulated:
        print(f"{', '.join(precisions)} are native on this {device}: every arm trains the preset's "
              f"{preset.steps} steps{presented}")
        return {}
    steps = max(2, preset.reduced_precision_steps_on_emulated_cpu // 2)
    samples = min(preset.max_eval_samples, EMULATED_EVAL_SAMPLES)
    slower = " and ".join(f"{p} (a matmul measured {hardware.cpu_matmul_slowdown(p):.0f}x slower than fp32)" for p in emulated)
    print(f"Cut: this {device} emulates {slower}. Every arm trains {steps} steps, not the preset's {preset.steps}, "
          f"at its batch of {preset.batch_size[model]}, logs each one, and evaluates {samples} held-out samples{presented}.")
    return {"steps": steps, "log_every": 1, "eval_samples": samples}


def claim_rows(baseline: Any, fp16: Any, bf16: Any, forced: Any) -> list[tuple[Any, ...]]:
    """The notebook's claims against its runs: the GPT in fp32, fp16 and bf16 (same steps), and the
    MLP's fp16 run started at an overflowing scale. On a card without bf16 the bf16 arm ran in fp16
    (`precision_here`): its part of each claim is 'not shown here', with the reason.

    Asserts what must hold on any hardware: the 16-bit losses within 3% of fp32's (where the runs
    trained the preset's full steps, or the arm skipped none; held-out accuracy within 1.5 points
    too, where the runs trained the preset's full steps), every
    skipped step one halving of the scale, an emulated step clearly slower than fp32's; and on
    the `gpu` preset, where a format is native, a speed-up of at least 1.3x and a lower peak.
    """
    arms, device, preset = {"fp16": fp16, "bf16": bf16}, baseline.device, get_preset()
    ran = {arm: r.config.precision for arm, r in arms.items()}  # the bf16 arm: fp16 on a card without bf16
    support = {arm: hardware.precision_support(device, ran[arm]) for arm in arms}
    speed = {arm: baseline.step_time_s / r.step_time_s for arm, r in arms.items()}
    saved = {arm: 1 - r.memory.activation_bytes / baseline.memory.activation_bytes for arm, r in arms.items()}
    full = baseline.steps_done == preset.steps and not preset.capped  # else too few steps to compare accuracy
    # A CPU class presented for a test (cpu_class) decides the cut and which formats count as native, but
    # the kernels timed are this CPU's: their speed says nothing about that class, so none is asserted.
    presented = hardware.presented_note() if device == "cpu" else ""
    for arm, r in arms.items():
        # A run capped for a test (WORKBENCH_MAX_STEPS) is too short for the scaler's first skipped
        # steps to wash out: on a CPU with native fp16 (AVX512-FP16), the cpu preset capped at 10
        # steps skipped 2 and its held-out loss sat 3.2% above fp32's, having trained 8 steps to
        # fp32's 10. There the losses are compared only for an arm that skipped none; every arm
        # must still have trained (a finite loss, most steps applied).
        if full or not r.skipped_steps:
            for metric in ("final_loss", "eval_loss"):
                mine, base = getattr(r, metric), getattr(baseline, metric)
                assert abs(mine - base) <= 0.03 * base, f"{r.name}: {metric} {mine:.4f} vs fp32's {base:.4f}"
        else:
            assert math.isfinite(r.eval_loss) and r.skipped_steps < r.steps_done / 2, (
                f"{r.name}: {r.skipped_steps} of {r.steps_done} steps skipped, eval_loss {r.eval_loss}")
        assert not full or abs(r.accuracy - baseline.accuracy) <= 0.015, f"{r.name}: accuracy {r.accuracy:.2%}"
        assert r.memory.model_state_bytes == baseline.memory.model_state_bytes  # fp32 master weights, grads, AdamW
        if device == "cpu" and support[arm] == "emulated" and not presented:
            assert speed[arm] < 0.5, f"an emulated {ran[arm]} step should be clearly slower than fp32's, got {speed[arm]:.2f}x the speed"
        if baseline.config.preset == "gpu" and support[arm] == "native" and not presented:
            assert speed[arm] >= 1.3, f"{r.name}: {speed[arm]:.2f}x is not a tensor-core speed-up"
            assert r.memory.peak_bytes < baseline.memory.peak_bytes, f"{r.name}: peak memory not below fp32's"
    init = forced.config.grad_scaler["init_scale"]
    assert forced.skipped_steps >= 1 and forced.loss_scales[-1] == init * 0.5**forced.skipped_steps
    label = {arm: arm if ran[arm] == arm else f"{arm} arm in {ran[arm]}" for arm in arms}
    missing = {arm: f"{arm} not shown here: {hardware.missing_here(device, arm) or 'not run'}, its arm ran in {ran[arm]}"
               for arm in arms if ran[arm] != arm}

    def verdict(arm: str) -> tuple[bool, str]:
        if support[arm] == "emulated":
            return False, f"{arm} is emulated on this {device}, {1 / speed[arm]:.0f}x slower"
        return speed[arm] >= 1.5, f"{arm} native, {speed[arm]:.2f}x"

    verdicts = [verdict(arm) for arm in arms if arm not in missing]
    held = sum(ok for ok, _ in verdicts)
    word = ("holds" if held == len(verdicts) and not missing else "holds in part" if held
            else "does not hold here" if verdicts else "not shown here")
    speed_verdict = word + ": " + "; ".join([why for _, why in verdicts] + list(missing.values()))
    if presented:
        speed_verdict = f"not shown here: {presented}"
    memory = ", ".join(f"-{saved[arm]:.0%} ({label[arm]})" for arm in arms)
    if device == "cuda":
        memory += "; CUDA peak " + " / ".join(wb_bytes(r.memory.peak_bytes) for r in [baseline, *arms.values()])
    # The arms ran one after another with no free-core check: a speed verdict stands on a CPU only
    # where a ratio is beyond a busy core's noise (an emulated arm's 7x); a GPU's process waits on the GPU.
    timed = {label[arm]: speed[arm] for arm in arms if arm not in missing}
    accuracies = [r.accuracy for r in arms.values()]
    return [
        ("training 1.5-2.5x faster", "seed 000 §4.1, seed 003 §4.1 (NVIDIA tensor cores)",
         ", ".join(f"{label[arm]} {speed[arm]:.2f}x the speed of fp32" for arm in arms), speed_verdict,
         evidence.speed(timed, 1.5, free_core=True if device == "cuda" else None) if timed else None),
        ("~50% less memory", "seed 000 §4.1, §4.3", f"saved activations {memory}, exact; model state the same",
         "holds in part: activations shrink, the fp32 weights, gradients and AdamW state do not", evidence.count()),
        ("no accuracy loss (89.2% -> 89.5%)", "seed 000 §4.3",
         f"held-out accuracy {baseline.accuracy:.1%} / " + " / ".join(f"{a:.1%}" for a in accuracies)
         + f" (fp32 / {' / '.join(label.values())}) after {baseline.steps_done} steps",
         "holds: within 1.5 points" if max(abs(a - baseline.accuracy) for a in accuracies) <= 0.015
         else "does not hold here: more than 1.5 points apart",
         evidence.accuracy(baseline.accuracy, accuracies, samples=baseline.config.eval_samples,
                           chance=evidence.chance(baseline), effect=0.01)),
        ("the GradScaler skips overflowing steps and backs the scale off", "seed 004 §8.1; PyTorch AMP recipe",
         f"init_scale=2**{math.log2(init):.0f}: {forced.skipped_steps} of {forced.steps_done} steps skipped, "
         f"scale -> 2**{math.log2(forced.loss_scales[-1]):.0f}", "holds: each skipped step halved the scale, exactly",
         evidence.count()),
    ]


def gpt_activation_bytes_autocast(s: int, b: int, h: int, a: int, L: int, *, low_bytes: int = 2,
                                  softmax_fp32: bool, vocab_size: int | None = None) -> int:
    """Bytes autograd saves in one forward of `models.GPT` under 16-bit autocast.

    Against the fp32 count (`counters.gpt_activation_bytes_formula`, 16sbh + as²b + 4sb
    elements per layer, all 4 bytes) three things keep it from halving:

    * the residual stream stays fp32: the embeddings are fp32 and `x + block(x)` adds an
      fp32 and a 16-bit tensor, which promotes to fp32; so each LayerNorm's input (sbh)
      and statistics (2sb) stay 4 bytes: 4·(2sbh + 4sb) per layer;
    * autocast casts each Linear's fp32 weight to 16 bits once per forward, and the matmul
      keeps that copy for the input's gradient: 12h² more 16-bit elements per layer
      (qkv 3h², proj h², MLP 4h² + 4h²), and V·h for the lm_head (tied to the embedding);
    * where autocast runs softmax in fp32 (CUDA, `softmax_fp32=True`), the s×s attention
      probabilities are saved in fp32 *and* as the 16-bit copy `@ V` multiplies: as²b·(4 +
      low) bytes instead of as²b·low (CPU autocast keeps softmax in 16 bits).

    The other 14sbh per layer (Linear inputs, q, k, v, GELU input and output) are 16-bit.
    With `vocab_size`, adds the terms outside the blocks: int64 token ids (8sb), ln_f input
    and statistics in fp32, the lm_head's 16-bit input and weight copy. The loss's saved
    tensors (fp32 log-softmax sbV·4, int64 labels, a scalar) are not included.
    """
    attention = a * s * s * b * ((4 + low_bytes) if softmax_fp32 else low_bytes)
    per_layer = 4 * (2 * s * b * h + 4 * s * b) + low_bytes * (14 * s * b * h + 12 * h * h) + attention
    total = L * per_layer
    if vocab_size is not None:
        total += 8 * s * b + 4 * (s * b * h + 2 * s * b) + low_bytes * (s * b * h + vocab_size * h)
    return total


def loss_saved_bytes(tokens: int, num_classes: int) -> int:
    """What `train.loss_fn` saves: the fp32 log-softmax, the int64 labels and one fp32 scalar."""
    return 4 * tokens * num_classes + 8 * tokens + 4

def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _is_view(func: Any) -> bool:
    # Views and reshapes move no data and change no dtype: listing them hides the casts.
    return getattr(func, "is_view", False) or func.overloadpacket.__name__ in ("_unsafe_view", "split")


def autocast_policy(device: str, precision: str) -> dict[str, torch.dtype]:
    """What autocast on `device` makes of a few ops given 16-bit inputs (fp32 for linear).

    The op lists differ by device: CUDA autocast runs softmax, log_softmax and layer_norm
    in fp32; CPU autocast leaves them in the input's dtype. Losses are fp32 on both.
    Measured by running each op on tiny tensors (on CUDA this initialises CUDA).
    """
    dtype = DTYPES[precision]
    x = torch.randn(2, 8, device=device)
    low = x.to(dtype)
    ops = {
        "linear (fp32 inputs)": lambda: F.linear(x, torch.ones(3, 8, device=device)),
        "softmax": lambda: low.softmax(-1),
        "log_softmax": lambda: F.log_softmax(low, -1),
        "layer_norm": lambda: F.layer_norm(low, (8,)),
        "gelu": lambda: F.gelu(low),
        "cross_entropy": lambda: F.cross_entropy(low, torch.zeros(2, dtype=torch.long, device=device)),
    }
    with torch.autocast(device, dtype=dtype, enabled=precision != "fp32"):
        return {name: op().dtype for name, op in ops.items()}


@dataclass
class PrecisionReport:
    """What one forward + backward under autocast produced, dtype by dtype."""

    precision: str
    modules: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(module name, module type, output dtype, parameter dtype) in call order."""
    ops: dict[tuple[str, str], int] = field(default_factory=dict)
    """(aten op, output dtype) -> calls in the forward; autocast's casts show as _to_copy."""
    saved_bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    """Saved-for-backward bytes per dtype (SavedActivationCounter), the loss included."""
    loss_dtype: str = ""
    grad_dtypes: set[str] = field(default_factory=set)
    """Dtypes of the parameters' gradients: fp32, like the master weights."""

    def tables(self) -> list[tuple[str, list[str], list[tuple]]]:
        ops = sorted(self.ops.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        return [
            (f"{self.precision} autocast: module outputs", ["module", "type", "output", "parameters"], self.modules),
            ("aten ops in the forward", ["op", "output dtype", "calls"], [(op, dt, n) for (op, dt), n in ops]),
            ("saved for backward, loss, gradients", ["", ""],
             [*((f"saved {k} bytes", f"{v:,}") for k, v in self.saved_bytes_by_dtype.items()),
              ("loss dtype", self.loss_dtype), ("gradient dtypes", ", ".join(sorted(self.grad_dtypes)))]),
        ]

    def _repr_html_(self) -> str:
        return "".join(html_table(rows, header=header, caption=caption) for caption, header, rows in self.tables())

    def __str__(self) -> str:
        return "\n\n".join(text_table(rows, header=header, caption=caption) for caption, header, rows in self.tables())


def inspect_model(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, *, precision: str,
                  device: str = "cpu") -> PrecisionReport:
    """One forward + `train.loss_fn` + backward of `model` under autocast, dtypes recorded.

    The model's gradients are cleared afterwards (set to None).
    """
    report = PrecisionReport(precision)
    ops: Counter[tuple[str, str]] = Counter()

    class _OpDtypes(TorchDispatchMode):
        # Below autocast in the dispatcher: sees the ops with the dtypes autocast chose.
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            first = out[0] if isinstance(out, (tuple, list)) and out else out
            if isinstance(first, torch.Tensor) and first.is_floating_point() and not _is_view(func):
                ops[(func.overloadpacket.__name__, _short(first.dtype))] += 1
            return out

    names = {m: n or "(model)" for n, m in model.named_modules()}

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        out = output[0] if isinstance(output, (tuple, list)) else output
        params = {_short(p.dtype) for p in module.parameters(recurse=False)}
        report.modules.append((names[module], type(module).__name__,
                               _short(out.dtype) if isinstance(out, torch.Tensor) else "-",
                               ", ".join(sorted(params)) or "-"))

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    model.train()
    try:
        with SavedActivationCounter(model) as saved:
            with torch.autocast(device, dtype=DTYPES[precision], enabled=precision != "fp32"), _OpDtypes():
                logits = model(inputs.to(device))
            loss = loss_fn(logits, labels.to(device))
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    report.ops = dict(ops)
    report.saved_bytes_by_dtype = {_short(k): v for k, v in saved.by_dtype.items()}
    report.loss_dtype = _short(loss.dtype)
    report.grad_dtypes = {_short(p.grad.dtype) for p in model.parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return report
