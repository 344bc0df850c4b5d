"""Exact FLOP counts: what a step computes, by torch's own per-op formulas, and the textbook
formula for a GPT that they are checked against.

`FlopCounter` counts the ops run inside it (forward, backward, a checkpointed block's
recompute), holding no tensor, so the step it watches uses the memory it would unwatched;
`count_flops(fn)` runs `fn` under one. Both work on meta and fake tensors: a model too big for
this machine can be counted without allocating it.

Example:
    >>> import torch
    >>> count_flops(torch.nn.Linear(3, 4), torch.ones(2, 3))  # 2 * 2 rows * 3 * 4
    48
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["FlopCounter", "count_flops", "gpt_flops_formula", "matmul_parameter_count"]


class FlopCounter(TorchDispatchMode):
    """Count the FLOPs of the ops run inside the context, by torch's own formulas.

    The same per-op counts as `torch.utils.flop_counter.FlopCounterMode` (its registry:
    matmul-like ops, convolutions and attention kernels at 2 FLOPs per multiply-add,
    forward and backward; elementwise ops, normalisation, softmax and embedding lookups
    count 0), without its per-module breakdown. That breakdown is why: FlopCounterMode's
    module tracker keeps every checkpointed block's recomputed activations alive until the
    backward ends, so a step measured under it peaked at 9.4 MB of tensors where the same
    step alone peaks at 3.9 MB (a 12-layer GPT with checkpointing 'all', measured with
    MemTracker). This counter holds no tensor: the step it watches uses exactly the memory
    it would use unwatched, and the first step of a run can be counted for real.

    Example:
        >>> with FlopCounter() as flops:
        ...     torch.ones(4, 8) @ torch.ones(8, 2)  # doctest: +ELLIPSIS
        tensor(...)
        >>> flops.total                                  # 2 * 4 * 8 * 2
        128
    """

    def __init__(self, *, record_ops: bool = False) -> None:
        super().__init__()

        self._registry = {**flop_registry, **_cpu_attention_flops()}
        self.total = 0
        self.ops: list[tuple[int, int, str]] | None = [] if record_ops else None
        """With record_ops: (FLOPs, bytes read and written, dtype) of every op run, in order
        (views move no bytes; the dtype is a 16-bit one if any operand has it, else 'fp32')."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Under any other dispatch mode torch.compile declines to compile and the frame stays
        # eager for good (measured: a compiled GPT's first step under this counter ran eager, and
        # so did every step after). True: the mode steps aside while dynamo and inductor compile
        # and sees the compiled code's calls at run time; the matmuls inductor leaves to aten
        # (mm, addmm, bmm) are all it counts anyway, so a compiled step counts the eager FLOPs.
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet not in self._registry and func is not torch.ops.prim.device.default:
            with self:  # a composite op that reached dispatch: count what it decomposes into
                out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
        out = func(*args, **kwargs)
        flops = int(self._registry[packet](*args, **kwargs, out_val=out)) if packet in self._registry else 0
        self.total += flops
        if self.ops is not None:
            self.ops.append((flops, *_op_traffic(func, (args, kwargs, out))))
        return out


_HALF = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def _op_traffic(func: Any, operands: Any) -> tuple[int, str]:
    """(bytes an op reads and writes, the 16-bit dtype it computes in or 'fp32')."""
    if any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns):
        return 0, "fp32"  # a view: no data moves
    tensors = [t for t in tree_flatten(operands)[0] if isinstance(t, torch.Tensor)]
    half = next((_HALF[t.dtype] for t in tensors if t.dtype in _HALF), "fp32")
    return sum(t.numel() * t.element_size() for t in tensors), half


def _cpu_attention_flops() -> dict[Any, Callable[..., int]]:
    """FLOP formulas for the CPU's fused attention kernel, which torch's registry lacks (2.13
    counts the CUDA kernels only, so a CPU scaled_dot_product_attention counted 0). The same
    formulas as torch's for the CUDA kernels: QK^T and PV, forward; four such matmuls, backward;
    the full s x s (causal masking is not discounted, as for the explicit matmuls)."""
    aten = torch.ops.aten
    if not hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return {}

    def forward(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return sdpa_flop_count(query.shape, key.shape, value.shape)

    def backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None,
                 **kwargs: Any) -> int:
        return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)

    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Run `fn(*args, **kwargs)` and return the FLOPs it ran (`FlopCounter`). Works on meta
    and fake tensors, so a model too big for this machine can be counted."""
    with FlopCounter() as counter:
        fn(*args, **kwargs)
    return counter.total


def matmul_parameter_count(model: nn.Module) -> int:
    """Weights that multiply activations in a matmul: the weight of every nn.Linear module
    (a weight shared by two Linear modules counts twice, since it is used twice).

    For our GPT: 12·n_layer·d_model² (qkv, attention proj, MLP in and out) plus
    vocab_size·d_model for the lm_head, which is tied to the token embedding but, unlike
    the embedding lookup, is a real matmul. This is the N of `gpt_flops_formula`.
    """
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def gpt_flops_formula(
    n_params_non_embedding: int, tokens: int, n_layer: int, d_model: int, seq_len: int
) -> int:
    """Training FLOPs (forward + backward) of a decoder-only transformer, Chinchilla style.

    6·N·tokens + 12·n_layer·d_model·seq_len·tokens, where N is the number of weights that
    multiply activations (`matmul_parameter_count`): 12·n_layer·d_model² in the blocks plus
    vocab_size·d_model for the lm_head (tied to, but unlike, the embedding lookup, which
    is not a matmul). Biases, LayerNorm gains and position embeddings are excluded: they
    cost no matmul FLOPs. Forward is 2 FLOPs per weight per token, backward twice that
    (gradient for the input and for the weight). Attention: QK^T and attention-times-V cost
    2·s·d_model each per token per layer forward, x3 for forward + backward = 12·L·d·s.
    The full s x s score matrix is counted (as the kernels compute it), not the causal half.
    This is what `count_flops` measures for `workbench.core.models.GPT`, exactly.
    """
    return 6 * n_params_non_embedding * tokens + 12 * n_layer * d_model * seq_len * tokens
