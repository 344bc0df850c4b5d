"""The optimizer (`optimizer`, `optimizer_impl`, `lr`, `weight_decay`, `max_grad_norm`), a converter
switch. The registries and the builder every caller shares (run(), the estimate's fake model state,
probes) are `core/optim.py`'s: OPTIMIZERS, IMPLEMENTATIONS, `make_optimizer`."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import torch

from workbench.base.errors import ConfigError
from workbench.core import limits
from workbench.core.optim import OPTIMIZERS, implementation_problem, make_optimizer


def check(r: dict[str, Any]) -> None:
    _check_update_rule(r)
    if r["optimizer"] == "adamw8bit" and importlib.util.find_spec("torchao") is None:
        raise ConfigError("optimizer='adamw8bit' needs torchao, which is not installed; "
                          "pip install --no-deps 'torchao>=0.18,<0.19', or use optimizer='adamw'")
    if problem := implementation_problem(SimpleNamespace(**r)):
        raise ConfigError(problem)


def apply(model: torch.nn.Module, cfg: Any) -> torch.optim.Optimizer:
    """The optimizer over the model's trainable parameters (the shards, when sharded), run the
    `cfg.optimizer_impl` way: for-loop, foreach or fused."""
    return make_optimizer(model, cfg)


def _check_update_rule(r: dict[str, Any]) -> None:
    """Hyper-parameters that would make the first steps diverge: refused before any step."""
    lr, wd, clip = r["lr"], r["weight_decay"], r["max_grad_norm"]
    if not (limits.is_finite(lr) and lr > 0):
        raise ConfigError(f"lr={limits.shown(lr)} must be a positive finite number; pass e.g. lr=1e-3")
    most = OPTIMIZERS[r["optimizer"]].max_lr
    if lr > most:
        raise ConfigError(f"lr={lr:g} is too large for optimizer={r['optimizer']!r}: the first steps would "
                          f"diverge; pass lr <= {most:g}, e.g. lr=1e-3")
    if not (limits.is_finite(wd) and wd >= 0):
        raise ConfigError(f"weight_decay={limits.shown(wd)} must be a finite number >= 0; pass e.g. weight_decay=0.01")
    if lr * wd >= 1:
        # AdamW multiplies each weight by (1 - lr*wd) every step; SGD and Adam subtract lr*wd*w.
        raise ConfigError(f"weight_decay={wd:g} with lr={lr:g} would zero or flip every weight each step "
                          f"(lr*weight_decay={lr * wd:g} >= 1); pass weight_decay < {1 / lr:g}, e.g. 0.01")
    if clip is not None and not (limits.is_finite(clip) and clip > 0):
        raise ConfigError(f"max_grad_norm={limits.shown(clip)} must be a positive finite number or None; "
                          "pass e.g. max_grad_norm=1.0")
