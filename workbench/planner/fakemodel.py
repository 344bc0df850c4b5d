"""Models on fake tensors: the one `FakeTensorMode` the estimate replays in, and the learner's
own module there (`RunConfig(model=MyNet())`).

- `fake_mode()`: plain CPU fake tensors (shapes and dtypes, no storage), shared by every estimate;
- `ModuleKey`: a learner's module as a cache key. The estimate's caches (`functools.lru_cache`)
  need hashable arguments; the key is the module's identity and its tensors' shapes, and it
  holds the module by a weak reference, so the caches never keep a model (and its real
  weights) alive, and a module changed in place (a layer swapped, weights frozen) is a new key;
- `fake_copy(module)`: a copy of the module whose parameters, buffers and tensor attributes are
  fake tensors of the same shapes, dtypes and requires_grad: it costs no memory, and the
  learner's module is not touched;
- `own_spec_key(key, inputs, labels)`: what the replay needs to know of the data and the
  output: the inputs' and labels' per-sample shapes and dtypes, and the logits' per-sample
  shape, read off one forward on fake tensors. A forward that depends on the data's values
  (`if x.sum() > 0`, `.item()`) cannot run on fake tensors: `CannotTrace` says so.

Example:
    >>> key = ModuleKey(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)))
    >>> own_spec_key(key, ((1, 28, 28), torch.float32), ((), torch.int64))
    ('custom', ((1, 28, 28), torch.float32), ((), torch.int64), (10,))
"""

from __future__ import annotations

import copy
import functools
import logging
import weakref
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

__all__ = ["CannotTrace", "ModuleKey", "fake_copy", "fake_mode", "own_spec_key"]


@functools.cache
def fake_mode():
    # Plain CPU fake tensors: CPU autocast applies to them (it would not to 'meta' ones).
    # One mode for every estimate: it caches each op's output shapes.
    return FakeTensorMode(allow_non_fake_inputs=False)


class CannotTrace(ValueError):
    """The learner's module cannot run on fake tensors (its forward reads the data's values)."""


class ModuleKey:
    """A learner's module as a hashable cache key, held by a weak reference (see the module doc)."""

    def __init__(self, module: nn.Module) -> None:
        self._ref = weakref.ref(module)
        self.name = type(module).__name__
        self._id = id(module)
        self._shapes = (type(module).__qualname__,
                        tuple((n, tuple(p.shape), p.dtype, p.requires_grad)
                              for n, p in module.named_parameters(remove_duplicate=False)),
                        tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()))

    def module(self) -> nn.Module:
        module = self._ref()
        if module is None:
            raise ValueError(f"the {self.name} module this estimate was made for no longer exists")
        return module

    def __hash__(self) -> int:
        return hash((self._id, self._shapes))

    def __eq__(self, other: object) -> bool:
        # The same live object with the same tensors (an id reused by a new module is not it).
        return (isinstance(other, ModuleKey) and (self._id, self._shapes) == (other._id, other._shapes)
                and self._ref() is other._ref() is not None)

    def __repr__(self) -> str:
        return f"ModuleKey({self.name})"


def fake_copy(module: nn.Module) -> nn.Module:
    """`module` on fake tensors, in training mode (call inside `fake_mode()`). Tied parameters
    stay tied; nothing of the module is copied but its structure."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for p in sub._parameters.values():
            if p is not None and id(p) not in memo:
                memo[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype), requires_grad=p.requires_grad)
        tensors = [*sub._buffers.values(), *(v for v in vars(sub).values() if isinstance(v, torch.Tensor))]
        for t in tensors:
            if t is not None and id(t) not in memo:
                memo[id(t)] = torch.empty(t.shape, dtype=t.dtype)
    return copy.deepcopy(module, memo).train()


def _data_dependent(error: BaseException) -> bool:
    real_tensor = isinstance(error, AssertionError) and "FakeTensor" in str(error)  # a global real tensor
    return real_tensor or isinstance(error, (DataDependentOutputException, DynamicOutputShapeException))


def cannot_trace(name: str, error: BaseException, inputs: tuple | None = None) -> CannotTrace:
    """The one-line error for a module the estimate cannot replay, with what still works."""
    reason = (str(error).splitlines() or [""])[0][:160]
    if inputs is not None and not _data_dependent(error):  # e.g. a first layer that does not fit the inputs
        shape, dtype = inputs
        return CannotTrace(f"model={name}(...)'s forward failed on inputs of shape {(2, *shape)} "
                           f"({str(dtype).removeprefix('torch.')}): {type(error).__name__}: {reason}")
    return CannotTrace(f"estimate() cannot trace model={name}(...) on fake tensors ({type(error).__name__}: {reason}): "
                       "its forward reads the data's values (.item(), if on a tensor, nonzero) or holds a real "
                       "tensor outside its parameters and buffers; run() still trains it and counts its first step "
                       "exactly")


def sample(shape_dtype: tuple[tuple[int, ...], torch.dtype], batch: int) -> torch.Tensor:
    """A batch of zeros of one sample's (shape, dtype): class 0 and token 0 are valid everywhere."""
    shape, dtype = shape_dtype
    return torch.zeros(batch, *shape, dtype=dtype)


@functools.lru_cache(maxsize=64)
def own_spec_key(key: ModuleKey, inputs: tuple, labels: tuple) -> tuple:
    """('custom', inputs, labels, logits' per-sample shape): one forward of two samples on fake tensors."""
    # torch logs a traceback when an op fails on fake tensors; the error below says it in one line.
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with fake_mode():
            out = fake_copy(key.module())(sample(inputs, 2))
    except Exception as error:  # data-dependent control flow, a real tensor in forward, a misfit ...
        raise cannot_trace(key.name, error, inputs) from None
    finally:
        log.setLevel(level)
    if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[0] != 2:
        raise CannotTrace(f"model={key.name}(...) returned {type(out).__name__} "
                          f"{tuple(out.shape) if isinstance(out, torch.Tensor) else ''} for 2 samples; "
                          "estimate() needs logits whose first dimension is the batch")
    return "custom", inputs, labels, tuple(out.shape[1:])
