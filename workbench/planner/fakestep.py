"""`run()`'s training step, replayed on fake tensors: what is live at every moment of it.

`estimate()` needs the peak of a real step, not a sum of upper bounds. So this module
replays the loop of `engine.train` on `FakeTensorMode` tensors (shapes and dtypes, no
storage: a 3B model costs nothing) and follows every tensor with `planner.live.LiveTensors`:

- steady state: the optimizer state exists (a first step made it); the loop still holds the
  previous micro-batch's fp32 logits (its `logits` variable) and its batch; on a CPU the
  DataLoader's next batch too (accelerate's loader keeps one batch ahead);
- a micro-batch: fetch, forward under autocast (fp32 logits out, as accelerate converts
  them), the loss, `backward()` of the loss over the accumulation steps (scaled for fp16).
  The first micro-batch of a window starts without gradients; with accumulation, a second
  one starts with them and adds into them (each further one repeats the second);
- the optimizer step, on the whole model with its gradients: its temporaries (AdamW's
  foreach form on a GPU holds a square-root copy of every parameter at once; the
  per-parameter form on a CPU one parameter's worth), after clipping if configured.

On a GPU (`device="cuda"`), three things differ, and are replayed (`planner.fakecuda`): every
storage is rounded up to the CUDA allocator's 512-byte blocks; autocast runs `softmax` (and
CUDA's other float32-listed ops) in fp32 where the CPU's autocast keeps 16 bits, which for
attention keeps an fp32 and a 16-bit copy of every score matrix; the optimizer takes its
foreach form (`planner.fakestate`, the model state and its optimizer step). The data loader's
look-ahead batch lives in host memory there, not on the device.

A GPT is replayed with at most two groups of blocks (a group is one block, or a
checkpointed and a plain block under 'every_other'), then scaled: marks at the group
boundaries give what one more group adds at every moment, and since the blocks are
identical, the live bytes at any moment are affine in the number of groups between them.

Example:
    >>> sim = simulate("mlp", ("image_classification", (1, 28, 28), 10, None), (("hidden", (64,)),),
    ...                "fp32", "none", batch=8, micro_batches=1, device="cpu")   # doctest: +SKIP
    >>> max(sim.levels)                                                          # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
from torch import nn

from workbench.base.precisions import AUTOCAST_DTYPES
from workbench.core.measure.counters import SavedActivationCounter
from workbench.core.measure.flops import FlopCounter
from workbench.core.measure.meters import LOSS_WINDOW_SLOTS
from workbench.core.models import loss_fn
from workbench.core.switches.activation_checkpointing import set_activation_checkpointing
from workbench.planner.fakecuda import CudaAutocastPolicy, run_backward
from workbench.planner.fakemodel import fake_mode, sample
from workbench.planner.fakestate import build
from workbench.planner.live import CUDA_BLOCK_BYTES, LiveTensors, op_name

__all__ = ["Mark", "Simulation", "StepOps", "Storage", "simulate", "step_storages"]


class Mark(NamedTuple):
    """A named moment of the replay."""

    index: int
    """Allocations before it (an index into Simulation.levels)."""
    level: int
    """Live bytes then."""
    flops: int
    """FLOPs so far (first micro-batch)."""
    saved: int
    """Saved-activation bytes so far (first micro-batch)."""
    clock: int
    """LiveTensors' clock then (orders it among allocations and releases)."""
    op: int
    """Ops of its micro-batch so far (an index into Simulation.ops[micro - 1])."""


class Simulation(NamedTuple):
    """One replayed optimizer step's micro-batches, model state excluded."""

    levels: tuple[int, ...]
    """Live bytes after every allocation, in order."""
    marks: dict[str, Mark]
    """'label.micro' -> the mark."""
    flops: int
    """FLOPs of one micro-batch (forward, loss, backward, recompute)."""
    saved_bytes: int
    """Saved-activation bytes of one micro-batch (forward and loss)."""
    end_bytes: int
    """Live after the last backward: what the optimizer step starts with (gradients included)."""
    let_go: tuple[int, ...] = ()
    """Per micro-batch: bytes the second group made in its forward and freed when it ended."""
    ops: tuple[tuple[tuple[int, int, str], ...], ...] = ()
    """Per micro-batch: (FLOPs, bytes, dtype) of each op, from the forward to the backward's end."""


def _inputs(spec_key: tuple, batch: int) -> dict[str, torch.Tensor]:
    task, shape = spec_key[:2]
    if task == "custom":  # ('custom', (inputs' shape, dtype), (labels' shape, dtype), logits' shape)
        return {"inputs": sample(spec_key[1], batch), "labels": sample(spec_key[2], batch)}
    if task == "language_modeling":
        return {"inputs": torch.zeros(batch, *shape, dtype=torch.long), "labels": torch.zeros(batch, *shape, dtype=torch.long)}
    return {"inputs": torch.zeros(batch, *shape), "labels": torch.zeros(batch, dtype=torch.long)}


