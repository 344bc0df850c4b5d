"""What does the workbench add to a training step? run() against a bare loop.

Each arm trains the same seeded model on the same data through the same DataLoader
with AdamW in fp32, in a fresh ipykernel of its own (a notebook's process, no shared
warm caches; the dashboard's widgets send real messages there), and reports its mean
step time with the first step excluded. Arms are interleaved round by round because
this machine's speed drifts; the figure is the median over rounds of the per-round
ratio arm / bare, with the spread.

The workbench arms time steps from the first log step to the last, measured by a sink
that hears each log step before the others: the view's drawing falls inside that
window (the run's own `step_time_s` leaves the sinks' time out, so it cannot show what
a view costs). The dashboard also counts the seconds it spends itself (`busy_s`): its
share of that window is reported beside the ratios, and so are its one-off costs
before the first step (building the widgets) and after the last (the final numbers
and the static PNG).

Arms:
  bare       a hand-written loop: forward, loss, backward, step; loss.item() at log steps
  monitor    the bare loop under wb.monitor (three added lines; text sink to /dev/null)
  run        workbench.run() with the text sink (throttled printing to /dev/null)
  dashboard  workbench.run() with the widget Dashboard, displayed in the kernel (no browser)

    python benchmarks/overhead.py                  # cpu preset, MLP and small GPT
    python benchmarks/overhead.py --models mlp --rounds 10 --steps 600 --log-every 1
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import time

ARMS = ("bare", "monitor", "run", "dashboard")


def _config(model: str, steps: int, log_every: int):
    from workbench import RunConfig

    return RunConfig(model=model, steps=steps, eval_samples=0, log_every=log_every,
                     preset=os.environ.get("WORKBENCH_PRESET", "cpu")).resolved()


def bare_step_time(model_name: str, steps: int, log_every: int, *, monitored: bool = False) -> dict:
    """A plain PyTorch loop over the same model, data, DataLoader and optimizer; with
    `monitored`, the same loop under wb.monitor (its three added lines, marked)."""
    import contextlib

    import torch
    import torch.nn.functional as F

    import workbench as wb
    from workbench.core.data import build_dataloader, load_data
    from workbench.core.models import build_model

    cfg = _config(model_name, steps, log_every)
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
    return {"step_time_s": (time.perf_counter() - start) / (steps - 1)}


class LogClock:
    """A sink that notes when each log step reaches the sinks (and what the view had spent by then)."""

    def __init__(self, view=None) -> None:
        self.view, self.marks = view, []

    def start(self, record) -> None:
        pass

    def log(self, record) -> None:
        self.marks.append((record.step, time.perf_counter(), self.view.busy_s if self.view else 0.0))

    def end(self, record) -> None:
        pass


def workbench_step_time(model_name: str, steps: int, log_every: int, arm: str) -> dict:
    import workbench as wb

    view = None
    if arm == "dashboard":
        began = time.perf_counter()
        view = wb.Dashboard()  # what run() makes for a run in a notebook
        build_s = time.perf_counter() - began
        sinks = [view]
    else:
        sinks = [wb.TextSink(open(os.devnull, "w"))]
    clock = LogClock(view)
    wb.run(_config(model_name, steps, log_every), sinks=[clock, *sinks], name=arm)
    (first, t0, busy0), (last, t1, busy1) = clock.marks[0], clock.marks[-1]
    out = {"step_time_s": (t1 - t0) / (last - first)}
    if view is not None:
        out.update(view_share=(busy1 - busy0) / (t1 - t0), window_s=t1 - t0, build_s=build_s,
                   start_s=busy0, end_s=view.busy_s - busy1, plot_updates=view.plot_updates,
                   numbers_updates=view.numbers_updates, log_steps=len(clock.marks))
    return out


def _one(client, arm: str, model: str, steps: int, log_every: int) -> dict:
    """One arm in the given fresh kernel; its figures as a dict."""
    here = os.path.dirname(os.path.abspath(__file__))
    call = (f"bare_step_time({model!r}, {steps}, {log_every}, monitored={arm == 'monitor'})"
            if arm in ("bare", "monitor") else f"workbench_step_time({model!r}, {steps}, {log_every}, {arm!r})")
    code = f"import sys, json; sys.path.insert(0, {here!r}); from overhead import *; print('RESULT', json.dumps({call}))"
    msg_id = client.execute(code)
    result = None
    while True:
        try:
            msg = client.get_iopub_msg(timeout=1800)
        except queue.Empty:
            raise RuntimeError(f"{arm}: the kernel did not answer") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            for line in msg["content"]["text"].splitlines():
                if line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT "):])
        elif msg["msg_type"] == "error":
            raise RuntimeError(f"{arm}:\n" + "\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return result


def run_arm(arm: str, model: str, steps: int, log_every: int) -> dict:
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "WORKBENCH_HEADLESS": "0"}  # a kernel nobody watches, but a notebook's kernel
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_")}
    manager, client = start_new_kernel(kernel_name="python3", env=env)
    try:
        return _one(client, arm, model, steps, log_every)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _spread(values: list[float], fmt: str = "{:.3f}") -> str:
    return (f"median {fmt.format(statistics.median(values))}  (range {fmt.format(min(values))}-"
            f"{fmt.format(max(values))}, per round: {', '.join(fmt.format(v) for v in values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,gpt")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args()

    arms = args.arms.split(",")
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"preset {os.environ.get('WORKBENCH_PRESET', 'cpu')}, {args.rounds} rounds x {args.steps} steps, "
          f"a log step every {args.log_every}; each arm in a fresh ipykernel")
    for model in args.models.split(","):
        figures: dict[str, list[dict]] = {arm: [] for arm in arms}
        for r in range(args.rounds):
            order = arms if r % 2 == 0 else arms[::-1]  # alternate who goes first
            for arm in order:
                figures[arm].append(run_arm(arm, model, args.steps, args.log_every))
        times = {arm: [f["step_time_s"] for f in figs] for arm, figs in figures.items()}
        base = "bare" if "bare" in arms else arms[0]
        print(f"\n{model}: {base} step {statistics.median(times[base]) * 1e3:.2f} ms (median)")
        for arm in arms:
            if arm != base:
                print(f"  {arm:<9} / {base}: " + _spread([a / b for a, b in zip(times[arm], times[base])]))
        if "dashboard" in arms and "run" in arms:
            print("  dashboard / run: " + _spread([a / b for a, b in zip(times["dashboard"], times["run"])]))
        if "dashboard" in arms:
            dash = figures["dashboard"]
            print("  dashboard's own time, share of the steps it watched: "
                  + _spread([f["view_share"] * 100 for f in dash], "{:.3f}%"))
            print(f"  dashboard updates: plot {statistics.median(f['plot_updates'] for f in dash):.0f}, numbers "
                  f"{statistics.median(f['numbers_updates'] for f in dash):.0f} in "
                  f"{statistics.median(f['window_s'] for f in dash):.1f} s "
                  f"({statistics.median(f['log_steps'] for f in dash):.0f} log steps); one-off: build "
                  f"{statistics.median(f['build_s'] for f in dash) * 1e3:.0f} ms, start "
                  f"{statistics.median(f['start_s'] for f in dash) * 1e3:.0f} ms, end (final numbers, PNG) "
                  f"{statistics.median(f['end_s'] for f in dash) * 1e3:.0f} ms (medians)")


if __name__ == "__main__":
    main()
