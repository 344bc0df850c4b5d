"""workbench: learn and teach how to make PyTorch training faster and smaller.

    >>> import workbench as wb
    >>> result = wb.run(wb.RunConfig(model="mlp", precision="bf16"))
    >>> wb.compare([baseline, result])

Importing this package is cheap and creates no CUDA context (accelerate's
notebook_launcher forks; CUDA initialised in the parent breaks the children):
the public names below load their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "RunConfig": "config",
    "ConfigError": "config",
    "run": "train",
    "RunResult": "result",
    "MemoryBreakdown": "result",
    "compare": "comparison",
    "Comparison": "comparison",
    "hardware_report": "hardware",
    "get_preset": "presets",
    "load_data": "data",
    "build_model": "models",
    "set_activation_checkpointing": "models",
    "Sink": "sinks",
    "TextSink": "sinks",
    "RecordingSink": "sinks",
    "RunStart": "sinks",
    "StepRecord": "sinks",
    "RunEnd": "sinks",
    "format_bytes": "sinks",
    "Dashboard": "dashboard",
    "check": "exercises",
    "launch": "launcher",
    "launch_function": "launcher",
    "LaunchError": "launcher",
    "Estimate": "estimate",  # the function is workbench.estimate.estimate (a module of that name)
    "parse_oom": "oom",
    "plan": "planner",
    "Target": "planner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from .comparison import Comparison, compare
    from .config import ConfigError, RunConfig
    from .dashboard import Dashboard
    from .exercises import check
    from .launcher import LaunchError, launch, launch_function
    from .data import load_data
    from .hardware import hardware_report
    from .models import build_model, set_activation_checkpointing
    from .estimate import Estimate
    from .oom import parse_oom
    from .planner import Target, plan
    from .presets import get_preset
    from .result import MemoryBreakdown, RunResult
    from .sinks import RecordingSink, RunEnd, RunStart, Sink, StepRecord, TextSink, format_bytes
    from .train import run
