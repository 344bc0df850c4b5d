"""What does a live loss curve cost the kernel? bqplot against plotly's FigureWidget.

The dashboard's curve is drawn in the browser from points the kernel sends, so its cost
to the training run is what the kernel spends per update: building the message (trait
serialisation, validation) and publishing it on the kernel's IOPub socket. This starts
a real ipykernel (jupyter_client, no browser attached: the kernel serialises and sends
the same messages either way), and inside it, for each library:

  import     seconds to import the library in a fresh kernel (a first run pays it once)
  create     seconds to build a figure with one line, and the bytes its comm_open messages
             carry (what the browser receives, and what a saved notebook's widget state holds)
  update     median seconds per update that sets a line's x and y to n points (bqplot under
             `hold_sync`, plotly under `batch_update`), the messages and bytes of one update

The matplotlib PNG the dashboard drew before (Agg, one savefig) is measured the same way
for reference. Bytes are counted where the client receives them (IOPub), times inside the
kernel with perf_counter, medians over `--repeats` updates.

    python benchmarks/plot_widgets.py
    python benchmarks/plot_widgets.py --points 100,1000,10000 --repeats 100
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys

# Runs inside the kernel: build one figure, then update its line `repeats` times per size.
KERNEL_CODE = r"""
import time, statistics, numpy as np
_t0 = time.perf_counter()
LIBRARY = {library!r}
if LIBRARY == "bqplot":
    import bqplot
elif LIBRARY == "plotly":
    import plotly.graph_objects as go
    go.FigureWidget, go.Scatter  # graph_objects loads lazily: this is the import
else:
    from matplotlib.figure import Figure
    import io
_import_s = time.perf_counter() - _t0

_t0 = time.perf_counter()
if LIBRARY == "bqplot":
    sx, sy = bqplot.LinearScale(), bqplot.LinearScale()
    line = bqplot.Lines(x=np.zeros(0), y=np.zeros(0), scales={{"x": sx, "y": sy}})
    fig = bqplot.Figure(marks=[line], axes=[bqplot.Axis(scale=sx, label="step"),
                        bqplot.Axis(scale=sy, orientation="vertical", label="loss")])
    def update(x, y):
        with line.hold_sync():
            line.x, line.y = x, y
elif LIBRARY == "plotly":
    fig = go.FigureWidget(data=[go.Scatter(x=[], y=[], mode="lines")])
    def update(x, y):
        with fig.batch_update():
            fig.data[0].x, fig.data[0].y = x, y
else:
    fig = Figure(figsize=(7, 2.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    (mline,) = ax.plot([], [])
    def update(x, y):
        mline.set_data(x, y); ax.relim(); ax.autoscale_view()
        buf = io.BytesIO(); fig.savefig(buf, format="png")
        return buf.getvalue()
_create_s = time.perf_counter() - _t0
print("MARK create", _import_s, _create_s, flush=True)
"""

UPDATE_CODE = r"""
x = np.arange(1, {n} + 1, dtype=np.float64)
y = 2.0 / np.sqrt(x)
times = []
for i in range({repeats}):
    y = y * 0.999  # a new curve each time, as a run's grows
    t0 = time.perf_counter()
    _png = update(x, y)
    times.append(time.perf_counter() - t0)
print("MARK update", {n}, statistics.median(times), min(times), max(times),
      len(_png) if isinstance(_png, bytes) else 0, flush=True)
"""


def _message_bytes(msg: dict) -> int:
    return len(json.dumps(msg["content"], default=str)) + sum(len(b) for b in msg.get("buffers", []))


def _execute(client, code: str, timeout: float = 300) -> tuple[list[str], dict[str, list[int]]]:
    """Run code; return its MARK lines and the bytes of the comm messages it published, by type."""
    msg_id = client.execute(code)
    marks: list[str] = []
    sizes: dict[str, list[int]] = {"comm_open": [], "comm_msg": []}
    while True:
        try:
            msg = client.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            raise RuntimeError("the kernel did not answer") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind in sizes:
            sizes[kind].append(_message_bytes(msg))
        elif kind == "stream":
            marks += [line for line in msg["content"]["text"].splitlines() if line.startswith("MARK")]
        elif kind == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"]))
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            return marks, sizes


def measure(library: str, points: list[int], repeats: int) -> dict:
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        marks, sizes = _execute(client, KERNEL_CODE.format(library=library))
        _, import_s, create_s = marks[0].split()[1:]
        out = {"library": library, "import_s": float(import_s), "create_s": float(create_s),
               "create_bytes": sum(sizes["comm_open"]) + sum(sizes["comm_msg"]),
               "create_messages": len(sizes["comm_open"]) + len(sizes["comm_msg"]), "updates": []}
        for n in points:
            marks, sizes = _execute(client, UPDATE_CODE.format(n=n, repeats=repeats))
            _, _, _, median_s, min_s, max_s, png_bytes = marks[0].split()
            msgs = sizes["comm_msg"]
            out["updates"].append({
                "points": n, "median_s": float(median_s), "min_s": float(min_s), "max_s": float(max_s),
                "messages_per_update": len(msgs) / repeats,
                "bytes_per_update": sum(msgs) / repeats if msgs else int(png_bytes),
            })
        return out
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--libraries", default="bqplot,plotly,matplotlib")
    parser.add_argument("--points", default="100,1000,10000")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    points = [int(p) for p in args.points.split(",")]
    results = [measure(lib, points, args.repeats) for lib in args.libraries.split(",")]
    print(f"python {sys.version.split()[0]}, {args.repeats} updates per size, medians (min-max)")
    for r in results:
        print(f"\n{r['library']}: import {r['import_s']:.2f} s, create {r['create_s'] * 1e3:.1f} ms, "
              f"{r['create_messages']} messages, {r['create_bytes'] / 1e3:,.1f} kB sent on creation")
        for u in r["updates"]:
            print(f"  {u['points']:>6} points: {u['median_s'] * 1e3:7.2f} ms/update "
                  f"({u['min_s'] * 1e3:.2f}-{u['max_s'] * 1e3:.2f}), {u['messages_per_update']:.0f} message(s), "
                  f"{u['bytes_per_update'] / 1e3:,.1f} kB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
