"""The bytes a model stores, whichever quantization path made it: its Linear weights exactly
(int values plus their scales and zero points; torchao's tensor subclasses, torch.ao's quantized
modules, pt2e's exported graphs) and its state dict as `torch.save` writes it. The notebook
reaches them through lessons.quantization, which measures with them.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch import nn


def _tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds: inner tensors of a torchao subclass, int values plus per-channel
    scales of a torch quantized tensor, else numel x element size."""
    if hasattr(t, "__tensor_flatten__") and type(t) is not torch.Tensor and not isinstance(t, nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, n)) for n in names if getattr(t, n, None) is not None)
    if isinstance(t, nn.Parameter) and type(t.data) is not torch.Tensor:
        return _tensor_bytes(t.data)  # a torchao subclass wrapped in a Parameter
    if t.is_quantized:
        extra = 0
        if t.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            extra = _tensor_bytes(t.q_per_channel_scales()) + _tensor_bytes(t.q_per_channel_zero_points())
        return t.numel() * t.element_size() + extra
    return t.numel() * t.element_size()


def _graph_linear_weights(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """The stored tensors behind each linear's weight in an exported graph (pt2e)."""
    found: dict[int, torch.Tensor] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and "linear" in str(node.target):
            weight = node.args[1]
            sources = [weight]
            if weight.op == "call_function" and "dequantize" in str(weight.target):
                sources = [a for a in weight.args if isinstance(a, torch.fx.Node)]
            for src in sources:
                if src.op == "get_attr":
                    t = _attr(gm, src.target)
                    found[id(t)] = t
    return list(found.values())


def _attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def linear_weight_bytes(model: nn.Module) -> int:
    """Exact bytes of the Linear weights of `model` as stored (any quantization path here).

    Example:
        >>> linear_weight_bytes(nn.Linear(256, 10))   # 2,560 fp32 weights
        10240
    """
    if isinstance(model, torch.fx.GraphModule) and any(n.op == "call_function" for n in model.graph.nodes):
        return sum(_tensor_bytes(t) for t in _graph_linear_weights(model))
    total = 0
    for m in model.modules():
        if isinstance(m, nn.Linear):
            total += _tensor_bytes(m.weight)
        elif isinstance(m, torch.ao.nn.quantized.dynamic.Linear):
            total += _tensor_bytes(m.weight())
    return total


def _used_state_dict(model: nn.Module) -> dict[str, Any]:
    state = model.state_dict()
    if not isinstance(model, torch.fx.GraphModule):
        return state
    # pt2e's convert leaves the original fp32 weights as unused attributes: ship only what
    # the graph reads (get_attr targets, or a module's own tensors for call_module nodes).
    used = [n.target for n in model.graph.nodes if n.op in ("get_attr", "call_module")]
    return {k: v for k, v in state.items() if any(k == u or k.startswith(f"{u}.") for u in used)}


def size_on_disk(model: nn.Module) -> int:
    """Bytes of `torch.save(model.state_dict())`, written to memory, not disk."""
    buffer = io.BytesIO()
    torch.save(_used_state_dict(model), buffer)
    return buffer.tell()
