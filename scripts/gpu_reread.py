"""Re-read a GPU check's measured peaks against the CUDA replay, on any machine (no GPU needed).

For every run the GPU check recorded (`summary.json`), it replays that run's training step
(`estimate(..., device="cuda")`, with the GPU's cuBLAS workspaces) and the evaluation that
followed it as run() did then (fp32, no grad, 64 sequences), and prints measured / predicted
for both: a peak that matches the evaluation was not the training step's.

    python scripts/gpu_reread.py docs/gpu-reference/run1/summary.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

# (notebook, run name) -> the RunConfig fields of that run (preset gpu)
RUNS = {
    ("00_tour", "baseline"): dict(model="mlp"),
    ("00_tour", "batch 32"): dict(model="mlp", batch_size=32),
    ("01_mixed_precision", "fp32"): dict(model="gpt"),
    ("01_mixed_precision", "fp16 + GradScaler"): dict(model="gpt", precision="fp16"),
    ("01_mixed_precision", "bf16"): dict(model="gpt", precision="bf16"),
    ("02_gradient_accumulation", "batch 32"): dict(model="gpt"),
    ("02_gradient_accumulation", "8 x 4 accumulated"): dict(model="gpt", batch_size=8, grad_accum_steps=4),
    ("02_gradient_accumulation", "batch 8"): dict(model="gpt", batch_size=8),
    ("02_gradient_accumulation", "exercise"): dict(model="gpt", batch_size=1, grad_accum_steps=8),
    ("03_activation_checkpointing", "baseline"): dict(model="gpt"),
    ("03_activation_checkpointing", "checkpoint all"): dict(model="gpt", activation_checkpointing="all"),
    ("07_planner", "baseline, no budget"): dict(model="gpt", batch_size=16),
    ("07_planner", "seed's recipe"): dict(model="gpt", precision="bf16", activation_checkpointing="every_other",
                                          batch_size=8, grad_accum_steps=2),
}
PLANS = {  # 07's verified plans, by label
    "bf16, checkpointing none, 4 x 4, adamw": dict(model="gpt", precision="bf16", batch_size=4, grad_accum_steps=4),
    "bf16, checkpointing every_other, 8 x 2, adamw": RUNS[("07_planner", "seed's recipe")],
}
EVAL_BATCH_THEN = 64  # run() evaluated at max(micro-batch, 64) until it moved to the micro-batch


def evaluation_peak(config, batch: int, resident: int, workspaces: int) -> int:
    """The peak of run()'s evaluation as it was: fp32 forward and loss, no grad, `batch` samples,
    on top of the model state (gradients already dropped) and the cuBLAS workspaces."""
    import torch
    import torch.nn.functional as F

    from workbench.planner.estimate import _freeze, _spec_key, input_spec, model_key
    from workbench.planner.fakemodel import fake_mode
    from workbench.planner.fakestate import build
    from workbench.planner.live import CUDA_BLOCK_BYTES, LiveTensors

    cfg = config.resolved()
    spec = _spec_key(input_spec(cfg), model_key(cfg))
    with fake_mode():
        model = build(model_key(cfg), spec, _freeze(cfg.dims)).eval()
        live = LiveTensors(round_to=CUDA_BLOCK_BYTES)
        shape = spec[1]
        with torch.no_grad(), live:
            if spec[0] == "language_modeling":
                x = torch.zeros(batch, *shape, dtype=torch.long)
                labels = x
            else:
                x, labels = torch.zeros(batch, *shape), torch.zeros(batch, dtype=torch.long)
            logits = model(x).float()
            F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="sum")
    return resident + workspaces + live.peak_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", type=pathlib.Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
    from workbench import RunConfig
    from workbench.planner.estimate import estimate
    from workbench.planner.fakecuda import cublas_workspace_bytes

    summary = json.loads(args.summary.read_text())
    if summary["machine"].get("gpu_memory_bytes"):  # the gpu preset as it was sized on that card
        os.environ.setdefault("WORKBENCH_GPU_MEMORY_GIB", str(summary["machine"]["gpu_memory_bytes"] / 2**30))
    capability = tuple(int(v) for v in summary["machine"].get("capability", "9.0").split("."))
    workspaces = 2 * cublas_workspace_bytes(capability)
    rows = []
    for name, nb in summary["notebooks"].items():
        claims = nb.get("claims", {})
        measured = {r["name"]: r["peak_bytes"] for r in claims.get("runs", []) if r.get("device") == "cuda"}
        measured |= {p["plan"]: p["max_memory_allocated"] for p in claims.get("estimate_vs_max_memory_allocated", [])}
        for run_name, peak in measured.items():
            changes = RUNS.get((name, run_name)) or PLANS.get(run_name)
            if changes is None or not peak:
                continue
            cfg = RunConfig(preset="gpu", **changes)
            est = estimate(cfg, device="cuda")
            step = est.peak_bytes - est.runtime_bytes + workspaces
            evaluation = evaluation_peak(cfg, max(cfg.resolved().batch_size, EVAL_BATCH_THEN), est.resident_bytes,
                                         workspaces)
            rows.append((f"{name[:2]} {run_name}", peak, step, evaluation))
    print(f"{'run':<52} {'measured':>15} {'step (replay)':>15} {'ratio':>6} {'evaluation':>15} {'ratio':>6}")
    for label, peak, step, evaluation in rows:
        print(f"{label:<52} {peak:>15,} {step:>15,} {peak / step:>6.3f} {evaluation:>15,} {peak / evaluation:>6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
