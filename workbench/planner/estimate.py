"""Estimate a training step's memory and FLOPs before running it, without allocating.

`estimate(config)` replays `run()`'s training step on fake tensors (`planner.fakestep`:
shapes and dtypes, no storage, so a 3B-parameter model costs nothing) and reads off, with
the same exact counters `run()` uses:

- parameter, gradient and optimizer-state bytes: the full model, one fake optimizer step;
- saved-activation bytes of one micro-batch: `SavedActivationCounter` on the forward
  (autocast on, as accelerate does it) and the loss;
- FLOPs: `FlopCounter` on the forward and backward (recompute included);
- the peak: the most bytes live at any moment of a steady-state step (the optimizer state
  made; the previous micro-batch's logits still held by the loop), followed tensor by tensor
  with `planner.live.LiveTensors`. Not a sum of upper bounds: at accumulation 1 the
  gradients appear as the activations go; with accumulation a later micro-batch adds into
  gradients that are already there; the optimizer step has its own temporaries.

The device matters to the peak (`device=`, default the config's): a GPU rounds every
allocation to 512 bytes, runs softmax in fp32 under autocast, takes the optimizer's foreach
form and keeps two cuBLAS workspaces; a CPU holds the data loader's next batch too.

Your own module (`RunConfig(model=MyNet())`) is replayed whole on a fake copy of it
(`planner.fakemodel`): its inputs' and labels' shapes from the data, its logits' from one fake
forward. A GPT is replayed with two groups of blocks and scaled to its depth (the blocks are
identical, so every moment's live bytes are affine in the number of groups between them).

`accelerate_estimate(config)` is 🤗 accelerate's `estimate-memory` rule on the same model,
for comparison: it counts model state only (no activations) and its training figure is the
largest component, not a sum.

Example:
    >>> est = estimate(RunConfig(model="gpt", preset="cpu-quick"))  # doctest: +SKIP
    >>> est.activation_bytes, est.peak_bytes                        # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from workbench.base.arguments import ArgumentError, shown, whole_number
from workbench.base.precisions import DTYPES
from workbench.base.report import Report, counted_rows, format_bytes
from workbench.core import custom
from workbench.core.config import RunConfig, run_config
from workbench.core.data import DATASETS
from workbench.core.models import MODEL_SPECS
from workbench.core.switches import activation_checkpointing, attention, gradient_accumulation, sharding, trainable
from workbench.machine import hardware
from workbench.planner import fakecuda, fakestate, fakestep
from workbench.planner.fakemodel import ModuleKey, cannot_trace, fake_mode, own_spec_key

__all__ = ["Estimate", "accelerate_estimate", "estimate", "input_spec", "model_key"]

_BYTE_VOCAB = 256  # the byte-level language-modelling data
MOST_PROCESSES = 2**20  # a sharded plan's ranks: beyond any cluster built


@dataclass(frozen=True, slots=True)
class Estimate(Report):
    """Predicted memory of one training step (bytes) and its FLOPs, before running it.

    `counted_bytes` holds the four parts `run()` counts exactly (RunResult.memory);
    `peak_bytes` is what is live at the step's worst moment: the figure to hold against a device.
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
    flops_per_step: int
    """One optimizer step: every micro-batch's forward and backward (and recompute)."""
    peak_bytes: int
    """The most bytes live at any moment of a steady-state step on `device`."""
    peak_at: str
    """Where in the step the peak falls."""
    resident_bytes: int
    """Parameters, buffers and optimizer state as the device holds them, all step long."""
    runtime_bytes: int = 0
    """Allocations outside tensors that the peak includes: two cuBLAS workspaces on a GPU."""
    device: str = "cpu"
    vocab_size: int | None = None
    method: str = ""
    trainable_parameter_count: int | None = None
    """Parameters that train (freezing and LoRA leave the rest without gradient and optimizer state)."""
    processes: int = 1
    """Processes the model state is sharded over (sharding='full'); the model-state bytes are
    then one process's share (rank 0's, the largest)."""
    ops: fakestep.StepOps | None = field(default=None, repr=False, compare=False)
    """Every op of the step (FLOPs, bytes, dtype): what a roofline needs (see roofline_seconds)."""

    @property
    def model_state_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_state_bytes

    @property
    def counted_bytes(self) -> int:
        """Parameters + gradients + optimizer state + saved activations (run()'s exact counts)."""
        return self.model_state_bytes + self.activation_bytes

    @property
    def transient_bytes(self) -> int:
        """Live at the peak beyond the resident state: gradients, activations, batches, temporaries."""
        return self.peak_bytes - self.resident_bytes - self.runtime_bytes

    def roofline_seconds(self, peaks: dict[str, float], bandwidth: float | None) -> float:
        """A lower bound on the step's time on a device with these peak FLOP/s per dtype and
        this memory bandwidth (bytes/s): every op at the slower of the two, back to back."""
        if self.ops is None:
            raise ValueError("this Estimate carries no ops; make it with estimate()")
        return self.ops.seconds(peaks, bandwidth)

    header = ("part", "estimate")

    def rows(self) -> list[tuple[str, str]]:
        rows = [
            *counted_rows(self),
            ("buffers", format_bytes(self.buffer_bytes)),
            ("at the peak: gradients, activations, batches, temporaries", format_bytes(self.transient_bytes)),
        ]
        if self.runtime_bytes:
            rows.append(("cuBLAS workspaces", format_bytes(self.runtime_bytes)))
        return [*rows, (f"predicted peak ({self.peak_at})", format_bytes(self.peak_bytes)),
                ("FLOPs per optimizer step", f"{self.flops_per_step:.3g}")]

    def caption(self) -> str:
        c = self.config
        fewer = ""  # notebook 09's switches, when used
        if self.trainable_parameter_count is not None and self.trainable_parameter_count != self.parameter_count:
            fewer += f", {self.trainable_parameter_count:,} of them trained"
        if self.processes > 1:
            fewer += f", model state: one of {self.processes} processes' shares"
        return (f"{custom.model_name(c.model)} {self.parameter_count / 1e6:,.1f}M params{fewer}, {c.precision}, micro-batch "
                f"{c.batch_size} x {c.grad_accum_steps}, checkpointing {c.activation_checkpointing}, "
                f"on {self.device}")


