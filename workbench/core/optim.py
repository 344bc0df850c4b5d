"""The optimizers a RunConfig names, built the one way run(), the estimate and probes share."""

from __future__ import annotations

from typing import Any

import torch

# name -> what it keeps per parameter (what the optimizer-state bytes count)
OPTIMIZERS: dict[str, str] = {
    "adamw": "two running averages (fp32) per parameter, decoupled weight decay",
    "adam": "two running averages (fp32) per parameter",
    "sgd": "one momentum buffer per parameter (momentum 0.9)",
}

# How torch runs an optimizer's update (the torch.optim docs' three implementations; the
# same math each way, so `optimizer_impl` changes speed, not the update) -> its constructor
# keywords. The docs: "the performance ordering of the 3 implementations is fused > foreach
# > for-loop"; torch's default is foreach when every parameter is on a CUDA device, else for-loop.
IMPLEMENTATIONS: dict[str, dict[str, bool]] = {
    "default": {},                    # torch's choice
    "for-loop": {"foreach": False},   # parameter by parameter: a few small ops each
    "foreach": {"foreach": True},     # each op over all parameters at once (torch._foreach_*)
    "fused": {"fused": True},         # the whole update in one kernel per dtype and device
}


def make_optimizer(model: torch.nn.Module, cfg: Any) -> torch.optim.Optimizer:
    """The optimizer `cfg.optimizer` over the model's trainable parameters, run the
    `cfg.optimizer_impl` way (see IMPLEMENTATIONS)."""
    params = [p for p in model.parameters() if p.requires_grad]
    impl = IMPLEMENTATIONS[cfg.optimizer_impl]  # technique: fused / foreach optimizer
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay, **impl)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)


def implementation_problem(cfg: Any) -> str | None:
    """Why `cfg.optimizer` cannot run as `cfg.optimizer_impl` (None: it can), found by building
    it on a one-weight model, so an optimizer added later is checked the same way.

    Example:
        >>> from types import SimpleNamespace
        >>> implementation_problem(SimpleNamespace(optimizer="adamw", optimizer_impl="fused", lr=1e-3, weight_decay=0.0))
    """
    if cfg.optimizer_impl == "default":
        return None
    try:
        make_optimizer(torch.nn.Linear(1, 1), cfg)
    except (TypeError, RuntimeError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return (f"optimizer_impl={cfg.optimizer_impl!r} does not work with optimizer={cfg.optimizer!r} "
                f"({reason}); use optimizer_impl='foreach', 'for-loop' or 'default'")
    return None
