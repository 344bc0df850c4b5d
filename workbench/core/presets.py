"""One switch that sizes everything: WORKBENCH_PRESET = cpu-quick | cpu | gpu.

A preset holds the defaults a RunConfig takes when a field is left unset: model
sizes, batch sizes, steps, evaluation size. `cpu-quick` is what CI and nbval run
(each notebook well under a minute on 2 cores) and what the notebooks' saved outputs come
from, so it is also the default without a GPU: a learner's screen then shows the numbers
the teacher's saved notebooks (the projector) show, the exercises' model answers included.
`cpu` is an opt-in for a longer self-study run (larger models, more steps, clearer effects);
`gpu` is sized to show real effects on one modern GPU, and is the default where there is one.

Two more variables cap a preset without changing its shapes (model sizes, batch sizes,
sequence lengths): WORKBENCH_MAX_STEPS caps its steps and WORKBENCH_MAX_EVAL_SAMPLES its
evaluation. CI uses them to run every notebook with the `cpu` and `gpu` shapes in minutes
(a notebook that hard-codes one preset's shapes fails there); a learner never needs them.

The `gpu` preset is sized to the card: its GPT shape comes from `GPU_CARDS` by the card's total
memory ($WORKBENCH_GPU_MEMORY_GIB, else nvidia-smi: no CUDA context), and `Preset.sized` says
what it chose and why. The table is the CUDA replay's answer (`scripts/card_sizes.py` computes it;
tests/test_card_sizes.py recomputes it and fails when it is stale): core cannot call the planner,
and a replay on a learner's first cell would cost seconds for a figure that never changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from workbench.base.arguments import shown
from workbench.machine import environment

PRESET_ENV_VAR = "WORKBENCH_PRESET"
MAX_STEPS_ENV_VAR = "WORKBENCH_MAX_STEPS"
MAX_EVAL_ENV_VAR = "WORKBENCH_MAX_EVAL_SAMPLES"


@dataclass(frozen=True, kw_only=True, slots=True)
class Preset:
    name: str
    steps: int
    """Default optimizer steps per run."""
    batch_size: dict[str, int]
    """Default micro-batch size per model."""
    dims: dict[str, dict[str, Any]]
    """Model size keyword arguments per model (see models.build_model)."""
    seq_len: dict[str, int]
    """Sequence length for the text models."""
    max_eval_samples: int
    """Held-out samples evaluated after training."""
    log_every: int
    """Log (and sync the device) every this many optimizer steps."""
    reduced_precision_steps_on_emulated_cpu: int = field(default=0)
    """Steps for bf16/fp16 runs on a CPU that emulates them (0: same as steps): their own
    budget, since such a step is 15-30x an fp32 one (see each preset's measurement)."""
    max_steps: int | None = None
    """The step cap in force (WORKBENCH_MAX_STEPS), already applied to `steps`; None: none."""
    capped: str = ""
    """Which caps (WORKBENCH_MAX_STEPS, WORKBENCH_MAX_EVAL_SAMPLES) shortened this preset; '' if none."""
    sized: str = ""
    """What the gpu preset sized to the card, and why (one line); '' for a preset not sized."""

    def __str__(self) -> str:
        """The name, and the sizing note where there is one: what a notebook's first cell prints."""
        return f"{self.name} ({self.sized})" if self.sized else self.name

    def cap(self, steps: int) -> int:
        """`steps` within the step cap in force: for a notebook's own step counts.

        Example:
            >>> PRESETS["cpu"].cap(80)  # no cap in force: unchanged
            80
        """
        return steps if self.max_steps is None else min(steps, self.max_steps)


PRESETS: dict[str, Preset] = {
    "cpu-quick": Preset(
        name="cpu-quick",
        steps=30,
        batch_size={"mlp": 64, "cnn": 32, "gpt": 8, "minilm": 8},
        dims={
            "mlp": {"hidden": (256, 256)},
            "cnn": {"channels": (8, 16)},
            "gpt": {"n_layer": 2, "n_head": 4, "d_model": 128},
            "minilm": {},
        },
        seq_len={"gpt": 64, "minilm": 48},
        max_eval_samples=500,
        log_every=5,
        reduced_precision_steps_on_emulated_cpu=6,
    ),
    # A 2-core laptop without AVX-512 (one BLAS thread), each notebook's Run All within
    # 3 minutes: the GPT step here is ~0.5 s fp32 and ~8 s in emulated fp16/bf16 (measured on
    # a 2-core EPYC capped to AVX2), so 60 steps, and 4 for emulated arms (~35 s each).
    "cpu": Preset(
        name="cpu",
        steps=60,
        batch_size={"mlp": 128, "cnn": 64, "gpt": 16, "minilm": 16},
        dims={
            "mlp": {"hidden": (512, 512)},
            "cnn": {"channels": (16, 32)},
            "gpt": {"n_layer": 4, "n_head": 4, "d_model": 256},
            "minilm": {},
        },
        seq_len={"gpt": 128, "minilm": 64},
        max_eval_samples=1000,
        log_every=10,
        reduced_precision_steps_on_emulated_cpu=4,
    ),
    "gpu": Preset(
        name="gpu",
        steps=300,
        # The GPT's batch and sequence are a 16 GB card's (GPU_CARDS): what a card of unknown size gets.
        batch_size={"mlp": 512, "cnn": 256, "gpt": 24, "minilm": 64},
        dims={
            "mlp": {"hidden": (2048, 2048)},
            "cnn": {"channels": (64, 128)},
            "gpt": {"n_layer": 12, "n_head": 12, "d_model": 768},
            "minilm": {},
        },
        seq_len={"gpt": 512, "minilm": 128},
        max_eval_samples=100_000,
        log_every=25,
    ),
}


CARD_HEADROOM = 0.85
"""A sized notebook's largest run, replayed on fake CUDA tensors, peaks under this share of the
card. The rest: the CUDA context (0.3-0.5 GiB, outside torch's allocator), the allocator's
rounding and fragmentation, and what a notebook still holds from earlier cells (01's fp32 baseline
at batch 32 replays at 14.82 GiB; the H200 measured 16.3 GB, 15.2 GiB, for it)."""


@dataclass(frozen=True, slots=True)
class CardShape:
    """The gpu preset's GPT shape on cards of at least `min_gib` GiB (nvidia-smi's memory.total)."""

    min_gib: float
    gpt_batch: int
    gpt_seq_len: int


# The classes' floors sit under each class's nominal size, since a card reports less than its
# label (nvidia-smi: a 16 GB T4 15,360 MiB; this project's 141 GB H200 143,156 MiB). The shapes are
# scripts/card_sizes.py's: per class, the largest GPT batch of 32, 24, 16, 8 at seq 512 (else
# 256) whose replayed peak in every notebook stays under CARD_HEADROOM of the class's floor. 07
# trains a batch of 16 whatever the preset: on 8 GB only seq 256 fits it. 32 is the batch the
# notebooks' claims were checked at on an H200: larger cards keep it (bigger is not checked).
# The MLP, CNN and MiniLM shapes fit the smallest class as they are.
GPU_CARDS: tuple[CardShape, ...] = (
    CardShape(7.5, 24, 256),   # 8 GB
    CardShape(11.0, 16, 512),  # 11-12 GB
    CardShape(14.5, 24, 512),  # 16 GB (a T4: 15 GiB); also a card of unknown size
    CardShape(22.0, 32, 512),  # 24 GB and up
)


UNKNOWN_CARD_GIB = 14.5
"""A card whose memory cannot be read is sized as this class's (a 16 GB card's): the gpu preset's own shapes."""


def _sized_to_card(preset: Preset) -> Preset:
    """The gpu preset with its GPT shape for this machine's card, and a note saying which and why."""
    # lazy: presets stay free of torch (machine.hardware imports it); only the gpu preset asks the card
    from workbench.machine.hardware import gpu_memory_bytes

    total, source = gpu_memory_bytes()
    gib = UNKNOWN_CARD_GIB if total is None else total / 2**30
    row = max((r for r in GPU_CARDS if r.min_gib <= gib), key=lambda r: r.min_gib, default=GPU_CARDS[0])
    if total is None:
        why = f"as for a 16 GB card: this card's memory is unknown ({source})"
    elif row.min_gib > gib:
        why = (f"for this {gib:.1f} GiB card ({source}), below the smallest sized for ({row.min_gib:g} GiB): "
               "its runs may not fit; WORKBENCH_PRESET=cpu fits any machine")
    else:
        why = (f"for this {gib:.1f} GiB card ({source}): each notebook's largest run replays under "
               f"{CARD_HEADROOM:.0%} of {row.min_gib:g} GiB")
        if row is GPU_CARDS[-1]:
            why += ", at the batch the notebooks were checked at on an H200 (larger ones are not checked)"
    return replace(preset, batch_size={**preset.batch_size, "gpt": row.gpt_batch},
                   seq_len={**preset.seq_len, "gpt": row.gpt_seq_len},
                   sized=f"GPT batch {row.gpt_batch} x seq {row.gpt_seq_len} {why}")


def _cuda_available() -> bool:
    # torch.cuda.is_available() asks the driver via NVML where it can and does not
    # create a CUDA context, so it is safe before notebook_launcher forks.
    import torch

    return torch.cuda.is_available()


def default_preset_name() -> str:
    """The preset in force: $WORKBENCH_PRESET, else 'gpu' with CUDA, else 'cpu-quick' (the preset
    whose outputs the committed notebooks hold: what the teacher projects is what a learner sees)."""
    name = environment.choice(PRESET_ENV_VAR, PRESETS, must="is not a preset",
                              fix=f"set it to one of: {', '.join(PRESETS)}")
    return name or ("gpu" if _cuda_available() else "cpu-quick")


def _env_cap(var: str) -> int | None:
    return environment.whole(var, fix="unset it for no cap")


def get_preset(name: str | None = None) -> Preset:
    """The named preset, or the one in force, within the caps of WORKBENCH_MAX_STEPS and
    WORKBENCH_MAX_EVAL_SAMPLES where they are set (the shapes never change); `gpu` sized to the
    card (GPU_CARDS).

    Example:
        >>> get_preset("cpu-quick").steps
        30
    """
    name = name or default_preset_name()
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"preset={shown(name)} is not a preset; use one of: {', '.join(PRESETS)}")
    preset = _sized_to_card(PRESETS[name]) if name == "gpu" else PRESETS[name]
    max_steps, max_eval = _env_cap(MAX_STEPS_ENV_VAR), _env_cap(MAX_EVAL_ENV_VAR)
    if max_steps is None and max_eval is None:
        return preset
    quick = preset.reduced_precision_steps_on_emulated_cpu
    return replace(
        preset, steps=min(preset.steps, max_steps or preset.steps),
        reduced_precision_steps_on_emulated_cpu=min(quick, max_steps) if quick and max_steps else quick,
        max_eval_samples=min(preset.max_eval_samples, max_eval or preset.max_eval_samples),
        max_steps=max_steps, capped=", ".join(f"{var}={value}" for var, value in
                         ((MAX_STEPS_ENV_VAR, max_steps), (MAX_EVAL_ENV_VAR, max_eval)) if value),
    )
