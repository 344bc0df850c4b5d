"""Memory snapshots in PyTorch's own format: the file its memory viewer opens.

`torch.cuda.memory._snapshot()` returns a dict, and `torch.cuda.memory._dump_snapshot(path)`
pickles it; https://pytorch.org/memory_viz opens that file (in the browser: the file is read by
the page, not uploaded) and so does the HTML `torch.cuda._memory_viz.trace_plot(snapshot)` writes.
Its two keys (torch/cuda/memory.py, `_snapshot`'s docstring):

- "segments": the allocator's memory at the end, as blocks (`active_allocated` or `inactive`)
  with their sizes and the stack frames that allocated them. An active block with no alloc event
  in the trace existed before the record began (the viewer stacks it at the bottom);
- "device_traces": per device, the events in order: `alloc`, then `free_requested` and
  `free_completed`, each with an address, a size and frames.

`build_snapshot(lifetimes, start=, stop=)` writes one from storages' lifetimes (when each was
made and freed, on any clock), so a step replayed on fake tensors (`planner.predicted_snapshot`) or the
tensors a CPU step made (tracked with `planner.live.LiveTensors`) open in the same viewer as a
CUDA allocator's record (`cuda_history`). `MemorySnapshot` holds one, with what it came from.

What works without the internet: the snapshot files and torch's text tools on them
(`python -m torch.cuda._memory_viz stats FILE` and `trace FILE`, or `MemorySnapshot.stats()`),
and the workbench's own figure of the same timeline. The viewer does not: memory_viz is a web
page, and the HTML trace_plot writes loads its script (MemoryViz.js, which loads d3) from a CDN;
the torch wheel does not carry that script and no package registry does, so it is not shipped.

Example:
    >>> snap = build_snapshot([Lifetime(0, 2, 1024, 1024, ()), Lifetime(1, None, 512, 500, ())], start=0, stop=3)
    >>> [e["action"] for e in snap["device_traces"][0]], snapshot_levels(snap)
    (['alloc', 'alloc', 'free_requested', 'free_completed'], [0, 1024, 1536, 512])
"""

from __future__ import annotations

import bisect
import contextlib
import pathlib
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["Lifetime", "MemorySnapshot", "build_snapshot", "cuda_history", "frame", "snapshot_levels"]

BASE_ADDRESS = 1 << 40
"""Where the made-up layout starts (any number: the viewer only needs addresses that differ)."""


def frame(filename: str, name: str, line: int = 0) -> dict[str, Any]:
    """One stack frame as a snapshot holds it; the viewer prints `filename:line:name`."""
    return {"filename": filename, "line": line, "name": name}


class Lifetime(NamedTuple):
    """One storage: when it was made and freed (any clock: only the order counts), its bytes as
    the device holds them and as asked for, and the frames that say what made it."""

    born: float
    freed: float | None
    """None: never freed (still live at the end)."""
    size: int
    requested: int
    frames: tuple[dict[str, Any], ...]


class _FirstFit:
    """Addresses for the viewer: the lowest hole that fits, holes merged when freed."""

    def __init__(self) -> None:
        self.holes: list[tuple[int, int]] = []  # (address, size), sorted
        self.top = self.high = BASE_ADDRESS

    def take(self, size: int) -> int:
        for i, (address, room) in enumerate(self.holes):
            if room >= size:
                self.holes[i:i + 1] = [(address + size, room - size)] if room > size else []
                return address
        address, self.top = self.top, self.top + size
        self.high = max(self.high, self.top)
        return address

    def give(self, address: int, size: int) -> None:
        i = bisect.bisect(self.holes, (address, size))
        self.holes.insert(i, (address, size))
        if i + 1 < len(self.holes) and address + size == self.holes[i + 1][0]:  # merge with the next
            self.holes[i:i + 2] = [(address, size + self.holes[i + 1][1])]
        if i and self.holes[i - 1][0] + self.holes[i - 1][1] == address:  # and with the one before
            self.holes[i - 1:i + 1] = [(self.holes[i - 1][0], self.holes[i - 1][1] + self.holes[i][1])]
        last, room = self.holes[-1]
        if last + room == self.top:  # a hole at the top gives the top back
            self.holes.pop()
            self.top = last


