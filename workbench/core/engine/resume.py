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
resume_from=...)` are the switches; `train.py` calls `check` and `check_folder` before it
builds anything, `restore` and `check_disk_space` after `prepare()`, and `save` at log steps.

Nothing is lost or overwritten:
- before step 1 the folder is made, written to, and checked for space and for other runs'
  steps: each run has an id (a resumed run keeps its own), and a run never saves into a
  folder holding another run's steps, nor over a later step of its own;
- a save is written to `step_N.partial-<run>` and renamed when whole, with every file's size
  and SHA-256 in the loop file; a save the disk has no space for is refused before it is written,
  and one that fails however it fails (a full disk, as safetensors' or torch's error; no
  permission) removes its partial folder and raises SaveError in one line naming the
  folder, the cause and the last complete save (the run's result so far is `last_result()`);
- `check` verifies every file against what was saved before any is loaded, loads the RNG
  states itself (accelerate skips a bad one quietly), and notes where the resume cannot be
  exact (another max_grad_norm, device or torch): they become the run's warnings.

Example:
    >>> half = run(RunConfig(model="mlp", steps=10, save_state_dir="ckpt"))  # doctest: +SKIP
    >>> rest = run(RunConfig(model="mlp", steps=20, resume_from="ckpt"))  # doctest: +SKIP
    >>> rest.losses == run(RunConfig(model="mlp", steps=20)).losses  # doctest: +SKIP
    True
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.data_loader import get_sampler
from accelerate.utils import broadcast_object_list, load

from workbench.base.report import format_bytes
from workbench.core.config import ConfigError, RunConfig
from workbench.core.measure.counters import parameter_bytes

LOOP_FILE = "workbench_loop.json"
_STEP = re.compile(r"step_(\d{6,})")
# Config fields that decide the model's shapes, the data order or the update rule:
# resuming with another value would not continue the same run.
MUST_MATCH = ("model", "data", "dims", "seq_len", "batch_size", "grad_accum_steps", "optimizer",
              "lr", "weight_decay", "precision", "seed", "qat")
# Fields a resumed run may change, though its curve then differs from an unbroken run's (said).
CHANGES_THE_CURVE = ("max_grad_norm", "grad_scaler")
# The loop's history (its recorder's attributes: measure.recorder.Recorder) that a resumed run carries on.
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
    """The generator that shuffles `loader` (shared by all processes: accelerate syncs it). With
    several processes the sampler sits behind accelerate's BatchSamplerShard, where `get_sampler`
    finds none: the generator is then the loader's `synchronized_generator` (measured: without it
    no shuffle state was saved, and a 2-process resume past the first epoch drew another order)."""
    synced = getattr(loader, "synchronized_generator", None)
    return synced if synced is not None else getattr(get_sampler(loader), "generator", None)


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


def _step_of(folder: Path) -> int | None:
    match = _STEP.fullmatch(folder.name)
    return int(match.group(1)) if match else None


def _steps(root: Path, *, complete: bool = True) -> list[Path]:
    """The step_* folders under `root` (with their loop file when `complete`), oldest first.
    Saves in progress (`step_N.partial-<run>`) are never among them."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _step_of(p) is not None and p.is_dir()]
    return sorted((p for p in found if not complete or (p / LOOP_FILE).is_file()), key=_step_of)


def find(path: str | Path) -> Path:
    """The save folder `path` names: itself, or its latest `step_*` folder."""
    path = Path(path)
    if (path / LOOP_FILE).is_file():
        return path
    steps = _steps(path)
    if not steps:
        raise ConfigError(f"resume_from={str(path)!r} holds no saved run (no {LOOP_FILE}); "
                          "pass a folder written by save_state_dir")
    return steps[-1]


def _instead(path: Path) -> str:
    """What to do when the save in `path` cannot be used: the save before it, if any."""
    step = _step_of(path)
    earlier = [p for p in _steps(path.parent) if step is not None and _step_of(p) < step]
    if earlier:
        return f"resume from {str(earlier[-1])!r} (the save before it), or start afresh without resume_from"
    return "start afresh without resume_from (no earlier save is there)"


def _damaged(path: Path, name: str, what: str) -> ConfigError:
    return ConfigError(f"{name} in {str(path)!r} {what}; {_instead(path)}")


def _read_record(path: Path) -> dict[str, Any]:
    """The loop file of a save, checked for what restore() reads from it."""
    try:
        record = json.loads((path / LOOP_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:  # JSONDecodeError is a ValueError
        raise _damaged(path, LOOP_FILE, f"cannot be read ({type(error).__name__}: {error})") from None
    loop = record.get("loop") if isinstance(record, dict) else None
    shape_ok = (isinstance(loop, dict) and isinstance(record.get("data"), dict) and isinstance(record.get("config"), dict)
                and isinstance(record.get("num_processes"), int) and isinstance(loop.get("step"), int)
                and loop["step"] >= 0 and all(isinstance(loop.get(k, []), list) for k in ("losses", "loss_steps")))
    if not shape_ok:
        raise _damaged(path, LOOP_FILE, "is damaged (its loop, data or config entries are missing or malformed)")
    return record


def _digest(file: Path) -> str:
    with open(file, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _verify_files(path: Path, record: dict[str, Any], rank: int) -> None:
    """Every file the save was written with is there, whole and unchanged (sizes and
    SHA-256 written at save time), so a damaged one is named before anything loads it."""
    files = record.get("files") or {}  # absent in saves written before it was recorded
    needed = {f"random_states_{rank}.pkl": None, **{name: info for name, info in files.items()}}
    for name, info in needed.items():
        file = path / name
        if not file.is_file():
            raise _damaged(path, name, "is missing" + (": the RNG states, without which the resume cannot be exact"
                                                      if name.startswith("random_states") else ""))
        if info is None:
            continue
        size, digest = info
        if file.stat().st_size != size:
            raise _damaged(path, name, f"is truncated or changed ({file.stat().st_size:,} bytes, saved {size:,})")
        if _digest(file) != digest:
            raise _damaged(path, name, "is damaged (its SHA-256 differs from the one saved with it)")


def _rng_notes(path: Path, rank: int) -> list[str]:
    """accelerate skips an RNG file it cannot load, quietly, and the resume is then not exact:
    load it here first, so a bad one is an error and a missing CUDA state is said."""
    name = f"random_states_{rank}.pkl"
    try:
        states = load(path / name)
    except Exception as error:  # any unpickling failure
        raise _damaged(path, name, f"cannot be loaded ({type(error).__name__}); without it the resume cannot be "
                                   "exact") from None
    if not isinstance(states, dict) or not {"random_state", "numpy_random_seed", "torch_manual_seed"} <= set(states):
        raise _damaged(path, name, "lacks the Python, NumPy or torch RNG state; without it the resume cannot be exact")
    if torch.cuda.is_available() and "torch_cuda_manual_seed" not in states:
        return ["resume is not exact: the save holds no CUDA RNG state (saved without a GPU), so random "
                "draws on the GPU (dropout) differ from an unbroken run's"]
    return []


def _inexact_notes(cfg: RunConfig, record: dict[str, Any], device: str) -> list[str]:
    """Differences that a resume allows but that make its curve differ from an unbroken run's."""
    notes = []
    saved = record.get("curve", {})
    for name in CHANGES_THE_CURVE:
        if name in saved and saved[name] != json.loads(json.dumps(getattr(cfg, name))):
            notes.append(f"resume is not exact: saved with {name}={saved[name]!r}, this run has "
                         f"{name}={getattr(cfg, name)!r}; the curve from step {record['loop']['step']} differs "
                         "from an unbroken run's")
    for what, mine in (("device", device), ("torch", torch.__version__)):
        if record.get(what) not in (None, mine):
            notes.append(f"resume is not exact: saved with {what} {record[what]}, resumed with {mine}; the kernels "
                         "differ, so the curve matches an unbroken run's only to rounding")
    return notes


def check_folder(accelerator: Any, cfg: RunConfig, state: Any, *, from_step: int = 0) -> None:
    """Before anything is built: the save folder exists, can be written, and holds no other
    run's steps, so a save never overwrites anything (measured before: a second run into the
    same folder replaced the first one's step folders silently, and an unwritable folder
    failed only at the last step, after all the training)."""
    root = Path(cfg.save_state_dir)
    if accelerator.num_processes > 1:  # one id for the run: every process names the same folders
        state.run_id = broadcast_object_list([state.run_id])[0]
    for folder in _steps(root, complete=False):
        owner = _owner(folder)
        if owner != state.run_id:
            raise ConfigError(
                f"save_state_dir={str(root)!r} holds another run's save ({folder.name}), which saving here could "
                f"overwrite; pass a new folder such as {str(root / 'run-2')!r}, or resume_from={str(root)!r} to "
                "continue that run")
        if _step_of(folder) > from_step:
            raise ConfigError(
                f"save_state_dir={str(root)!r} holds {folder.name} of this run, later than step {from_step} resumed "
                f"from, which saving would replace; resume from the latest save, or pass another save_state_dir")
    if not accelerator.is_main_process:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test-{os.getpid()}"
        probe.write_bytes(b"0")
        probe.unlink()
    except OSError as error:
        raise ConfigError(f"save_state_dir={str(root)!r} is not a folder this run can write "
                          f"({type(error).__name__}: {error.strerror or error}); pass a folder you can write to") from None


def check_disk_space(accelerator: Any, cfg: RunConfig, state: Any, model: Any) -> None:
    """Before step 1: the disk under save_state_dir holds every save this run will make."""
    if not accelerator.is_main_process:
        return
    root = Path(cfg.save_state_dir)
    every = cfg.save_every or cfg.steps
    saves = cfg.steps // every - state.step // every + (1 if cfg.steps % every else 0)

    # Weights, and the optimizer's fp32 moments: one (SGD momentum) or two (Adam) per weight.
    size = parameter_bytes(model) * (2 if cfg.optimizer == "sgd" else 3)
    free = shutil.disk_usage(root).free
    if saves * size > free:
        raise ConfigError(
            f"save_state_dir={str(root)!r} has {format_bytes(free)} free, but this run writes {saves} save(s) "
            f"of about {format_bytes(size)}; free some space, save less often (save_every), or pass another folder")


def _owner(folder: Path) -> str | None:
    """The run_id a step folder was saved by ('legacy' before ids were written; None if unreadable)."""
    try:
        record = json.loads((folder / LOOP_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record.get("run_id", "legacy") if isinstance(record, dict) else None


class SaveError(RuntimeError):
    """A save that failed during a run (disk full, folder removed): says which and what to do."""


def _free(root: Path) -> int | None:
    """Bytes free on the disk under `root` (None when that cannot be read: the folder was removed)."""
    try:
        return shutil.disk_usage(root).free
    except OSError:
        return None


def _disk_full(error: Exception, free: int | None, size: int | None) -> bool:
    """Whether a save failed for want of space, whatever its writer called it: an OSError's errno,
    safetensors' text ("No space left on device (os error 28)"), or torch's zip writer, which says
    only "unexpected pos" (measured on a full tmpfs), with less free than the save holds."""
    if getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error):
        return True
    return None not in (free, size) and free < size


def _save_failed(root: Path, path: Path, step: int, error: Exception | None, full: bool,
                 size: int | None) -> SaveError:
    """One line: the folder, why (the disk is full, with how much is free and needed; else the
    error), the save that is kept, and the fix."""
    done = _steps(root)
    kept = (f"the last complete save, {done[-1].name}, is kept (resume_from={str(root)!r})" if done
            else "no complete save is there")
    if full:
        free = _free(root)
        space = ", ".join(text for text in (free is not None and f"{format_bytes(free)} free there",
                                           size is not None and f"this save needs about {format_bytes(size)}") if text)
        why = f": the disk is full ({space})" if space else ": the disk is full"
        fix = "free space there, or pass a save_state_dir on a disk with space"
    else:
        first = (getattr(error, "strerror", None) or str(error)).strip().splitlines() or [""]
        why, fix = f" ({type(error).__name__}: {first[0]})", "pass a save_state_dir you can write to, with space"
    return SaveError(f"saving step {step} to {str(path)!r} failed{why}; {kept}; {fix} (the result so far is "
                           "workbench.last_result())")


def save(accelerator: Any, cfg: RunConfig, state: Any, *, size: int | None = None) -> Path:
    """Save everything needed to continue this run; every process must call it.

    The files are written into `step_N.partial-<run>` and the folder renamed to `step_N`
    once complete, so a save cut short never looks like a finished one and never replaces one.
    `size`: the bytes the save holds at least (the weights and the optimizer's state): with
    less free, the save is refused before a byte is written. Any failure while writing (a
    full disk, no permission, a read-only disk) removes the partial folder and raises
    SaveError; the saves before it stay whole.
    """
    root = Path(cfg.save_state_dir)
    path = step_dir(root, state.step)
    partial = root / f"{path.name}.partial-{state.run_id}"
    main = accelerator.is_main_process
    if None not in (size, free := _free(root)) and free < size:  # every process: they stop together
        raise _save_failed(root, path, state.step, None, True, size)
    try:
        if main and partial.exists():  # this run's own save, cut short before
            shutil.rmtree(partial)
        accelerator.wait_for_everyone()
        # Model, optimizer, GradScaler, accelerate's step counter, each process's RNGs.
        accelerator.save_state(str(partial))
        accelerator.wait_for_everyone()  # every process's files are in
        if main:
            _write_loop_file(accelerator, cfg, state, partial)
            if path.exists():
                raise SaveError(f"{str(path)!r} appeared while this run was saving: another run saves into "
                                      f"{str(root)!r}; give each run its own save_state_dir")
            os.rename(partial, path)
    except Exception as error:  # whatever the writer raised: safetensors' and torch's errors are no OSError
        full = not isinstance(error, SaveError) and _disk_full(error, _free(root), size)
        if main:
            shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, SaveError):
            raise
        raise _save_failed(root, path, state.step, error, full, size) from error
    accelerator.wait_for_everyone()  # the folder is complete before anyone reads it
    return path


def _write_loop_file(accelerator: Any, cfg: RunConfig, state: Any, partial: Path) -> None:
    """The loop's position and history, and every file's size and SHA-256, beside accelerate's files."""
    position = state.data_position
    record = {
        "run_id": state.run_id,
        "loop": {name: getattr(state, name) for name in LOOP_FIELDS if hasattr(state, name)},
        "data": {"epoch": position.epoch, "batches_in_epoch": position.batches_in_epoch,
                 "shuffle_state": _encode(position.shuffle_state)},
        "num_processes": accelerator.num_processes,
        "config": {name: getattr(cfg, name) for name in MUST_MATCH},
        "curve": {name: getattr(cfg, name) for name in CHANGES_THE_CURVE},
        "device": accelerator.device.type, "torch": torch.__version__,
        "files": {str(f.relative_to(partial)): [f.stat().st_size, _digest(f)]
                  for f in sorted(partial.rglob("*")) if f.is_file()},
    }
    (partial / LOOP_FILE).write_text(json.dumps(record, indent=1))


@dataclass(frozen=True, slots=True)
class SavedState:
    """A save checked whole and fitting this run, before anything is built (`check`)."""

    path: Path
    record: dict[str, Any]
    notes: list[str]
    """Where the resume cannot be exact (a changed max_grad_norm, another device): the run's warnings."""

    @property
    def step(self) -> int:
        return self.record["loop"]["step"]


def check(accelerator: Any, cfg: RunConfig, state: Any) -> SavedState:
    """The save `cfg.resume_from` names, checked before any data or model is loaded:
    it fits this run, and every file is there, whole and unchanged (a damaged or missing
    one is a ConfigError naming it). The run takes the save's run id."""
    path = find(cfg.resume_from)
    record = _read_record(path)
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
    _verify_files(path, record, accelerator.process_index)
    notes = _rng_notes(path, accelerator.process_index) + _inexact_notes(cfg, record, accelerator.device.type)
    data = record["data"]
    try:
        _decode(data["shuffle_state"]), int(data["epoch"]), int(data["batches_in_epoch"])
    except (KeyError, TypeError, ValueError) as error:
        raise _damaged(path, LOOP_FILE, f"has a damaged data position ({type(error).__name__})") from None
    state.run_id = record.get("run_id", "legacy")
    return SavedState(path, record, notes)


def restore(accelerator: Any, saved: SavedState, state: Any, loader: Any) -> None:
    """Load a checked save into this run (after accelerator.prepare): model, optimizer,
    scaler, RNGs (accelerate), then the loop's history and the data position."""
    path, record = saved.path, saved.record
    loop, data = record["loop"], record["data"]
    try:
        accelerator.load_state(str(path))
    except Exception as error:  # a save written before files were recorded: name the folder
        first = (str(error).strip().splitlines() or [""])[0]
        raise ConfigError(f"resume_from={str(path)!r} could not be loaded ({type(error).__name__}: {first}); "
                          f"{_instead(path)}") from None
    for name in LOOP_FIELDS:
        if name in loop:
            setattr(state, name, loop[name])
    position = state.data_position
    position.epoch, position.batches_in_epoch = int(data["epoch"]), int(data["batches_in_epoch"])
    position.shuffle_state = _decode(data["shuffle_state"])
    generator = _shuffle_generator(loader)
    if generator is not None and position.shuffle_state is not None:
        generator.set_state(position.shuffle_state)  # the shuffle as the saved epoch began


def _encode(tensor: torch.Tensor | None) -> str | None:
    return None if tensor is None else base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


def _decode(text: str | None) -> torch.Tensor | None:
    if text is None:
        return None
    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8).clone()
