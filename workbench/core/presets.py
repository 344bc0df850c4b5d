"""One switch that sizes everything: WORKBENCH_PRESET = cpu-quick | cpu | gpu.

A preset holds the defaults a RunConfig takes when a field is left unset: model
sizes, batch sizes, steps, evaluation size. `cpu-quick` is what CI and nbval run
(each notebook well under a minute on 2 cores); `cpu` is a learner's laptop; `gpu`
is sized to show real effects on one modern GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

PRESET_ENV_VAR = "WORKBENCH_PRESET"


@dataclass(frozen=True, kw_only=True, slots=True)
class Preset:
    name: str
    steps: int
    """Default optimizer steps per run."""
    batch_size: dict[str, int]
    """Default micro-batch size per model."""
    dims: dict[str, dict[str, Any]]
    """Model size keyword arguments per model (see models.build_model)."""
    seq_len: dict[str, int]
    """Sequence length for the text models."""
    max_eval_samples: int
    """Held-out samples evaluated after training."""
    log_every: int
    """Log (and sync the device) every this many optimizer steps."""
    reduced_precision_steps_on_emulated_cpu: int = field(default=0)
    """Steps for bf16/fp16 runs on a CPU that emulates them (0: same as steps)."""


PRESETS: dict[str, Preset] = {
    "cpu-quick": Preset(
        name="cpu-quick",
        steps=30,
        batch_size={"mlp": 64, "cnn": 32, "gpt": 8, "minilm": 8},
        dims={
            "mlp": {"hidden": (256, 256)},
            "cnn": {"channels": (8, 16)},
            "gpt": {"n_layer": 2, "n_head": 4, "d_model": 128},
            "minilm": {},
        },
        seq_len={"gpt": 64, "minilm": 48},
        max_eval_samples=500,
        log_every=5,
        reduced_precision_steps_on_emulated_cpu=6,
    ),
    "cpu": Preset(
        name="cpu",
        steps=200,
        batch_size={"mlp": 128, "cnn": 64, "gpt": 16, "minilm": 16},
        dims={
            "mlp": {"hidden": (512, 512)},
            "cnn": {"channels": (16, 32)},
            "gpt": {"n_layer": 4, "n_head": 4, "d_model": 256},
            "minilm": {},
        },
        seq_len={"gpt": 128, "minilm": 64},
        max_eval_samples=2000,
        log_every=10,
        reduced_precision_steps_on_emulated_cpu=20,
    ),
    "gpu": Preset(
        name="gpu",
        steps=300,
        batch_size={"mlp": 512, "cnn": 256, "gpt": 32, "minilm": 64},
        dims={
            "mlp": {"hidden": (2048, 2048)},
            "cnn": {"channels": (64, 128)},
            "gpt": {"n_layer": 12, "n_head": 12, "d_model": 768},
            "minilm": {},
        },
        seq_len={"gpt": 512, "minilm": 128},
        max_eval_samples=100_000,
        log_every=25,
    ),
}


def _cuda_available() -> bool:
    # torch.cuda.is_available() asks the driver via NVML where it can and does not
    # create a CUDA context, so it is safe before notebook_launcher forks.
    import torch

    return torch.cuda.is_available()


def default_preset_name() -> str:
    """The preset in force: $WORKBENCH_PRESET, else 'gpu' with CUDA, else 'cpu'."""
    name = os.environ.get(PRESET_ENV_VAR, "").strip()
    if name:
        if name not in PRESETS:
            raise ValueError(
                f"{PRESET_ENV_VAR}={name!r} is not a preset; set it to one of: {', '.join(PRESETS)}"
            )
        return name
    return "gpu" if _cuda_available() else "cpu"


def get_preset(name: str | None = None) -> Preset:
    """The named preset, or the one in force.

    Example:
        >>> get_preset("cpu-quick").steps
        30
    """
    name = name or default_preset_name()
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not a preset; use one of: {', '.join(PRESETS)}")
    return PRESETS[name]
