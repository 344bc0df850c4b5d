"""What a CUDA device does differently from a CPU's, for the replay on CPU fake tensors.

`planner.fakestep` replays a training step on CPU fake tensors; on a GPU (`device="cuda"`)
these differ, and this module supplies them:

- autocast: CUDA's runs its float32-listed ops (`softmax`, `layer_norm`, ...) in fp32 where
  the CPU's keeps 16 bits (`CudaAutocastPolicy`), and an fp16 softmax reads its input in place;
- the caching allocator hands out whole 512-byte blocks (`device_bytes`);
- every thread that runs matmuls holds a cuBLAS workspace from that allocator
  (`cublas_workspace_bytes`);
- the backward keeps the policy on through checkpointed blocks' recompute (`run_backward`).

Example:
    >>> device_bytes(1, "cuda"), device_bytes(1, "cpu")
    (512, 1)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from workbench.planner.live import CUDA_BLOCK_BYTES

__all__ = ["CUDA_FP32_OPS", "CudaAutocastPolicy", "cublas_workspace_bytes", "device_bytes", "run_backward"]

# CUDA autocast's "ops that can autocast to float32" (PyTorch AMP docs) that the CPU's
# autocast does not list: on a GPU they run in fp32 whatever their input.
CUDA_FP32_OPS = frozenset({
    "softmax", "log_softmax", "softmin", "layer_norm", "group_norm", "norm", "normalize", "exp", "expm1",
    "log", "log10", "log1p", "log2", "pow", "reciprocal", "rsqrt", "sum", "prod", "cumsum", "cumprod",
    "softplus", "erfinv", "sinh", "cosh", "tan", "acos", "asin", "renorm",
})


def cublas_workspace_bytes(compute_capability: tuple[int, int] | None) -> int:
    """One cuBLAS workspace, as torch allocates it from the caching allocator (so it shows in
    max_memory_allocated): 32 MiB from Hopper (compute capability 9) on, else :4096:2:16:8
    (8 MiB + 128 KiB); torch's CublasHandlePool.cpp, without CUBLAS_WORKSPACE_CONFIG."""
    major = compute_capability[0] if compute_capability else 8
    return 4096 * 8 * 1024 if major >= 9 else 4096 * 1024 * 2 + 16 * 1024 * 8


# CUDA's autocast calls these with dtype=float32 ("fp32_set_opt_dtype"), and ATen's softmax on a
# CUDA fp16 input with dtype=float32 runs one kernel that reads fp16 and writes fp32
# (`half_to_float`): no fp32 copy of the input, and a backward that hands back fp16 gradients.
# A bf16 input is converted to fp32 first (aten/src/ATen/native/SoftMax.cpp, `softmax`).
_HALF_TO_FLOAT = {"softmax": torch._softmax, "log_softmax": torch._log_softmax}


class CudaAutocastPolicy(TorchFunctionMode):
    """On CPU fake tensors, run CUDA_FP32_OPS in fp32 while autocast is on, as CUDA's does."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _HALF_TO_FLOAT and torch.is_autocast_enabled("cpu") and args and \
                isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float16:
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            if isinstance(dim, int) and kwargs.get("dtype") is None:
                return _HALF_TO_FLOAT[name](args[0], dim, True)
        if name in CUDA_FP32_OPS and torch.is_autocast_enabled("cpu"):
            def up(a: Any) -> Any:
                low = isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16)
                return a.float() if low else a
            args, kwargs = tuple(up(a) for a in args), {k: up(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def device_bytes(nbytes: int, device: str) -> int:
    """A storage of `nbytes` as `device` holds it: on CUDA whole 512-byte blocks (an empty
    tensor takes none), elsewhere exactly."""
    return nbytes and -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES if device == "cuda" else nbytes


def run_backward(loss: torch.Tensor, policy: Any) -> None:
    """`loss.backward()`, with `policy` (a CudaAutocastPolicy or a null context) on throughout."""
    if isinstance(policy, CudaAutocastPolicy):
        # Tensor.backward() would go through the policy mode, which torch switches off while
        # it handles a call: the recompute of checkpointed blocks inside backward would then
        # run without it. The engine, called directly, keeps the mode on.
        from torch.autograd.graph import _engine_run_backward

        _engine_run_backward((loss,), (torch.ones_like(loss),), False, False, (), allow_unreachable=True,
                             accumulate_grad=True)
    else:
        loss.backward()
