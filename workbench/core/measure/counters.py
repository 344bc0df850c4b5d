"""Exact, deterministic counts of bytes: parameters, gradients, optimizer state and saved
activations, and the textbook formula they are checked against (FLOPs: `measure.flops`).

These are the numbers a notebook may assert exactly (unlike timings). Everything here
works on CPU, and the activation counter also works on meta tensors, so a model too big
for this machine can still be measured without allocating it.

Example:
    >>> import torch
    >>> model = torch.nn.Linear(3, 4)
    >>> parameter_bytes(model)                       # 12 weights + 4 biases, fp32
    64
    >>> with SavedActivationCounter(model) as saved:
    ...     model(torch.ones(2, 3)).relu().sum()     # doctest: +ELLIPSIS
    tensor(...)
    >>> saved.bytes                                  # Linear input 24 B + ReLU output 32 B
    56
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from workbench.core.saved import listening

__all__ = [
    "parameter_bytes",
    "gradient_bytes",
    "optimizer_state_bytes",
    "shard_rows",
    "sharded_bytes",
    "SavedActivationCounter",
    "gpt_activation_bytes_formula",
]


def _storage_key(t: torch.Tensor) -> int:
    # The StorageImpl address identifies the memory block. data_ptr() would not do: it
    # is 0 for every meta/fake tensor, so all of them would collapse into one key.
    return t.untyped_storage()._cdata


def _storage_bytes(t: torch.Tensor) -> int:
    # Bytes of the whole storage: a saved view (q sliced out of a fused qkv) keeps the
    # whole block alive, so the whole block is what memory pays for.
    return t.untyped_storage().nbytes()


def _held(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold `t`'s data in this process: `t` itself, or a wrapper
    subclass's inner tensors. A DTensor (a parameter sharded by FSDP) holds only its local
    shard, though `numel()` reports the whole; torchao's 8-bit optimizer state reports
    float32 but holds uint8 codes, a float32 scale per block and a 256-entry lookup table."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    inner = (getattr(t, name) for name in names)  # a DTensor also lists its device mesh
    return [leaf for x in inner if isinstance(x, torch.Tensor) for leaf in _held(x)]


def _held_bytes(t: torch.Tensor) -> int:
    return sum(leaf.numel() * leaf.element_size() for leaf in _held(t))


def parameter_bytes(model: nn.Module) -> int:
    """Bytes this process holds for the model's parameters (tied parameters counted once;
    buffers not; a sharded parameter: its local shard)."""
    return sum(_held_bytes(p) for p in model.parameters())


def gradient_bytes(model: nn.Module, *, expected: bool = False) -> int:
    """Bytes of the parameters' gradients (a sharded parameter's: its local shard).

    By default counts the `.grad` tensors that exist now (0 before the first backward,
    or after `zero_grad(set_to_none=True)`). With `expected=True` counts what a backward
    will allocate: one gradient, of the parameter's dtype, per parameter that requires grad
    (a frozen parameter gets none).
    """
    if expected:
        return sum(_held_bytes(p) for p in model.parameters() if p.requires_grad)
    return sum(_held_bytes(p.grad) for p in model.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in the optimizer's state (AdamW: exp_avg, exp_avg_sq and the
    per-parameter `step` scalar tensor), each storage counted once; what this process holds
    (a sharded state: its local shard; quantized state: its codes, scales and tables). 0
    before the first step, since PyTorch optimizers create their state lazily."""
    seen: set[int] = set()
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                for leaf in _held(value):
                    key = _storage_key(leaf)
                    if key not in seen:
                        seen.add(key)
                        total += leaf.numel() * leaf.element_size()
    return total


