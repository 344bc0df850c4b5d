"""The training precisions, once: their torch dtypes, accelerate's names, and fp16's scaler.

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

import math
from typing import Any, Literal

import torch

Precision = Literal["fp32", "fp16", "bf16"]
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


def grad_scaler_problem(knobs: dict[str, Any] | None, precision: str) -> str | None:
    """Why these GradScaler knobs cannot work (a one-line fix), or None when they can."""
    if knobs is None:
        return None
    if precision != "fp16":
        return (f"grad_scaler applies to precision='fp16' only ({precision} needs no loss scaling: "
                f"bf16 and fp32 share fp32's exponent range); drop grad_scaler or use precision='fp16'")
    if unknown := sorted(set(knobs) - set(SCALER_DEFAULTS), key=repr):
        return f"grad_scaler keys {unknown} are not GradScaler knobs; use {', '.join(SCALER_DEFAULTS)}"
    checks = {
        # No upper bound: a huge init_scale only makes the scaler skip steps while it halves
        # (notebook 01 uses 2**40 on purpose to show it); inf or nan never recovers.
        "init_scale": (lambda v: math.isfinite(v) and v > 0, "a positive number such as 65536.0"),
        "growth_factor": (lambda v: math.isfinite(v) and v > 1, "a number above 1 such as 2.0"),
        "backoff_factor": (lambda v: 0 < v < 1, "a number between 0 and 1 such as 0.5"),
        "growth_interval": (lambda v: isinstance(v, int) and v >= 1, "a whole number such as 2000"),
    }
    for name, value in knobs.items():
        ok, hint = checks[name]
        try:
            fine = not isinstance(value, bool) and isinstance(value, (int, float)) and ok(value)
        except OverflowError:  # an int too large for a float
            fine = False
        if not fine:
            return f"grad_scaler[{name!r}]={value!r} cannot work; pass {hint}"
    return None


def scaler_kwargs(knobs: dict[str, Any] | None) -> dict[str, Any]:
    """The GradScaler's keyword arguments: torch's defaults updated with `knobs`."""
    return {**SCALER_DEFAULTS, **(knobs or {})}
