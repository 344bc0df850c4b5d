"""Which parameters train (`freeze`, `freeze_layers`, `lora_rank`, `lora_alpha`, `lora_targets`), a
converter switch, in one module: the registries (FREEZE_CHOICES, LORA_TARGETS), freezing by part and
LoRA adapters through peft (also what the estimate and the lessons call), its checks and `apply`."""

from __future__ import annotations

import importlib.util
import math
from typing import Any

from torch import nn

from workbench.base.errors import ConfigError
from workbench.core import custom
from workbench.core.models import GPT, MLP, PretrainedClassifier, SmallCNN

__all__ = ["FREEZE_CHOICES", "LORA_TARGETS", "model_parts", "freeze_parts", "add_lora",
           "lora_target_names", "lora_shapes", "lora_parameter_count", "check", "apply"]

# what each `freeze` choice leaves untrained
FREEZE_CHOICES: dict[str, str] = {
    "none": "every parameter trains",
    "embeddings": "the token (and position) embeddings are frozen; on the GPT that is also its lm_head (tied)",
    "all_but_head": "only the head trains (a linear probe on the pretrained features)",
}

# LoRA target choice -> the Linear layers it adapts, per model (peft matches these as
# module-name suffixes). The GPT's fused c_attn holds q, k and v in one Linear.
LORA_TARGETS: dict[str, dict[str, tuple[str, ...]]] = {
    "attention": {
        "minilm": ("query", "key", "value", "attention.output.dense"),
        "gpt": ("c_attn", "attn.c_proj"),
    },
    "attention_mlp": {
        "minilm": ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense"),
        "gpt": ("c_attn", "attn.c_proj", "mlp.0", "mlp.2"),
    },
}


def _model_name(model: nn.Module) -> str:
    for cls, name in ((GPT, "gpt"), (PretrainedClassifier, "minilm"), (MLP, "mlp"), (SmallCNN, "cnn")):
        if isinstance(model, cls):
            return name
    raise TypeError(f"{type(model).__name__} is not a workbench model (mlp, cnn, gpt, minilm)")


def model_parts(model: nn.Module) -> dict[str, list[nn.Module]]:
    """The model's parts freezing speaks of: 'embeddings', 'blocks' (in order) and 'head'.

    The GPT's head is its final LayerNorm and lm_head, whose weight *is* the token
    embedding (tied): whatever freezes one freezes the other. The MLP and CNN have no
    embeddings and no blocks: their head is the last Linear layer.
    """
    name = _model_name(model)
    if name == "gpt":
        return {"embeddings": [model.wte, model.wpe], "blocks": list(model.blocks), "head": [model.ln_f, model.lm_head]}
    if name == "minilm":
        bert = model.hf.bert
        return {"embeddings": [bert.embeddings], "blocks": list(bert.encoder.layer), "head": [model.hf.classifier]}
    head = model.net[-1] if name == "mlp" else model.head
    return {"embeddings": [], "blocks": [], "head": [head]}


def freeze_parts(model: nn.Module, what: str = "none", *, first_layers: int = 0) -> nn.Module:
    """Freeze `what` (a FREEZE_CHOICES name) and the first `first_layers` blocks; returns the model.

    Example:
        >>> freeze_parts(model, "embeddings", first_layers=2)  # doctest: +SKIP
    """
    if what not in FREEZE_CHOICES:
        raise ValueError(f"freeze={what!r} is not known; use one of {', '.join(map(repr, FREEZE_CHOICES))}")
    if what == "none" and first_layers == 0:  # nothing to freeze: any module (your own too) passes as it is
        return model
    parts = model_parts(model)
    if not 0 <= first_layers <= len(parts["blocks"]):
        raise ValueError(f"freeze_layers={first_layers} but the model has {len(parts['blocks'])} blocks; "
                         f"pass 0..{len(parts['blocks'])}")
    if what == "all_but_head":
        model.requires_grad_(False)
        for module in parts["head"]:
            module.requires_grad_(True)
        return model
    frozen = (parts["embeddings"] if what == "embeddings" else []) + parts["blocks"][:first_layers]
    for module in frozen:
        module.requires_grad_(False)
    return model


def lora_target_names(model_name: str, targets: str) -> tuple[str, ...]:
    """The Linear layers (module-name suffixes) LoRA adapts for this target choice and model."""
    if targets not in LORA_TARGETS:
        raise ValueError(f"lora_targets={targets!r} is not known; use one of {', '.join(map(repr, LORA_TARGETS))}")
    if model_name not in LORA_TARGETS[targets]:
        raise ValueError(f"LoRA applies to the transformers (gpt, minilm), not model={model_name!r}")
    return LORA_TARGETS[targets][model_name]


def _targeted_linears(model: nn.Module, names: tuple[str, ...]) -> list[nn.Linear]:
    return [m for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and any(n == t or n.endswith("." + t) for t in names)]


def lora_shapes(model: nn.Module, *, rank: int, targets: str = "attention") -> list[tuple[int, int]]:
    """The shapes of the matrices LoRA adds to this (un-adapted) model: A (rank, in) and
    B (out, rank) for each targeted Linear, in module order. The estimate adds exactly these."""
    names = lora_target_names(_model_name(model), targets)
    return [shape for m in _targeted_linears(model, names)
            for shape in ((rank, m.in_features), (m.out_features, rank))]


def lora_parameter_count(model: nn.Module, *, rank: int, targets: str = "attention") -> int:
    """LoRA's new trainable values on this (un-adapted) model: rank x (in + out) per targeted Linear.

    Example:
        >>> lora_parameter_count(minilm, rank=8)   # 6 layers x 4 Linear(384, 384) x 8 x 768 # doctest: +SKIP
        147456
    """
    return sum(rows * cols for rows, cols in lora_shapes(model, rank=rank, targets=targets))


def add_lora(model: nn.Module, *, rank: int, targets: str = "attention", alpha: float | None = None) -> nn.Module:
    """Wrap `model` with LoRA adapters (peft) on the `targets` Linear layers; every other
    weight is frozen except the head (MiniLM's fresh classifier trains whole, as peft's
    `modules_to_save` would, but in place: no second copy). Returns the peft model
    (`merge_and_unload()` gives back a plain model with B @ A folded into each weight).

    alpha: LoRA's scale numerator (the update is alpha / rank x B @ A); None: 2 x rank, so
    the scale stays 2 whatever the rank.
    """
    # lazy: peft (it imports transformers) only for LoRA
    from peft import LoraConfig, get_peft_model

    name = _model_name(model)
    names = lora_target_names(name, targets)
    if rank < 1:
        raise ValueError(f"lora_rank={rank} must be at least 1 to add adapters")
    config = LoraConfig(r=rank, lora_alpha=2 * rank if alpha is None else alpha, lora_dropout=0.0,
                        target_modules=list(names), bias="none")
    peft_model = get_peft_model(model, config)
    if name == "minilm":  # the classifier is new: adapters on it would train a random matrix's update
        for module in model_parts(model)["head"]:
            module.requires_grad_(True)
    return peft_model


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
