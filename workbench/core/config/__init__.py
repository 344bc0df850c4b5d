"""RunConfig: every knob of a training run, checked before anything runs.

Each technique is a field here and a visible line in `train.py`, never a subclass.
Fields left as None take the preset's value (see `presets.py`); `resolved()`
returns the config with every value filled in, which is what `run()` uses and
what results record. Bad values raise `ConfigError`, one line that names the
field and the fix, before any data is loaded or memory allocated.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.data import DataLoader, Dataset

from workbench.base.arguments import instance
from workbench.base.errors import ConfigError
from workbench.base.precisions import PRECISIONS, scaler_kwargs
from workbench.core import custom
from workbench.core.config.checks import check_types, check_values, one_of
from workbench.core.data import DATASETS
from workbench.core.models import MODELS
from workbench.core.presets import PRESETS, get_preset
from workbench.core.switches import activation_checkpointing, attention, compiling, memory_format, qat, sharding
from workbench.core.switches.optimizer import IMPLEMENTATIONS, OPTIMIZERS
from workbench.core.switches.trainable import FREEZE_CHOICES, LORA_TARGETS
from workbench.machine import cpu_class, hardware

__all__ = ["ConfigError", "RunConfig", "field_choices"]

# The choices of each named field, as types: validation, the type checks and the CLI's choices
# read them off the annotations (`field_choices`, `field_types`). The registries (models,
# optimizers, precisions, presets, and each switch's in workbench/switches) are the one place
# those names are written.
ModelName = Literal[MODELS]
OptimizerName = Literal[tuple(OPTIMIZERS)]
PrecisionName = Literal[PRECISIONS]
PresetName = Literal[tuple(PRESETS)]
Checkpointing = Literal[tuple(activation_checkpointing.CHOICES)]
QATScheme = Literal[tuple(qat.SCHEMES)]
Device = Literal["auto", "cpu", "cuda"]
FreezeChoice = Literal[tuple(FREEZE_CHOICES)]
LoraTargets = Literal[tuple(LORA_TARGETS)]
Sharding = Literal[sharding.CHOICES]
CompileMode = Literal[compiling.COMPILE_MODES]
Attention = Literal[attention.CHOICES]
MemoryFormat = Literal[memory_format.CHOICES]
OptimizerImpl = Literal[tuple(IMPLEMENTATIONS)]


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """One training run. Unset (None) fields take the preset's value.

    Example:
        >>> cfg = RunConfig(model="mlp", precision="bf16", steps=10)
        >>> cfg.resolved().batch_size  # from the preset in force
        64
    """

    model: ModelName | torch.nn.Module = "mlp"
    """'mlp', 'cnn' (images), 'gpt' (byte-level language model), 'minilm' (pretrained), or your own
    torch.nn.Module: `logits = model(batch["inputs"])`, trained with cross-entropy over the logits'
    last dimension (checked on two samples before training). Each run trains a deep copy, so every
    arm of a comparison starts from the same weights and your module is never changed (run(...,
    keep_model=True) hands back the trained copy). Switches that reach into a built-in model's
    architecture (dims, activation_checkpointing, freeze, lora_rank, sharding, attention='sdpa',
    save_state_dir, resume_from) are refused for a module; the rest work."""
    data: str | Dataset | DataLoader | tuple[Dataset, Dataset] | None = None
    """A built-in data set (see data.DATASETS) or 'hub:<name>'; None: the model's default. With your
    own model also: a map-style torch Dataset whose items are {"inputs": tensor, "labels": tensor}
    dicts or (inputs, labels) pairs; a (train, test) tuple of them (test: the held-out set
    eval_samples draws from, in order); or a DataLoader, whose dataset, batch_size (when batch_size
    is unset), num_workers and collate_fn are kept: the run makes its own seeded DataLoader from them,
    so every arm of a comparison sees the same order (its sampler and shuffle are not used)."""
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
    """Which blocks (gpt, minilm) recompute their activations in backward; what each choice keeps:
    switches.activation_checkpointing.CHOICES ('selective': the matmuls' outputs). True means 'all'."""
    max_grad_norm: float | None = None
    """Clip the gradient norm to this before each optimizer step; None: no clipping."""
    qat: QATScheme = "none"
    """Quantization-aware training: 'int8', 'int4', 'int3' or 'int2' fake-quantizes Linear weights
    to that many bits (per output channel) and activations to int8 in training (torchao);
    convert after with workbench.lessons.quantization.convert_qat. 'none': plain training."""
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
    memory_format: MemoryFormat = "contiguous"
    """cnn (or your module with nn.Conv2d): 'channels_last' lays the 4-D weights and activations out
    as N,H,W,C, the layout oneDNN and cuDNN convolve in natively; 'contiguous': torch's N,C,H,W."""
    optimizer_impl: OptimizerImpl = "default"
    """How the optimizer runs its update: 'for-loop' (parameter by parameter), 'foreach' (each op
    over all parameters at once), 'fused' (one kernel) or 'default' (torch's choice: foreach on
    CUDA, for-loop on CPU). The same update every way."""
    tf32: bool = False
    """CUDA (Ampere or newer): fp32 matmuls and convolutions on TF32 tensor cores (10-bit mantissa,
    fp32 range) during training; evaluation stays full fp32. Not available on a CPU."""

    def __post_init__(self) -> None:
        check_types(self, {f.name: field_types(f.name) for f in dataclasses.fields(self)})
        check_values(self, _resolve(self), field_choices)

    def resolved(self) -> RunConfig:
        """This config with every None filled from the preset and defaults.

        Epochs become optimizer steps here (and `epochs` None), so the resolved
        config says exactly how many steps the run takes.
        """
        values = _resolve(self)
        check_values(self, values, field_choices)
        values["epochs"] = None
        return RunConfig(**values)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain values (JSON-able once resolved). A module or a dataset is described
        in words ('MyNet (12,345 parameters)', 'TensorDataset of 1,000 samples'), not copied."""
        values = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)
                  if f.name not in ("model", "data")}
        return {"model": custom.describe_model(self.model), "data": custom.describe_data(self.data), **values}


# What each kind of annotation accepts at run time, and how an error says it. A float field
# takes an int too; bool is kept apart from int, because True == 1 would pass as a batch size.
_KINDS: dict[Any, tuple[tuple[type, ...], str]] = {
    int: ((int,), "a whole number"), float: ((int, float), "a number"), bool: ((bool,), "True or False"),
    str: ((str,), "text"), dict: ((dict,), "a dict"), tuple: ((tuple,), "(train, test) Datasets"),
    os.PathLike: ((os.PathLike,), "a path"), type(None): ((type(None),), "None"),
    torch.nn.Module: ((torch.nn.Module,), "your torch.nn.Module"), Dataset: ((Dataset,), "a torch Dataset"),
    DataLoader: ((DataLoader,), "a DataLoader"),
}


def run_config(config: Any, *, example: str = "RunConfig(model='mlp')") -> RunConfig:
    """`config` resolved: what each public function that takes a RunConfig (run, estimate, plan,
    plan_parallel, training_parts) starts with; a dict, a name or None is refused in one line."""
    instance("config", config, RunConfig, example)
    return config.resolved()


@functools.cache
def field_types(name: str) -> tuple[tuple[type, ...], str]:
    """(the types a RunConfig field accepts, what to write instead), read off its annotation;
    a Literal's words are its choices, so they are the registry's.

    Example:
        >>> field_types("steps")
        ((<class 'int'>, <class 'NoneType'>), 'a whole number or None')
    """
    hint = typing.get_type_hints(RunConfig)[name]
    parts = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    accepted: list[type] = []
    words: list[str] = []
    for part in parts:
        if typing.get_origin(part) is Literal:
            accepted.append(str)
            words += [repr(n) for n in typing.get_args(part)]
        else:
            kinds, said = _KINDS[typing.get_origin(part) or part]
            accepted += kinds
            words.append(said)
    return tuple(dict.fromkeys(accepted)), ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]


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


def _one_of(name: str, value: str) -> None:
    one_of(name, value, field_choices(name))


def _train_count(data: Any) -> int:
    try:
        return custom.train_count(data, None) or 1
    except Exception:  # a dataset of the wrong form: check_values names what is wrong with it
        return 1


def _resolve(cfg: RunConfig) -> dict[str, Any]:
    """Fill every None from the preset; assumes types are already checked."""
    if cfg.preset is not None:
        _one_of("preset", cfg.preset)
    own_model = isinstance(cfg.model, torch.nn.Module)
    if not own_model:
        _one_of("model", cfg.model)
    if isinstance(cfg.data, str) and not cfg.data.removeprefix("hub:").strip():
        raise ConfigError(f"data={cfg.data!r} names no data set; pass a name such as 'mnist' or 'hub:<name>', "
                          "or None for the model's default")
    if own_model and cfg.data is None:
        raise ConfigError(f"model={custom.shown_model(cfg.model)} needs data=: pass a torch Dataset, (train, test) "
                          "Datasets, a DataLoader, or a built-in name such as 'mnist'")
    spec = custom.model_spec(cfg.model)
    try:
        preset = get_preset(cfg.preset)
        cpu_class.presented_class()  # read by the run's decisions: a bad value refused here, before anything runs
    except ValueError as error:  # $WORKBENCH_PRESET names no preset, or $WORKBENCH_CPU_CLASS no class
        raise ConfigError(str(error)) from None
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    values["preset"] = preset.name
    values["data"] = data = spec.default_data if cfg.data is None else cfg.data  # (an empty Dataset is falsy)
    values["lr"] = spec.default_lr if cfg.lr is None else cfg.lr
    pick = lambda given, default: default if given is None else given  # noqa: E731 (0 is a value)
    key = custom.preset_key(cfg.model, data)  # a custom module: the built-in model of its data's kind
    loader = data if isinstance(data, DataLoader) else None  # its batch size and workers, unless given
    values["batch_size"] = pick(cfg.batch_size, loader.batch_size if loader else preset.batch_size[key])
    if cfg.batch_size is None and custom.is_own_data(data) and not loader:  # a small dataset: one batch at most
        values["batch_size"] = min(values["batch_size"], max(1, _train_count(data)))
    values["num_workers"] = cfg.num_workers or (loader.num_workers if loader else 0)
    text_data = isinstance(data, str) and (not own_model or data not in DATASETS
                                           or DATASETS[data].task != "image_classification")
    values["seq_len"] = pick(cfg.seq_len, preset.seq_len.get(key) if text_data else None)
    values["log_every"] = pick(cfg.log_every, preset.log_every)
    # A plain dataset has no held-out split: nothing to evaluate unless asked (and checked).
    held_out = not custom.is_own_data(data) or isinstance(data, tuple)
    values["eval_samples"] = pick(cfg.eval_samples, preset.max_eval_samples if held_out else 0)
    values["dims"] = dict(cfg.dims or {}) if own_model else {**preset.dims[cfg.model], **(cfg.dims or {})}
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
