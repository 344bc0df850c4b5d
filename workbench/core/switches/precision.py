"""Mixed precision (`precision`, `grad_scaler`), the precision switch. Names and dtypes: the
registry `base/precisions.py`. accelerate wraps forward in autocast at `prepare()` and scales
fp16's loss in `backward()`; the loop logs the scale and lets fp16 skip a non-finite step; the
estimate replays the forward under the same autocast (AUTOCAST_DTYPES)."""

from __future__ import annotations

import math
from typing import Any

import torch

from workbench.base.errors import ConfigError
from workbench.base.precisions import ACCELERATE_NAMES, SCALER_DEFAULTS, scaler_kwargs
from workbench.machine import hardware


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


def check(r: dict[str, Any]) -> None:
    """The scaler's knobs, and a precision this device can run (emulated is allowed, and said)."""
    if problem := grad_scaler_problem(r["grad_scaler"], r["precision"]):  # fp16: torch's defaults filled in
        raise ConfigError(problem)
    if why := hardware.missing_here(hardware.resolve_device(r["device"]), r["precision"]):
        raise ConfigError(f"precision={r['precision']!r}: {why}; use precision={hardware.STAND_INS[r['precision']]!r}")


def accelerator_kwargs(cfg: Any) -> dict[str, Any]:
    """accelerate's name for the precision, and fp16's GradScaler knobs."""
    return {"mixed_precision": ACCELERATE_NAMES[cfg.precision], "kwargs_handlers": kwargs_handlers(cfg.precision, cfg.grad_scaler)}


def kwargs_handlers(precision: str, knobs: dict[str, Any] | None) -> list:
    """accelerate kwargs handlers for a run: a GradScalerKwargs for fp16, else none."""
    if precision != "fp16":
        return []
    # lazy: a RunConfig stays free of accelerate (tests/test_import.py); only a run needs it
    from accelerate.utils import GradScalerKwargs

    return [GradScalerKwargs(**scaler_kwargs(knobs))]


def enable_fp16_on_cpu(accelerator: Any, knobs: dict[str, Any] | None) -> bool:
    """Make `Accelerator(cpu=True, mixed_precision="fp16")` really train in fp16.

    accelerate 1.x sets up autocast and a GradScaler for fp16 only on accelerators
    (`accelerator.scaler` stays None and `native_amp` False on a CPU), so the run would
    be plain fp32 under an fp16 label. Giving it a CPU GradScaler and `native_amp` before
    `prepare()` lets accelerate do the rest as on a GPU: `prepare()` wraps forward in
    `torch.autocast("cpu", torch.float16)`, `backward()` scales the loss, the optimizer
    steps through `scaler.step` / `scaler.update` and reports `step_was_skipped`.
    Returns True when it switched fp16 on.
    """
    if accelerator.mixed_precision != "fp16" or accelerator.device.type != "cpu" or accelerator.scaler is not None:
        return False
    accelerator.scaler = torch.amp.GradScaler("cpu", **scaler_kwargs(knobs))
    accelerator.native_amp = True
    return True


def loss_scale(accelerator: Any) -> float | None:
    """The GradScaler's current scale (a device sync on a GPU), or None without one."""
    return None if accelerator.scaler is None else float(accelerator.scaler.get_scale())


def stops_on(precision: str, finite: int) -> bool:
    """Whether a log window with a non-finite loss stops the run. A non-finite loss has poisoned
    the weights (fp32, bf16: the step applied it); in fp16 the GradScaler skips such steps, so
    only a window with no finite loss at all stops it."""
    return precision != "fp16" or not finite
