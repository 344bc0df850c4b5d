"""Channels-last memory format (`memory_format`), a converter switch: 'channels_last' stores a
model's 4-D weights, and so the activations its 2-D convolutions make, as N,H,W,C (each pixel's
channels side by side) instead of torch's default N,C,H,W. oneDNN (CPUs) and cuDNN (GPUs, tensor
cores) convolve natively in that layout; the default one costs them a reorder around each
convolution. The math is the same: the same values, parameter and activation bytes. Only 4-D
tensors have the layout, so only a model with nn.Conv2d layers (the CNN, or yours) can use it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workbench.base.errors import ConfigError
from workbench.core.custom import shown_model

CHOICES = ("contiguous", "channels_last")


def check(r: dict[str, Any]) -> None:
    if r["memory_format"] == "contiguous":
        return
    model = r["model"]
    if isinstance(model, nn.Module):
        if not any(isinstance(m, nn.Conv2d) for m in model.modules()):
            raise ConfigError(f"memory_format='channels_last' lays out 2-D convolutions' tensors and "
                              f"model={shown_model(model)} has no nn.Conv2d; pass memory_format='contiguous'")
    elif model != "cnn":
        raise ConfigError(f"memory_format='channels_last' lays out 2-D convolutions' tensors and model={model!r} "
                          "has none; use model='cnn' or memory_format='contiguous'")


def apply(model: nn.Module, cfg: Any) -> nn.Module:
    if cfg.memory_format == "channels_last":
        # The 4-D parameters and buffers change layout, in place; a convolution whose weight is
        # channels-last makes a channels-last output from any input (torch's suggest_memory_format).
        model = model.to(memory_format=torch.channels_last)
    return model
