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


def make_optimizer(model: torch.nn.Module, cfg: Any) -> torch.optim.Optimizer:
    """The optimizer `cfg.optimizer` over the model's trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