def shard_rows(rows: int, processes: int, rank: int) -> int:
    """Rows of a `rows`-row tensor that `rank` holds when FSDP2 shards it along its first
    dimension: ceil(rows/N) per rank, in rank order, so the last ranks may hold fewer (or none).

    Example:
        >>> [shard_rows(7, 2, r) for r in (0, 1)]
        [4, 3]
    """
    per_rank = -(-rows // processes)
    return max(0, min(per_rank, rows - rank * per_rank))


def sharded_bytes(tensors: Iterable[torch.Tensor], *, processes: int, rank: int) -> int:
    """Bytes `rank` holds of these (unsharded) tensors once each is split along its first
    dimension across `processes` (`shard_rows`): the exact figure `parameter_bytes` reads
    from a sharded model, computed from the shapes alone (real, meta or fake tensors).

    Example:
        >>> sharded_bytes([torch.zeros(7, 3)], processes=2, rank=1)  # 3 rows x 3 x 4 bytes
        36
    """
    return sum(shard_rows(t.shape[0], processes, rank) * (t.numel() // t.shape[0]) * t.element_size()
               for t in tensors if t.dim() > 0 and t.shape[0] > 0)


class SavedActivationCounter:
    """Count the bytes autograd saves for backward while the context is active.

    Each unique storage is counted once, at its full size (a saved view keeps the whole
    storage alive). Parameters, buffers and views of them are excluded: they are model
    state, alive anyway. Pass the model(s) so their parameter and buffer storages are
    known; without one, only `nn.Parameter` objects and their direct views are excluded.
    `exclude`: more tensors held anyway (a batch a pipeline's micro-batches are views of).
    Works on real, meta and fake tensors. The hooks return the tensor unchanged, so the
    run being measured behaves (and uses memory) exactly as without the counter.

    Storages are keyed by their address, and a key is forgotten once a backward unpacks it:
    a context around several forward+backward pairs (an accumulation window) counts each
    forward's storages, even where a later one reuses a freed address.

    Activation checkpointing: the input a checkpointed block keeps for its recompute is
    counted once. On torch 2.13 it reaches these hooks itself (non-reentrant `checkpoint`
    stores it as an autograd SavedTensor before installing its own, innermost, hooks), and
    the models also report it through `core.saved.note_saved` (for versions and wrappers
    where it does not); both land on the same storage, and storages are deduplicated. A
    3-layer GPT checkpointing 'all' counts 480,004 bytes with and without `note_saved`.

    Attributes:
        bytes: total bytes of unique saved storages.
        count: number of unique saved storages.
        by_dtype: bytes per dtype (the dtype of the first tensor seen on each storage).

    Example:
        >>> with SavedActivationCounter(model) as saved:  # doctest: +SKIP
        ...     loss = loss_fn(model(x), y)
        >>> saved.bytes  # doctest: +SKIP
    """

    def __init__(self, model: nn.Module | Iterable[nn.Module] | None = None, *,
                 exclude: Iterable[torch.Tensor] = ()) -> None:
        modules = [model] if isinstance(model, nn.Module) else list(model or ())
        self._excluded: set[int] = set()
        for t in (*(t for module in modules for t in (*module.parameters(), *module.buffers())), *exclude):
            self._excluded.update(_storage_key(leaf) for leaf in _held(t))
        self._seen: set[int] = set()
        self.bytes = 0
        self.count = 0
        self.by_dtype: dict[torch.dtype, int] = {}
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._listening: Any = None

    def _add(self, t: torch.Tensor) -> None:
        if torch._C._current_graph_task_id() != -1:
            # Saved during a backward (a checkpointed block's recompute, a double backward):
            # kept only until that backward uses it, not for the step. Counting the forward
            # alone keeps a counter around a whole hand-written step exact.
            return
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return
        if is_traceable_wrapper_subclass(t):  # a DTensor (tensor parallelism): this process holds its local part
            for leaf in _held(t):
                self._add(leaf)
            return
        if t.layout != torch.strided:  # sparse etc. have no single storage
            key, size = id(t), t.numel() * t.element_size()
        else:
            key = _storage_key(t)
            if key in self._seen or key in self._excluded:
                return
            size = _storage_bytes(t)
        self._seen.add(key)
        self.bytes += size
        self.count += 1
        self.by_dtype[t.dtype] = self.by_dtype.get(t.dtype, 0) + size

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._add(t)
        return t  # unchanged: no copy, no change to what autograd keeps

    def _unpack(self, t: torch.Tensor) -> torch.Tensor:
        # A backward is using what a forward saved: that forward's storages will be freed, and
        # a later forward (the next micro-batch of an accumulation window) may get a new one at
        # the same address. Forgetting the key here counts it then. Measured before: a monitor
        # around 4 micro-batches of 2 counted 8,150,544 bytes, not 4 x 2,628,612.
        for leaf in _held(t):
            if leaf.layout == torch.strided:
                self._seen.discard(_storage_key(leaf))
        return t

    def __enter__(self) -> SavedActivationCounter:
        # models also report what a checkpoint keeps for its recompute (core.saved.note_saved);
        # where the hooks below see it too, the shared storage is counted once
        self._listening = listening(self._add)
        self._listening.__enter__()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(*exc)
        self._listening.__exit__(*exc)

    def __repr__(self) -> str:
        return f"SavedActivationCounter(bytes={self.bytes}, count={self.count})"


def gpt_activation_bytes_formula(
    s: int,
    b: int,
    h: int,
    a: int,
    L: int,
    bytes_per_element: int = 4,
    *,
    vocab_size: int | None = None,
    attention: str = "explicit",
) -> int:
    """Bytes autograd saves in one forward of `workbench.core.models.GPT` (no dropout).

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", eq. (1), gives per layer sbh(34 + 5as/h) bytes, for 16-bit activations
    (2 bytes) *with* dropout (1-byte masks). Term by term (s seq, b batch, h width, a heads):

    ==========================  paper (bytes, 16-bit)  here (elements, no dropout)
    LayerNorm 1 input            2sbh                   sbh
    QKV Linear input             2sbh                   sbh
    Q and K (for QK^T)           4sbh                   2sbh
    softmax output               2as²b                  as²b
    attention dropout mask       as²b                   0   (no dropout)
    dropout output (for @V)      2as²b                  0   (no dropout: @V saves the
                                                             softmax output, same storage)
    V (for @V)                   2sbh                   sbh
    output proj input            2sbh                   sbh
    attention dropout mask       sbh                    0
    LayerNorm 2 input            2sbh                   sbh
    MLP first Linear input       2sbh                   sbh
    GELU input                   8sbh                   4sbh
    MLP second Linear input      8sbh                   4sbh
    MLP dropout mask             sbh                    0
    LayerNorm mean and rstd      (neglected)            2 x 2sb
    ==========================
    total                        34sbh + 5as²b          16sbh + as²b + 4sb

    So per layer: bytes_per_element · (16sbh + as²b + 4sb); in fp32 that is 64sbh + 4as²b
    + 16sb, i.e. exactly the paper's 32sbh + 2as²b (its 34 minus two masks, its 5 minus the
    mask and the dropout output) at twice the bytes, plus the LayerNorm statistics the
    paper neglects: 4sb against about 16sbh, so about 1/(4h) of a layer (0.39% at h=64,
    0.31% with the attention term at s=64, a=4), small, but counted here to be exact. Q, K, V
    are separate copies because `matmul` makes the head-transposed views contiguous
    before its batched bmm; the fused qkv output itself is not saved.

    With `vocab_size` the terms outside the blocks are added: the token ids the embedding
    lookup keeps (sb int64 = 8sb bytes), the final LayerNorm's input and statistics
    (sbh + 2sb elements) and the lm_head's input (sbh). The logits themselves are only
    saved once a loss is taken (log_softmax keeps sbV more), so they are not included.
    Without `vocab_size`, the L blocks only.

    `attention="sdpa"` (F.scaled_dot_product_attention, the CPU's fused kernel): the as²b
    softmax output is gone. The kernel keeps q, k and v as views of the one qkv output (3sbh,
    where the explicit path kept Q and K copies and V: also 3sbh), its output (sbh, laid out
    so that the output projection's input is the same storage: where the explicit path kept
    that input, sbh) and the log-sum-exp of each softmax row, a·s·b values, always fp32
    (4 bytes). Per layer: bytes_per_element · (16sbh + 4sb) + 4asb. Exact on CPU; CUDA's
    kernels may keep a few bytes more (RNG state, padded log-sum-exp rows): measure them there.
    """
    if attention not in ("explicit", "sdpa"):
        raise ValueError(f"attention={attention!r}: use 'explicit' or 'sdpa'")
    if attention == "sdpa":
        total = L * ((16 * s * b * h + 4 * s * b) * bytes_per_element + 4 * a * s * b)
    else:
        total = L * (16 * s * b * h + a * s * s * b + 4 * s * b) * bytes_per_element
    if vocab_size is not None:
        total += 8 * s * b + (2 * s * b * h + 2 * s * b) * bytes_per_element
    return total
