"""What a process sends to its peers: the bytes of the collectives it calls, counted exactly.

`CollectiveCounter` counts, per kind of collective, the calls and the bytes of the *full*
tensor each call moves (an all-gather's output, a reduce-scatter's input, an all-reduce's
buffer) while it is active:
- torch.distributed's Python collectives (what FSDP2's `fully_shard` calls: all-gather
  before each forward and backward of a group, reduce-scatter of its gradients), by
  wrapping them for the duration of the block;
- DistributedDataParallel's bucketed all-reduce, which runs in C++, once
  `ddp_model.register_comm_hook(None, allreduce_hook)` has routed it through Python (torch's own
  default communication hook, `torch.distributed.algorithms.ddp_comm_hooks.default_hooks`: the
  same all-reduce of the same buckets; tests/test_plan_parallel.py does this);
- the functional collectives DTensor calls (tensor parallelism's all-reduces, all-gathers
  and reduce-scatters, forward and backward; the optimizer's reach the older `c10d_functional`
  namespace), seen by a dispatch mode beneath DTensor, as torch's own CommDebugMode sees them
  (on fake tensors too: what the planner's replay counts), and the point-to-point sends between
  pipeline stages (the `c10d.send` op that `isend` dispatches to, kind 'send': each byte once,
  by the process that sends it).

How many bytes cross the wire per process follows from these: a ring all-gather or
reduce-scatter of B bytes sends (N-1)/N x B from each process, an all-reduce twice that
(`wire_bytes`).

Example:
    >>> with CollectiveCounter() as comm:      # doctest: +SKIP
    ...     loss = model(x).sum(); loss.backward()
    >>> comm.bytes                              # doctest: +SKIP
    {'all_gather': 526336, 'reduce_scatter': 263168}
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CollectiveCounter", "wire_bytes"]

# torch.distributed name -> (kind, which argument holds the full tensor)
_WRAPPED: dict[str, tuple[str, str]] = {
    "all_gather_single": ("all_gather", "output_tensor"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "all_reduce": ("all_reduce", "tensor"),
}

# DTensor's collectives (torch.ops._c10d_functional.<name>) -> kind; the full tensor is the
# all-gather's output, the others' input (the same convention as _WRAPPED)
_FUNCTIONAL = {"all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_gather_into_tensor": "all_gather",
               "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all", "broadcast": "broadcast"}

# The optimizer's DTensor ops reach the older c10d_functional ops; the layers reach _c10d_functional
_FUNCTIONAL_NAMESPACES = ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _functional_mode(counter: CollectiveCounter) -> Any:
    """A dispatch mode that counts DTensor's functional collectives into `counter` (the full
    tensor: an all-gather's output, the input of the others)."""
    class Functional(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            out = func(*args, **(kwargs or {}))
            kind = _FUNCTIONAL.get(func._overloadpacket.__name__) if func.namespace in _FUNCTIONAL_NAMESPACES else None
            if kind is not None:  # (not wait_tensor, nor the wrapping of a result for autograd)
                counter.add(kind, _nbytes(out if kind == "all_gather" else args[0]))
            elif func.namespace == "c10d" and func._overloadpacket.__name__ == "send":  # a pipeline's stages
                counter.add("send", sum(_nbytes(t) for t in args[0]))
            return out

    return Functional()


class CollectiveCounter:
    """Count collective calls and their bytes (see the module docstring). Not re-entrant.

    Attributes:
        calls: kind ('all_gather', 'reduce_scatter', 'all_reduce', 'all_to_all', 'send') -> calls made.
        bytes: kind -> bytes of the full tensors those calls moved.
    """

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self._saved: dict[str, Callable[..., Any]] = {}
        self._mode: Any = None

    def add(self, kind: str, nbytes: int) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.bytes[kind] = self.bytes.get(kind, 0) + nbytes

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        kind, arg = _WRAPPED[name]
        position = list(inspect.signature(fn).parameters).index(arg)

        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            tensor = kwargs[arg] if arg in kwargs else args[position]
            self.add(kind, _nbytes(tensor))
            return fn(*args, **kwargs)

        return counted

    def __enter__(self) -> CollectiveCounter:
        for name in _WRAPPED:
            if hasattr(dist, name):
                self._saved[name] = getattr(dist, name)
                setattr(dist, name, self._wrap(name, self._saved[name]))
        self._mode = _functional_mode(self).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved.clear()

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def __repr__(self) -> str:
        return f"CollectiveCounter(calls={self.calls}, bytes={self.bytes})"


def wire_bytes(kind: str, nbytes: int, processes: int) -> float:
    """Bytes each process sends for one collective over `nbytes` in a ring of `processes`:
    (N-1)/N x B for an all-gather or a reduce-scatter, 2(N-1)/N x B for an all-reduce
    (a reduce-scatter then an all-gather); a point-to-point send, its bytes.

    Example:
        >>> wire_bytes("all_reduce", 1000, 2)
        1000.0
    """
    share = (processes - 1) / processes * nbytes
    if kind == "send":  # point to point: the bytes themselves
        return float(nbytes)
    if kind == "all_reduce":
        return 2 * share
    if kind in ("all_gather", "reduce_scatter"):
        return share
    raise ValueError(f"kind={kind!r} is not a collective counted here; use 'all_gather', 'reduce_scatter' or 'all_reduce'")
