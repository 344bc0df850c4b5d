"""What the model, the data and this machine allow: the bounds RunConfig checks.

Each function returns a one-line problem (what is wrong, and the value to pass
instead) or None, so `core/config` raises them as ConfigError before anything is loaded
or allocated. The bounds come from the things themselves, not from taste:

- a model's dims must build a model: positive widths, heads that divide the width, a
  CNN whose poolings leave at least one pixel of the data's images;
- a sequence must fit the model (MiniLM's position table, read from its config.json)
  and the data (enough byte windows for one micro-batch);
- DataLoader workers: each is a process that competes for the cores, so more than
  twice the usable cores never helps (capped at 64);
- a learning rate times weight decay of 1 or more shrinks every weight to zero or
  flips its sign at each step (AdamW multiplies weights by 1 - lr*wd; SGD and Adam's
  L2 term subtract lr*wd*w).

Example:
    >>> dims_problem("gpt", {"n_layer": 2, "n_head": 3, "d_model": 128}, None)
    "dims['d_model']=128 must be divisible by dims['n_head']=3; pass d_model=129 or n_head=2"
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

# Re-exported: checks and switches call limits.shown, limits.as_float and limits.SEED_LIMIT.
from workbench.base.arguments import SEED_LIMIT, as_float, shown  # noqa: F401

MAX_WORKERS = 64


def is_finite(value: Any) -> bool:
    return math.isfinite(as_float(value))


def usable_cores() -> int:
    """Cores this process may run on (its affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def max_workers() -> int:
    return min(MAX_WORKERS, max(4, 2 * usable_cores()))


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _widths_problem(name: str, value: Any, example: str) -> str | None:
    if not isinstance(value, (list, tuple)):  # not a one-shot iterator: the model reads it again
        return f"dims['{name}']={value!r} must be a list of layer widths; pass e.g. {name}={example}"
    bad = [w for w in value if not _whole(w) or w < 1]
    if bad:
        return f"dims['{name}']={tuple(value)!r} holds {bad[0]!r}: widths are whole numbers >= 1; pass e.g. {name}={example}"
    return None


def dims_problem(model: str, dims: dict[str, Any], input_shape: tuple[int, ...] | None) -> str | None:
    """Why `dims` cannot build `model` (on images of `input_shape`, when known), or None."""
    # lazy: limits stays free of torch (launching.processes reads it before a launch imports torch)
    from workbench.core.models import MODEL_SPECS

    spec = MODEL_SPECS[model]
    if model == "minilm":
        if dims:
            return (f"dims {sorted(dims)} cannot resize model='minilm': it is pretrained, its size is fixed; "
                    "drop dims, or use model='gpt' to choose a size")
        return None
    if unknown := sorted(set(dims) - spec.dims):
        return f"dims {unknown} do not apply to model={model!r}; it takes {sorted(spec.dims)}"
    if model == "mlp":
        return _widths_problem("hidden", dims.get("hidden", ()), "(256, 256)")
    if model == "cnn":
        channels = dims.get("channels", ())
        if problem := _widths_problem("channels", channels, "(8, 16)"):
            return problem
        if input_shape is not None:
            side = min(input_shape[1:])
            most = max(0, int(math.log2(side))) if side >= 1 else 0
            if len(channels) > most:
                # Each conv block halves the image (max-pool 2): 8x8 digits survive 3 of them.
                return (f"dims['channels'] has {len(channels)} blocks, but each halves the "
                        f"{input_shape[1]}x{input_shape[2]} images and {most} leave a pixel; "
                        f"pass at most {most} channels")
        return None
    # gpt
    for name in ("n_layer", "n_head", "d_model"):
        value = dims.get(name)
        if not _whole(value) or value < 1:
            example = {"n_layer": 4, "n_head": 4, "d_model": 256}[name]
            return f"dims['{name}']={value!r} must be a whole number >= 1; pass e.g. {name}={example}"
    d_model, n_head = dims["d_model"], dims["n_head"]
    if d_model % n_head:
        up = d_model + n_head - d_model % n_head
        divisor = max(h for h in range(1, min(n_head, d_model) + 1) if d_model % h == 0)
        return (f"dims['d_model']={d_model} must be divisible by dims['n_head']={n_head}; "
                f"pass d_model={up} or n_head={divisor}")
    dropout = dims.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= as_float(dropout) < 1:
        return f"dims['dropout']={dropout!r} must be a probability in [0, 1); pass e.g. dropout=0.1"
    return None


def max_positions(model: str) -> int | None:
    """The longest sequence `model` can embed (None: the model is built for the data's)."""
    if model != "minilm":
        return None
    # lazy: limits stays free of torch (launching.processes reads it before a launch imports torch)
    from workbench.core.models import pretrained_config

    return int(pretrained_config()["max_position_embeddings"])


def longest_lm_seq_len(train_windows: Any, batch_size: int) -> int:
    """The largest seq_len whose byte windows still fill one micro-batch (train_windows(s)
    falls as s grows); 1 when none does."""
    low, high = 1, 1 << 40
    while low < high:  # the last s with train_windows(s) >= batch_size
        mid = (low + high + 1) // 2
        if train_windows(mid) >= batch_size:
            low = mid
        else:
            high = mid - 1
    return low


def workers_problem(num_workers: int) -> str | None:
    cap = max_workers()
    if num_workers > cap:
        return (f"num_workers={num_workers} is more worker processes than help here ({usable_cores()} usable "
                f"cores; at most {cap}); pass num_workers <= {cap}, e.g. num_workers=2")
    return None


def save_dir_problem(path: str) -> str | None:
    """Why a run could not save under `path`, found before step 1 (None: it can)."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            return f"save_state_dir={path!r} is a file, not a folder; pass a folder path such as 'saves'"
        target = path
    else:
        target = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(target):
            target = os.path.dirname(target)
        if not os.path.isdir(target):
            return f"save_state_dir={path!r} lies under the file {target!r}; pass a folder path such as 'saves'"
    if not os.access(target, os.W_OK | os.X_OK):
        return f"save_state_dir={path!r}: {target!r} is not writable; pass a folder you can write to"
    return None