def _logits_shape(spec_key: tuple, batch: int) -> tuple[int, ...]:
    task, shape, classes, vocab = spec_key
    if task == "custom":
        return (batch, *vocab)
    return (batch, *shape, vocab) if task == "language_modeling" else (batch, classes)


class _Raw(NamedTuple):
    """A replay as recorded, sizes exact: every storage's life and every mark, by clock."""

    storages: tuple[tuple[int, int, int], ...]
    """(clock made, clock freed or _NEVER, bytes) per storage."""
    marks: dict[str, tuple[int, int, int, int]]
    """'label.micro' -> (clock, FLOPs so far, saved bytes so far, ops of its micro-batch so far)."""
    ops: tuple[tuple[tuple[int, int, str], ...], ...]
    flops: int
    saved_bytes: int
    made_by: tuple[str, ...] = ()
    """The op that made each storage (aten::mm, ...), in the order of `storages`."""

    def shape(self) -> tuple:
        """What must agree between two batch sizes for sizes to be read as affine in the batch."""
        return (tuple((b, f) for b, f, _ in self.storages), tuple((k, v[0], v[3]) for k, v in self.marks.items()),
                tuple(tuple(d for _, _, d in ops) for ops in self.ops))

    def at(self, other: _Raw, batch: int, other_batch: int, wanted: int) -> _Raw:
        """This replay (at `batch`) and `other` (at `other_batch`) read as lines, at `wanted`."""
        def line(a: int, b: int) -> int:
            step, rest = divmod((b - a) * (wanted - batch), other_batch - batch)
            assert rest == 0
            return a + step

        return _Raw(
            storages=tuple((b, f, line(n, m)) for (b, f, n), (_, _, m) in zip(self.storages, other.storages, strict=True)),
            marks={k: (v[0], line(v[1], other.marks[k][1]), line(v[2], other.marks[k][2]), v[3])
                   for k, v in self.marks.items()},
            ops=tuple(tuple((line(f, g), line(n, m), d) for (f, n, d), (g, m, _) in zip(a, b, strict=True))
                      for a, b in zip(self.ops, other.ops, strict=True)),
            flops=line(self.flops, other.flops), saved_bytes=line(self.saved_bytes, other.saved_bytes),
            made_by=self.made_by)


_NEVER = 2**62


def _mark_groups(blocks: nn.ModuleList, group: int, state: SimpleNamespace, mark: Callable[[str], None]) -> None:
    """Hooks that `mark` the first two groups of `group` blocks: F0/F1 after each group's forward
    (not the recompute of a checkpointed block in backward), B1/B0 when the gradient of each
    group's input is complete."""
    def after(label: str, hook_output: bool) -> Any:
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if state.forward:
                mark(label)
                if hook_output:  # its gradient is complete once the next group's backward is done
                    output.register_hook(lambda grad: mark("B1"))
        return hook

    def before_first(module: nn.Module, args: tuple) -> None:
        if state.forward:
            args[0].register_hook(lambda grad: mark("B0"))

    blocks[group - 1].register_forward_hook(after("F0", True))
    blocks[2 * group - 1].register_forward_hook(after("F1", False))
    blocks[0].register_forward_pre_hook(before_first)


def _held_between_steps(spec_key: tuple, batch: int, precision: str, device: str) -> tuple:
    """What the loop holds when a step begins, made in this order: the previous step's `logits`,
    `loss` and `batch`; on a CPU also the batch accelerate's loader has fetched ahead (else None);
    the loop's loss window (its slots and three running figures, for the whole run); fp16's
    GradScaler scale (else None) with its growth tracker and the last step's found-inf flag:
    scalars, but live too."""
    logits = torch.empty(_logits_shape(spec_key, batch))
    loss = torch.zeros(())
    batch_now = _inputs(spec_key, batch)
    ahead = _inputs(spec_key, batch) if device == "cpu" else None
    scalars = [torch.zeros(LOSS_WINDOW_SLOTS), torch.zeros(3)]
    scale = None
    if precision == "fp16":
        scale = torch.ones(())
        scalars += [torch.zeros((), dtype=torch.int32), torch.zeros(())]
    return logits, loss, batch_now, ahead, scalars, scale


