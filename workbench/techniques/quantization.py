"""Quantize a trained model: post-training (PTQ) three ways, and quantization-aware training (QAT).

Every function copies the model and returns the quantized copy, so the fp32 original stays
available to compare against. What each path is, and where it is fast:

* `dynamic_int8(model, backend="torch.ao")`: the deprecated `torch.ao.quantization.quantize_dynamic`
  (what seed 004 teaches). int8 weights, activations quantized on the fly; CPU only, and on x86
  its fbgemm kernels are still the fast int8 path in eager mode.
* `dynamic_int8(model)` / `weight_intx(model, bits=4)`: the current API, torchao `quantize_`
  with `Int8DynamicActivationInt8WeightConfig` / `Int8DynamicActivationIntxWeightConfig`.
  Its kernels target GPUs; on a CPU in eager mode measure before you believe a speed-up.
* `static_int8(model, calibration)`: static PTQ through torch.export + torchao's pt2e
  (`prepare_pt2e` inserts observers, calibration batches set activation ranges,
  `convert_pt2e` freezes int8 weights). In eager mode the result runs reference
  quantize/dequantize ops: accuracy is real, speed needs torch.compile (inductor) lowering.
* `prepare_qat` / `convert_qat`: torchao QAT. `RunConfig(qat="int4")` calls `prepare_qat`
  inside the training loop; convert the trained model afterwards.

Only `nn.Linear` layers are quantized (embeddings and norms stay fp32). torchao is optional
(the `quantization` extra) and imported only when a function needs it, with its
load-time log lines silenced.

Example:
    >>> result = wb.run(wb.RunConfig(model="mlp"), keep_model=True)            # doctest: +SKIP
    >>> int8 = dynamic_int8(result.model, backend="torch.ao")                  # doctest: +SKIP
    >>> int2 = weight_intx(result.model, bits=2)                               # doctest: +SKIP
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from workbench.core.torchao_support import (
    config_by_name,
    first_line,
    import_torchao,
    intx_config,
    quiet_torchao_logs,
    require_linear,
    torchao_version,
)

BACKENDS = ("torchao", "torch.ao")

def _copy(model: nn.Module) -> nn.Module:
    require_linear(model)
    return copy.deepcopy(model).eval()


def quantize_with(model: nn.Module, config: Any) -> nn.Module:
    """A quantized copy of `model` under any torchao config (an object or a class name).

    An unsupported config becomes one ValueError line naming the config and the version.
    """
    if isinstance(config, str):
        config = config_by_name(config)
    quantization = import_torchao()
    quantized = _copy(model)
    try:
        with quiet_torchao_logs():
            quantization.quantize_(quantized, config)
    except (AssertionError, NotImplementedError, RuntimeError, TypeError, ValueError) as error:
        hint = ("for QAT use RunConfig(qat='int8'|'int4'|'int3'|'int2')" if type(config).__name__ == "QATConfig"
                else "try dynamic_int8() or weight_intx()")
        raise ValueError(f"torchao {torchao_version()} cannot apply {_config_name(config)}: "
                         f"{first_line(error)}; {hint}") from error
    return quantized


def dynamic_int8(model: nn.Module, *, backend: str = "torchao") -> nn.Module:
    """Dynamic INT8 PTQ: int8 weights; activations quantized per batch at run time.

    backend="torchao": the current API (torchao `Int8DynamicActivationInt8WeightConfig`).
    backend="torch.ao": the deprecated `torch.ao.quantization.quantize_dynamic` (CPU only);
    its deprecation warning is caught here, since the notebook labels the path itself.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not known; use 'torchao' (current) or 'torch.ao' (deprecated)")
    if backend == "torchao":
        return quantize_with(model, import_torchao().Int8DynamicActivationInt8WeightConfig())
    quantized = _copy(model).cpu()  # quantized::linear_dynamic has CPU kernels only
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions", category=UserWarning)
        return torch.ao.quantization.quantize_dynamic(quantized, {nn.Linear}, dtype=torch.qint8)


