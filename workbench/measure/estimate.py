"""Estimate a training step's memory and FLOPs before running it, without allocating.

`estimate(config)` builds the config's model under `FakeTensorMode` (tensors with shapes
and dtypes but no storage: nothing is allocated, so a 3B-parameter model costs nothing)
and measures, with the same exact counters `run()` uses:

- parameter, gradient and optimizer-state bytes: the full model, one fake optimizer step;
- saved-activation bytes of one micro-batch: `SavedActivationCounter` on a fake forward
  (autocast on, as accelerate does it) and the loss;
- FLOPs: `FlopCounterMode` on the fake forward and backward (recompute included);
- temporaries (gradients of activations, logits, a checkpointed block's recompute):
  torch's `MemTracker` on the same fake step, its peak less the counted parts.

A GPT is measured one layer at a time: a 0-layer and a 1-layer copy (with and without
checkpointing), scaled by the number of layers, so a 32-layer model costs the same seconds
as a 2-layer one. Activations, temporaries and FLOPs are measured at micro-batches 1 and 2
and extrapolated linearly (saved activations and FLOPs are exactly linear in the batch).

`accelerate_estimate(config)` is 🤗 accelerate's `estimate-memory` rule on the same model,
for comparison: it counts model state only (no activations) and its training figure is the
largest component, not a sum.

Example:
    >>> est = estimate(RunConfig(model="gpt", preset="cpu-quick"))  # doctest: +SKIP
    >>> est.activation_bytes, est.peak_bytes                        # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import gc
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from workbench.core.config import RunConfig
from workbench.core.data import DATASETS
from workbench.core.models import MODEL_SPECS
from workbench.core.precisions import AUTOCAST_DTYPES, DTYPES
from workbench.core.report import Report, counted_rows, format_bytes

__all__ = ["Estimate", "estimate", "accelerate_estimate", "input_spec"]

_BYTE_VOCAB = 256  # the byte-level language-modelling data


@dataclass(frozen=True, slots=True)
class Estimate(Report):
    """Predicted memory of one training step (bytes) and its FLOPs, before running it.

    `counted_bytes` holds the four parts `run()` counts exactly (RunResult.memory);
    `peak_bytes` adds buffers and temporaries: the figure to hold against a device.
    """

    config: RunConfig
    """The resolved config estimated."""
    parameter_count: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int
    """Saved for backward by one micro-batch."""
    temporary_bytes: int
    """Transient peak beyond the parts above (MemTracker on the fake step)."""
    flops_per_step: int
    """One optimizer step: every micro-batch's forward and backward (and recompute)."""
    vocab_size: int | None = None
    method: str = ""
    trainable_parameter_count: int | None = None
    """Parameters that train (freezing and LoRA leave the rest without gradient and optimizer state)."""
    processes: int = 1
    """Processes the model state is sharded over (sharding='full'); the model-state bytes are
    then one process's share (rank 0's, the largest)."""

    @property
    def model_state_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_state_bytes

    @property
    def counted_bytes(self) -> int:
        """Parameters + gradients + optimizer state + saved activations (run()'s exact counts)."""
        return self.model_state_bytes + self.activation_bytes

    @property
    def peak_bytes(self) -> int:
        """`counted_bytes` + buffers + temporaries: the predicted peak of a step.

        A sum, so an upper bound when gradients are freed between steps (accumulation 1),
        and close when they persist across micro-batches (accumulation > 1)."""
        return self.counted_bytes + self.buffer_bytes + self.temporary_bytes

    header = ("part", "estimate")

    def rows(self) -> list[tuple[str, str]]:
        return [
            *counted_rows(self),
            ("buffers", format_bytes(self.buffer_bytes)),
            ("temporaries (estimated)", format_bytes(self.temporary_bytes)),
            ("predicted peak", format_bytes(self.peak_bytes)),
            ("FLOPs per optimizer step", f"{self.flops_per_step:.3g}"),
        ]

    def caption(self) -> str:
        c = self.config
        fewer = ""  # notebook 09's switches, when used
        if self.trainable_parameter_count is not None and self.trainable_parameter_count != self.parameter_count:
            fewer += f", {self.trainable_parameter_count:,} of them trained"
        if self.processes > 1:
            fewer += f", model state: one of {self.processes} processes' shares"
        return (f"{c.model} {self.parameter_count / 1e6:,.1f}M params, {c.precision}, micro-batch "
                f"{c.batch_size} x {c.grad_accum_steps}, checkpointing {c.activation_checkpointing}{fewer}")


