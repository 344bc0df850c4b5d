"""Will a run fit this machine's memory? Answered before anything is allocated.

`check_fits(config)` is what `run()` and `launch()` call first. A run that needs more
memory than this machine has free is refused with a ConfigError that gives the figure
and the fix, instead of being killed by the OS halfway through building its model
(measured: `RunConfig(model="gpt", seq_len=100000)` built two 10 GB attention masks and
was killed; the estimate predicts terabytes in under a second).

Two steps, so a normal run pays nothing:
1. a closed-form floor from the config alone (microseconds): parameters, gradients,
   optimizer state, buffers (a GPT's s x s masks) and the textbook activation count;
   a run whose floor is under a tenth of the free memory goes ahead, and one whose floor
   alone exceeds it is refused ("needs at least");
2. in between, the estimate: `estimate.estimate()` on fake tensors for mlp, cnn, gpt and your
   own module (about a second), and for the pretrained MiniLM a bound from its config.json (the
   tensors one layer saves, counted on the real model once: see `_minilm_layer_bytes`).
Your own module's floor is its real parameter bytes: weights, and for what trains a gradient
and the optimizer's state.

"Free" is the least of: the memory the OS reports available, each memory limit of this
process's cgroup (v2 or v1) and its parents less their use, and this process's address-space
limit (RLIMIT_AS) less its size. On a GPU the model is still built in host memory before it
moves, so the host is checked for the model state
(the device's own out-of-memory error is clean: it ends the run with status 'oom').

Example:
    >>> check_fits(RunConfig(model="mlp", preset="cpu-quick"))  # fits: returns quietly
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psutil

try:
    import resource
except ImportError:  # Windows: no rlimits to hold a run against
    resource = None  # type: ignore[assignment]

from workbench.base.report import format_bytes
from workbench.core.config import ConfigError, RunConfig
from workbench.core.data import DATASETS
from workbench.core.measure.counters import gpt_activation_bytes_formula
from workbench.core.measure.meters import status_bytes
from workbench.core.models import MODEL_SPECS, pretrained_config
from workbench.machine import hardware
from workbench.planner.estimate import estimate

__all__ = ["DoesNotFit", "Need", "cgroup_memory_left", "check_fits", "floor_bytes", "free_bytes", "need_bytes"]

_BYTE_VOCAB = 256  # the byte-level language-modelling data
_FAR_BELOW = 10  # a floor under 1/10 of the free memory needs no closer look


class DoesNotFit(ConfigError):
    """A run refused before allocating: its estimate exceeds the memory free. A ConfigError
    (the config cannot work here); a search over batch sizes may read it as an 'oom'."""


@dataclass(frozen=True, slots=True)
class Need:
    """Bytes one process of a run needs, by part (what the fix depends on)."""

    model_state: int
    """Parameters, gradients and optimizer state."""
    buffers: int
    """Non-parameter tensors the model keeps (a GPT's causal masks: n_layer x seq_len² bytes)."""
    activations: int
    """One micro-batch's saved activations and the step's temporaries."""
    how: str

    @property
    def total(self) -> int:
        return self.model_state + self.buffers + self.activations


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


# Where a cgroup's memory limit and use are, by version: v2 (one tree) and v1 (a tree per controller).
_CGROUP_FILES = {"v2": ("", "memory.max", "memory.current"),
                 "v1": ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes")}


def cgroup_memory_left(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> list[int]:
    """Bytes left under each memory limit of this process's cgroup and its ancestors (v2 or v1):
    a JupyterHub that puts each learner in a cgroup of their own (room/) holds their runs to it."""
    try:
        with open(proc) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    figures = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        version = "v2" if controllers == "" else "v1" if "memory" in controllers.split(",") else None
        if version is None:
            continue
        tree, limit_file, used_file = _CGROUP_FILES[version]
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):  # a parent's limit holds its children too
            folder = "/".join([root, tree, *parts[:depth]]).replace("//", "/")
            limit, used = _read_int(f"{folder}/{limit_file}"), _read_int(f"{folder}/{used_file}")
            if limit is not None and used is not None:
                figures.append(max(0, limit - used))
    return figures


def free_bytes() -> int | None:
    """Memory this process can still allocate (the least of the OS, cgroup and rlimit figures)."""
    figures = [psutil.virtual_memory().available, *cgroup_memory_left()]
    for which, field in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")) if resource else ():
        soft, _ = resource.getrlimit(which)
        if soft != resource.RLIM_INFINITY and (size := status_bytes(field)) is not None:
            figures.append(max(0, soft - size))
    return min(figures)


def _optimizer_bytes(params: int, optimizer: str) -> int:
    return params * 4 * (1 if optimizer == "sgd" else 2)  # momentum; or Adam's two moments


def _parameters(cfg: RunConfig) -> tuple[int, int]:
    """(parameter count, buffer bytes) of the config's model, in closed form."""
    dims, model = cfg.dims, cfg.model
    if model == "minilm":
        c = pretrained_config()
        h, inner, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        embeddings = (c["vocab_size"] + c["max_position_embeddings"] + c["type_vocab_size"]) * h + 2 * h
        layer = 4 * (h * h + h) + (h * inner + inner) + (inner * h + h) + 4 * h
        classes = DATASETS[cfg.data].num_classes if cfg.data in DATASETS else 2
        return embeddings + layers * layer + (h * h + h) + (h * classes + classes), 0
    if model == "gpt":
        s, d, layers = cfg.seq_len, dims["d_model"], dims["n_layer"]
        layer = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
        return _BYTE_VOCAB * d + s * d + layers * layer + 2 * d, layers * s * s
    info = DATASETS[cfg.data]
    channels, height, width = info.input_shape
    if model == "mlp":
        widths = [channels * height * width, *dims["hidden"], info.num_classes]
        return sum(a * b + b for a, b in zip(widths, widths[1:])), 0
    params, c_in = 0, channels
    for c in dims["channels"]:
        params += 9 * c_in * c + c
        c_in, height, width = c, height // 2, width // 2
    return params + c_in * height * width * info.num_classes + info.num_classes, 0


def _activation_floor(cfg: RunConfig) -> int:
    """Saved activations of one micro-batch, counted low (no temporaries)."""
    b = cfg.batch_size
    element = 4 if cfg.precision == "fp32" else 2
    if cfg.model == "minilm":
        return _minilm_saved(cfg)
    if cfg.model == "gpt":
        h, a, layers = cfg.dims["d_model"], cfg.dims["n_head"], cfg.dims["n_layer"]
        return gpt_activation_bytes_formula(cfg.seq_len, b, h, a, layers, element)
    info = DATASETS[cfg.data]
    channels, height, width = info.input_shape
    if cfg.model == "mlp":
        return b * element * (channels * height * width + sum(cfg.dims["hidden"]) + info.num_classes)
    total = 0
    for c in cfg.dims["channels"]:
        total += b * element * c * height * width  # each conv block's output
        height, width = height // 2, width // 2
    return total


def _own_floor(model: Any, optimizer: str) -> Need:
    """Your own module's state, from its real tensors: its weights, and for what trains a
    gradient and the optimizer's state (no activations: they depend on its forward)."""
    params = {id(p): p for p in model.parameters()}.values()
    trained = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    weights = sum(p.numel() * p.element_size() for p in params)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    count = sum(p.numel() for p in params if p.requires_grad)
    return Need(weights + trained + _optimizer_bytes(count, optimizer), buffers, 0, "closed-form floor")


def floor_bytes(cfg: RunConfig) -> Need:
    """A closed-form lower bound of what one process of `cfg` (resolved) needs; no torch work."""
    if not isinstance(cfg.model, str):
        return _own_floor(cfg.model, cfg.optimizer)
    params, buffers = _parameters(cfg)
    state = params * 8 + _optimizer_bytes(params, cfg.optimizer)  # fp32 weights and gradients
    return Need(state, buffers, _activation_floor(cfg), "closed-form floor")


def _minilm_layer_bytes(cfg: RunConfig) -> tuple[int, int]:
    """(bytes one MiniLM layer saves for backward, layers), in fp32 with its dropout on.

    Counted on the real model (b=2, s=32) with saved-tensor hooks: per layer 15·sbh elements
    (Linear inputs, LayerNorm inputs, the 4h-wide GELU input and output), six a·s²·b tensors
    (sdpa's math path with dropout keeps the scores, the probabilities, an fp32 dropout mask
    and its output, some twice) and 4·sb LayerNorm statistics: with the embeddings 12.59 MB
    counted, 12.70 MB measured (the pooler and head keep the rest). At longer sequences sdpa
    takes kernels that keep less (b=16, s=128: 575 MB measured, 743 MB counted; b=8, s=256:
    802 MB against 1,196 MB), so the count is a bound."""
    c = pretrained_config()
    s, b = cfg.seq_len, cfg.batch_size
    h, a = c["hidden_size"], c["num_attention_heads"]
    return 4 * (15 * s * b * h + 6 * a * s * s * b + 4 * s * b), c["num_hidden_layers"]


def _minilm_saved(cfg: RunConfig) -> int:
    per_layer, layers = _minilm_layer_bytes(cfg)
    s, b, h = cfg.seq_len, cfg.batch_size, 384
    return layers * per_layer + 4 * 2 * s * b * h + 8 * s * b  # + the embeddings' output and the ids


def _minilm_bound(cfg: RunConfig) -> Need:
    """MiniLM's step: model state, the saved activations counted above, and a layer's worth
    of activation gradients held at a time in backward. fp32 throughout: an upper-side
    figure for bf16/fp16. Measured at b=16, s=128: the process peak rose 1,143 MB in
    training; the bound is 1,229 MB."""
    params, _ = _parameters(cfg)
    per_layer, _ = _minilm_layer_bytes(cfg)
    return Need(params * 8 + _optimizer_bytes(params, cfg.optimizer), 0, _minilm_saved(cfg) + per_layer,
                "bound from MiniLM's config.json")


def need_bytes(cfg: RunConfig) -> Need | None:
    """The estimate of one process's peak (None when it cannot be estimated offline)."""
    if cfg.model == "minilm":
        return _minilm_bound(cfg)

    try:
        est = estimate(cfg)
    except ValueError:  # e.g. a hub data set, whose shapes are unknown offline
        return None
    # The estimate's peak is what is live at the step's worst moment: the rest of it, beyond the
    # model state and buffers, is saved activations and the step's temporaries.
    rest = max(0, est.peak_bytes - est.model_state_bytes - est.buffer_bytes)
    return Need(est.model_state_bytes, est.buffer_bytes, rest,
                "estimate() on fake tensors")


def _fix(cfg: RunConfig, need: Need) -> str:
    """What to change, for the part that dominates."""
    largest = max(("model_state", need.model_state), ("buffers", need.buffers),
                  ("activations", need.activations), key=lambda part: part[1])[0]
    if not isinstance(cfg.model, str):  # your own module: its size and its forward are yours
        return (f"lower batch_size (now {cfg.batch_size})" if largest == "activations" else
                "use a smaller model" + (", or optimizer='sgd'" if cfg.optimizer != "sgd" else ""))
    if largest == "buffers":
        return f"lower seq_len (now {cfg.seq_len}): each of the {cfg.dims.get('n_layer')} layers keeps a seq_len² mask"
    if largest == "model_state":
        smaller = "use model='gpt' with small dims (MiniLM's size is fixed)" if cfg.model == "minilm" else "use smaller dims"
        return (smaller + (", or optimizer='sgd'" if cfg.optimizer != "sgd" else "")
                + " (the parameters, gradients and optimizer state alone do not fit)")
    knobs = f"lower batch_size (now {cfg.batch_size})"
    if MODEL_SPECS[cfg.model].is_text:
        knobs += f" or seq_len (now {cfg.seq_len})"
    if MODEL_SPECS[cfg.model].has_blocks and cfg.activation_checkpointing == "none":
        knobs += ", or pass activation_checkpointing='all'"
    return knobs


def check_fits(config: RunConfig, *, processes: int = 1) -> None:
    """Raise DoesNotFit (a ConfigError) when `processes` copies of this run cannot fit the
    memory free now, with the estimate by part and the fix."""
    cfg = config.resolved()
    free = free_bytes()
    hub = isinstance(cfg.data, str) and cfg.data not in DATASETS
    if free is None or (hub and cfg.model != "minilm"):
        return  # nothing to hold it against, or a hub data set of unknown shape
    if hardware.resolve_device(cfg.device) == "cuda":
        # The host builds the model before it moves: its weights and buffers, counted exactly.
        # (Your own module: the copy a run makes of it.)
        if isinstance(cfg.model, str):
            params, buffers = _parameters(cfg)
            weights = params * 4
        else:
            weights = sum(p.numel() * p.element_size() for p in cfg.model.parameters())
            buffers = sum(b.numel() * b.element_size() for b in cfg.model.buffers())
        need, where = Need(weights, buffers, 0, "weights and buffers, built on the host"), "host memory"
    else:
        floor = floor_bytes(cfg)
        if floor.total * processes * _FAR_BELOW < free:
            return
        # A floor over the limit settles it at once; between, the estimate decides.
        need, where = (floor if floor.total * processes > free else need_bytes(cfg) or floor), "memory"
    total = need.total * processes
    if total <= free:
        return
    copies = f"{processes} processes x {format_bytes(need.total)}" if processes > 1 else format_bytes(total)
    about = "at least" if need.how == "closed-form floor" else "about"
    raise DoesNotFit(
        f"this run needs {about} {copies} of {where} ({need.how}: model state {format_bytes(need.model_state)}, "
        f"buffers {format_bytes(need.buffers)}, activations {format_bytes(need.activations)}) but this machine has "
        f"{format_bytes(free)} free; {_fix(cfg, need)}"
    )

