"""TF32 (`tf32`), a loop switch: `matmuls` lets CUDA fp32 matmuls and cuDNN convolutions use
TF32 tensor cores during training only. It does not change what the estimate counts (the
bytes are fp32's); the peak FLOP/s the MFU divides by is TF32's while it is on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from workbench.base.errors import ConfigError
from workbench.machine import hardware


def check(r: dict[str, Any]) -> None:
    """TF32 needs an Ampere or newer GPU."""
    device = hardware.resolve_device(r["device"])
    if r["tf32"]:
        if device != "cuda":
            raise ConfigError("tf32=True acts on CUDA matmuls and this run is on the CPU (which has no TF32); "
                              "use tf32=False, or device='cuda' on an Ampere or newer GPU")
        if why := hardware.missing_here(device, "tf32"):  # nvidia-smi: no CUDA context before a launcher forks
            raise ConfigError(f"tf32=True needs an Ampere or newer GPU (compute capability 8.0+): {why}; use tf32=False")



@contextlib.contextmanager
def matmuls(enabled: bool) -> Iterator[None]:
    """Inside: CUDA fp32 matmuls and cuDNN convolutions may use TF32 tensor cores (`enabled`);
    after: as before, so a baseline run later in the same process is full fp32 again. Does
    nothing when not enabled.

    The flags are the long-standing `allow_tf32` ones (what `set_float32_matmul_precision("high")`
    sets for CUDA), not torch 2.9's per-backend `fp32_precision`: torch raises when a program
    mixes the two APIs (measured on 2.13: `get_float32_matmul_precision()` after setting
    `fp32_precision`), and most code, inductor's included, still reads these.

    Example:
        >>> with matmuls(False):
        ...     pass
    """
    if not enabled:
        yield
        return
    flags = [torch.backends.cuda.matmul, torch.backends.cudnn]
    before = [flag.allow_tf32 for flag in flags]
    for flag in flags:
        flag.allow_tf32 = True
    try:
        yield
    finally:
        for flag, value in zip(flags, before):
            flag.allow_tf32 = value