def input_spec(config: RunConfig, *, vocab_size: int | None = None) -> SimpleNamespace:
    """What `models.build_model` needs to know about the data, without loading it.

    `vocab_size` overrides the byte-level GPT's 256 (e.g. 50257 to size a GPT-2-like
    model on paper; such a model cannot train on the workbench's byte data).
    """
    cfg = config.resolved()
    if cfg.data.startswith("hub:"):
        raise ValueError(f"data={cfg.data!r}: estimate() needs a built-in data set's shape; "
                         f"estimate with data='mnist' or 'rotten_tomatoes_lm' of the same shape")
    if cfg.model == "minilm":
        raise ValueError("model='minilm' is not supported by estimate(); estimate model='gpt' "
                         "with MiniLM's dims (n_layer=6, d_model=384) instead")
    if not MODEL_SPECS[cfg.model].is_text:
        info = DATASETS[cfg.data]  # its shape and classes are known without loading it
        return SimpleNamespace(name=cfg.data, task=info.task, input_shape=info.input_shape,
                               num_classes=info.num_classes, vocab_size=None, pad_token_id=None)
    if vocab_size is not None and vocab_size < 2:
        raise ValueError(f"vocab_size={vocab_size} must be at least 2; pass e.g. vocab_size=50257")
    return SimpleNamespace(name=cfg.data, task="language_modeling", input_shape=(cfg.seq_len,),
                           num_classes=None, vocab_size=vocab_size or _BYTE_VOCAB, pad_token_id=None)


def _spec_key(spec: SimpleNamespace) -> tuple:
    return (spec.task, tuple(spec.input_shape), spec.num_classes, spec.vocab_size)


def _freeze(dims: dict[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in dims.items()))


@functools.cache
def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Plain CPU fake tensors: CPU autocast applies to them (it would not to 'meta' ones).
    # One mode for every estimate: it caches each op's output shapes, and the proxies
    # repeat the same ops at the same shapes (about halves the time of a plan).
    return FakeTensorMode(allow_non_fake_inputs=False)


def _build(model_name: str, spec_key: tuple, dims: tuple) -> nn.Module:
    from workbench.core.models import build_model

    task, shape, classes, vocab = spec_key
    spec = SimpleNamespace(name="estimate", task=task, input_shape=shape, num_classes=classes,
                           vocab_size=vocab, pad_token_id=None)
    return build_model(model_name, data=spec, dims=dict(dims))


# RunConfig fields that choose what trains (notebook 09), in this order in the cache keys.
_TRAINABLE_FIELDS = ("freeze", "freeze_layers", "lora_rank", "lora_targets", "lora_alpha")
_ALL_TRAIN = ("none", 0, 0, "attention", None)


