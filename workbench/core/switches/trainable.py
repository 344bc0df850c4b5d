"""Training fewer parameters (`freeze`, `freeze_layers`, `lora_*`), a converter switch: frozen
parameters get no gradient and no optimizer state; LoRA adds small adapters (peft). The parts and
adapters, and the registries FREEZE_CHOICES and LORA_TARGETS, are `core/trainable.py`'s."""

from __future__ import annotations

import importlib.util
import math
from typing import Any

from torch import nn

from workbench.base.errors import ConfigError
from workbench.core import custom
from workbench.core.trainable import add_lora, freeze_parts

# all-MiniLM-L6-v2: 6 transformer layers (the "L6"); known here without loading it.
_MINILM_LAYERS = 6

# RunConfig fields that choose what trains, in this order in the estimate's model-state key.
FIELDS = ("freeze", "freeze_layers", "lora_rank", "lora_targets", "lora_alpha")
ALL_TRAIN = ("none", 0, 0, "attention", None)


def check(r: dict[str, Any]) -> None:
    custom.refuse_for_own_model(r, r["freeze"] != "none" or r["freeze_layers"] != 0, "freeze and freeze_layers pick "
                                "parts of the built-in models", "call requires_grad_(False) on what you freeze (the "
                                "optimizer gets only what trains), and pass freeze='none', freeze_layers=0")
    custom.refuse_for_own_model(r, r["lora_rank"] != 0, f"lora_rank={r['lora_rank']} adapts the built-in "
                                "transformers' layers", "wrap your module with peft.get_peft_model yourself, and "
                                "pass lora_rank=0")
    model, spec = r["model"], custom.model_spec(r["model"])  # a module: freezing and LoRA were refused above
    if r["freeze"] == "embeddings" and not spec.is_text:
        raise ConfigError(f"freeze='embeddings' needs a model with embeddings (gpt, minilm), not model={model!r}; "
                          "use freeze='all_but_head'")
    layers = r["freeze_layers"]
    if layers:
        blocks = _MINILM_LAYERS if model == "minilm" else r["dims"].get("n_layer", 4) if model == "gpt" else 0
        if layers < 0 or layers > blocks or not spec.has_blocks:
            raise ConfigError(f"freeze_layers={layers} must be 0..{blocks} for model={model!r} "
                              f"({blocks} transformer blocks); pass a count in that range")
        if r["freeze"] == "all_but_head":
            raise ConfigError("freeze_layers has nothing left to freeze under freeze='all_but_head'; pass freeze_layers=0")
    if r["lora_rank"] < 0:
        raise ConfigError(f"lora_rank={r['lora_rank']} must not be negative; pass e.g. lora_rank=8, or 0 for no LoRA")
    alpha = r["lora_alpha"]
    if alpha is not None and (not r["lora_rank"] or not (math.isfinite(alpha) and alpha > 0)):
        raise ConfigError(f"lora_alpha={alpha} needs lora_rank >= 1 and a positive value; pass e.g. lora_alpha=16")
    if r["lora_rank"]:
        if model not in ("gpt", "minilm"):
            raise ConfigError(f"lora_rank={r['lora_rank']} adapts transformer layers; use model='minilm' or 'gpt'")
        if r["freeze"] != "none" or layers:
            raise ConfigError("lora_rank freezes every pretrained weight itself; leave freeze='none' and freeze_layers=0")
        if importlib.util.find_spec("peft") is None:
            raise ConfigError(f"lora_rank={r['lora_rank']} needs peft, which is not installed; "
                              "pip install 'peft>=0.21,<0.22', or use lora_rank=0")


def apply(model: nn.Module, cfg: Any) -> nn.Module:
    """What trains in a run of `cfg` (a resolved RunConfig): its `freeze`, `freeze_layers` and
    `lora_*` fields applied to `model`. Returns the model to train (a peft model with LoRA)."""
    if cfg.lora_rank:
        return add_lora(model, rank=cfg.lora_rank, targets=cfg.lora_targets, alpha=cfg.lora_alpha)
    return freeze_parts(model, cfg.freeze, first_layers=cfg.freeze_layers)


def replay_key(cfg: Any) -> tuple:
    """The FIELDS' values: what the estimate's model state applies."""
    return tuple(getattr(cfg, name) for name in FIELDS)
