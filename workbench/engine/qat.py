"""Quantization-aware training: the loop's `qat` switch.

`RunConfig(qat="int4")` makes every Linear layer fake-quantize in forward (int8 activations,
`bits`-bit per-channel weights), so training sees the rounding it will suffer and learns
around it. Converting the trained model to real low-bit weights is the technique's
(`workbench.lessons.quantization.convert_qat`).
"""

from __future__ import annotations

from torch import nn

from workbench.core.torchao_support import (
    import_torchao,
    intx_config,
    quiet_torchao_logs,
    require_linear,
)


def prepare_qat(model: nn.Module, *, bits: int) -> nn.Module:
    """Insert fake quantization (int8 activations, `bits`-bit per-channel weights) IN PLACE:
    training then sees the rounding it will suffer, and learns around it."""
    qat = import_torchao("torchao.quantization.qat")
    require_linear(model)
    with quiet_torchao_logs():
        import_torchao().quantize_(model, qat.QATConfig(intx_config(bits), step="prepare"))
    return model
