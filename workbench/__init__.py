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

# Before anything compiles: inductor's cache must not mix kernels of two instruction sets (why: there)
from workbench.machine.compile_cache import separate_capped_cache  # noqa: E402

separate_capped_cache()

# public name -> module that defines it (the layers: core, measure, planner, engine, views, lessons)
_EXPORTS = {
    "RunConfig": "core.config",
    "ConfigError": "core.config",
    "run": "api",
    "launch": "api",
    "monitor": "api",
    "share": "classroom.sharing",
    "training_parts": "api",
    "claims": "lessons.exercises",
    "evidence": "lessons.exercises",
    "last_result": "core.engine.ending",
    "RunInterrupted": "core.engine.ending",
    "RunResult": "core.measure.result",
    "MemoryBreakdown": "core.measure.result",
    "compare": "core.views.compare",
    "Comparison": "core.views.compare",
    "hardware_report": "machine.hardware",
    "get_preset": "core.presets",
    "load_data": "core.data",
    "build_model": "core.models",
    "set_activation_checkpointing": "core.switches.activation_checkpointing",
    "Sink": "core.measure.records",
    "RunStart": "core.measure.records",
    "StepRecord": "core.measure.records",
    "RunEnd": "core.measure.records",
    "TextSink": "core.views.sinks",
    "RecordingSink": "core.views.sinks",
    "format_bytes": "base.report",
    "Dashboard": "core.views.dashboard",
    "check": "lessons.exercises",
    "agree": "lessons.exercises",
    "calibration": "classroom.ledger",
    "launch_function": "launching.launch",
    "LaunchError": "launching.launch",
    "Estimate": "planner.estimate",
    "estimate": "planner.estimate",
    "parse_oom": "core.measure.oom",
    "plan": "planner.planning",
    "Target": "planner.planning",
    "Cluster": "planner.parallel",
    "plan_parallel": "planner.parallel",
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
    from workbench.api import launch, monitor, run, training_parts
    from workbench.base.report import format_bytes
    from workbench.classroom.ledger import calibration
    from workbench.core.config import ConfigError, RunConfig
    from workbench.core.data import load_data
    from workbench.core.engine.ending import RunInterrupted, last_result
    from workbench.core.measure.oom import parse_oom
    from workbench.core.measure.records import RunEnd, RunStart, Sink, StepRecord
    from workbench.core.measure.result import MemoryBreakdown, RunResult
    from workbench.core.models import build_model
    from workbench.core.presets import get_preset
    from workbench.core.switches.activation_checkpointing import set_activation_checkpointing
    from workbench.core.views.compare import Comparison, compare
    from workbench.core.views.dashboard import Dashboard
    from workbench.core.views.sinks import RecordingSink, TextSink
    from workbench.launching.launch import LaunchError, launch_function
    from workbench.lessons.exercises import agree, check, claims, evidence
    from workbench.machine.hardware import hardware_report
    from workbench.planner.estimate import Estimate, estimate
    from workbench.planner.parallel import Cluster, plan_parallel
    from workbench.planner.planning import Target, plan
