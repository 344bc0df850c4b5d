"""The teacher's room notebook (notebooks/teacher/room.ipynb): the room's store started as the
teacher starts it (docs/WORKSHOP.md, "What the room measured"), learners played by processes
under CPU caps, and the room's views.

A simulated learner is a real process on this machine: its own `import workbench`, its own runs,
its own fingerprint. The caps change what its matmuls may use (ONEDNN_MAX_CPU_ISA) and ATen's
vector kernels (ATEN_CPU_CAPABILITY), so its bf16 is native or emulated for real.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from workbench.core.fingerprint import CAP_VARIABLES
from workbench.measure.room import PROJECT, room_records
from workbench.views.room import calibration_table, effects, outlier_table, outliers, room_figure, room_table

__all__ = ["Room", "as_learner", "calibration_table", "effects", "outlier_table", "outliers", "room_figure",
           "room_records", "room_table", "start_room"]


@dataclass
class Room:
    url: str
    """What learners set WORKBENCH_ROOM to: the server with its write token."""
    store: str
    """The folder trackio keeps the room's SQLite database in (TRACKIO_DIR)."""
    process: subprocess.Popen

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

    def __repr__(self) -> str:
        return f"Room({self.url.split('?')[0]}, store {self.store})"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_room(token: str = "workshop", *, wait_s: float = 60.0) -> Room:
    """`trackio show --project workbench-room` in a fresh store on a free loopback port, as the
    teacher's command in docs/WORKSHOP.md starts it; returns when the server answers."""
    import httpx

    store, port = tempfile.mkdtemp(prefix="room-store-"), _free_port()
    env = {**os.environ, "TRACKIO_DIR": store, "TRACKIO_WRITE_TOKEN": token, "GRADIO_SERVER_PORT": str(port),
           "BROWSER": "true"}  # the CLI opens a browser tab: not from a notebook
    trackio = pathlib.Path(sys.executable).with_name("trackio")
    process = subprocess.Popen([str(trackio), "show", "--project", PROJECT], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base, deadline = f"http://127.0.0.1:{port}/", time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"trackio show exited with {process.returncode} before answering on {base}")
        try:
            httpx.get(base + "version", timeout=1).raise_for_status()
            return Room(f"{base}?write_token={token}", store, process)
        except httpx.HTTPError:
            time.sleep(0.3)
    process.terminate()
    raise RuntimeError(f"trackio show did not answer on {base} within {wait_s:.0f} s")


def as_learner(code: str, room: Room | str, caps: dict[str, str], *, label: str) -> None:
    """Run a learner's `code` in its own process under `caps` and only those (the kernel's own caps,
    e.g. CI's AVX2 switches, are not passed on: `caps={}` is this machine as it is), sharing with
    `room`; print its 'room:' lines (what the learner saw) under `label`."""
    url = room.url if isinstance(room, Room) else room
    own = {k: v for k, v in os.environ.items() if k not in CAP_VARIABLES}
    env = {**own, **caps, "WORKBENCH_ROOM": url}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"learner {label!r} failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    for line in done.stdout.splitlines():
        if line.startswith("room:"):
            print(f"[{label}] {line}")