def input_spec(config: RunConfig, *, vocab_size: int | None = None) -> SimpleNamespace:
    """What `models.build_model` needs to know about the data, without loading it.

    `vocab_size` overrides the byte-level GPT's 256 (e.g. 50257 to size a GPT-2-like
    model on paper; such a model cannot train on the workbench's byte data).
    """
    cfg = config.resolved()
    if not isinstance(cfg.model, str):
        return _own_input_spec(cfg, vocab_size)
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
    if vocab_size is not None:
        whole_number("vocab_size", vocab_size, least=2, most=2**31 - 1, example="vocab_size=50257")
    return SimpleNamespace(name=cfg.data, task="language_modeling", input_shape=(cfg.seq_len,),
                           num_classes=None, vocab_size=vocab_size or _BYTE_VOCAB, pad_token_id=None)


def _own_input_spec(cfg: RunConfig, vocab_size: int | None) -> SimpleNamespace:
    """Your own module's data, without loading it: one sample's inputs and labels as (shape,
    dtype), from a built-in set's catalog entry or the first items of the dataset passed in."""
    if vocab_size is not None:
        raise ValueError(f"vocab_size={vocab_size} sizes the built-in GPT; model={custom.shown_model(cfg.model)} "
                         "has its own vocabulary: leave vocab_size unset")
    data = cfg.data
    if custom.is_own_data(data):
        form = custom.read_data(data)
        inputs, labels = (form.inputs_shape, form.inputs_dtype), (form.labels_shape, torch.long)
    elif data.startswith("hub:"):
        raise ValueError(f"data={data!r}: estimate() needs the data's shape, unknown offline for a hub set; "
                         "estimate with a built-in data set or a Dataset of the same shape")
    elif (info := DATASETS[data]).task == "image_classification":
        inputs, labels = (info.input_shape, torch.float32), ((), torch.long)
    else:  # token ids; a language model's labels are the next tokens, a classifier's one label
        inputs = ((cfg.seq_len,), torch.long)
        labels = ((cfg.seq_len,) if info.task == "language_modeling" else (), torch.long)
    return SimpleNamespace(name=custom.describe_data(data), task="custom", inputs=inputs, labels=labels,
                           input_shape=inputs[0], num_classes=None, vocab_size=None, pad_token_id=None)


def _spec_key(spec: SimpleNamespace, model: Any = None) -> tuple:
    if spec.task == "custom":  # the logits' shape comes from one forward of the module on fake tensors
        return own_spec_key(model, spec.inputs, spec.labels)
    return (spec.task, tuple(spec.input_shape), spec.num_classes, spec.vocab_size)


