"""The teacher's room notebook (notebooks/teacher/room.ipynb): the room that is running, or a simulated
one, and the room's views, refreshed while learners work.

The real room: on the room's machine (`make room`) the teacher's kernel has WORKBENCH_ROOM (the room's
store) and WORKBENCH_ROOM_KEY (the teacher's key, which reads everyone's records): `the_room()` is that
room. Elsewhere (CI, nbval, a teacher trying the notebook alone) `simulated_room()` starts a store of its
own on loopback, and learners are played by processes under CPU caps: a simulated learner is a real
process with its own `import workbench`, its own runs and fingerprint; the caps change what its matmuls
may use (ONEDNN_MAX_CPU_ISA) and ATen's vector kernels (ATEN_CPU_CAPABILITY), so its bf16 is native or
emulated for real.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.classroom.room_view import (
    calibration_table,
    class_table,
    effects,
    outlier_table,
    outliers,
    room_figure,
    room_table,
    skipped_table,
)
from workbench.classroom.sharing import KEY_VARIABLE, ROOM_VARIABLE, RoomUnreadable, room_records
from workbench.machine.cpu_class import CAP_VARIABLES

__all__ = ["Room", "as_learner", "calibration_table", "class_table", "effects", "outlier_table", "outliers",
           "room_figure", "room_records", "room_table", "simulated_room", "skipped_table", "the_room", "watch"]


@dataclass
class Room:
    url: str
    """The room's store: what learners' WORKBENCH_ROOM holds."""
    key: str = field(repr=False)
    """The teacher's key: reads every learner's records."""
    simulated: bool
    learner_keys: dict[str, str] = field(default_factory=dict, repr=False)
    """A simulated room's learners: name -> key."""
    process: subprocess.Popen | None = field(default=None, repr=False)

    def records(self) -> list[dict[str, Any]]:
        return room_records(self.url, key=self.key)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)


def the_room() -> Room | None:
    """The room this kernel runs in (WORKBENCH_ROOM and the teacher's WORKBENCH_ROOM_KEY), or None."""
    url, key = os.environ.get(ROOM_VARIABLE), os.environ.get(KEY_VARIABLE)
    return Room(url, key, simulated=False) if url and key else None


