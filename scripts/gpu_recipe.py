"""The GPU check's best-recipe arms: bf16 + torch.compile + SDPA + fused AdamW, measured as MFU.

Each arm is one `wb.run` of the GPT with the four speed switches on, in its own process (a clean
GPU, a fresh compile), its MFU held against the card's dense bf16 peak from its data sheet
(`hardware.peak_flops`: 989.5 TFLOP/s for an H100 SXM or an H200). The arms then push toward 40%:

1. `recipe`: the gpu preset's GPT shape (12 layers, d=768, batch 32 x 512 tokens on a 24 GB+ card);
2. `recipe, seq x2, fill memory`: twice the sequence, the largest batch (of BATCHES) whose
   estimated peak (`wb.estimate(device="cuda")`) stays under HEADROOM of the card: bigger matmuls,
   fewer launches per token;
3. `recipe, wider model`: the same, d_model x2 with heads of 128 (12 of them at d=1536), a model of
   ~4x the FLOPs per token: matmuls large enough for the tensor cores to stay busy;
4. `wider, compile max-autotune-no-cudagraphs`: inductor benchmarks its matmul and fused-kernel
   variants while compiling (a longer compile), the last arm, run only when the budget has room.

On a CPU (`--preset cpu-quick`, the dry run) the same arms run at the preset's small shapes, the
"card" being 4 x the first arm's estimated peak, eager (inductor's C++ build of one arm took over
110 s on this project's busy 2-core machine) and without the autotune arm: the code path, not a
measurement.

    python scripts/gpu_recipe.py --out /tmp/recipe --budget-s 200        # alone, or through gpu_check.py
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

HEADROOM = 0.80
"""An arm's estimated peak stays under this share of the card (the rest: CUDA context, allocator
rounding, compile's workspaces, which the estimate does not model)."""
BATCHES = (256, 192, 128, 96, 64, 48, 32, 24, 16, 8, 4, 2)
ARM_TIMEOUT_S = {"recipe": 120, "seq": 120, "wider": 130, "autotune": 300}
SWITCHES = dict(precision="bf16", compile="default", attention="sdpa", optimizer_impl="fused")