@functools.lru_cache(maxsize=64)
def _model_state(model_name: str, spec_key: tuple, dims: tuple, optimizer: str, trainable: tuple = _ALL_TRAIN,
                 shard: tuple[int, int] = (1, 0)) -> tuple[int, int, int, int, int, int]:
    """(parameter count, parameter, buffer, gradient, optimizer-state bytes, trainable count):
    the whole model, with `trainable` (the _TRAINABLE_FIELDS values) applied; with `shard`
    = (processes, rank), the bytes that rank holds when the model state is sharded."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    from workbench.core.optim import make_optimizer
    from workbench.core.trainable import freeze_parts, lora_shapes
    from workbench.measure.counters import (
        gradient_bytes,
        optimizer_state_bytes,
        parameter_bytes,
        shard_rows,
    )

    choice = SimpleNamespace(**dict(zip(_TRAINABLE_FIELDS, trainable)))
    if optimizer == "adamw8bit":
        # Its 256-entry lookup tables are built from Python lists, which fake tensors cannot
        # be: build them (torchao caches them) before entering the fake mode.
        from workbench.core.torchao_support import import_torchao

        tables = import_torchao("torchao.optim.subclass_8bit")
        tables.get_qmap_signed(), tables.get_qmap_unsigned()
    with _fake_mode():
        model = _build(model_name, spec_key, dims)
        params = list(model.parameters())
        if choice.lora_rank:
            # peft cannot wrap fake tensors (its .to() swaps them): every weight frozen, plus
            # LoRA's A and B matrices of exactly the shapes peft adds (trainable.lora_shapes).
            model.requires_grad_(False)
            params += [nn.Parameter(torch.zeros(shape)) for shape in
                       lora_shapes(model, rank=choice.lora_rank, targets=choice.lora_targets)]
        else:
            freeze_parts(model, choice.freeze, first_layers=choice.freeze_layers)
        count = sum(p.numel() for p in params)  # LoRA's adapters included, as run() counts them
        trainable_count = sum(p.numel() for p in params if p.requires_grad)
        processes, rank = shard
        if processes > 1:  # one process's shard of every parameter (FSDP2: rows ceil(d/N) per rank)
            params = [nn.Parameter(p.new_zeros(shard_rows(p.shape[0], processes, rank), *p.shape[1:]), p.requires_grad)
                      for p in params]
        held = nn.ParameterList(params)
        for p in held:  # what a backward would leave: one gradient per trainable parameter
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        # The optimizer creates its state lazily, at its first step: take one, on fake tensors.
        opt = make_optimizer(held, RunConfig(model=model_name, optimizer=optimizer).resolved())
        try:
            opt.step()
        except DataDependentOutputException:
            # Adafactor reads a norm with .item(), which a fake tensor cannot answer; it has made
            # every parameter's state by then (counted only if so).
            if len(opt.state) < sum(p.requires_grad for p in held):
                raise
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        return (count, parameter_bytes(held), buffers, gradient_bytes(held, expected=True),
                optimizer_state_bytes(opt), trainable_count)


@functools.lru_cache(maxsize=256)
def _measure(model_name: str, spec_key: tuple, dims: tuple, precision: str, checkpointing: str,
             batch: int) -> tuple[int, int, int]:
    """(saved-activation bytes, FLOPs, temporary bytes) of one fake forward + backward."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.flop_counter import FlopCounterMode

    from workbench.core.models import loss_fn, set_activation_checkpointing
    from workbench.measure.counters import SavedActivationCounter

    task, shape, classes, vocab = spec_key
    with _fake_mode():
        model = _build(model_name, spec_key, dims)
        set_activation_checkpointing(model, checkpointing)
        if task == "language_modeling":
            inputs = torch.zeros(batch, *shape, dtype=torch.long)
            labels = torch.zeros(batch, *shape, dtype=torch.long)
        else:
            inputs, labels = torch.zeros(batch, *shape), torch.zeros(batch, dtype=torch.long)
        tracker = MemTracker()
        tracker.track_external(model)
        autocast = (torch.autocast("cpu", dtype=AUTOCAST_DTYPES[precision]) if precision in AUTOCAST_DTYPES
                    else contextlib.nullcontext())
        # The tracked peak depends on when fake tensors are freed: by reference counts
        # alone, it is the same everywhere; a garbage collection landing mid-step (its
        # timing depends on everything the process allocated before) would move it.
        gc.collect()
        gc.disable()
        try:
            with tracker, FlopCounterMode(display=False) as flops:
                with SavedActivationCounter(model) as saved:
                    with autocast:  # as accelerate wraps forward: autocast inside, fp32 outputs out
                        logits = model(inputs)
                    loss = loss_fn(logits.float(), labels)
                loss.backward()
        finally:
            gc.enable()
        peak = {getattr(k, "value", k): v for k, v in next(iter(tracker.get_tracker_snapshot("peak").values())).items()}
        # Temporaries: what the peak holds beyond model state and the saved activations.
        temporary = peak["Total"] - peak["Parameter"] - peak["Buffer"] - peak["Gradient"] - saved.bytes
        return saved.bytes, int(flops.get_total_flops()), max(0, temporary)


