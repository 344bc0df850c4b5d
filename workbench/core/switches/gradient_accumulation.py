"""Gradient accumulation (`grad_accum_steps`), a loop switch: accelerate runs it (the loop's
`accelerator.accumulate(model)`); here what the Accelerator is given and the estimate replays."""

from __future__ import annotations

from typing import Any


def accelerator_kwargs(cfg: Any) -> dict[str, Any]:
    """Windows run across epoch ends: by default accelerate would step a short last window at
    every epoch end, so a run of N steps would not be N windows of grad_accum_steps micro-batches."""
    # lazy: a RunConfig stays free of accelerate (tests/test_import.py); only a run needs it
    from accelerate.utils import GradientAccumulationPlugin

    return {"gradient_accumulation_plugin": GradientAccumulationPlugin(num_steps=cfg.grad_accum_steps,
                                                                       sync_with_dataloader=False)}


def replayed_micro_batches(cfg: Any) -> int:
    """Micro-batches the estimate replays: the first (no gradients yet), and with accumulation
    a later one, which adds into gradients already there (the rest repeat it)."""
    return 2 if cfg.grad_accum_steps > 1 else 1
