"""Which parameters train: freezing parts of a model, or LoRA adapters through 🤗 peft.

Training fewer parameters saves exactly their gradients and their optimizer state: a
frozen parameter (`requires_grad=False`) gets no `.grad`, and `optim.make_optimizer`
gives the optimizer only the parameters that train. The weights themselves stay.

- `freeze_parts(model, what, first_layers=0)`: 'embeddings', 'all_but_head', and/or the
  first N transformer blocks (seed 004 §6.1 freezes by parameter name; here by part);
- `add_lora(model, rank=..., targets=...)`: LoRA (Hu et al. 2021, "LoRA: Low-Rank
  Adaptation of Large Language Models", https://arxiv.org/abs/2106.09685) on the chosen
  Linear layers: each frozen weight W (out x in) gains B @ A, with A (rank x in) and
  B (out x rank) the only new trainable values, rank x (in + out) per layer. The model's
  head (a fresh classifier) trains whole; `merge_and_unload()` folds B @ A into W after;
- the switch itself (its checks, what `run()` calls, the estimate's key): `core/switches/trainable.py`;
- `lora_parameter_count(model, rank, targets)`: the exact count of LoRA's new values.

Example:
    >>> model = freeze_parts(build_model("gpt", data=spec, dims=dims), "embeddings")  # doctest: +SKIP
    >>> sum(p.numel() for p in model.parameters() if p.requires_grad)              # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["FREEZE_CHOICES", "LORA_TARGETS", "model_parts", "freeze_parts", "add_lora",
           "lora_target_names", "lora_shapes", "lora_parameter_count"]

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
    from workbench.core.models import GPT, MLP, PretrainedClassifier, SmallCNN

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