def model_key(cfg: RunConfig) -> str | ModuleKey:
    """The model as the estimate's caches take it: its name, or a key for your own module."""
    return cfg.model if isinstance(cfg.model, str) else ModuleKey(cfg.model)


def _freeze(dims: dict[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in dims.items()))


def model_state(cfg: RunConfig, model: str | ModuleKey, spec_key: tuple, device: str,
                shard: tuple[int, int] = (1, 0)) -> fakestate.ModelState:
    """The model state `estimate()` sizes for a resolved config (cached: the same replay)."""
    return fakestate.model_state(model, spec_key, _freeze(cfg.dims), cfg.optimizer, float(cfg.weight_decay),
                                 bool(cfg.max_grad_norm), device, trainable.replay_key(cfg), shard)


def _peak(sim: fakestep.Simulation, scaled: int, micro_batches: int) -> tuple[int, str, int]:
    """(peak of the micro-batches, where it falls, live bytes after the last backward), with
    `scaled` more groups of blocks than the replay had."""
    best, where, carry, start = -1, "", 0, 0
    for micro in range(1, micro_batches + 1):
        mark = {k.rsplit(".", 1)[0]: v for k, v in sim.marks.items() if k.endswith(f".{micro}")}
        end = mark["end"].index
        # (first event, last event + 1, what each scaled group adds then)
        if scaled:
            f0, f1, done, b1, b0 = mark["F0"], mark["F1"], mark["forward_end"], mark["B1"], mark["B0"]
            forward, backward = f1.level - f0.level, b0.level - b1.level
            kept = forward - sim.let_go[micro - 1]  # after the forward, autocast's weight casts are gone
            spans = [(start, f0.index, carry), (f0.index, done.index, carry + forward),
                     (done.index, b1.index, carry + kept), (b1.index, end, carry + kept + backward)]
            carry += kept + backward
        else:
            spans = [(start, end, 0)]
        for lo, hi, extra in spans:
            for i in range(lo, hi):
                level = sim.levels[i] + scaled * extra
                if level > best:
                    best, where = level, (micro, i)
        start = end
    micro, i = where
    phase = "forward" if i < sim.marks[f"backward.{micro}"].index else "backward"
    return best, f"{phase}, {'first micro-batch' if micro == 1 else 'later micro-batch'}", sim.end_bytes + scaled * carry


