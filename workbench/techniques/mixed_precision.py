"""Mixed precision made visible: the GradScaler, its knobs, and exact bytes under autocast.

`RunConfig(precision=...)` reaches accelerate's `Accelerator(mixed_precision=...)`,
which wraps the model's forward in `torch.autocast` and, for fp16 on a GPU, creates a
`torch.amp.GradScaler` (configured through accelerate's `GradScalerKwargs`). On a CPU
accelerate 1.x does neither for fp16: it silently trains in fp32. `enable_fp16_on_cpu`
fills that gap with `torch.autocast("cpu", torch.float16)` and `torch.amp.GradScaler("cpu")`,
so fp16 means fp16 on every device. `simulate_scaler` replays the scaler's rule on chosen
overflows; `gpt_activation_bytes_autocast` is the exact saved-activation count of
`models.GPT` under autocast, to check the counter against. (What dtype each module and op
produces under autocast: `autocast_dtypes.py`.)

Example:
    >>> gpt_activation_bytes_autocast(s=4, b=1, h=8, a=2, L=1, low_bytes=2, softmax_fp32=False)
    2816
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from workbench.core.precisions import ACCELERATE_NAMES, scaler_kwargs
from workbench.engine.accelerator import (
    enable_fp16_on_cpu,
    kwargs_handlers,
    plain_accelerator,
    reset_accelerate_state,
)


def accelerate_setup(precision: str, *, device: str = "auto") -> list[tuple[str, str, str]]:
    """What `Accelerator(mixed_precision=...)` sets up for `precision` on `device`, and what
    the workbench runs with: rows of (what, accelerate alone, the workbench).

    Builds a fresh single-process Accelerator (resetting accelerate's singletons, as
    `engine.accelerator.make_accelerator` does), so call it between runs, not inside one.
    """
    from accelerate import Accelerator

    from workbench.core.hardware import resolve_device

    device = resolve_device(device)

    def describe(acc: Any) -> tuple[str, str]:
        with acc.autocast():
            on = torch.is_autocast_enabled(device)
            autocast = f"on, {str(torch.get_autocast_dtype(device)).removeprefix('torch.')}" if on else "off"
        scaler = acc.scaler
        if scaler is None:
            return autocast, "none"
        knobs = (f"init_scale={scaler.get_scale():g}, growth_factor={scaler.get_growth_factor():g}, "
                 f"backoff_factor={scaler.get_backoff_factor():g}, growth_interval={scaler.get_growth_interval()}")
        return autocast, f"{type(scaler).__module__}.{type(scaler).__name__}('{scaler._device}', {knobs})"

    reset_accelerate_state(keep_process_group=False)
    accelerator = Accelerator(cpu=device == "cpu", mixed_precision=ACCELERATE_NAMES[precision],
                              kwargs_handlers=kwargs_handlers(precision, None))
    alone = describe(accelerator)  # what accelerate sets up by itself
    enable_fp16_on_cpu(accelerator, None)
    workbench = describe(accelerator)
    return [("autocast", alone[0], workbench[0]), ("GradScaler", alone[1], workbench[1])]


def evaluation_dtypes(precision: str, *, device: str = "auto") -> list[tuple[str, str]]:
    """The dtype a prepared model's first Linear computes in, four ways of evaluating it.

    accelerate bakes autocast into the prepared model's forward, so an outer context that
    turns autocast off does not reach inside; only unwrapping with keep_fp32_wrapper=False
    (what `engine.state.evaluate` does) evaluates in fp32.
    """
    from accelerate.utils import AutocastKwargs

    from workbench.core.hardware import resolve_device

    device = resolve_device(device)
    accelerator = plain_accelerator(precision, device=device)
    model = accelerator.prepare(nn.Sequential(nn.Linear(4, 4)))
    seen: list[torch.dtype] = []
    model[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    x = torch.randn(2, 4, device=accelerator.device)
    with torch.no_grad():
        model(x)
        with accelerator.autocast(AutocastKwargs(enabled=False)):
            model(x)
        with torch.autocast(device, enabled=False):
            model(x)
        accelerator.unwrap_model(model, keep_fp32_wrapper=False)(x)
    ways = ["prepared model as is", "inside accelerator.autocast(AutocastKwargs(enabled=False))",
            f"inside torch.autocast('{device}', enabled=False)", "unwrap_model(model, keep_fp32_wrapper=False)"]
    return [(way, str(dtype).removeprefix("torch.")) for way, dtype in zip(ways, seen)]


def simulate_scaler(knobs: dict[str, Any] | None, *, steps: int, overflow_at: set[int] | frozenset[int]) -> list[float]:
    """The scale a real `torch.amp.GradScaler` holds after each of `steps` steps, when the
    gradients hold an inf at the steps in `overflow_at` (1-based) and are finite otherwise.

    Example:
        >>> simulate_scaler({"init_scale": 8.0, "growth_interval": 2}, steps=4, overflow_at={3})
        [8.0, 16.0, 8.0, 8.0]
    """
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", **scaler_kwargs(knobs))
    history = []
    for step in range(1, steps + 1):
        scaler.scale(torch.ones(()))  # the scale is created lazily, by the first scale()
        param.grad = torch.full((1,), math.inf if step in overflow_at else 1.0)
        scaler.step(optimizer)  # finds the inf while unscaling: skips optimizer.step()
        scaler.update()  # inf found: scale x backoff; else growth after growth_interval clean steps
        history.append(scaler.get_scale())
    return history


class ScalePlot:
    """The GradScaler's scale (log2) and the loss per log step of fp16 runs; a PNG in Jupyter."""

    def __init__(self, results: list) -> None:
        from matplotlib.figure import Figure  # no pyplot: no global figure state

        self.figure = Figure(figsize=(11, 3))
        ax_scale, ax_loss = self.figure.subplots(1, 2)
        for i, r in enumerate(results):
            steps = r.loss_steps[: len(r.loss_scales)]
            ax_scale.step(steps, [math.log2(v) for v in r.loss_scales], where="post", color=f"C{i}",
                          label=f"{r.name} ({r.skipped_steps} skipped)")
            ax_loss.plot(r.loss_steps, r.losses, marker=".", color=f"C{i}", label=r.name)
        ax_scale.set(title="GradScaler scale", xlabel="optimizer step", ylabel="log2(scale)")
        ax_loss.set(title="training loss", xlabel="optimizer step")
        ax_scale.legend(fontsize=8)
        self.figure.tight_layout()

    def _repr_png_(self) -> bytes:
        import io

        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        return buf.getvalue()


def steps_for(precisions: list[str] | tuple[str, ...], *, device: str = "auto", preset: str | None = None) -> int:
    """Optimizer steps that every one of `precisions` gets from the preset on this device.

    The preset gives emulated precisions fewer steps; a loss-parity comparison needs the
    same number of steps in every arm, so this is the fewest of them.
    """
    from workbench.core.config import RunConfig

    return min(RunConfig(model="mlp", precision=p, device=device, preset=preset).resolved().steps
               for p in precisions)


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
