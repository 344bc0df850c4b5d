"""Fused attention (`RunConfig.attention`), a converter switch: 'sdpa' makes the GPT's attention
layers `FusedAttention`, which call `F.scaled_dot_product_attention` (one kernel, no s x s matrix kept).

The switch swaps each `CausalSelfAttention` for its subclass in place (`module.__class__`, as
torch's FSDP2 `fully_shard` does): same parameters under the same names, so a model switches back
and forth and its state dict loads either way; the GPT itself reads no flag.

Example:
    >>> model = GPT(vocab_size=256, seq_len=16, n_layer=1, n_head=2, d_model=8)
    >>> type(set_attention(model, "sdpa").blocks[0].attn).__name__
    'FusedAttention'
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.base.errors import ConfigError
from workbench.core import custom
from workbench.core.models import GPT, CausalSelfAttention  # noqa: F401  (GPT: the docstring's example)

# The registry: how the GPT computes attention. 'explicit': matmul, mask, softmax, matmul (what
# Korthikanti et al. count); 'sdpa': torch.nn.functional.scaled_dot_product_attention, a fused kernel.
CHOICES = ("explicit", "sdpa")


class FusedAttention(CausalSelfAttention):
    """The GPT's attention through `F.scaled_dot_product_attention` (what 'sdpa' swaps in)."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Saves q, k, v (views of the one qkv output), the output and the softmax's log-sum-exp
        # per row (fp32) on CPU: counters.gpt_activation_bytes_formula(attention="sdpa"). With
        # dropout the CPU picks the math backend, which keeps s x s tensors again. The output is
        # laid out (B, T, heads, d) in memory: the caller's transpose and view copy nothing.
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                              is_causal=True)


def set_attention(model: nn.Module, attention: str) -> nn.Module:
    """Compute the GPT's attention explicitly ('explicit') or with the fused kernel ('sdpa').

    'explicit' is accepted by every model, so a loop may always call this; 'sdpa' needs the GPT
    (MiniLM's attention is chosen inside transformers). Weights are untouched: the two compute
    the same function. Returns the model."""
    if attention not in CHOICES:
        raise ValueError(f"attention={attention!r} is not known; use one of: {', '.join(map(repr, CHOICES))}")
    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    if attention == "sdpa" and not layers:
        raise ValueError(f"attention='sdpa' applies to the GPT, not {type(model).__name__}; use attention='explicit'")
    if wrapped := sorted({type(m).__name__ for m in layers} - {"CausalSelfAttention", "FusedAttention"}):
        raise ValueError(f"attention={attention!r}: the GPT's attention layers are already {', '.join(wrapped)}; "
                         "switch it on the plain model, before sharding it")
    for layer in layers:
        layer.__class__ = FusedAttention if attention == "sdpa" else CausalSelfAttention
    return model


def check(r: dict[str, Any]) -> None:
    custom.refuse_for_own_model(r, r["attention"] != "explicit", f"attention={r['attention']!r} switches the built-in "
                                "GPT's attention", "call F.scaled_dot_product_attention in your forward, and pass "
                                "attention='explicit'")
    if r["attention"] == "sdpa" and r["model"] != "gpt":
        raise ConfigError(f"attention='sdpa' switches the GPT's attention and model={r['model']!r} is not the GPT; "
                          "use model='gpt' or attention='explicit'")


def apply(model: nn.Module, cfg: Any) -> nn.Module:
    return set_attention(model, cfg.attention)


def replay_dims(cfg: Any) -> dict[str, Any]:
    """What the estimate's replayed GPT is built with besides its sizes (fakestate.build)."""
    return {"attention": cfg.attention}
