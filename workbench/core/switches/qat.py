"""Quantization-aware training (`qat`), a converter switch: `qat="int4"` makes every Linear layer
fake-quantize in forward (int8 activations, 4-bit per-channel weights), so training learns around
the rounding (`lessons.quantization.convert_qat` converts after). The estimate replays the plain model."""

from __future__ import annotations

import importlib.util
from typing import Any

from torch import nn

from workbench.base.errors import ConfigError
from workbench.core import custom
from workbench.machine.torchao_support import import_torchao, intx_config, quiet_torchao_logs, require_linear

# The registry: the schemes RunConfig accepts ('intN': N-bit weights, int8 activations).
SCHEMES: dict[str, int | None] = {"none": None, "int8": 8, "int4": 4, "int3": 3, "int2": 2}


def check(r: dict[str, Any]) -> None:
    if r["qat"] == "none":
        return
    model = r["model"]
    if isinstance(model, nn.Module) and not any(isinstance(m, nn.Linear) for m in model.modules()):
        raise ConfigError(f"qat={r['qat']!r} fake-quantizes nn.Linear layers and model={custom.shown_model(model)} has "
                          "none; pass qat='none'")
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(f"qat={r['qat']!r} needs torchao, which is not installed; "
                          "pip install --no-deps 'torchao>=0.18,<0.19', or use qat='none'")
    if r["lora_rank"]:
        raise ConfigError(f"lora_rank with qat={r['qat']!r} is not supported; pass qat='none' or lora_rank=0")


def apply(model: nn.Module, cfg: Any) -> nn.Module:
    """Linear layers now fake-quantize in forward (nothing for 'none')."""
    return model if cfg.qat == "none" else prepare_qat(model, bits=SCHEMES[cfg.qat])


def prepare_qat(model: nn.Module, *, bits: int) -> nn.Module:
    """Insert fake quantization (int8 activations, `bits`-bit per-channel weights) IN PLACE:
    training then sees the rounding it will suffer, and learns around it."""
    qat = import_torchao("torchao.quantization.qat")
    require_linear(model)
    with quiet_torchao_logs():
        import_torchao().quantize_(model, qat.QATConfig(intx_config(bits), step="prepare"))
    return model