def base_config(steps: int) -> Any:
    import workbench as wb

    return wb.RunConfig(model="gpt", steps=steps, log_every=max(1, steps // 2), eval_samples=0, **SWITCHES)


def _largest_batch(config: Any, memory_bytes: int, device: str) -> tuple[int | None, int | None]:
    """(the largest batch of BATCHES whose estimated peak fits HEADROOM of memory_bytes, its peak)."""
    import dataclasses

    import workbench as wb

    for batch in BATCHES:
        cfg = dataclasses.replace(config, batch_size=batch)
        peak = wb.estimate(cfg, device=device).peak_bytes
        if peak <= HEADROOM * memory_bytes:
            return batch, peak
    return None, None


def plan_arms(steps: int) -> list[dict[str, Any]]:
    """The arms' configs (RunConfig fields) and why each, sized for this machine's card."""
    import dataclasses

    import torch

    import workbench as wb
    from workbench.machine.hardware import gpu_memory_bytes

    base = base_config(steps).resolved()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    first = wb.estimate(base, device=device).peak_bytes
    memory, source = gpu_memory_bytes() if device == "cuda" else (None, "")
    if memory is None:
        memory, source = 4 * first, "a CPU dry run: 4 x the first arm's estimated peak stands in for a card"
    dims = dict(base.dims)
    eager = {} if device == "cuda" else {"compile": "none"}  # a CPU dry run: no C++ builds
    arms = [{"arm": "recipe", "why": "the gpu preset's GPT shape", "config": dict(eager)}]
    longer = dataclasses.replace(base, seq_len=2 * base.seq_len)
    batch, peak = _largest_batch(longer, memory, device)
    if batch:
        arms.append({"arm": "seq", "why": f"seq x2, the largest batch that fits {HEADROOM:.0%} of the card "
                     f"(estimated peak {peak:,} B)", "config": {"seq_len": longer.seq_len, "batch_size": batch, **eager}})
    wide_dims = {**dims, "d_model": 2 * dims["d_model"], "n_head": max(1, 2 * dims["d_model"] // 128)}
    wider = dataclasses.replace(longer, dims=wide_dims)
    batch, peak = _largest_batch(wider, memory, device)
    if batch:
        wide = {"seq_len": wider.seq_len, "batch_size": batch, "dims": wide_dims}
        arms.append({"arm": "wider", "why": f"d_model x2 (heads of {wide_dims['d_model'] // wide_dims['n_head']}), "
                     f"seq x2, the largest batch that fits (estimated peak {peak:,} B)", "config": {**wide, **eager}})
        if device == "cuda":
            arms.append({"arm": "autotune", "why": "the wider arm, compile mode max-autotune-no-cudagraphs",
                         "config": {**wide, "compile": "max-autotune-no-cudagraphs"}})
    for a in arms:
        a["memory_bytes"], a["memory_source"] = memory, source
    return arms


def run_arm(arm: dict[str, Any], steps: int) -> dict[str, Any]:
    """One arm's run (in this process) and what the MFU claim reads."""
    import dataclasses

    import workbench as wb

    cfg = dataclasses.replace(base_config(steps), **arm["config"])
    began = time.perf_counter()
    r = wb.run(cfg, name=arm["arm"])
    return {"arm": arm["arm"], "why": arm["why"], "status": r.status, "message": r.message,
            "device": r.device, "batch_size": r.config.batch_size, "seq_len": r.config.seq_len, "dims": r.config.dims,
            "compile": r.config.compile, "steps": r.steps_done, "first_step_s": r.first_step_s,
            "step_time_s": r.step_time_s, "tokens_per_sec": r.tokens_per_sec, "tflops_per_sec": r.tflops_per_sec,
            "mfu": r.mfu, "peak_flops_source": r.peak_flops_source,
            "peak_bytes": r.memory and r.memory.peak_bytes, "wall_s": round(time.perf_counter() - began, 1)}


def run_arms(out: pathlib.Path, *, budget_s: float, steps: int, env: dict[str, str], log: Any) -> dict[str, Any]:
    """Every arm in its own process while the budget lasts; the results (also in out/recipe.json)."""
    began = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    plan_file = out / "recipe_plan.json"
    proc = subprocess.run([sys.executable, __file__, "--plan", str(plan_file), "--steps", str(steps)], env=env,
                          stdout=log, stderr=subprocess.STDOUT, timeout=max(10.0, budget_s), check=False)
    if proc.returncode:
        return {"status": "error", "error": f"planning the arms failed (exit {proc.returncode}): see log.txt", "arms": []}
    arms, results = json.loads(plan_file.read_text()), []
    plan_file.unlink()
    for arm in arms:
        left = budget_s - (time.perf_counter() - began)
        timeout = min(ARM_TIMEOUT_S[arm["arm"]], left)
        if timeout < 30:
            results.append({"arm": arm["arm"], "why": arm["why"], "status": "not run",
                            "message": f"the recipe's budget of {budget_s:.0f} s was spent"})
            continue
        print(f"\n===== recipe arm {arm['arm']} (timeout {timeout:.0f} s): {arm['why']}", file=log, flush=True)
        result_file = out / f"recipe_{arm['arm']}.json"
        child = subprocess.Popen([sys.executable, __file__, "--arm", json.dumps(arm), "--steps", str(steps),
                                  "--result", str(result_file)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            child.wait(timeout=timeout)
            results.append(json.loads(result_file.read_text()))
            result_file.unlink()
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            results.append({"arm": arm["arm"], "why": arm["why"], "status": "timeout", "message": f"stopped after {timeout:.0f} s"})
        except (OSError, ValueError) as error:
            results.append({"arm": arm["arm"], "why": arm["why"], "status": "crashed",
                            "message": f"exit {child.returncode}: {error}"})
        r = results[-1]
        print(f"recipe {r['arm']:<9} {r['status']:<8} MFU {r.get('mfu')}", flush=True)
    # against a data sheet's dense bf16 peak: a GPU's only (a CPU's "peak" is a matmul timed here)
    mfus = [r["mfu"] for r in results if r.get("device") == "cuda" and isinstance(r.get("mfu"), (int, float))]
    summary = {"switches": SWITCHES, "headroom": HEADROOM, "arms": results, "best_mfu": max(mfus) if mfus else None,
               "seconds": round(time.perf_counter() - began, 1)}
    if not mfus:
        summary["why_null"] = "no arm ran on a CUDA GPU: MFU against a data sheet's peak is a GPU figure"
    (out / "recipe.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("recipe-out"))
    parser.add_argument("--budget-s", type=float, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--plan", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plan:
        args.plan.write_text(json.dumps(plan_arms(args.steps), default=str))
        return 0
    if args.arm:
        result = run_arm(json.loads(args.arm), args.steps)
        args.result.write_text(json.dumps(result, default=str))
        return 0 if result["status"] == "ok" else 1
    summary = run_arms(args.out, budget_s=args.budget_s, steps=args.steps, env=dict(os.environ), log=sys.stdout)
    print(json.dumps({a["arm"]: (a["status"], a.get("mfu")) for a in summary["arms"]}))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    sys.exit(main())
