"""Tensors a model keeps for backward that autograd's saved-tensor hooks do not see.

Non-reentrant activation checkpointing keeps a block's input alive for the recompute.
Whether that tensor passes through an outer `saved_tensors_hooks` pair depends on the
torch version (on 2.13 it does: `checkpoint` stores it as an autograd SavedTensor before
installing its own, innermost, hooks), so models that checkpoint also call `note_saved` on
it; the exact counter (`workbench.core.measure.counters.SavedActivationCounter`) listens while
it is active and counts each storage once, however often it is reported. The hook point lives here, with the models, so the models need not import the
measuring code: measure depends on core, never the reverse.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch

_LISTENER: ContextVar[Callable[[torch.Tensor], None] | None] = ContextVar("workbench_saved_listener", default=None)


def note_saved(tensor: torch.Tensor) -> None:
    """Report `tensor` as kept for backward to the active listener; a no-op without one."""
    listener = _LISTENER.get()
    if listener is not None and isinstance(tensor, torch.Tensor):
        listener(tensor)


@contextlib.contextmanager
def listening(callback: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Within this block, `note_saved(t)` calls `callback(t)`."""
    token = _LISTENER.set(callback)
    try:
        yield
    finally:
        _LISTENER.reset(token)
