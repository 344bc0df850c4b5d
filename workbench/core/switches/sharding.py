"""Sharding the model state across processes (`RunConfig.sharding`): FSDP2's `fully_shard`
(ZeRO stage 3), a converter switch. The estimate counts one process's share (rank 0's).

Data parallelism keeps a whole copy of the parameters, gradients and optimizer state in
every process. `shard_model` splits each parameter along its first dimension across the N
processes (a DTensor: rank r holds rows r x ceil(d/N) onward), so each process keeps about
1/N of all three. Before a group of layers runs forward (and again for backward), its
parameters are all-gathered; after backward its gradients are reduce-scattered, so each
process ends the step holding the averaged gradient of its own shard only, and the
optimizer updates only that shard. The transformer blocks are one group each, the rest of
the model the root group: at most one block's full parameters are gathered at a time.

Why not accelerate's FSDP plugin: on CPU processes (distributed type MULTI_CPU) accelerate
1.15 ignores `fsdp_plugin` without a word (state.py switches to FSDP only for GPU-like
types) and wraps the model in DistributedDataParallel instead: every process keeps the
whole model (measured in notebook 09). `fully_shard` itself runs on CPU over gloo.

Example:
    >>> model = shard_model(model)             # doctest: +SKIP  (inside a launched process)
    >>> optimizer = make_optimizer(model, cfg)  # doctest: +SKIP  (after sharding: it holds the shards)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch import nn

from workbench.base.errors import ConfigError
from workbench.core import custom
from workbench.core.switches.trainable import model_parts

CHOICES = ("none", "full")
"""The registry: 'none' (data parallel: every process holds the whole state) or 'full' (ZeRO stage 3)."""


def check(r: dict[str, Any]) -> None:
    """What the sharded loop does not wire (yet): said, rather than running something else."""
    if r["sharding"] == "none":
        return
    custom.refuse_for_own_model(r, True, f"sharding={r['sharding']!r} is wired for the built-in models",
                                "pass sharding='none'")
    if r["precision"] != "fp32":
        raise ConfigError(f"sharding={r['sharding']!r} trains in fp32 here (FSDP2's MixedPrecisionPolicy is not "
                          "wired in); use precision='fp32'")
    for name, off in (("qat", "none"), ("save_state_dir", None), ("resume_from", None)):
        if r[name] != off:
            raise ConfigError(f"sharding={r['sharding']!r} does not support {name} yet; "
                              f"pass {name}={off!r} or sharding='none'")


def apply(model: nn.Module, cfg: Any) -> nn.Module:
    return model if cfg.sharding == "none" else shard_model(model)


def prepare(accelerator: Any, model: nn.Module, optimizer: Any, cfg: Any) -> tuple[nn.Module, Any]:
    """accelerate's prepare(). Sharded: not the model, which accelerate would wrap in DDP as
    well (on CPU it ignores its FSDP plugin)."""
    if cfg.sharding == "none":
        return accelerator.prepare(model, optimizer)
    return model, accelerator.prepare(optimizer)


def whole(model: nn.Module, cfg: Any) -> contextlib.AbstractContextManager:
    """Evaluation's context: sharded, the whole weights gathered once (no collective per batch)."""
    return gathered(model) if cfg.sharding != "none" else contextlib.nullcontext()


def replay_shard(cfg: Any, processes: int) -> tuple[int, int]:
    """(processes, rank) whose share of the model state the estimate counts."""
    return (processes, 0) if cfg.sharding != "none" else (1, 0)


def _base(model: nn.Module) -> nn.Module:
    """The workbench model inside a peft wrapper (LoRA), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def shard_model(model: nn.Module, mesh: Any = None) -> nn.Module:
    """Shard `model` over the default process group (or `mesh`): each transformer block one
    FSDP group, then the whole model (the rest). Build the optimizer after this: it must hold
    the shards. (The planner passes a mesh it made before entering fake mode.)

    Raises ValueError in a single process: there is nothing to shard across.
    """
    # lazy: `import torch` does not load FSDP (600 modules, half a second)
    from torch.distributed.fsdp import fully_shard

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        raise ValueError("sharding='full' splits the model state across processes, and this run has one; "
                         "start it with wb.launch(config, num_processes=2), or use sharding='none'")
    for block in model_parts(_base(model))["blocks"]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block every process holds the whole (unsharded) model: one all-gather per
    group on entry, none per forward. Evaluation needs it: the processes' shares of the
    held-out set may differ by a batch, and a sharded forward is a collective all must join.
    """
    # lazy: `import torch` does not load FSDP (600 modules, half a second)
    from torch.distributed.fsdp import FSDPModule

    groups = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for group in groups:  # the same order in every process: the all-gathers pair up
        group.unshard()
        group.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        for group in groups:
            group.reshard()
            group.set_reshard_after_forward(True, recurse=False)

