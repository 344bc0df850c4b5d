"""torch.compile (`compile`), a loop switch: `compile_model` wraps the module the loop trains
(evaluation and the result keep the plain one, same parameters). It does not change what the
estimate counts."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import torch
from torch import nn

from workbench.base.errors import ConfigError
from workbench.machine import hardware

# The registry: torch.compile's modes (RunConfig.compile's docstring says what each does), 'none': eager.
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check(r: dict[str, Any]) -> None:
    """compile needs a compiler for the device (and is not wired with sharding)."""
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
