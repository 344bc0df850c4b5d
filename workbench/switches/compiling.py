"""torch.compile and TF32 (`compile`, `tf32`), loop switches: `compile_model` wraps the module the
loop trains (evaluation and the result keep the plain one, same parameters); `tf32_matmuls` lets
CUDA fp32 matmuls use TF32 during training only. Neither changes what the estimate counts."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from workbench.core import hardware
from workbench.core.errors import ConfigError

# The registry: torch.compile's modes (RunConfig.compile's docstring says what each does), 'none': eager.
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check(r: dict[str, Any]) -> None:
    """compile needs a compiler for the device; TF32 needs an Ampere or newer GPU."""
    device = hardware.resolve_device(r["device"])
    if r["compile"] != "none":
        if device == "cpu" and hardware.cpp_compiler() is None:
            raise ConfigError(f"compile={r['compile']!r} on a CPU needs a C++ compiler (inductor writes C++ "
                              "kernels) and none was found: apt-get install g++ (or set $CXX), or use compile='none'")
        if not torch._dynamo.is_dynamo_supported():
            raise ConfigError(f"compile={r['compile']!r}: torch.compile does not support this Python "
                              f"({sys.version_info[0]}.{sys.version_info[1]}); use compile='none'")
        if device == "cuda" and importlib.util.find_spec("triton") is None:
            raise ConfigError(f"compile={r['compile']!r} on a GPU needs triton, which is not installed: "
                              "pip install triton (the version your torch names), or use compile='none'")
    if r["compile"] != "none" and r["sharding"] != "none":
        raise ConfigError(f"compile={r['compile']!r} with sharding={r['sharding']!r} is not wired or tested here; "
                          "pass compile='none' or sharding='none'")
    if r["tf32"]:
        if device != "cuda":
            raise ConfigError("tf32=True acts on CUDA matmuls and this run is on the CPU (which has no TF32); "
                              "use tf32=False, or device='cuda' on an Ampere or newer GPU")
        if why := hardware.missing_here(device, "tf32"):  # nvidia-smi: no CUDA context before a launcher forks
            raise ConfigError(f"tf32=True needs an Ampere or newer GPU (compute capability 8.0+): {why}; use tf32=False")


def compile_model(model: nn.Module, mode: str) -> nn.Module:
    """`torch.compile(model, mode=mode)`, or the model itself for mode 'none'. Lazy: the first
    forward compiles (the first, untimed, step of a run pays it).

    Example:
        >>> compile_model(nn.Linear(2, 2), "none")
        Linear(in_features=2, out_features=2, bias=True)
    """
    if mode == "none":
        return model
    return torch.compile(model, mode=mode)


@contextlib.contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """Inside: CUDA fp32 matmuls and cuDNN convolutions may use TF32 tensor cores (`enabled`);
    after: as before, so a baseline run later in the same process is full fp32 again. Does
    nothing when not enabled.

    The flags are the long-standing `allow_tf32` ones (what `set_float32_matmul_precision("high")`
    sets for CUDA), not torch 2.9's per-backend `fp32_precision`: torch raises when a program
    mixes the two APIs (measured on 2.13: `get_float32_matmul_precision()` after setting
    `fp32_precision`), and most code, inductor's included, still reads these.

    Example:
        >>> with tf32_matmuls(False):
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
