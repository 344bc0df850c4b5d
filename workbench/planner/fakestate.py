"""The model and its optimizer on fake tensors: the bytes of the model state, exactly.

`model_state(...)` builds the model on fake tensors (`build`), gives every trainable parameter
its gradient, makes the optimizer's state with a first `step()`, and replays a second step
under `planner.live.LiveTensors`: parameters, buffers, gradients and optimizer state to the
byte, and the peak of that step's temporaries (AdamW's foreach form on a GPU holds a square
root of every second moment at once, its per-parameter form on a CPU one parameter's worth).
Freezing, LoRA and sharding change which parameters train and which rows a process holds.

Example:
    >>> state = model_state("mlp", ("image_classification", (1, 28, 28), 10, None), (("hidden", (64,)),),
    ...                     "adamw", 0.01, False, "cpu")
    >>> state.parameter_count, state.optimizer_state_bytes  # 50,890 parameters; two fp32 moments and a step each
    (50890, 407136)
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException

from workbench.core.config import RunConfig
from workbench.core.measure.counters import _held, gradient_bytes, optimizer_state_bytes, parameter_bytes, shard_rows
from workbench.core.measure.flops import FlopCounter
from workbench.core.models import build_model
from workbench.core.switches.attention import set_attention
from workbench.core.switches.optimizer import make_optimizer
from workbench.core.switches.trainable import ALL_TRAIN, FIELDS, freeze_parts, lora_shapes
from workbench.planner.fakecuda import device_bytes
from workbench.planner.fakemodel import ModuleKey, fake_copy, fake_mode
from workbench.planner.live import CUDA_BLOCK_BYTES, LiveTensors

__all__ = ["ModelState", "build", "model_state"]


def build(model_name: str | ModuleKey, spec_key: tuple, dims: tuple) -> nn.Module:
    """The model on fake tensors (call inside `fake_mode()`): a built-in one by name, or a copy
    of the learner's module (`ModuleKey`). `dims` may carry the GPT's `attention` ('explicit' or
    'sdpa', RunConfig.attention) beside its sizes."""
    if isinstance(model_name, ModuleKey):
        return fake_copy(model_name.module())

    task, shape, classes, vocab = spec_key
    spec = SimpleNamespace(name="estimate", task=task, input_shape=shape, num_classes=classes,
                           vocab_size=vocab, pad_token_id=None)
    sizes = dict(dims)
    attention = sizes.pop("attention", "explicit")
    return set_attention(build_model(model_name, data=spec, dims=sizes), attention)


def _storages(tensors: Any) -> dict[int, int]:
    return {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}


class ModelState(NamedTuple):
    """The whole model's state (exact bytes) and what its optimizer step adds on top."""

    parameter_count: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    resident_bytes: int
    """Parameters + buffers + optimizer state as the device holds them (CUDA: in 512-byte
    blocks, and without the optimizer's `step` counters, which torch keeps on the host)."""
    gradient_device_bytes: int
    optimizer_step_bytes: int
    """Peak of the optimizer step's temporaries (clipping included), gradients present."""
    optimizer_ops: tuple[tuple[int, int, str], ...] = ()
    """(FLOPs, bytes, dtype) of each op of that step."""
    trainable_parameter_count: int | None = None
    """Parameters that train (freezing and LoRA leave the rest without gradient and state)."""
    held_device_bytes: int = 0
    """The parameters and buffers alone, as the device holds them (resident_bytes less the
    optimizer state): the two parts a memory snapshot shows (`planner.predicted_snapshot`)."""


