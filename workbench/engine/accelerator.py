"""The Accelerator a run trains with: accelerate owns devices, mixed precision and accumulation.

`make_accelerator(cfg)` builds a fresh one for a config. Three things accelerate does not do
by itself, done here once for every caller:
- `reset_accelerate_state()`: accelerate keeps its state in process-wide singletons and
  refuses a second Accelerator with another mixed precision; a notebook compares
  precisions in one kernel, so the single-process state is reset before each;
- `enable_fp16_on_cpu()`: accelerate 1.x turns fp16 on only on accelerators; on a CPU it
  would silently train in fp32;
- the per-step `lomo_optim` package check is cached (2% of a small model's step).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from workbench.core import hardware
from workbench.core.precisions import ACCELERATE_NAMES, scaler_kwargs


def reset_accelerate_state(*, keep_process_group: bool | None = None) -> None:
    """Forget accelerate's per-run singletons so the next Accelerator may differ.

    Under a distributed launch the process group must survive (only the per-run part is
    reset); by default that is decided from the state itself.
    """
    from accelerate.state import AcceleratorState, GradientState, PartialState

    if keep_process_group is None:
        keep_process_group = PartialState._shared_state.get("num_processes", 1) > 1
    AcceleratorState._reset_state(reset_partial_state=not keep_process_group)
    GradientState._reset_state()


def _cache_accelerate_package_check() -> None:
    """accelerate (1.15) asks importlib whether `lomo_optim` is installed twice in every
    optimizer.step(): ~160 µs a step, 2% of a small model's 7 ms step, measured with
    cProfile. Installed packages do not change during a run, so the answer is cached,
    in accelerate.optimizer's namespace only."""
    import accelerate.optimizer as accelerate_optimizer

    check = accelerate_optimizer.is_lomo_available
    if not hasattr(check, "cache_info"):
        accelerate_optimizer.is_lomo_available = functools.cache(check)


def kwargs_handlers(precision: str, knobs: dict[str, Any] | None) -> list:
    """accelerate kwargs handlers for a run: a GradScalerKwargs for fp16, else none."""
    if precision != "fp16":
        return []
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


def plain_accelerator(precision: str, *, device: str = "auto", **kwargs: Any) -> Any:
    """A fresh single-process Accelerator for `precision` (fp16 real on a CPU too), for
    demonstrations between runs; `make_accelerator` is the one a run uses."""
    from accelerate import Accelerator

    device = hardware.resolve_device(device)
    reset_accelerate_state(keep_process_group=False)
    accelerator = Accelerator(cpu=device == "cpu", mixed_precision=ACCELERATE_NAMES[precision], **kwargs)
    enable_fp16_on_cpu(accelerator, None)
    return accelerator


def make_accelerator(cfg: Any) -> Any:
    """A fresh Accelerator for this (resolved) RunConfig."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, GradientAccumulationPlugin

    _cache_accelerate_package_check()
    device = hardware.resolve_device(cfg.device)
    reset_accelerate_state()
    accelerator = Accelerator(
        cpu=device == "cpu",
        mixed_precision=ACCELERATE_NAMES[cfg.precision],
        # technique: gradient accumulation. Windows run across epoch ends: by default
        # accelerate would step a short last window at every epoch end, so a run of N
        # steps would not be N windows of grad_accum_steps micro-batches.
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=cfg.grad_accum_steps, sync_with_dataloader=False),
        # technique: input pipeline. With pinned batches the host-to-GPU copy can be
        # asynchronous (non_blocking): it overlaps the previous step's GPU work.
        dataloader_config=DataLoaderConfiguration(non_blocking=cfg.pin_memory),
        # technique: precision. fp16's GradScaler knobs reach accelerate's GradScalerKwargs.
        kwargs_handlers=kwargs_handlers(cfg.precision, cfg.grad_scaler),
    )
    # accelerate turns fp16 on only on accelerators; on a CPU it would silently train in
    # fp32. This gives it torch.amp.GradScaler("cpu") and autocast, before prepare().
    enable_fp16_on_cpu(accelerator, cfg.grad_scaler)
    return accelerator