def build_snapshot(lifetimes: Iterable[Lifetime], *, start: float, stop: float, device: int = 0) -> dict[str, Any]:
    """The snapshot of what happened between `start` and `stop` (inclusive), in torch's format.

    A storage made before `start` and still live then is a block allocated before the record
    began (in "segments" if it outlives `stop`; else only its free is in the trace, as a real
    record shows it); one made in the window gets an `alloc` event, one freed in it a
    `free_requested` and a `free_completed`. Storages of 0 bytes get none (CUDA allocates nothing
    for them). Addresses: a first-fit layout in one segment, made up for the viewer.
    """
    if stop < start:
        raise ValueError(f"stop={stop} is before start={start}: pass the window's first clock, then its last")
    kept = [t for t in lifetimes if t.size > 0 and t.born <= stop and (t.freed is None or t.freed >= start)]
    # (clock, 0 = free before 1 = alloc at the same clock, index)
    order = sorted([(t.born, 1, i) for i, t in enumerate(kept)] +
                   [(t.freed, 0, i) for i, t in enumerate(kept) if t.freed is not None and t.freed <= stop])
    layout, addresses, events = _FirstFit(), {}, []
    for clock, is_alloc, i in order:
        t = kept[i]
        if is_alloc:
            addresses[i] = layout.take(t.size)
            if clock >= start:
                events.append({"action": "alloc", "addr": addresses[i], "size": t.size, "stream": 0,
                               "frames": list(t.frames)})
        else:
            layout.give(addresses[i], t.size)
            if clock >= start:
                events += [{"action": action, "addr": addresses[i], "size": t.size, "stream": 0,
                            "frames": list(t.frames)} for action in ("free_requested", "free_completed")]
    live = sorted((addresses[i], t) for i, t in enumerate(kept) if t.freed is None or t.freed > stop)
    blocks, at = [], BASE_ADDRESS
    for address, t in live:
        if address > at:
            blocks.append({"address": at, "size": address - at, "requested_size": 0, "state": "inactive", "frames": []})
        blocks.append({"address": address, "size": t.size, "requested_size": t.requested, "state": "active_allocated",
                       "frames": list(t.frames)})
        at = address + t.size
    total = max(layout.high, at) - BASE_ADDRESS
    if at < BASE_ADDRESS + total:
        blocks.append({"address": at, "size": BASE_ADDRESS + total - at, "requested_size": 0, "state": "inactive",
                       "frames": []})
    active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    segment = {"device": device, "address": BASE_ADDRESS, "total_size": total, "stream": 0, "segment_type": "large",
               "segment_pool_id": (0, 0), "allocated_size": active, "active_size": active,
               "requested_size": sum(b["requested_size"] for b in blocks), "blocks": blocks}
    return {"segments": [segment] if total else [], "device_traces": [[] for _ in range(device)] + [events]}


def snapshot_levels(snapshot: dict[str, Any], device: int = 0) -> list[int]:
    """Bytes live before the first event and after each alloc and free of `device`'s trace: the
    curve memory_viz's "Active Memory Timeline" stacks (a block allocated before the record began,
    whether freed in it or still active at the end, counts from the start)."""
    events = snapshot["device_traces"][device] if device < len(snapshot["device_traces"]) else []
    allocated: dict[int, int] = {}
    before, changes = 0, []
    for e in events:
        if e["action"] == "alloc":
            allocated[e["addr"]] = e["size"]
            changes.append(e["size"])
        elif e["action"] == "free_completed":
            size = allocated.pop(e["addr"], None)
            if size is None:  # allocated before the record began
                size = e["size"]
                before += size
            changes.append(-size)
    before += sum(b["size"] for seg in snapshot["segments"] if seg.get("device", device) == device
                  for b in _addressed(seg) if b["state"] == "active_allocated" and b["address"] not in allocated)
    levels = [before]
    for change in changes:
        levels.append(levels[-1] + change)
    return levels


def _addressed(segment: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A segment's blocks with their addresses (older snapshots leave them to be summed)."""
    address = segment["address"]
    for block in segment["blocks"]:
        yield {"address": address, **block}
        address += block["size"]


@dataclass(frozen=True)
class MemorySnapshot:
    """A memory snapshot (`data`, torch's dict) and what it is: `source` says whose bytes they are."""

    data: dict[str, Any]
    source: str

    def levels(self) -> list[int]:
        return snapshot_levels(self.data)

    @property
    def peak_bytes(self) -> int:
        """The most bytes live at any moment of the trace, blocks from before it included."""
        return max(self.levels())

    def write(self, path: str | pathlib.Path) -> pathlib.Path:
        """Pickle it as `torch.cuda.memory._dump_snapshot` does: the file memory_viz opens."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(self.data))
        return path

    @classmethod
    def read(cls, path: str | pathlib.Path, source: str = "") -> MemorySnapshot:
        """A snapshot file written by `write` or `_dump_snapshot` (a pickle: open only files you trust)."""
        data = pickle.loads(pathlib.Path(path).read_bytes())
        if not isinstance(data, dict) or "segments" not in data:
            raise ValueError(f"{path} is not a memory snapshot (a pickled dict with 'segments' and 'device_traces')")
        data.setdefault("device_traces", [])
        return cls(data, source or f"read from {path}")

    def stats(self) -> str:
        """torch's text summary of the segments (`python -m torch.cuda._memory_viz stats`): offline."""
        from torch.cuda import _memory_viz  # lazy: reading a saved snapshot needs no torch

        return _memory_viz.segsum(self.data)

    def write_html(self, path: str | pathlib.Path) -> pathlib.Path:
        """torch's `trace_plot` page for it. It loads MemoryViz.js from a CDN: it needs the internet."""
        from torch.cuda import _memory_viz  # lazy: reading a saved snapshot needs no torch

        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_memory_viz.trace_plot(self.data))
        return path


@contextlib.contextmanager
def cuda_history(max_entries: int = 1_000_000, stacks: str = "python") -> Iterator[dict[str, Any]]:
    """Record the CUDA caching allocator's events while the block runs; the dict it yields gets
    the snapshot (`torch.cuda.memory._snapshot()`) under "snapshot" when the block ends. Python
    frames only by default: torch's "all" adds every C++ frame, several KB an event (its docs).

        with cuda_history() as taken:
            train_one_step()
        MemorySnapshot(taken["snapshot"], "measured").write("step.pickle")

    The same three calls a script makes: `_record_memory_history(max_entries=...)`, `_snapshot()`
    (or `_dump_snapshot(path)`), `_record_memory_history(enabled=None)`.
    """
    import torch  # lazy: reading a saved snapshot needs no torch

    if not torch.cuda.is_available():
        raise RuntimeError("cuda_history() records the CUDA allocator and this machine has no CUDA device; "
                           "on a CPU track the tensors instead (planner.live.LiveTensors(levels=True))")
    taken: dict[str, Any] = {}
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks=stacks)
    try:
        yield taken
        taken["snapshot"] = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
