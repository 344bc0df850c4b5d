"""The gpu preset sized to the card: each notebook's largest run replayed on fake CUDA tensors.

`workbench.core.presets.GPU_CARDS` gives the gpu preset's GPT shape per class of card. This
script is where that table comes from, and tests/test_card_sizes.py recomputes it with the same
functions, so it cannot go stale:

- `LARGEST_RUNS`: the run in each notebook that needs the most memory, read off its cells (the
  notebook's own numbers where it hard-codes one, the preset's otherwise);
- `peak_bytes(config)`: its peak on a CUDA device, replayed on fake tensors (`estimate(device=
  "cuda")`: nothing allocated, no GPU needed); MiniLM, which the replay does not trace (a
  pretrained Hugging Face model), gets the bound `check_fits` uses, from its config.json;
- `shape_for(gib)`: the largest GPT batch of 32, 24, 16, 8 at seq 512 (else at 256) whose every
  notebook's largest run peaks under CARD_HEADROOM of a card of `gib` GiB.

    python scripts/card_sizes.py     # the table of replayed peaks, and GPU_CARDS as computed
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace

from workbench.core.config import RunConfig
from workbench.core.presets import CARD_HEADROOM, GPU_CARDS, PRESETS, CardShape, Preset

GIB = 2**30
BATCHES = (32, 24, 16, 8)  # 32: the batch checked on an H200; 8: 02 still splits it 8 ways
SEQ_LENS = (512, 256)
CARDS_GIB = {8: 8.0, 12: 12.0, 16: 15.0, 24: 22.49, 80: 79.6, 141: 139.8}
"""Nominal size -> the total (GiB) the card is tested at: for 16, 24 and 80 GB what a T4 (15,360 MiB),
an L4 (23,034 MiB) and an H100 80GB (81,559 MiB) report to nvidia-smi, less than their labels; for
141 GB the H200 of docs/gpu-reference (150,109,880,320 bytes)."""


def _gpt(preset: Preset, **fields) -> RunConfig:
    return RunConfig(model="gpt", preset="gpu", **{"batch_size": preset.batch_size["gpt"],
                                                   "seq_len": preset.seq_len["gpt"], **fields})


# notebook -> its largest run under a preset (every other run of the notebook needs less).
LARGEST_RUNS: dict[str, Callable[[Preset], RunConfig]] = {
    "00_tour": lambda p: RunConfig(model="mlp", data="mnist", preset="gpu", batch_size=4 * p.batch_size["mlp"]),
    "01_mixed_precision": lambda p: _gpt(p, max_grad_norm=1.0),  # the fp32 baseline (bf16, fp16 save less)
    "02_gradient_accumulation": _gpt,  # the whole-batch baseline (the accumulated arm: a quarter of it)
    "03_activation_checkpointing": _gpt,  # the baseline, nothing checkpointed
    "04_input_pipelines": lambda p: RunConfig(model="mlp", data="mnist_files", preset="gpu",
                                              batch_size=p.batch_size["mlp"]),
    "05_quantization": lambda p: RunConfig(model="minilm", preset="gpu", batch_size=64, seq_len=128),  # its gpu SIZES
    "06_multi_gpu": lambda p: RunConfig(model="mlp", preset="gpu", batch_size=p.batch_size["mlp"]),  # one process's
    "07_planner": lambda p: _gpt(p, batch_size=16),  # 'baseline, no budget': fp32 at its own batch of 16
    "08_speed_without_changing_the_math": _gpt,  # the eager baseline (compile's own memory is not replayed)
    "09_train_fewer_bytes": _gpt,  # full training (LoRA and the 8-bit optimizer hold less)
    # CPU processes and a CPU run only (device='cpu', a CPU preset's sizes; cpu-quick's on a GPU machine)
    "10_tensor_and_pipeline_parallel": lambda p: RunConfig(model="gpt", preset="cpu-quick", device="cpu"),
    # its runs are on the CPU (--device cpu); one process's run, as it would be on a card
    "11_two_nodes_on_one_machine": lambda p: RunConfig(model="mlp", data="digits", preset="gpu",
                                                       batch_size=p.batch_size["mlp"]),
}


_PEAKS: dict[str, int] = {}  # repr(config) -> bytes: a config is not hashable, and each shape is replayed once


def peak_bytes(config: RunConfig) -> int:
    """The run's peak on a CUDA device, replayed on fake tensors (MiniLM: check_fits's bound)."""
    from workbench.planner.estimate import estimate
    from workbench.planner.fit import need_bytes

    key = repr(config)
    if key not in _PEAKS:
        _PEAKS[key] = (need_bytes(config.resolved()).total if config.model == "minilm"
                       else estimate(config, device="cuda").peak_bytes)
    return _PEAKS[key]


def with_shape(batch: int, seq_len: int) -> Preset:
    """The gpu preset with this GPT shape (what GPU_CARDS would give it)."""
    gpu = PRESETS["gpu"]
    return replace(gpu, batch_size={**gpu.batch_size, "gpt": batch}, seq_len={**gpu.seq_len, "gpt": seq_len})


def peaks(preset: Preset) -> dict[str, int]:
    """Each notebook's largest run's replayed peak under this preset, in bytes."""
    return {notebook: peak_bytes(run(preset)) for notebook, run in LARGEST_RUNS.items()}


def shape_for(gib: float) -> tuple[int, int] | None:
    """(GPT batch, seq_len) for a card of `gib` GiB: the first of SEQ_LENS, then the largest of
    BATCHES, at which every notebook's largest run peaks under CARD_HEADROOM of it; None if none does."""
    for seq_len in SEQ_LENS:
        for batch in BATCHES:
            if max(peaks(with_shape(batch, seq_len)).values()) <= CARD_HEADROOM * gib * GIB:
                return batch, seq_len
    return None


