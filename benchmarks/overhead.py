"""What does the workbench add to a training step? run() against a bare loop.

Each arm trains the same seeded model on the same data through the same DataLoader
with AdamW in fp32, in a fresh process (no shared warm caches), and reports its mean
step time with the first step excluded. Arms are interleaved round by round because
this machine's speed drifts; the figure is the median over rounds of the per-round
ratio arm / bare, with the spread.

Arms:
  bare       a hand-written loop: forward, loss, backward, step; loss.item() at log steps
  monitor    the bare loop under wb.monitor (three added lines; text sink to /dev/null)
  run        workbench.run() with the text sink (throttled printing to /dev/null)
  dashboard  workbench.run() with the widget Dashboard, driven without a browser

    python benchmarks/overhead.py                  # cpu preset, MLP and small GPT
    python benchmarks/overhead.py --models mlp --rounds 10 --steps 600
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ARMS = ("bare", "monitor", "run", "dashboard")


def _config(model: str, steps: int):
    from workbench import RunConfig

    return RunConfig(model=model, steps=steps, eval_samples=0, log_every=50, preset=os.environ.get("WORKBENCH_PRESET", "cpu")).resolved()


def bare_step_time(model_name: str, steps: int, *, monitored: bool = False) -> float:
    """A plain PyTorch loop over the same model, data, DataLoader and optimizer; with
    `monitored`, the same loop under wb.monitor (its three added lines, marked)."""
    import contextlib

    import torch
    import torch.nn.functional as F

    import workbench as wb
    from workbench.core.data import build_dataloader, load_data
    from workbench.core.models import build_model

    cfg = _config(model_name, steps)
    torch.manual_seed(cfg.seed)
    bundle = load_data(cfg.data, seq_len=cfg.seq_len or 128, seed=cfg.seed)
    model = build_model(cfg.model, data=bundle, dims=cfg.dims)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    loader = build_dataloader(bundle.train, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    mon = (wb.monitor(model, optimizer, steps=steps, log_every=cfg.log_every, name="monitor",  # monitor
                      sinks=[wb.TextSink(open(os.devnull, "w"))]) if monitored else None)
    step, start = 0, None
    with mon or contextlib.nullcontext():
        while step < steps:
            for batch in loader:
                with mon.step(samples=len(batch["labels"])) if mon else contextlib.nullcontext():  # monitor
                    logits = model(batch["inputs"])
                    loss = F.cross_entropy(logits.flatten(0, -2).float(), batch["labels"].flatten())
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if mon:
                        mon.loss(loss)  # monitor
                step += 1
                if step == 1:
                    start = time.perf_counter()  # the first step is warm-up, as in run()
                elif not mon and (step % cfg.log_every == 0 or step == steps):
                    loss.item()  # the monitor reads the loss at its log steps itself
                if step == steps:
                    break
    return (time.perf_counter() - start) / (steps - 1)


def workbench_step_time(model_name: str, steps: int, arm: str) -> float:
    import workbench as wb

    if arm == "dashboard":
        sinks = [wb.Dashboard()]  # widgets without a front end: the traits still update
    else:
        sinks = [wb.TextSink(open(os.devnull, "w"))]
    result = wb.run(_config(model_name, steps), sinks=sinks, name=arm)
    return result.step_time_s


def _one(arm: str, model: str, steps: int) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--one", arm, "--models", model, "--steps", str(steps)],
        capture_output=True, text=True, check=True, env={**os.environ, "WORKBENCH_HEADLESS": "1"},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["step_time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,gpt")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--one", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:
        if args.one in ("bare", "monitor"):
            t = bare_step_time(args.models, args.steps, monitored=args.one == "monitor")
        else:
            t = workbench_step_time(args.models, args.steps, args.one)
        print(json.dumps({"step_time_s": t}))
        return

    arms = args.arms.split(",")
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"preset {os.environ.get('WORKBENCH_PRESET', 'cpu')}, {args.rounds} rounds x {args.steps} steps")
    for model in args.models.split(","):
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        for r in range(args.rounds):
            order = arms if r % 2 == 0 else arms[::-1]  # alternate who goes first
            for arm in order:
                times[arm].append(_one(arm, model, args.steps))
        print(f"\n{model}: bare step {statistics.median(times['bare']) * 1e3:.2f} ms (median)")
        for arm in arms:
            if arm == "bare":
                continue
            ratios = [a / b for a, b in zip(times[arm], times["bare"])]
            print(f"  {arm:<9} / bare: median {statistics.median(ratios):.3f}  "
                  f"(range {min(ratios):.3f}-{max(ratios):.3f}, per round: {', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