def estimate(config: RunConfig, *, vocab_size: int | None = None, device: str | None = None,
             processes: int = 1) -> Estimate:
    """Predict the memory and FLOPs of one training step of `config`, allocating nothing.

    Args:
        config: the run (model, dims, micro-batch, seq_len, precision, optimizer,
            accumulation, checkpointing). Models: 'mlp', 'cnn', 'gpt', or your own module,
            replayed whole on a fake copy (its forward must not read the data's values:
            `fakemodel.CannotTrace`, a ValueError, says so where it does).
        vocab_size: GPT only, to size a model whose vocabulary is not the byte data's 256.
        device: 'cpu' or 'cuda', the device whose step to predict; default the config's.
        processes: the processes a sharding='full' config runs on; its model-state bytes are
            then rank 0's share, exactly. Freezing and LoRA change the parameter, gradient and
            optimizer-state bytes exactly; the replayed step (activations, FLOPs, peak) is still
            full training's.

    Example:
        >>> est = estimate(RunConfig(model="mlp", batch_size=64, preset="cpu-quick"))
        >>> est.activation_bytes   # 64 samples x 5,232 B + one 4-byte loss scalar
        334852
    """
    cfg = run_config(config)
    device = device or hardware.resolve_device(cfg.device)
    if device not in ("cpu", "cuda"):
        raise ArgumentError(f"device={shown(device)}: estimate() models 'cpu' or 'cuda'")
    whole_number("processes", processes, most=MOST_PROCESSES, example="processes=2")
    if cfg.sharding != "none" and processes < 2:
        raise ValueError(f"sharding={cfg.sharding!r} splits the model state across processes; pass processes=2 or more")
    model = model_key(cfg)
    spec_key = _spec_key(input_spec(cfg, vocab_size=vocab_size), model)
    dims = _freeze(cfg.dims)
    # What each switch adds to the replay (workbench/switches): what trains, the share of a
    # sharded state, the groups of blocks checkpointing replays, the micro-batches accumulation does.
    shard = sharding.replay_shard(cfg, processes)
    group, replayed, scaled = activation_checkpointing.replay_groups(cfg)
    micro_batches = gradient_accumulation.replayed_micro_batches(cfg)
    try:
        state = model_state(cfg, model, spec_key, device, shard)
        if cfg.model == "gpt":  # the replayed layers, and how they compute attention
            dims = _freeze({**cfg.dims, "n_layer": replayed, **attention.replay_dims(cfg)})
        sim = fakestep.simulate(model, spec_key, dims, cfg.precision, cfg.activation_checkpointing,
                                batch=cfg.batch_size, micro_batches=micro_batches, device=device, group=group)
    except Exception as error:
        if isinstance(model, str) or isinstance(error, ValueError):
            raise
        raise cannot_trace(model.name, error) from None  # your module's step, beyond its first forward
    flops, saved = sim.flops, sim.saved_bytes
    if scaled:  # what one more group adds: its forward (F0 to F1) and its backward (B1 to B0)
        f0, f1, b1, b0 = (sim.marks[f"{k}.1"] for k in ("F0", "F1", "B1", "B0"))
        flops += scaled * ((f1.flops - f0.flops) + (b0.flops - b1.flops))
        saved += scaled * (f1.saved - f0.saved)
    peak, where, end = _peak(sim, scaled, micro_batches)
    if end + state.optimizer_step_bytes > peak:
        peak, where = end + state.optimizer_step_bytes, "optimizer step"
    runtime = 0
    if device == "cuda":  # the forward's thread and autograd's each have a cuBLAS handle and workspace
        info = hardware.gpu_info()
        runtime = 2 * fakecuda.cublas_workspace_bytes(info.compute_capability if info else None)
    groups = []
    for micro, ops in enumerate(sim.ops, 1):  # one scaled group's ops: its forward and its backward
        m = {k: sim.marks.get(f"{k}.{micro}") for k in ("F0", "F1", "B1", "B0")}
        groups.append(ops[m["F0"].op:m["F1"].op] + ops[m["B1"].op:m["B0"].op] if scaled else ())
    step_ops = fakestep.StepOps(sim.ops, tuple(groups), scaled, cfg.grad_accum_steps, state.optimizer_ops)
    method = (f"{replayed} of {cfg.dims.get('n_layer', 4)} layers replayed on fake tensors, scaled"
              if cfg.model == "gpt" else "whole model replayed on fake tensors")
    return Estimate(
        config=cfg, parameter_count=state.parameter_count, parameter_bytes=state.parameter_bytes,
        buffer_bytes=state.buffer_bytes, gradient_bytes=state.gradient_bytes,
        optimizer_state_bytes=state.optimizer_state_bytes, activation_bytes=saved,
        flops_per_step=flops * cfg.grad_accum_steps, peak_bytes=state.resident_bytes + peak + runtime,
        peak_at=where, resident_bytes=state.resident_bytes, runtime_bytes=runtime, device=device,
        vocab_size=None if spec_key[0] == "custom" else spec_key[3], method=f"{method}; steady-state step on {device}", ops=step_ops,
        trainable_parameter_count=state.trainable_parameter_count, processes=shard[0],
    )


def accelerate_estimate(config: RunConfig, *, vocab_size: int | None = None) -> dict[str, int]:
    """🤗 accelerate's `estimate-memory` figures for this config's model, computed offline.

    Calls accelerate's own `calculate_maximum_sizes` (on the fake model) and
    `estimate_training_usage`. Its training figure is the *largest* of model, gradients,
    optimizer and step (Adam, batch size 1, no activations), not their sum.

    Returns: {'total_size', 'largest_layer', 'model', 'gradients', 'optimizer', 'step', 'training'}.
    """
    # lazy: accelerate's estimator loads half a second of modules; only this comparison needs it
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    cfg = config.resolved()
    key = model_key(cfg)
    spec_key = _spec_key(input_spec(cfg, vocab_size=vocab_size), key)
    with fake_mode():
        model = fakestate.build(key, spec_key, _freeze(cfg.dims))
        total, largest = calculate_maximum_sizes(model)
    dtype = str(DTYPES[cfg.precision]).removeprefix("torch.")  # accelerate's names: float32, bfloat16, ...
    usage = estimate_training_usage(total, dtype)
    return {"total_size": int(total), "largest_layer": int(largest[0]), **{k: int(v) for k, v in usage.items()},
            "training": int(max(usage.values()))}