@functools.lru_cache(maxsize=256)
def _replay(model_name: str, spec_key: tuple, dims: tuple, precision: str, checkpointing: str, *,
            batch: int, device: str, group: int) -> _Raw:
    """Replay two micro-batches of the loop on fake tensors (the first without gradients,
    the second adding into them), recording every storage's life and the marks (suffixed with the
    micro-batch number). `group` > 0 (GPT): the first two groups of `group` blocks marked too.
    """
    micro_batches = 2

    with fake_mode():
        model = build(model_name, spec_key, dims)
        set_activation_checkpointing(model, checkpointing)
        live = LiveTensors(levels=True)  # exact sizes: a device's rounding is applied after
        # One op recorder per micro-batch; the first also counts the FLOPs reported.
        counters = [FlopCounter(record_ops=True) for _ in range(micro_batches)]
        flops, saved = counters[0], SavedActivationCounter(model)
        marks: dict[str, tuple[int, int, int, int]] = {}
        state = SimpleNamespace(forward=False, micro=0)

        def mark(label: str) -> None:
            live.mark(label)
            clock = live.marks[-1][3]
            marks[f"{label}.{state.micro}"] = (clock, flops.total, saved.bytes, len(counters[state.micro - 1].ops or ()))

        if group:
            _mark_groups(model.blocks, group, state, mark)
        dtype = AUTOCAST_DTYPES.get(precision)
        policy = CudaAutocastPolicy() if device == "cuda" and dtype else contextlib.nullcontext()
        gc.disable()  # fake tensors freed by reference counts alone: the same levels everywhere
        try:
            with live, policy:
                logits, loss, batch_now, ahead, scalars, scale = _held_between_steps(spec_key, batch, precision, device)
                for micro in range(1, micro_batches + 1):
                    state.micro = micro
                    mark("fetch")  # where a micro-batch begins (what is made before was held over)
                    counting = micro == 1
                    # fetch: a CPU loader collates the batch after next; a GPU gets a device copy
                    fresh = _inputs(spec_key, batch)
                    if ahead is not None:
                        batch_now, ahead = ahead, fresh
                    else:
                        batch_now = fresh
                    del fresh
                    with counters[micro - 1]:
                        with saved if counting else contextlib.nullcontext():
                            state.forward = True
                            with torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext():
                                out = model(batch_now["inputs"])
                            mark("forward_end")  # autocast has let go of its cached weight casts
                            logits = out.float() if dtype else out  # accelerate's convert_outputs_to_fp32
                            del out
                            loss = loss_fn(logits, batch_now["labels"])
                            state.forward = False
                        mark("backward")
                        # accelerator.backward divides by the accumulation steps (a scalar, whatever their number)
                        scaled = loss / micro_batches
                        if scale is not None:
                            scaled = scaled * scale
                        run_backward(scaled, policy)
                        del scaled
                    mark("end")
        finally:
            gc.enable()
        del logits, loss, batch_now, ahead, scalars, scale
        storages = [(born, freed, size) for born, size, freed in live.released]
        storages += [(live._born[key], _NEVER, size) for key, size in live._live.items()]
        storages.sort()  # by the clock each was made at: no two share one
        return _Raw(storages=tuple(storages), marks=marks, ops=tuple(tuple(c.ops or ()) for c in counters),
                    flops=flops.total, saved_bytes=saved.bytes,
                    made_by=tuple(op_name(live.made_by.get(born)) for born, _, _ in storages))


@functools.lru_cache(maxsize=512)
def simulate(model_name: str, spec_key: tuple, dims: tuple, precision: str, checkpointing: str, *,
             batch: int, micro_batches: int, device: str, group: int = 0) -> Simulation:
    """The loop's first `micro_batches` (1 or 2) micro-batches at `batch` samples, on `device`.

    Every tensor's size is affine in the micro-batch, and the ops are the same at any size
    from 2 on: so two replays, at 2 and 3 samples, give every storage's size at any batch,
    exactly, and the device's rounding is applied to each. (Checked: when the two replays
    differ in shape, or for 1 sample, the batch itself is replayed.)
    """
    raw = _raw(model_name, spec_key, dims, precision, checkpointing, batch=batch, device=device, group=group)
    return _materialise(raw, micro_batches, round_to=CUDA_BLOCK_BYTES if device == "cuda" else 1)


def _raw(model_name: str, spec_key: tuple, dims: tuple, precision: str, checkpointing: str, *,
         batch: int, device: str, group: int) -> _Raw:
    """The replay at `batch` samples, from the replays at 2 and 3 (see `simulate`)."""
    key = (model_name, spec_key, dims, precision, checkpointing)
    if batch in (2, 3) or batch < 2:
        return _replay(*key, batch=batch, device=device, group=group)
    two, three = (_replay(*key, batch=b, device=device, group=group) for b in (2, 3))
    return (two.at(three, 2, 3, batch) if two.shape() == three.shape()
            else _replay(*key, batch=batch, device=device, group=group))