def computed_cards() -> tuple[CardShape, ...]:
    """GPU_CARDS recomputed: each class's floor, sized by the replay."""
    return tuple(CardShape(row.min_gib, *shape_for(row.min_gib)) for row in GPU_CARDS)


def _row(label: str, cells) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"


def main() -> int:
    from workbench.core.presets import get_preset

    print("Replayed peak (GiB) of each notebook's largest run under the gpu preset sized to each card "
          "(estimate(device='cuda') on fake tensors; MiniLM: check_fits's bound); "
          f"limit {CARD_HEADROOM:.0%} of the card.\n")
    print(_row("notebook", (f"{n} GB ({g:g} GiB)" for n, g in CARDS_GIB.items())))
    print("|---|" + "---|" * len(CARDS_GIB))
    sized = {}
    for nominal, gib in CARDS_GIB.items():
        os.environ["WORKBENCH_GPU_MEMORY_GIB"] = str(gib)  # what the test sets, as a user would
        sized[nominal] = get_preset("gpu")
    table = {n: peaks(p) for n, p in sized.items()}
    for notebook in LARGEST_RUNS:
        print(_row(notebook, (f"{table[n][notebook] / GIB:.2f}" for n in CARDS_GIB)))
    print(_row("GPT batch x seq", (f"{p.batch_size['gpt']} x {p.seq_len['gpt']}" for p in sized.values())))
    print(_row("largest / card", (f"{max(table[n].values()) / (g * GIB):.0%}" for n, g in CARDS_GIB.items())))
    cards = computed_cards()
    print("\nGPU_CARDS as the replay computes it:")
    for row in cards:
        print(f"    CardShape({row.min_gib!r}, {row.gpt_batch}, {row.gpt_seq_len}),")
    stale = cards != GPU_CARDS
    print("workbench/core/presets.py's GPU_CARDS is " + ("STALE: copy the rows above into it" if stale else "up to date"))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
