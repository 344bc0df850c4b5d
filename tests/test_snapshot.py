"""Memory snapshots in torch's format: the estimator's step (planner.predicted_snapshot), a CPU step's
tracked tensors and the CUDA allocator's record (lessons.planner.measured_snapshot), read back
from the file and through torch's own `_memory_viz` functions."""

from __future__ import annotations

import base64
import json
import pickle
import re

import pytest
import torch
from torch.cuda import _memory_viz

from workbench import RunConfig
from workbench.core.measure import snapshot as snapshots
from workbench.core.measure.snapshot import Lifetime, MemorySnapshot, build_snapshot, cuda_history, frame
from workbench.lessons import planner as lesson
from workbench.planner.estimate import estimate
from workbench.planner.predicted_snapshot import predicted_snapshot

SMALL_GPT = dict(model="gpt", dims=dict(n_layer=3, n_head=2, d_model=32), seq_len=32)


def _peak_as_the_viewer_reads_it(data: dict) -> int:
    """Written apart from MemorySnapshot.levels(), after MemoryViz.js's process_alloc_data: a free
    of an address the trace has not allocated (by then), and a block active at the end that the
    trace did not allocate, were there from the start; an alloc adds, a free_completed takes away."""
    open_allocs, there_before, changes = {}, 0, []
    for e in data["device_traces"][0]:
        if e["action"] == "alloc":
            open_allocs[e["addr"]] = e["size"]
            changes.append(e["size"])
        elif e["action"] == "free_completed":
            if open_allocs.pop(e["addr"], None) is None:
                there_before += e["size"]
            changes.append(-e["size"])
    for segment in data["segments"]:
        address = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated" and address not in open_allocs:
                there_before += block["size"]
            address += block["size"]
    level = peak = there_before
    for change in changes:
        level += change
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("changes, device", [
    (dict(model="mlp", batch_size=32), "cpu"),       # its peak is the optimizer step's
    (dict(SMALL_GPT, batch_size=3, grad_accum_steps=3), "cpu"),   # a later micro-batch's
    (dict(SMALL_GPT, precision="bf16", activation_checkpointing="all"), "cuda"),  # 512-byte blocks, workspaces
], ids=["mlp-cpu", "gpt-accumulated-cpu", "gpt-bf16-checkpointed-cuda"])
def test_the_predicted_snapshot_read_back_from_its_file_peaks_at_the_estimate(tmp_path, changes, device):
    cfg = RunConfig(preset="cpu-quick", **changes)
    est = estimate(cfg, device=device)
    path = predicted_snapshot(cfg, device=device).write(tmp_path / "predicted.pickle")
    data = pickle.loads(path.read_bytes())
    assert _peak_as_the_viewer_reads_it(data) == est.peak_bytes  # to the byte
    assert MemorySnapshot.read(path).peak_bytes == est.peak_bytes
    events = data["device_traces"][0]
    assert {e["action"] for e in events} == {"alloc", "free_requested", "free_completed"}
    assert all(e["size"] > 0 and e["frames"] and {"filename", "line", "name"} <= set(e["frames"][0]) for e in events)
    if device == "cuda":  # the allocator's blocks, with what was asked for beside them
        assert all(e["size"] % 512 == 0 for e in events)
        assert any(b["requested_size"] < b["size"] for b in data["segments"][0]["blocks"] if b["state"] != "inactive")
    # the model state was there before the record began: active blocks never allocated in the trace
    named = {b["frames"][0]["name"] for b in data["segments"][0]["blocks"] if b["frames"]}
    assert {"parameters and buffers", "optimizer state"} <= named


def test_torchs_own_memory_viz_functions_accept_the_predicted_snapshot(tmp_path):
    snap = predicted_snapshot(RunConfig(preset="cpu-quick", **SMALL_GPT))
    # the viewer's page: the snapshot pickled into it, as torch embeds a real one
    html = snap.write_html(tmp_path / "step.html").read_text()
    assert html == _memory_viz.trace_plot(snap.data) and "MemoryViz.js" in html  # from a CDN: not offline
    embedded = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))[0]["base64"]
    assert pickle.loads(base64.b64decode(embedded).rstrip(b"\x00")) == snap.data
    assert "Allocator State History" in _memory_viz.segment_plot(snap.data)
    # the text tools that need no internet: segsum asserts its own accounting of every block
    stats = snap.stats()
    assert "segments: 1" in stats and "total_allocated" in stats
    listing = _memory_viz.trace(snap.data)
    assert listing.count("cudaMalloc") == 0 and f"{len(snap.data['device_traces'][0])} entries" in listing
    lines = _memory_viz.segments(snap.data, format_flamegraph=lambda text: text)  # flamegraph.pl would be downloaded
    assert "predicted on fake tensors" in lines or "model state" in lines


