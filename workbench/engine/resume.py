"""Save a run's whole training state and resume it exactly where it stopped.

accelerate's `save_state` / `load_state` keep the model, the optimizer (AdamW's
moments), the GradScaler, accelerate's step counter and every RNG (Python, NumPy,
torch CPU and CUDA, per process). A run also has a position that accelerate does
not know about, and without it a resumed run would quietly differ:
- where the data order is: the epoch, the batches already drawn in it, and the
  shuffle generator's state when the epoch began (the resumed run replays that
  shuffle and skips the batches it has seen, with accelerate's `skip_first_batches`);
- the loop's history: step, the loss curve so far, the exact counts measured at step 1.
That goes in `workbench_loop.json` beside accelerate's files. On a CPU the resumed
loss curve is then bit-identical to a run that never stopped (the notebook and the
tests assert it).

Runs save to `<save_state_dir>/step_000020/`; `resume_from` takes such a folder, or
`save_state_dir` itself for its latest step. `RunConfig(save_state_dir=..., save_every=...,
resume_from=...)` are the switches; `train.py` calls `save` and `restore`.

Example:
    >>> half = run(RunConfig(model="mlp", steps=10, save_state_dir="ckpt"))  # doctest: +SKIP
    >>> rest = run(RunConfig(model="mlp", steps=20, resume_from="ckpt"))  # doctest: +SKIP
    >>> rest.losses == run(RunConfig(model="mlp", steps=20)).losses  # doctest: +SKIP
    True
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.core.config import ConfigError, RunConfig

LOOP_FILE = "workbench_loop.json"
# Config fields that decide the model's shapes, the data order or the update rule:
# resuming with another value would not continue the same run.
MUST_MATCH = ("model", "data", "dims", "seq_len", "batch_size", "grad_accum_steps", "optimizer",
              "lr", "weight_decay", "precision", "seed", "qat")
# The loop's history (loop_state.LoopState attributes) that a resumed run carries on.
LOOP_FIELDS = ("step", "loss_steps", "losses", "activation_bytes", "flops_per_step",
               "skipped_steps", "loss_scales")


@dataclass(slots=True)
class DataPosition:
    """Where a run is in its data order."""

    epoch: int = 0
    batches_in_epoch: int = 0
    """Micro-batches this process has drawn in the current epoch."""
    shuffle_state: torch.Tensor | None = None
    """The shuffle generator's state when this epoch began."""


def _shuffle_generator(loader: Any) -> torch.Generator | None:
    """The generator that shuffles `loader` (shared by all processes: accelerate syncs it)."""
    from accelerate.data_loader import get_sampler

    return getattr(get_sampler(loader), "generator", None)


def epoch_loader(accelerator: Any, loader: Any, position: DataPosition) -> Any:
    """The loader for the epoch at `position`: the whole epoch, or after a resume
    the rest of it (the same shuffle, the batches already trained on skipped)."""
    generator = _shuffle_generator(loader)
    if position.batches_in_epoch == 0:
        if generator is not None:
            position.shuffle_state = generator.get_state()
        epoch = loader
    else:
        # The skipped batches are not loaded, but the shuffle draws the same random
        # numbers, so the generator leaves this epoch as an unbroken run's would.
        epoch = accelerator.skip_first_batches(loader, position.batches_in_epoch)
    if hasattr(epoch, "set_epoch"):
        epoch.set_epoch(position.epoch)
    return epoch


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def find(path: str | Path) -> Path:
    """The checkpoint folder `path` names: itself, or its latest `step_*` folder."""
    path = Path(path)
    if (path / LOOP_FILE).is_file():
        return path
    steps = sorted(p for p in path.glob("step_*") if (p / LOOP_FILE).is_file())
    if not steps:
        raise ConfigError(f"resume_from={str(path)!r} holds no saved run (no {LOOP_FILE}); "
                          "pass a folder written by save_state_dir")
    return steps[-1]


def save(accelerator: Any, cfg: RunConfig, state: Any) -> Path:
    """Save everything needed to continue this run; every process must call it."""
    path = step_dir(cfg.save_state_dir, state.step)
    # Model, optimizer, GradScaler, accelerate's step counter, each process's RNGs.
    accelerator.save_state(str(path))
    if accelerator.is_main_process:
        position = state.data_position
        loop = {name: getattr(state, name) for name in LOOP_FIELDS if hasattr(state, name)}
        record = {
            "loop": loop,
            "data": {"epoch": position.epoch, "batches_in_epoch": position.batches_in_epoch,
                     "shuffle_state": _encode(position.shuffle_state)},
            "num_processes": accelerator.num_processes,
            "config": {name: getattr(cfg, name) for name in MUST_MATCH},
        }
        (path / LOOP_FILE).write_text(json.dumps(record, indent=1))
    accelerator.wait_for_everyone()  # the folder is complete before anyone reads it
    return path


def restore(accelerator: Any, cfg: RunConfig, state: Any, loader: Any) -> Path:
    """Load a saved run into this one (after accelerator.prepare); checks it fits first."""
    path = find(cfg.resume_from)
    record = json.loads((path / LOOP_FILE).read_text())
    saved = record["config"]
    for name in MUST_MATCH:
        mine = getattr(cfg, name)
        theirs = saved.get(name)
        if isinstance(mine, dict):  # JSON turned tuples into lists
            mine = json.loads(json.dumps(mine))
        if mine != theirs:
            raise ConfigError(f"resume_from={str(path)!r} was saved with {name}={theirs!r}, this run has "
                              f"{name}={mine!r}; resume with the same {name}")
    if record["num_processes"] != accelerator.num_processes:
        raise ConfigError(f"resume_from={str(path)!r} was saved by {record['num_processes']} processes; "
                          f"resume on {record['num_processes']} (this run has {accelerator.num_processes})")
    loop = record["loop"]
    if loop["step"] >= cfg.steps:
        raise ConfigError(f"resume_from={str(path)!r} is at step {loop['step']} already; "
                          f"pass steps > {loop['step']}")
    accelerator.load_state(str(path))
    for name, value in loop.items():
        setattr(state, name, value)
    data = record["data"]
    position = state.data_position
    position.epoch, position.batches_in_epoch = data["epoch"], data["batches_in_epoch"]
    position.shuffle_state = _decode(data["shuffle_state"])
    generator = _shuffle_generator(loader)
    if generator is not None and position.shuffle_state is not None:
        generator.set_state(position.shuffle_state)  # the shuffle as the saved epoch began
    return path


def _encode(tensor: torch.Tensor | None) -> str | None:
    return None if tensor is None else base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


def _decode(text: str | None) -> torch.Tensor | None:
    if text is None:
        return None
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()