class Storage(NamedTuple):
    """One storage of the replayed step: when it was made and freed (LiveTensors' clock), its
    exact bytes, and the op that made it."""

    born: int
    freed: int | None
    """None: still live when the replayed micro-batches end."""
    nbytes: int
    op: str


def step_storages(model_name: str, spec_key: tuple, dims: tuple, precision: str, checkpointing: str, *,
                  batch: int, micro_batches: int, device: str) -> tuple[tuple[Storage, ...], dict[str, int]]:
    """Every storage the replay of the loop's first `micro_batches` (1 or 2) micro-batches makes,
    the held-over batch and logits included, and the clock of each mark ('forward_end.1', 'backward.1',
    'end.1', ...): the events a memory snapshot is made of (`planner.predicted_snapshot`). Sizes exact (the
    device's rounding is the caller's); the replay is `simulate`'s, whole (no groups scaled)."""
    raw = _raw(model_name, spec_key, dims, precision, checkpointing, batch=batch, device=device, group=0)
    stop = raw.marks[f"end.{micro_batches}"][0]
    storages = tuple(Storage(born, None if freed > stop else freed, n, op)
                     for (born, freed, n), op in zip(raw.storages, raw.made_by, strict=True) if born <= stop)
    marks = {k: v[0] for k, v in raw.marks.items() if int(k.rsplit(".", 1)[1]) <= micro_batches}
    return storages, marks


def _materialise(raw: _Raw, micro_batches: int, *, round_to: int) -> Simulation:
    """Live bytes after every allocation, and each mark's place and level, with sizes rounded."""
    size = (lambda n: n) if round_to <= 1 else (lambda n: n and -(-n // round_to) * round_to)
    events = sorted([(born, size(n)) for born, _, n in raw.storages] +
                    [(freed, -size(n)) for _, freed, n in raw.storages if freed != _NEVER])
    stop = raw.marks[f"end.{micro_batches}"][0]
    levels, level, at_clock = [], 0, []
    for clock, change in events:
        if clock > stop:
            break
        level += change
        if change > 0:
            levels.append(level)
        at_clock.append((clock, level, len(levels)))
    clocks = [c for c, _, _ in at_clock]

    def place(clock: int) -> tuple[int, int]:  # (allocations before, live bytes) at a mark's clock
        i = bisect.bisect_left(clocks, clock)
        return (at_clock[i - 1][2], at_clock[i - 1][1]) if i else (0, 0)

    marks = {}
    for label, (clock, flops, saved, op) in raw.marks.items():
        if int(label.rsplit(".", 1)[1]) <= micro_batches:
            index, lvl = place(clock)
            marks[label] = Mark(index, lvl, flops, saved, clock, op)
    let_go = []
    for micro in range(1, micro_batches + 1):
        if f"F0.{micro}" not in marks:
            let_go.append(0)
            continue
        # What the second group made in its forward and autocast let go of when the forward
        # ended (its weight casts, unless saved): one more group holds that only until then.
        f0, f1, end = (marks[f"{k}.{micro}"].clock for k in ("F0", "F1", "forward_end"))
        let_go.append(sum(size(n) for born, freed, n in raw.storages if f0 < born < f1 and f1 < freed < end))
    return Simulation(levels=tuple(levels), marks=marks, flops=raw.flops, saved_bytes=raw.saved_bytes,
                      end_bytes=marks[f"end.{micro_batches}"].level, let_go=tuple(let_go),
                      ops=raw.ops[:micro_batches])


class StepOps(NamedTuple):
    """Every op of an optimizer step, for a roofline: the replayed micro-batches' ops, what one
    more group of blocks adds to each, and the optimizer step's."""

    micro: tuple[tuple[tuple[int, int, str], ...], ...]
    group: tuple[tuple[tuple[int, int, str], ...], ...]
    scaled: int
    accumulation: int
    optimizer: tuple[tuple[int, int, str], ...]

    def seconds(self, peaks: dict[str, float], bandwidth: float | None) -> float:
        """A lower bound on the step's time: each op at the slower of its FLOPs at the peak
        of its dtype and its bytes at the memory bandwidth (None: FLOPs only)."""
        def time(ops: tuple) -> float:
            return sum(max(f / peaks.get(dtype, peaks["fp32"]) if f else 0.0, b / bandwidth if bandwidth else 0.0)
                       for f, b, dtype in ops)

        per_micro = [time(ops) + self.scaled * time(group) for ops, group in zip(self.micro, self.group, strict=True)]
        return per_micro[0] + (self.accumulation - 1) * per_micro[-1] + time(self.optimizer)
