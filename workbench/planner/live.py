"""Bytes of live tensors, tracked as ops create them: now, the peak, and optionally every level.

`LiveTensors` is a TorchDispatchMode: every tensor an op returns is registered by its
storage (counted once, at the storage's full size) and dropped when the storage is freed
(a weak reference's callback). So `peak_bytes` is the CPU analogue of CUDA's
`max_memory_allocated`, at the level of tensors: what a step holds at its worst moment.
It works on real tensors on any device and on fake ones (no storage, same sizes), holds
no tensor itself, and, unlike torch's `MemTracker`, needs no module hooks: it can watch a
whole `run()` of many steps, reset between them.

Tensors created before the context are not seen unless passed to `add` (the model's
parameters, say), nor are views of them; those created outside the dispatcher (a
DataLoader worker's batch in shared memory) are not seen at all.

Example:
    >>> with LiveTensors() as live:
    ...     a = torch.ones(1000)           # 4,000 bytes
    ...     b = a * 2                      # 4,000 more
    ...     del a
    >>> live.peak_bytes, live.current_bytes
    (8000, 4000)
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["CUDA_BLOCK_BYTES", "LiveTensors", "op_name"]

CUDA_BLOCK_BYTES = 512
"""The CUDA caching allocator rounds every allocation up to a multiple of 512 bytes (its
`kMinBlockSize`): what `max_memory_allocated` counts."""


def op_name(op: Any) -> str:
    """aten::mm for the OpOverload aten.mm.default (the name a profiler shows); '' for None."""
    schema = getattr(op, "_schema", None)
    return schema.name if schema is not None else str(op or "")


class LiveTensors(TorchDispatchMode):
    """Track the bytes of tensor storages alive while the context runs.

    Args:
        round_to: round each storage up to a multiple of this (512 mimics the CUDA
            allocator's blocks; 1 counts bytes exactly).
        levels: also record the live bytes after every allocation (`self.levels`), and
            `mark(label)` records where named points fall in that list.

    Attributes:
        current_bytes, peak_bytes: live now, and the most since entering (or `reset_peak`).
        levels: with `levels=True`, live bytes after each new storage, in order.
        marks: (label, index into levels, live bytes then, clock) for each `mark`.
        released: with `levels=True`, (clock when made, bytes, clock when freed) per storage freed.
        made_by: with `levels=True`, clock when made -> the op that made the storage (an
            `OpOverload` such as aten.mm.default; None for tensors passed to `add`): what a
            memory snapshot's frames name.
    """

    def __init__(self, *, round_to: int = 1, levels: bool = False) -> None:
        super().__init__()
        self.round_to = round_to
        self.current_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, int] = {}
        self.levels: list[int] | None = [] if levels else None
        self.marks: list[tuple[str, int, int, int]] = []
        # With levels: a clock that ticks at every allocation, release and mark, when each
        # live storage was made, and (made, size, freed) for each storage given back.
        self.clock = 0
        self._born: dict[int, int] = {}
        self.released: list[tuple[int, int, int]] = []
        self.made_by: dict[int, Any] = {}

    def _size(self, nbytes: int) -> int:
        r = self.round_to
        return nbytes if r <= 1 or not nbytes else -(-nbytes // r) * r

    def add(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors that already exist (e.g. parameters) as live from now on."""
        for t in tensors:
            self._track(t)

    def _track(self, t: torch.Tensor, op: Any = None) -> None:
        if t.layout != torch.strided:  # sparse etc.: no single storage to follow
            return
        storage = t.untyped_storage()
        key = storage._cdata
        size = self._size(storage.nbytes())
        old = self._live.get(key)
        if old == size:
            return
        if old is None:
            # The StorageImpl's Python object lives as long as the storage does (torch keeps
            # it), so its finalizer runs exactly when the memory is given back.
            weakref.finalize(storage, self._release, key)
        self._live[key] = size  # a storage resized in place (an out= op) counts its new size
        self.current_bytes += size - (old or 0)
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        if self.levels is not None:
            self.levels.append(self.current_bytes)
            self.clock += 1
            if key not in self._born:
                self._born[key] = self.clock
                self.made_by[self.clock] = op

    def _release(self, key: int) -> None:
        size = self._live.pop(key, 0)
        self.current_bytes -= size
        if self.levels is not None:
            self.clock += 1
            self.released.append((self._born.pop(key, 0), size, self.clock))

    def reset_peak(self) -> None:
        """Start a new peak from what is live now (e.g. at the start of a step)."""
        self.peak_bytes = self.current_bytes

    def mark(self, label: str) -> None:
        """Record a named point: (label, how many levels so far, live bytes now, clock)."""
        self.clock += 1
        self.marks.append((label, len(self.levels or ()), self.current_bytes, self.clock))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs: set[int] | None = None
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            storage = t.untyped_storage()
            if storage._cdata in self._live and self._live[storage._cdata] == self._size(storage.nbytes()):
                continue  # known already: a view or an in-place result of a tracked tensor
            if inputs is None:
                # An output on an input's storage is a view or an in-place result: nothing new.
                # Without this, indexing one sample out of a data set made before tracking (a
                # view) would count the whole data set's storage. (`lift_fresh` is the exception:
                # it hands over a tensor torch.tensor() has just made.)
                fresh = func is torch.ops.aten.lift_fresh.default
                inputs = set() if fresh else {a.untyped_storage()._cdata for a in tree_flatten((args, kwargs))[0]
                                              if isinstance(a, torch.Tensor) and a.layout == torch.strided}
            if storage._cdata not in inputs or storage._cdata in self._live:
                self._track(t, func)
        return out