@functools.lru_cache(maxsize=64)
def model_state(model_name: str, spec_key: tuple, dims: tuple, optimizer: str, weight_decay: float,
                clip: bool, device: str, trainable: tuple = ALL_TRAIN, shard: tuple[int, int] = (1, 0)) -> ModelState:
    """Parameter, buffer, gradient and optimizer-state bytes of the full model, and its
    optimizer step's temporaries in steady state (the second step: the state exists).

    `trainable`: the values of switches.trainable.FIELDS (freezing, LoRA) applied; `shard` = (processes,
    rank): the bytes that rank holds when the model state is sharded (sharding='full')."""
    if optimizer == "adamw8bit":
        # Its 256-entry lookup tables are built from Python lists, which fake tensors cannot
        # be: build them (torchao caches them) before entering the fake mode.
        from workbench.machine.torchao_support import import_torchao

        tables = import_torchao("torchao.optim.subclass_8bit")
        tables.get_qmap_signed(), tables.get_qmap_unsigned()
    foreach = device == "cuda"  # torch's default: foreach on CUDA tensors, per parameter on CPU ones
    with fake_mode():
        model = build(model_name, spec_key, dims)
        every = _parameters_to_hold(model, SimpleNamespace(**dict(zip(FIELDS, trainable))))
        count = sum(p.numel() for p in every)  # LoRA's adapters included, as run() counts them
        trained = sum(p.numel() for p in every if p.requires_grad)
        processes, rank = shard
        if processes > 1:  # one process's shard of every parameter (FSDP2: rows ceil(d/N) per rank)
            every = [nn.Parameter(p.new_zeros(shard_rows(p.shape[0], processes, rank), *p.shape[1:]), p.requires_grad)
                     for p in every]
        held = nn.ParameterList(every)
        params = [p for p in held if p.requires_grad]
        for p in params:  # what a backward leaves: one gradient per trainable parameter
            p.grad = torch.zeros_like(p)
        # (only the optimizer's fields matter here: a learner's module stands in as the MLP)
        named = model_name if isinstance(model_name, str) else "mlp"
        opt = make_optimizer(held, RunConfig(model=named, optimizer=optimizer, weight_decay=weight_decay).resolved())
        for group in opt.param_groups:
            group["foreach"] = foreach
        resident, step_bytes, ops = _optimizer_steps(opt, params, [*held, *model.buffers()], clip=clip,
                                                     foreach=foreach, device=device)
        held_bytes = sum(device_bytes(n, device) for n in _storages([*held, *model.buffers()]).values())
        return ModelState(
            parameter_count=count, parameter_bytes=parameter_bytes(held),
            buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
            gradient_bytes=gradient_bytes(held, expected=True), optimizer_state_bytes=optimizer_state_bytes(opt),
            resident_bytes=resident, gradient_device_bytes=sum(device_bytes(p.numel() * p.element_size(), device)
                                                               for p in params),
            optimizer_step_bytes=step_bytes, optimizer_ops=ops, trainable_parameter_count=trained,
            held_device_bytes=held_bytes,
        )


def _parameters_to_hold(model: nn.Module, choice: SimpleNamespace) -> list[nn.Parameter]:
    """The model's parameters with freezing applied, or, with LoRA, every weight frozen plus the
    adapters: peft cannot wrap fake tensors (its .to() swaps them), so LoRA's A and B matrices
    are made here, of exactly the shapes peft adds (trainable.lora_shapes)."""
    every = list(model.parameters())
    if choice.lora_rank:
        model.requires_grad_(False)
        every += [nn.Parameter(torch.zeros(shape)) for shape in
                  lora_shapes(model, rank=choice.lora_rank, targets=choice.lora_targets)]
    else:
        freeze_parts(model, choice.freeze, first_layers=choice.freeze_layers)
    return every


def _optimizer_steps(opt: torch.optim.Optimizer, params: list[nn.Parameter], resident: list[torch.Tensor], *,
                     clip: bool, foreach: bool, device: str) -> tuple[int, int, tuple[tuple[int, int, str], ...]]:
    """Two optimizer steps: the first makes the state, the second (clipping first) is replayed;
    (resident bytes of `resident` and the state, peak of the second step's temporaries, its ops)."""
    live = LiveTensors(round_to=CUDA_BLOCK_BYTES if device == "cuda" else 1)
    ops = FlopCounter(record_ops=True)
    try:
        opt.step()  # PyTorch optimizers create their state lazily, at the first step
        resident_bytes = _resident_bytes(resident, opt, device, host_steps=device == "cuda")
        with live, ops:
            if clip:
                torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=foreach)
            opt.step()
    except DataDependentOutputException:
        # Adafactor reads a norm with .item(), which a fake tensor cannot answer; it has made
        # every parameter's state by then (counted only if so). Its step's temporaries are not.
        if len(opt.state) < len(params):
            raise
        resident_bytes = _resident_bytes(resident, opt, device, host_steps=False)
    return resident_bytes, live.peak_bytes, tuple(ops.ops or ())


def _resident_bytes(tensors: list[torch.Tensor], opt: torch.optim.Optimizer, device: str, *, host_steps: bool) -> int:
    """Device bytes of `tensors` and of the optimizer's state, each storage once (`host_steps`:
    without the `step` counters, which torch keeps on the host)."""
    state = [leaf for s in opt.state.values() for k, v in s.items()
             if isinstance(v, torch.Tensor) and not (host_steps and k == "step") for leaf in _held(v)]
    return (sum(device_bytes(n, device) for n in _storages(tensors).values())
            + sum(device_bytes(n, device) for n in _storages(state).values()))
