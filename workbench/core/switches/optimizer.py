"""The optimizer (`optimizer`, `optimizer_impl`, `lr`, `weight_decay`, `max_grad_norm`), a converter
switch, in one module: the registries (OPTIMIZERS, IMPLEMENTATIONS), the builder every caller shares
(`make_optimizer`: run(), the estimate's fake model state, the lessons' one-step probes), its checks
and `apply`."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from workbench.base.errors import ConfigError
from workbench.core import limits
from workbench.machine.torchao_support import import_torchao


@dataclass(frozen=True)
class OptimizerSpec:
    keeps: str
    """What it keeps per parameter (what the optimizer-state bytes count)."""
    max_lr: float
    """The largest learning rate a RunConfig accepts: above it the first steps diverge. Adam's
    step is about lr per weight whatever the gradient, and the models' weights are ~0.02-0.1:
    lr > 1 moves every weight past its own scale at the first step. SGD's step is lr x gradient,
    so it tolerates more: at 10 the MLP on digits still recovers (loss 22 -> 5 in 20 steps,
    measured), at 50 it does not (1434 -> 97)."""


# The one registry of optimizers: config choices, validation, the planner read it.
OPTIMIZERS: dict[str, OptimizerSpec] = {
    "adamw": OptimizerSpec("two running averages (fp32) per parameter, decoupled weight decay", 1.0),
    "adam": OptimizerSpec("two running averages (fp32) per parameter", 1.0),
    "sgd": OptimizerSpec("one momentum buffer per parameter (momentum 0.9)", 10.0),
    "adafactor": OptimizerSpec("a row and a column average of squared gradients per matrix, one per vector "
                               "element; no momentum (torch.optim.Adafactor)", 1.0),
    "adamw8bit": OptimizerSpec("AdamW's two averages in 8 bits: a uint8 code per value, an fp32 scale per 256 "
                               "values and a 256-entry table; tensors under 4,096 values keep fp32 "
                               "(torchao.optim.AdamW8bit)", 1.0),
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
    if cfg.optimizer == "adafactor":
        return torch.optim.Adafactor(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)
    if cfg.optimizer == "adamw8bit":
        AdamW8bit = import_torchao("torchao.optim").AdamW8bit  # quietly: it logs about CUDA-only parts
        return _eager_on_cpu(AdamW8bit(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **impl))
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)


def _eager_on_cpu(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """torchao's low-bit optimizers torch.compile their update once per parameter shape. On
    this 2-core CPU the first compile took 45 s (a warm cache: 7 s), longer than a whole
    notebook; eager steps took 0.36 s per 1.2M parameters. So on a CPU the step runs eagerly:
    the state, and its bytes, are the same; only the speed differs (and is slow either way).
    Decided at each step: the model reaches its device (prepare()) after the optimizer is made."""
    step = optimizer.step

    @functools.wraps(step)
    def step_eagerly(*args: Any, **kwargs: Any) -> Any:
        if optimizer.param_groups[0]["params"][0].device.type == "cuda":
            return step(*args, **kwargs)
        with torch.compiler.set_stance("force_eager"):
            return step(*args, **kwargs)

    optimizer.step = step_eagerly
    return optimizer


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
