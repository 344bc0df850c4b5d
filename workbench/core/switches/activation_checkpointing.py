"""Activation checkpointing (`RunConfig.activation_checkpointing`): a converter switch.

A checkpointed block keeps only its input in forward and recomputes the rest in backward
(`torch.utils.checkpoint.checkpoint`, non-reentrant): fewer saved-activation bytes for one
more forward of the block. For the GPT the switch swaps each chosen block for its subclass
`CheckpointedBlock` in place (`module.__class__`, as torch's FSDP2 `fully_shard` does): same
parameters under the same names, so a state dict saved with one setting loads under another and
the GPT reads no flag. The MiniLM takes Hugging Face's own switch.

Example:
    >>> set_activation_checkpointing(model, "every_other")  # doctest: +SKIP
    >>> checkpointed_blocks(model)                          # doctest: +SKIP
    [0, 2]
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from workbench.base.arguments import listed
from workbench.base.errors import ConfigError
from workbench.core import custom
from workbench.core.models import GPT, MODEL_SPECS, Block, PretrainedClassifier
from workbench.core.saved import note_saved

# The registry: the names RunConfig accepts (its Literal type and the CLI's choices read them).
CHOICES: dict[str, str] = {
    "none": "every block keeps what its ops save",
    "all": "every block keeps its input only and recomputes the rest in backward",
    "every_other": "blocks 0, 2, 4, ... keep their input only; the others keep everything",
    "selective": "every block keeps its input and its matmuls' outputs; the rest is recomputed in backward",
}

# 'selective': the ops whose outputs a checkpointed block keeps (the costly ones to recompute).
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
           torch.ops.aten.baddbmm.default}


def _keep_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


class _NoteMatmuls(TorchDispatchMode):
    """Reports the matmul outputs selective checkpointing keeps (in its own cache, where
    autograd's saved-tensor hooks do not see them) to an active SavedActivationCounter."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in MATMULS:
            note_saved(out)
        return out


def noting_matmuls(context_fn: Callable[[], tuple[Any, Any]]) -> Callable[[], tuple[Any, Any]]:
    """A selective checkpoint's `context_fn`, its forward run under the reporter (entered first,
    so the cache sees each output it reports): an active SavedActivationCounter then counts
    the matmul outputs the policy keeps. For a policy written by hand too (notebook 03)."""
    def contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        forward, recompute = context_fn()
        both = contextlib.ExitStack()
        both.enter_context(_NoteMatmuls())
        both.enter_context(forward)
        return both, recompute
    return contexts


# checkpoint()'s context_fn for 'selective': torch's selective-checkpoint contexts for the policy.
_selective_contexts = noting_matmuls(functools.partial(create_selective_checkpoint_contexts, _keep_matmuls))


class CheckpointedBlock(Block):
    """A GPT block that keeps only its input and recomputes the rest in backward (what the switch
    swaps in); `checkpoint_options`: torch.utils.checkpoint's further keywords ('selective')."""

    checkpoint_options: dict[str, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():  # nothing is saved for a backward: no checkpoint to make
            return super().forward(x)
        # The checkpoint keeps x alive for the recompute: report it so counted activation bytes
        # stay exact (torch 2.13's hooks see it too; counted once).
        note_saved(x)
        # No RNG state to save when there is no dropout (saves a copy per block).
        return checkpoint(super().forward, x, use_reentrant=False, preserve_rng_state=self.dropout > 0,
                          **self.checkpoint_options)


def checkpointed_blocks(model: nn.Module) -> list[int]:
    """The indices of the GPT's blocks that recompute in backward ([] for other models)."""
    return [i for i, block in enumerate(getattr(model, "blocks", ())) if isinstance(block, CheckpointedBlock)]


def check(r: dict[str, Any]) -> None:
    """The resolved values `r` can checkpoint: a built-in model with blocks."""
    custom.refuse_for_own_model(r, r["activation_checkpointing"] != "none",
                                f"activation_checkpointing={r['activation_checkpointing']!r} recomputes the built-in "
                                "models' blocks", "put torch.utils.checkpoint inside your module's forward, and pass "
                                "activation_checkpointing='none'")
    if r["activation_checkpointing"] != "none" and not MODEL_SPECS[r["model"]].has_blocks:
        raise ConfigError(
            f"activation_checkpointing={r['activation_checkpointing']!r} needs a model with blocks; "
            f"use model='gpt' or 'minilm', or activation_checkpointing='none'"
        )


def apply(model: nn.Module, cfg: Any) -> nn.Module:
    """What `run()` does: the config's setting on the model it built (every model takes 'none')."""
    return set_activation_checkpointing(model, cfg.activation_checkpointing)


def set_activation_checkpointing(model: nn.Module, blocks: str | Iterable[int]) -> nn.Module:
    """Recompute the chosen blocks' activations in backward instead of keeping them.

    `blocks`: a CHOICES name or block indices (GPT only: the MiniLM wrapper takes the switches
    Hugging Face offers, "none", "all" and, on transformers with `activation_checkpointing_enable`,
    "every_other"). "none" is accepted by every model, so a loop may always call this. Returns the model.
    """
    options: dict[str, Any] = {}
    if blocks == "selective":  # every block, through torch's policy-based checkpoint
        blocks, options = "all", {"context_fn": _selective_contexts}
    if isinstance(model, GPT):
        n = len(model.blocks)
        if blocks == "none":
            chosen: set[int] = set()
        elif blocks == "all":
            chosen = set(range(n))
        elif blocks == "every_other":
            chosen = set(range(0, n, 2))
        elif isinstance(blocks, str):
            raise ValueError(f"activation checkpointing blocks={blocks!r}: "
                             f"use {', '.join(map(repr, CHOICES))} or block indices")
        else:
            chosen = set(listed("blocks", blocks, "blocks=[0, 2] (block indices) or 'all'"))
            if bad := sorted((i for i in chosen if not (isinstance(i, int) and 0 <= i < n)), key=repr):
                raise ValueError(f"activation checkpointing blocks {bad} out of range: "
                                 f"this GPT has blocks 0..{n - 1}")
        if wrapped := sorted({type(b).__name__ for b in model.blocks} - {"Block", "CheckpointedBlock"}):
            raise ValueError(f"activation checkpointing: the GPT's blocks are already {', '.join(wrapped)}; "
                             "switch it on the plain model, before sharding it")
        for i, block in enumerate(model.blocks):
            block.__class__ = CheckpointedBlock if i in chosen else Block
            if i in chosen:
                block.checkpoint_options = options
            else:
                vars(block).pop("checkpoint_options", None)
    elif isinstance(model, PretrainedClassifier):
        hf, kwargs = model.hf, {"use_reentrant": False, **options}
        # transformers >= 5.2x renamed the switch (the old name warns) and added every_n_layers.
        new_api = hasattr(hf, "activation_checkpointing_enable")
        if blocks == "none":
            hf.activation_checkpointing_disable() if new_api else hf.gradient_checkpointing_disable()
        elif blocks == "all" and not new_api:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        elif blocks in ("all", "every_other") and new_api:
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs,
                                               every_n_layers=1 if blocks == "all" else 2)
        else:
            raise ValueError(f"activation checkpointing blocks={blocks!r}: the pretrained MiniLM takes "
                             f"{'none, all or every_other' if new_api else 'only all or none'}")
    elif blocks != "none":
        raise ValueError("activation checkpointing applies to models with blocks (gpt, minilm), "
                         f"not {type(model).__name__}")
    return model


def replay_groups(cfg: Any) -> tuple[int, int, int]:
    """What the estimate replays of a GPT: (blocks per group, layers replayed, groups scaled in);
    (0, 0, 0) for other models.

    A group is one block, or under 'every_other' a checkpointed block and a plain one. Two
    groups (and an odd block left over) are replayed; the groups between them are scaled in."""
    if cfg.model != "gpt":
        return 0, 0, 0
    layers = cfg.dims.get("n_layer", 4)
    size = 2 if cfg.activation_checkpointing == "every_other" else 1
    replayed = min(layers, 2 * size + layers % size)
    scaled = (layers - replayed) // size
    return (size if scaled else 0), replayed, scaled
