"""What autocast really does to a forward pass: the dtype of every module output and op.

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

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.core.precisions import DTYPES
from workbench.core.report import html_table, text_table


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