def torch_ao_deprecation() -> str | None:
    """The first line of the deprecation warning this torch gives `torch.ao.quantization`
    (read live from the installed version), or None if it gives none."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(2, 2)), {nn.Linear}, dtype=torch.qint8)
    for w in caught:
        if issubclass(w.category, DeprecationWarning) and "deprecated" in str(w.message):
            return str(w.message).strip().splitlines()[0].strip()
    return None


def weight_intx(model: nn.Module, *, bits: int, group_size: int | None = None) -> nn.Module:
    """Low-bit weight PTQ: `bits`-bit weights (torchao), int8 dynamic activations.

    Note: torchao's default CPU layout keeps each low-bit value in a byte (unpacked), so
    the file is no smaller than int8; packed layouts are backend-specific.
    """
    config = intx_config(bits, group_size=group_size)
    if group_size is not None:
        if bad := [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.in_features % group_size]:
            raise ValueError(f"group_size={group_size} does not divide the input width of Linear {bad[0]!r}; "
                             "pick a divisor of every in_features, or group_size=None (per-channel)")
    return quantize_with(model, config)


def convert_qat(model: nn.Module, *, bits: int) -> nn.Module:
    """A real quantized copy of a QAT-trained model (same scheme as weight_intx(bits))."""
    qat = import_torchao("torchao.quantization.qat")
    if not any(type(m).__name__.startswith("FakeQuantized") for m in model.modules()):
        raise ValueError("this model has no fake-quantized layers: train it with RunConfig(qat='int4') "
                         "(or prepare_qat) first, or use weight_intx() for PTQ")
    return quantize_with(model, qat.QATConfig(intx_config(bits), step="convert"))


def static_int8(model: nn.Module, calibration: Iterable[torch.Tensor] | torch.Tensor, *,
                per_channel: bool = True) -> nn.Module:
    """Static INT8 PTQ through torch.export and torchao pt2e (x86 quantizer).

    `calibration`: input batches run through the observed model to fix activation ranges.
    per_channel=False gives each weight matrix one scale instead of one per output row.
    """
    batches = [calibration] if isinstance(calibration, torch.Tensor) else list(calibration)
    if not batches or not all(isinstance(b, torch.Tensor) and b.numel() for b in batches):
        raise ValueError("calibration must be a non-empty tensor or list of input tensors, "
                         "e.g. data.train.inputs[:64]")
    pt2e = import_torchao("torchao.quantization.pt2e.quantize_pt2e")
    x86 = import_torchao("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    quantized = _copy(model).cpu()
    try:  # eagerly first: a wrong shape is one line here, not a trace from inside torch.export
        with torch.no_grad():
            quantized(batches[0][:1].cpu())
    except (RuntimeError, TypeError, ValueError, IndexError) as error:
        shape = tuple(batches[0].shape)
        raise ValueError(f"calibration batches must be inputs the model takes: a batch of shape {shape} fails "
                         f"({first_line(error)}); pass e.g. data.train.inputs[:64]") from None
    # Export with a batch of 2: a batch of 1 would let export specialise the batch size to 1.
    example = batches[0][:1].expand(2, *batches[0].shape[1:])
    batch = torch.export.Dim("batch", min=1)
    with quiet_torchao_logs():
        exported = torch.export.export(quantized, (example,), dynamic_shapes=({0: batch},)).module()
        config = x86.get_default_x86_inductor_quantization_config()
        if not per_channel:
            config = _per_tensor_weights(config)
        observed = pt2e.prepare_pt2e(exported, x86.X86InductorQuantizer().set_global(config))
        with torch.no_grad():
            for b in batches:
                observed(b)  # observers record activation ranges; nothing is learned
        converted = pt2e.convert_pt2e(observed)
    # Exported graphs refuse .eval()/.train(); this makes them no-ops, as for any eval model.
    return import_torchao("torchao.quantization.pt2e").allow_exported_model_train_eval(converted)


def activation_scales(model: nn.Module) -> list[float]:
    """The fixed activation scales a static_int8 model computes with, in graph order: what
    calibration chose (one real number per integer step of each quantized activation)."""
    if not isinstance(model, torch.fx.GraphModule):
        raise ValueError(f"activation_scales needs a static_int8() model, got {type(model).__name__}")
    return [float(n.args[1]) for n in model.graph.nodes
            if n.op == "call_function" and "quantize_per_tensor" in str(n.target)
            and "dequantize" not in str(n.target) and isinstance(n.args[1], float)]


def _per_tensor_weights(config: Any) -> Any:
    """The x86 default config with one symmetric scale per weight tensor."""
    import dataclasses

    observer = import_torchao("torchao.quantization.pt2e").MinMaxObserver
    weight = dataclasses.replace(config.weight, qscheme=torch.per_tensor_symmetric, ch_axis=None,
                                 observer_or_fake_quant_ctr=observer.with_args(eps=2**-12))
    return dataclasses.replace(config, weight=weight)


def _config_name(config: Any) -> str:
    base = getattr(config, "base_config", None)
    return f"{type(config).__name__}({type(base).__name__})" if base is not None else type(config).__name__


