"""The training precisions, once: their torch dtypes, accelerate's names, and fp16's scaler
defaults (the switch itself, its checks and its accelerator side: `core/switches/precision.py`).

Every other module asks here: the config validates against `PRECISIONS`, the hardware
report times `DTYPES`, the engine passes `ACCELERATE_NAMES` to `Accelerator`, the
estimate and the dtype inspection enter autocast with `AUTOCAST_DTYPES`.

Example:
    >>> ACCELERATE_NAMES["fp32"], DTYPES["bf16"]
    ('no', torch.bfloat16)
    >>> scaler_kwargs({"init_scale": 1024.0})["growth_interval"]  # torch's default kept
    2000
"""

from __future__ import annotations

from typing import Any

import torch

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# accelerate's `mixed_precision` values (its PrecisionType): fp32 is "no" mixed precision.
ACCELERATE_NAMES: dict[str, str] = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}
# What autocast computes in: the reduced precisions only (fp32 runs without autocast).
AUTOCAST_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16}

# torch.amp.GradScaler's defaults (and accelerate's GradScalerKwargs'): the scale starts
# at 2**16, doubles after 2000 steps without an inf/NaN gradient, halves on each one.
SCALER_DEFAULTS: dict[str, float] = {
    "init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
}


def scaler_kwargs(knobs: dict[str, Any] | None) -> dict[str, Any]:
    """The GradScaler's keyword arguments: torch's defaults updated with `knobs`."""
    return {**SCALER_DEFAULTS, **(knobs or {})}
