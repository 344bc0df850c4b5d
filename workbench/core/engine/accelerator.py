"""The Accelerator a run trains with: accelerate owns devices, mixed precision and accumulation.

`make_accelerator(cfg)` builds a fresh one for a config, with the keywords of the switches
that act through it (precision, accumulation, data loading: `workbench/core/switches`). Two things
accelerate does not do by itself, done here once for every caller:
- `reset_accelerate_state()`: accelerate keeps its state in process-wide singletons and
  refuses a second Accelerator with another mixed precision; a notebook compares
  precisions in one kernel, so the single-process state is reset before each;
- the per-step `lomo_optim` package check is cached (2% of a small model's step).
"""

from __future__ import annotations

import functools
from typing import Any

import accelerate.optimizer as accelerate_optimizer
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState, PartialState

from workbench.core.switches import data_loading, gradient_accumulation, precision
from workbench.machine import hardware


def reset_accelerate_state(*, keep_process_group: bool | None = None) -> None:
    """Forget accelerate's per-run singletons so the next Accelerator may differ.

    Under a distributed launch the process group must survive (only the per-run part is
    reset); by default that is decided from the state itself.
    """
    if keep_process_group is None:
        keep_process_group = PartialState._shared_state.get("num_processes", 1) > 1
    AcceleratorState._reset_state(reset_partial_state=not keep_process_group)
    GradientState._reset_state()


def _cache_accelerate_package_check() -> None:
    """accelerate (1.15) asks importlib whether `lomo_optim` is installed twice in every
    optimizer.step(): ~160 µs a step, 2% of a small model's 7 ms step, measured with
    cProfile. Installed packages do not change during a run, so the answer is cached,
    in accelerate.optimizer's namespace only."""
    check = accelerate_optimizer.is_lomo_available
    if not hasattr(check, "cache_info"):
        accelerate_optimizer.is_lomo_available = functools.cache(check)


def make_accelerator(cfg: Any) -> Any:
    """A fresh Accelerator for this (resolved) RunConfig."""
    _cache_accelerate_package_check()
    device = hardware.resolve_device(cfg.device)
    reset_accelerate_state()
    accelerator = Accelerator(
        cpu=device == "cpu",
        **precision.accelerator_kwargs(cfg),  # technique: precision (fp16's GradScaler knobs too)
        **gradient_accumulation.accelerator_kwargs(cfg),  # technique: gradient accumulation
        **data_loading.accelerator_kwargs(cfg),  # technique: input pipeline (non_blocking copies)
    )
    # accelerate turns fp16 on only on accelerators; on a CPU it would silently train in
    # fp32. This gives it torch.amp.GradScaler("cpu") and autocast, before prepare().
    precision.enable_fp16_on_cpu(accelerator, cfg.grad_scaler)
    return accelerator