def _per_micro_batch(cfg: RunConfig, spec_key: tuple, batch: int) -> tuple[int, int, int, str]:
    """(activations, FLOPs, temporaries, method) of one micro-batch of `batch` samples."""
    dims = _freeze(cfg.dims)
    ckpt = cfg.activation_checkpointing
    if cfg.model != "gpt":
        saved, flops, temp = _measure(cfg.model, spec_key, dims, cfg.precision, ckpt, batch)
        return saved, flops, temp, "whole model on fake tensors"
    n_layer = cfg.dims.get("n_layer", 4)
    checkpointed = {"none": 0, "all": n_layer, "every_other": (n_layer + 1) // 2}[ckpt]
    # Blocks are identical: measure 0 and 1 layer, then every block adds the same again.
    base = _measure("gpt", spec_key, _freeze({**cfg.dims, "n_layer": 0}), cfg.precision, "none", batch)
    totals = list(base)
    temp = base[2]
    for setting, blocks in (("none", n_layer - checkpointed), ("all", checkpointed)):
        if blocks == 0:
            continue
        one = _measure("gpt", spec_key, _freeze({**cfg.dims, "n_layer": 1}), cfg.precision, setting, batch)
        for i in (0, 1):
            totals[i] += blocks * (one[i] - base[i])
        temp = max(temp, one[2])  # temporaries do not add up across layers: the largest
    return totals[0], totals[1], temp, f"1 layer of {n_layer} on fake tensors, scaled"


def estimate(config: RunConfig, *, vocab_size: int | None = None, processes: int = 1) -> Estimate:
    """Predict the memory and FLOPs of one training step of `config`, allocating nothing.

    Args:
        config: the run (model, dims, micro-batch, seq_len, precision, optimizer,
            accumulation, checkpointing, freezing / LoRA, sharding). Models: 'mlp', 'cnn', 'gpt'.
            Freezing and LoRA change the parameter, gradient and optimizer-state bytes exactly;
            the saved activations and FLOPs are still full training's (frozen layers need no
            weight gradients and frozen first layers save nothing, so less; LoRA adds rank x
            tokens values per adapted layer, a little more).
        vocab_size: GPT only, to size a model whose vocabulary is not the byte data's 256.
        processes: the processes a sharding='full' config runs on; its model-state bytes
            are then rank 0's share, exactly.

    Example:
        >>> est = estimate(RunConfig(model="mlp", batch_size=64, preset="cpu-quick"))
        >>> est.activation_bytes   # 64 samples x 5,232 B + one 4-byte loss scalar
        334852
    """
    cfg = config.resolved()
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes={processes!r} must be a whole number >= 1; pass e.g. processes=2")
    if cfg.sharding != "none" and processes < 2:
        raise ValueError(f"sharding={cfg.sharding!r} splits the model state across processes; pass processes=2 or more")
    spec_key = _spec_key(input_spec(cfg, vocab_size=vocab_size))
    trainable = tuple(getattr(cfg, name) for name in _TRAINABLE_FIELDS)
    shard = (processes, 0) if cfg.sharding != "none" else (1, 0)
    count, params, buffers, grads, opt, trained = _model_state(cfg.model, spec_key, _freeze(cfg.dims), cfg.optimizer,
                                                               trainable, shard)
    # Saved activations and FLOPs are affine in the micro-batch: measure at 1 and 2.
    one, two = (_per_micro_batch(cfg, spec_key, b) for b in (1, 2))
    b = cfg.batch_size
    at_b = [one[i] + (b - 1) * (two[i] - one[i]) for i in range(3)]
    return Estimate(
        config=cfg, parameter_count=count, parameter_bytes=params, buffer_bytes=buffers,
        gradient_bytes=grads, optimizer_state_bytes=opt, activation_bytes=at_b[0],
        temporary_bytes=max(0, at_b[2]), flops_per_step=at_b[1] * cfg.grad_accum_steps,
        vocab_size=spec_key[3], method=f"{one[3]}; micro-batches 1 and 2, scaled to {b}",
        trainable_parameter_count=trained, processes=shard[0],
    )


def accelerate_estimate(config: RunConfig, *, vocab_size: int | None = None) -> dict[str, int]:
    """🤗 accelerate's `estimate-memory` figures for this config's model, computed offline.

    Calls accelerate's own `calculate_maximum_sizes` (on the fake model) and
    `estimate_training_usage`. Its training figure is the *largest* of model, gradients,
    optimizer and step (Adam, batch size 1, no activations), not their sum.

    Returns: {'total_size', 'largest_layer', 'model', 'gradients', 'optimizer', 'step', 'training'}.
    """
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    cfg = config.resolved()
    spec_key = _spec_key(input_spec(cfg, vocab_size=vocab_size))
    with _fake_mode():
        model = _build(cfg.model, spec_key, _freeze(cfg.dims))
        total, largest = calculate_maximum_sizes(model)
    dtype = str(DTYPES[cfg.precision]).removeprefix("torch.")  # accelerate's names: float32, bfloat16, ...
    usage = estimate_training_usage(total, dtype)
    return {"total_size": int(total), "largest_layer": int(largest[0]), **{k: int(v) for k, v in usage.items()},
            "training": int(max(usage.values()))}