def test_torchs_text_tool_reads_the_file_offline_as_the_glossary_shows_it(tmp_path):
    """`python -m torch.cuda._memory_viz stats FILE` (docs/GLOSSARY.md): no browser, no internet."""
    import subprocess
    import sys

    path = predicted_snapshot(RunConfig(preset="cpu-quick", model="mlp", batch_size=32)).write(tmp_path / "s.pickle")
    proc = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "total_allocated" in proc.stdout, proc.stderr


def test_a_cpu_steps_tracked_tensors_peak_where_the_prediction_does():
    cfg = RunConfig(preset="cpu-quick", model="mlp", batch_size=32)
    measured = lesson.measured_snapshot(cfg, steps=3)
    predicted = predicted_snapshot(cfg)
    assert measured.peak_bytes == predicted.peak_bytes  # tensors on a CPU: exact, as check_peak finds
    assert _peak_as_the_viewer_reads_it(measured.data) == measured.peak_bytes
    assert "CPU" in measured.source and "predicted" in predicted.source
    ops = {e["frames"][0]["name"] for e in measured.data["device_traces"][0]}
    assert "aten::addmm" in ops  # each storage is named by the op that made it
    _memory_viz.segsum(measured.data)


def test_build_snapshot_lays_blocks_apart_reuses_holes_and_skips_empty_storages():
    f = (frame("here", "made"),)
    lifetimes = [Lifetime(-1, None, 100, 100, f),    # before the window, live throughout
                 Lifetime(-2, 3, 50, 50, f),         # before the window, freed in it
                 Lifetime(1, 2, 30, 30, f), Lifetime(4, None, 20, 20, f),  # the last fits the 50's hole
                 Lifetime(5, 6, 0, 0, f),            # empty: no event
                 Lifetime(8, None, 7, 7, f)]         # after the window: not there
    data = build_snapshot(lifetimes, start=0, stop=7)
    events = data["device_traces"][0]
    assert [e["action"] for e in events] == ["alloc", "free_requested", "free_completed", "free_requested",
                                             "free_completed", "alloc"]
    assert events[0]["addr"] == snapshots.BASE_ADDRESS + 150  # above the two made before
    assert events[3]["addr"] == events[-1]["addr"] == snapshots.BASE_ADDRESS  # first fit: the freed 50's hole
    assert snapshots.snapshot_levels(data) == [150, 180, 150, 100, 120]
    blocks = data["segments"][0]["blocks"]
    assert sum(b["size"] for b in blocks) == data["segments"][0]["total_size"] == 180
    assert [(b["state"], b["size"]) for b in blocks] == [("active_allocated", 20), ("inactive", 30),
                                                         ("active_allocated", 100), ("inactive", 30)]
    _memory_viz.segsum(data)
    with pytest.raises(ValueError, match="stop=1 is before start=2"):
        build_snapshot(lifetimes, start=2, stop=1)


def test_a_file_that_is_not_a_snapshot_says_so(tmp_path):
    path = tmp_path / "x.pickle"
    path.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(ValueError, match="is not a memory snapshot"):
        MemorySnapshot.read(path)


class _FakeCudaMemory:
    """torch.cuda.memory's record functions, as calls made (no GPU here)."""

    def __init__(self) -> None:
        self.calls: list = []

    def _record_memory_history(self, enabled="all", **kwargs):
        self.calls.append(("record", enabled, kwargs.get("max_entries")))

    def _snapshot(self):
        self.calls.append(("snapshot",))
        return {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 512, "frames": []}]]}


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = _FakeCudaMemory()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake._record_memory_history)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", fake._snapshot)
    return fake


def test_on_cuda_the_allocator_records_exactly_the_last_step(fake_cuda, monkeypatch):
    """The CUDA path without a GPU: the run is stubbed, its sink hears steps 1-4; the record starts
    at step 3's log and is taken (then stopped) at step 4's, so it holds step 4 alone."""
    from types import SimpleNamespace as S

    def run(config, steps, live, sink, name):
        assert live is None  # no tensor tracking on a GPU: the allocator's record is the measurement
        sink.start(None)
        for step in range(1, steps + 1):
            fake_cuda.calls.append(("log", step))
            sink.log(S(step=step))
        sink.end(None)

    monkeypatch.setattr(lesson, "_on_cuda", lambda config: True)
    monkeypatch.setattr(lesson, "_tracked_run", run)
    snap = lesson.measured_snapshot(RunConfig(model="mlp"), steps=4)
    assert fake_cuda.calls == [("log", 1), ("log", 2), ("log", 3), ("record", "all", 1_000_000), ("log", 4),
                               ("snapshot",), ("record", None, None)]
    assert snap.peak_bytes == 512 and "CUDA caching allocator" in snap.source


def test_a_run_that_ends_early_stops_the_cuda_record(fake_cuda):
    from types import SimpleNamespace as S

    sink = lesson._StepRecord(None, at=3)
    sink.log(S(step=2))
    sink.end(None)  # the run ended before step 3
    assert fake_cuda.calls == [("record", "all", 1_000_000), ("snapshot",), ("record", None, None)]


def test_cuda_history_on_a_cpu_says_what_to_do_instead(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device.*LiveTensors"):
        with cuda_history():
            pass
