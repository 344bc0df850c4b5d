"""How big a room (issue 40, point 5), measured: 20 real IPython kernels share with one room at once, and
10,000 pooled records of many hardware classes go through the teacher's views.

    python benchmarks/room_scale.py [--kernels 20] [--shares 3] [--records 10000] [--out benchmarks/results/room-scale.json]

Each kernel is a real `ipykernel` (jupyter_client's KernelManager, as a learner's JupyterLab starts one),
with its own key to a simulated room; each imports workbench and, once every kernel is ready, shares
`--shares` times (a run of its own and its predictions, as 00's sharing cell does). Measured: how many
records landed of how many sent, the slowest share, and how long after the last share the teacher's read
and views took. Then `--records` synthetic records (tests/test_room_scale.py's) through every view.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

KERNEL_CODE = """
import os, time
import workbench as wb
result = wb.run(wb.RunConfig(model="mlp", steps=4, log_every=4, eval_samples=0, dims={{"hidden": (16,)}}, data="digits"), name="tiny")
row = {{"notebook": "00_tour", "exercise": "answer_a", "predicted": 2.0, "measured": 1.6, "kind": "ratio", "unit": "x", "verdict": "wrong"}}
open({go!r} + "." + os.environ["WORKBENCH_ROOM_KEY"][:8], "w").close()  # ready: imported, trained
while not os.path.exists({go!r}):
    time.sleep(0.01)
times = []
for _ in range({shares}):
    t = time.perf_counter()
    assert wb.share(result, predictions=[row], notebook="00_tour")
    times.append(time.perf_counter() - t)
print("SHARE_TIMES", max(times))
"""


def kernels_share(n: int, shares: int, folder: Path) -> dict:
    from jupyter_client import KernelManager

    from workbench.classroom import room_view as views
    from workbench.lessons import room as lesson

    room = lesson.simulated_room(tuple(f"learner{i:02d}" for i in range(1, n + 1)))
    go = folder / "go"
    managers, clients = [], []
    try:
        started = time.perf_counter()
        for name, key in room.learner_keys.items():
            # unix sockets: 20 kernels choosing free TCP ports at once collided here (zmq's bind failed)
            km = KernelManager(kernel_name="python3", transport="ipc", ip=str(folder / f"kernel-{name}"))
            km.start_kernel(env={**os.environ, "WORKBENCH_ROOM": room.url, "WORKBENCH_ROOM_KEY": key,
                                 "OMP_NUM_THREADS": "1", "WORKBENCH_LEDGER": str(folder / f"{name}.jsonl"),
                                 "PYTHONPATH": str(ROOT)})
            kc = km.client()
            kc.start_channels()
            managers.append(km)
            clients.append(kc)
        for kc in clients:
            kc.wait_for_ready(timeout=300)
        msg_ids = [kc.execute(KERNEL_CODE.format(go=str(go), shares=shares)) for kc in clients]
        while len(list(folder.glob("go.*"))) < n:  # each kernel has imported workbench and trained its run
            time.sleep(0.2)
        ready_s = time.perf_counter() - started
        go.touch()
        released = time.perf_counter()
        slowest = []
        for kc, msg_id in zip(clients, msg_ids):
            while True:
                msg = kc.get_iopub_msg(timeout=600)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream" and "SHARE_TIMES" in msg["content"]["text"]:
                    slowest.append(float(msg["content"]["text"].split()[-1]))
                if msg["msg_type"] == "error":
                    raise RuntimeError(f"a kernel failed: {msg['content']['ename']}: {msg['content']['evalue']}")
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
        all_shared_s = time.perf_counter() - released
        read = time.perf_counter()
        records = room.records()
        views.class_table(records), views.room_table(records), views.calibration_table(records)
        read_s = time.perf_counter() - read
        return {"kernels": n, "shares each": shares, "records sent": n * shares * 2, "records landed": len(records),
                "learners seen": len({r["owner"] for r in records}), "kernels started, imported and trained s": round(ready_s, 1),
                "all shares done after release s": round(all_shared_s, 2),
                "slowest share s": round(max(slowest), 2), "median kernel's slowest share s": round(statistics.median(slowest), 2),
                "teacher's read and views after the last share s": round(read_s, 3)}
    finally:
        for kc, km in zip(clients, managers):
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        room.stop()


def views_time(n: int) -> dict:
    from test_room_scale import CLASSES, every_view, fake_records

    records = fake_records(n)
    started = time.perf_counter()
    shown = every_view(records)
    took = time.perf_counter() - started
    return {"records": n, "hardware classes": len(CLASSES), "effects": sum(r[2] for r in shown["effects"].rows),
            "every view s": round(took, 2), "bytes as JSON lines": sum(len(json.dumps(r)) + 1 for r in records)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=20)
    parser.add_argument("--shares", type=int, default=3)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/room-scale.json")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        kernels = kernels_share(args.kernels, args.shares, Path(folder))
    print("kernels:", kernels)
    pooled = views_time(args.records)
    print("views:", pooled)
    load = os.getloadavg()[0]
    record = {"measured": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, load {load:.1f} at the end",
              "kernels sharing at once": kernels, "pooled records through the views": pooled}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if kernels["records landed"] == kernels["records sent"] else 1


if __name__ == "__main__":
    sys.exit(main())