def simulated_room(learners: tuple[str, ...] = ("learner-a", "learner-b", "learner-c"), *,
                   wait_s: float = 60.0) -> Room:
    """A room of its own for the notebook alone (CI, nbval, a teacher trying it out): the room's store
    on a free loopback port, a fresh folder, a key for the teacher and one for each simulated learner."""
    folder = Path(tempfile.mkdtemp(prefix="room-store-"))
    keys = {secrets.token_hex(16): {"name": name, "teacher": False} for name in learners}
    teacher = secrets.token_hex(16)
    keys[teacher] = {"name": "teacher", "teacher": True}
    (folder / "keys.json").write_text(json.dumps(keys))
    (folder / "keys.json").chmod(0o600)
    command = [sys.executable, "-u", "-m", "workbench.classroom.store", "--store", str(folder / "records"),
               "--keys", str(folder / "keys.json"), "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                                   str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))})
    deadline = time.monotonic() + wait_s
    line = process.stdout.readline()  # 'room store: serving DIR on http://127.0.0.1:PORT/'
    if "serving" not in line or time.monotonic() > deadline:
        process.terminate()
        raise RuntimeError(f"the room's store did not start: {line.strip() or 'no output'}")
    url = line.rsplit(" on ", 1)[1].strip()
    return Room(url, teacher, simulated=True, process=process,
                learner_keys={who["name"]: key for key, who in keys.items() if not who["teacher"]})


def as_learner(code: str, room: Room, caps: dict[str, str], *, learner: str, label: str | None = None) -> None:
    """Run a simulated learner's `code` in its own process under `caps` and only those (the kernel's own
    caps, e.g. CI's AVX2 switches, are not passed on: `caps={}` is this machine as it is), sharing with
    `room` under `learner`'s key; print its 'room:' lines (what the learner saw) under `label`."""
    own = {k: v for k, v in os.environ.items() if k not in CAP_VARIABLES}
    folder = Path(tempfile.mkdtemp(prefix=f"room-{learner}-"))
    script = folder / "learner.py"  # a file, not -c: wb.check reads the answer's name from its line
    script.write_text(code)
    env = {**own, **caps, ROOM_VARIABLE: room.url, KEY_VARIABLE: room.learner_keys[learner],
           "WORKBENCH_LEDGER": str(folder / "ledger.jsonl"), "WORKBENCH_LEARNER": learner}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"learner {learner!r} failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    for line in done.stdout.splitlines():
        if line.startswith("room:"):
            print(f"[{label or learner}] {line}")


class Watch:
    """The room's views in one output, re-read from the room every `every_s` seconds while the kernel
    is idle (an asyncio task on the kernel's loop: the teacher's other cells still run)."""

    def __init__(self, room: Room, every_s: float) -> None:
        # notebook-only: importing workbench stays free of Jupyter (tests/test_dashboard.py)
        import ipywidgets

        self.room, self.every_s = room, every_s
        self.status = ipywidgets.HTML()
        self.output = ipywidgets.Output()
        self.box = ipywidgets.VBox([self.status, self.output])
        self.reads = 0
        self.task: asyncio.Task | None = None

    def show(self, records: list[dict[str, Any]]) -> None:
        """Replace the output's contents in one trait change: from the refresh task, outside any cell's
        execution, clear_output() and append_display_data() left the page showing the first read (seen
        in the browser test: the status said 7 records, the tables 0)."""
        # notebook-only: importing workbench stays free of Jupyter (tests/test_dashboard.py)
        from IPython.core.interactiveshell import InteractiveShell

        formatter = InteractiveShell.instance().display_formatter.format
        shown = []
        for view in (class_table(records), room_table(records), room_figure(records), outlier_table(records),
                     calibration_table(records), skipped_table(records)):
            data, metadata = formatter(view)
            shown.append({"output_type": "display_data", "data": data, "metadata": metadata})
        self.output.outputs = tuple(shown)

    def _read(self) -> list[dict[str, Any]] | RoomUnreadable:
        try:
            return self.room.records()
        except RoomUnreadable as why:
            return why

    def draw(self, records: list[dict[str, Any]] | RoomUnreadable) -> None:
        """Redraw from one read (a room that could not be read says why in the status line)."""
        if isinstance(records, RoomUnreadable):
            self.status.value = f"<b>room</b>: {html.escape(str(records))} (trying again in {self.every_s:g} s)"
            return
        self.reads += 1
        self.show(records)
        self.status.value = (f"<b>room</b> ({'simulated' if self.room.simulated else 'live'}): {len(records)} records, "
                             f"read at {time.strftime('%H:%M:%S')}, every {self.every_s:g} s")

    def refresh(self) -> None:
        self.draw(self._read())

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.every_s)
            # the read blocks (up to READ_TIMEOUT_S): in a thread; the widgets change on the kernel's loop
            self.draw(await loop.run_in_executor(None, self._read))

    def start(self) -> Watch:
        self.refresh()
        try:
            self.task = asyncio.get_running_loop().create_task(self._loop())
        except RuntimeError:  # no running loop (a plain script): one read, no refresh
            self.task = None
        return self

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def _ipython_display_(self) -> None:
        # notebook-only: importing workbench stays free of Jupyter (tests/test_dashboard.py)
        from IPython.display import display

        display(self.box)


def watch(room: Room, *, every_s: float = 5.0) -> Watch:
    """The room's views (by hardware class, each technique's effect, outliers, predictions, what was
    skipped), refreshed every `every_s` seconds while learners share. `.stop()` ends the refresh."""
    return Watch(room, every_s).start()
