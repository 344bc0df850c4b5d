"""Fused attention (`attention`), a converter switch: 'sdpa' makes the GPT call
`F.scaled_dot_product_attention` (keeps no s x s matrix). Names: `core.models.ATTENTIONS`."""

from __future__ import annotations

from typing import Any

from torch import nn

from workbench.base.errors import ConfigError
from workbench.core import custom
from workbench.core.models import ATTENTIONS, set_attention

CHOICES = ATTENTIONS


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
