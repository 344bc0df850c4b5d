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

What autocast really does to a forward pass: the dtype of every module output and op.

`autocast_policy(device, precision)` asks autocast on this device which dtype a few
telling ops (a matmul, softmax, layer_norm, a loss) produce. `inspect_precision(config)`
runs one real forward + loss + backward of a run's model under autocast and records the
dtypes: forward hooks give each module's output (and its fp32 master weights), a
TorchDispatchMode below autocast sees every aten op it ran, including the casts it
inserted, and the saved-tensor counter splits the activation bytes by dtype.

Example:
    >>> autocast_policy("cpu", "bf16")["cross_entropy"]  # losses stay fp32
    torch.float32
"""

from __future__ import annotations

import math
from typing import Any
import torch
from torch import nn
from workbench.core.precisions import ACCELERATE_NAMES, scaler_kwargs
from workbench.engine.accelerator import plain_accelerator, reset_accelerate_state
from workbench.switches.precision import enable_fp16_on_cpu, kwargs_handlers
from collections import Counter
from dataclasses import dataclass, field
import torch.nn.functional as F
from workbench.core.precisions import DTYPES
from workbench.core.report import html_table, text_table


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
    from torch.utils._python_dispatch import TorchDispatchMode

    from workbench.core.models import loss_fn
    from workbench.measure.counters import SavedActivationCounter

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


def inspect_precision(config: Any) -> PrecisionReport:
    """`inspect_model` on the model and first training batch that `run(config)` would use.

    Example:
        >>> report = inspect_precision(RunConfig(model="gpt", precision="bf16"))  # doctest: +SKIP
        >>> report.grad_dtypes  # doctest: +SKIP
        {'float32'}
    """
    from workbench.core.data import build_dataloader, load_data
    from workbench.core.hardware import resolve_device
    from workbench.core.models import build_model

    cfg = config.resolved()
    device = resolve_device(cfg.device)
    bundle = load_data(cfg.data, seq_len=cfg.seq_len or 128, max_test=1, seed=cfg.seed)
    model = build_model(cfg.model, data=bundle, dims=cfg.dims, seed=cfg.seed).to(device)  # run()'s weights
    loader = build_dataloader(bundle.train, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    batch = next(iter(loader))
    return inspect_model(model, batch["inputs"], batch["labels"], precision=cfg.precision, device=device)
