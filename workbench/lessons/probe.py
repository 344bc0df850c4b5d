"""One step, measured outside the training loop: a fixed batch, a freshly seeded model,
its gradients, and the peak memory of the step.

`run()` trains and times; some questions are about a single step instead ("are these two
ways of computing the gradient the same?", "how much memory does this step peak at?").
A `Probe` answers them on exactly the model and data `run()` would build from the same
config: `new_model()` seeds and builds the model as `run()` does, so a probe's model
starts from the same weights as the run's.

Example:
    >>> probe = make_probe(RunConfig(model="gpt", preset="cpu-quick"), samples=8)  # doctest: +SKIP
    >>> model = probe.new_model()                                                    # doctest: +SKIP
    >>> loss_fn(model(probe.inputs), probe.labels).backward()                       # doctest: +SKIP
    >>> step_peak(lambda: ..., track=[model])                                        # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.core.config import RunConfig
from workbench.core.data import load_data
from workbench.core.models import build_model
from workbench.core.switches.attention import set_attention
from workbench.machine import hardware

__all__ = ["Probe", "make_probe", "gradients", "max_relative_difference", "PeakReading", "step_peak", "tensor_peak"]


@dataclass(frozen=True)
class Probe:
    """A resolved config, the data it names, and a fixed batch of `len(inputs)` samples."""

    config: RunConfig
    data: Any
    """The DataBundle `run()` would load for this config."""
    inputs: torch.Tensor
    labels: torch.Tensor

    def new_model(self) -> nn.Module:
        """The model `run()` builds for this config: same seed, so the same weights; in train mode."""
        model = build_model(self.config.model, data=self.data, dims=self.config.dims, seed=self.config.seed)
        set_attention(model, self.config.attention)  # as run() does
        return model.to(self.inputs.device).train()


def make_probe(config: RunConfig, *, samples: int) -> Probe:
    """The first `samples` training examples of `config`'s data, on its device.

    Example:
        >>> probe = make_probe(RunConfig(model="mlp", data="digits", preset="cpu-quick"), samples=4)
        >>> tuple(probe.inputs.shape), tuple(probe.labels.shape)
        ((4, 1, 8, 8), (4,))
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples={samples!r} must be a positive whole number, e.g. samples=8")
    cfg = config.resolved()
    data = load_data(cfg.data, seq_len=cfg.seq_len or 128, seed=cfg.seed)
    if samples > len(data.train):
        raise ValueError(f"samples={samples} is more than the {len(data.train)} training examples of "
                         f"{cfg.data!r}; pass samples <= {len(data.train)}")
    device = torch.device(hardware.resolve_device(cfg.device))
    rows = [data.train[i] for i in range(samples)]
    inputs = torch.stack([r["inputs"] for r in rows]).to(device)
    labels = torch.stack([r["labels"] for r in rows]).to(device)
    return Probe(config=cfg, data=data, inputs=inputs, labels=labels)


def gradients(model: nn.Module) -> list[torch.Tensor]:
    """Copies of the model's gradients, in parameter order (zeros where a grad is None)."""
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in model.parameters() if p.requires_grad]


def max_relative_difference(got: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> float:
    """max over tensors of max|got - reference| / max|reference|.

    Per tensor, the largest error is measured against the tensor's largest entry: an
    elementwise ratio would blow up on entries that are zero by chance, and one norm over
    all tensors would let a large tensor hide an error in a small one.

    Example:
        >>> max_relative_difference([torch.tensor([1.0, 2.0])], [torch.tensor([1.0, 2.2])])  # doctest: +ELLIPSIS
        0.0909...
    """
    if len(got) != len(reference):
        raise ValueError(f"got {len(got)} tensors but the reference has {len(reference)}; "
                         "compare gradients of the same model")
    worst = 0.0
    for g, r in zip(got, reference):
        scale = r.abs().max().item()
        err = (g.double() - r.double()).abs().max().item()
        worst = max(worst, err / scale if scale > 0 else (0.0 if err == 0 else float("inf")))
    return worst


@dataclass(frozen=True)
class PeakReading:
    """The peak of one step. `bytes` is None when it cannot be read honestly here."""

    bytes: int | None
    kind: str
    """'CUDA allocator peak' or 'tensor peak (MemTracker)'; says what was read."""


def step_peak(step: Callable[[], Any] | Sequence[Callable[[], Any]], *,
              track: Iterable[nn.Module | torch.optim.Optimizer] = (),
              device: str | torch.device = "cpu") -> PeakReading:
    """Peak memory while `step()` runs (or each of a sequence of calls, in order, e.g. the
    micro-batches of an accumulation window), parameters and gradients included.

    On a GPU: the CUDA caching allocator's peak (`max_memory_allocated`), reset first.
    On a CPU there is no allocator counter (torch's CUDA counters read 0 there, and the
    process high-water mark also holds what glibc cached from earlier steps), so the
    tensors themselves are tracked with PyTorch's `MemTracker` (torch.distributed._tools):
    the peak of live tensor bytes, the CPU analogue of `max_memory_allocated`. Pass the
    model (and optimizer) as `track`: tensors made before the step are only seen if tracked.
    """
    device = torch.device(device)
    calls = list(step) if isinstance(step, Sequence) else [step]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        for call in calls:
            call()
        torch.cuda.synchronize(device)  # a measurement, not the training loop: sync is fine here
        return PeakReading(int(torch.cuda.max_memory_allocated(device)), "CUDA allocator peak")
    try:
        # lazy: `import torch` does not load mem_tracker (it imports torch._dynamo)
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:  # a private API: absent on some builds; say so rather than guess
        for call in calls:
            call()
        return PeakReading(None, "not measurable here (no MemTracker in this torch)")
    with tensor_peak(track, device) as reading:
        for call in calls:
            call()
            reading.next_call()
    return reading.result


class _TensorPeak:
    def __init__(self, tracker: Any, device: torch.device) -> None:
        self.tracker, self.device, self.result = tracker, device, PeakReading(None, "not read yet")

    def next_call(self) -> None:
        # MemTracker refuses a second forward of a module it has stats for; clearing the
        # per-module stats keeps the device-wide peak, which is what is read at the end.
        self.tracker.reset_mod_stats()


@contextlib.contextmanager
def tensor_peak(track: Iterable[nn.Module | torch.optim.Optimizer] = (),
                device: str | torch.device = "cpu", *, per_module: bool = True) -> Iterator[_TensorPeak]:
    """step_peak's CPU reading as a context (`with tensor_peak([model, optimizer]) as r: ...`,
    then `r.result`): the peak of live tensor bytes while the block runs, read by MemTracker.
    `per_module=False`: no per-module statistics (MemTracker refuses a module's second forward
    in one block, a pipeline's micro-batches); the device-wide peak is read all the same."""
    # lazy: `import torch` does not load mem_tracker (it imports torch._dynamo)
    from torch.distributed._tools.mem_tracker import MemTracker

    device = torch.device(device)
    tracker = MemTracker()
    tracker.track_external(*track)
    if not per_module:
        tracker._mod_tracker.register_user_hooks = lambda *hooks: None
    reading = _TensorPeak(tracker, device)
    with tracker:
        yield reading
    peak = sum(v["Total"] for d, v in tracker.get_tracker_snapshot("peak").items() if d.type == device.type)
    reading.result = PeakReading(int(peak), "tensor peak (MemTracker)")
