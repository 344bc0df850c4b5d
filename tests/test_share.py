"""Sharing with the room (issues 29 and 40): the fingerprint under caps, anonymity, a room that is down,
refusing or full, each learner's records their own, learners sharing at once, the teacher's pooled view.
(What a hostile classmate or server tries: tests/test_hostile.py's room section.)"""

from __future__ import annotations

import dataclasses
import getpass
import http.server
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

import workbench as wb
from workbench.classroom import room_view as view
from workbench.classroom import sharing as store
from workbench.classroom.fingerprint import cpu_level, hardware_class
from workbench.core.measure.result import LoopDescription
from workbench.lessons import room as lesson
from workbench.machine import cpu_class, hardware
from workbench.machine.cpu_class import CAP_VARIABLES

ROOT = pathlib.Path(__file__).resolve().parent.parent
X86_AVX2 = {"avx2", "fma"} <= cpu_class._proc_cpu_flags()
ROW = {"notebook": "01_mixed_precision", "exercise": "bf16 speed-up", "predicted": 2.0, "measured": 0.5,
       "kind": "ratio", "unit": "x", "verdict": "wrong"}


def _fingerprint_in(env: dict[str, str]) -> dict:
    code = "import json; from workbench.classroom.fingerprint import fingerprint; print(json.dumps(fingerprint('cpu')))"
    clean = {k: v for k, v in os.environ.items() if k not in CAP_VARIABLES}  # CI's own caps too
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(not X86_AVX2, reason="the AVX2 caps need an x86 CPU with AVX2")
def test_a_capped_process_fingerprints_as_an_avx2_machine():
    capped = _fingerprint_in({"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    assert capped["class"] == "CPU AVX2"
    assert (capped["isa"], capped["aten"], capped["bf16"], capped["fp16"]) == ("AVX2", "AVX2", "emulated", "emulated")
    assert not any(f.startswith(("avx512", "amx")) for f in capped["flags"])
    assert capped["caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    scalar = _fingerprint_in({"ATEN_CPU_CAPABILITY": "default"})
    assert scalar["aten"] == "DEFAULT" and scalar["class"].endswith("(ATen DEFAULT)")


@pytest.mark.parametrize("cap, kept, dropped", [
    ("AVX2", {"avx2"}, {"avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"}),
    ("AVX512_CORE", {"avx512f", "avx512_vnni"}, {"avx512_bf16", "avx512_fp16", "amx_bf16"}),
    ("AVX512_CORE_VNNI", {"avx512f", "avx512_vnni"}, {"avx512_bf16", "amx_bf16"}),
    ("AVX512_CORE_BF16", {"avx512_bf16"}, {"avx512_fp16", "amx_bf16"}),
    ("AVX512_CORE_FP16", {"avx512_bf16", "avx512_fp16"}, {"amx_bf16"}),
    ("AVX512_CORE_AMX", {"avx512_bf16", "amx_bf16"}, set()),
])
def test_onednn_caps_below_bf16_make_bf16_emulated(monkeypatch, cap, kept, dropped):
    everything = frozenset({"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16"})
    monkeypatch.setattr(cpu_class, "_proc_cpu_flags", lambda: everything)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    hardware.cpu_flags.cache_clear()
    try:
        flags = hardware.cpu_flags()
        assert kept <= flags and not dropped & flags
        assert hardware.precision_support("cpu", "bf16") == ("native" if "avx512_bf16" in kept else "emulated")
    finally:
        hardware.cpu_flags.cache_clear()


def test_the_hardware_class_names_the_level_and_a_lower_aten():
    assert cpu_level(frozenset({"avx2", "avx512f", "amx_bf16", "avx512_bf16"})) == "AMX"
    assert hardware_class({"device": "cpu", "isa": "AMX", "aten": "AVX512"}) == "CPU AMX"
    assert hardware_class({"device": "cpu", "isa": "AVX512", "aten": "AVX2"}) == "CPU AVX512 (ATen AVX2)"
    assert hardware_class({"device": "cuda", "gpu": "NVIDIA H200", "isa": "AVX2", "aten": "AVX2"}) == "GPU NVIDIA H200"


@pytest.fixture(scope="module")
def result():
    return wb.run(wb.RunConfig(model="mlp", steps=3, log_every=3, preset="cpu-quick"))


def test_a_share_is_anonymous_unless_named(result):
    (entry,) = store.records(result)
    assert entry["learner"].startswith("anon-") and entry["workbench"] == 1
    text = json.dumps(entry)
    for private in {getpass.getuser(), socket.gethostname(), str(pathlib.Path.home())} - {"", "/"}:
        if len(private) > 3:  # a short user name such as 'ci' could occur inside any word
            assert private not in text, f"{private!r} is in an anonymous share"
    (named,) = store.records(result, name="Ada", notebook="01_mixed_precision")
    assert (named["learner"], named["notebook"]) == ("Ada", "01_mixed_precision")
    assert named["figures"]["samples_per_sec"] == result.samples_per_sec
    assert named["figures"]["steps"] == 3 and named["config"]["precision"] == "fp32"


def test_runs_and_a_calibration_share_in_one_call(result):
    calibration = wb.calibration(rows=[ROW])
    made = store.records([result], predictions=calibration, notebook="01_mixed_precision")
    assert [r["kind"] for r in made] == ["run", "predictions"]
    assert made[1]["rows"] == [ROW] and made[1]["notebook"] == "01_mixed_precision"


def test_a_bad_argument_or_ledger_row_is_one_clear_error():
    with pytest.raises(TypeError, match="share\\(\\) takes a RunResult, several"):
        wb.share({"not": "a result"}, room="http://127.0.0.1:9/")
    with pytest.raises(ValueError, match=r"^predictions: rows\[0\]\.verdict=None must be a non-empty string$"):
        wb.share([{k: v for k, v in ROW.items() if k != "verdict"}], room="http://127.0.0.1:9/")


def _one_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = (out + err).strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens


def test_a_room_that_is_down_is_one_line_and_the_result_is_untouched(result, capsys, monkeypatch):
    before = result.summary()
    url = f"http://127.0.0.1:{_closed_port()}/services/room/"
    assert wb.share(result, room=url) is False
    line = _one_line(capsys)
    assert line.startswith(f"room: not shared: the room at {url} is not answering") and "make room" in line
    assert result.summary() == before
    monkeypatch.delenv(store.ROOM_VARIABLE, raising=False)
    assert wb.share(result) is False
    assert "no room given" in _one_line(capsys)


class _FullStore(http.server.BaseHTTPRequestHandler):
    """Answers like a room's store whose disk is full: 507 with its reason."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        data = json.dumps({"error": "the store could not write (No space left on device): tell the teacher"}).encode()
        self.send_response(507)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST

    def log_message(self, *args):
        pass


def test_a_full_room_is_one_line(result, capsys):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FullStore)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/"
    try:
        assert wb.share(result, room=url) is False
        with pytest.raises(store.RoomUnreadable, match=r"^room_records: the room at .* could not store it \(HTTP 507"):
            store.room_records(url, key="k")
    finally:
        server.shutdown()
    assert _one_line(capsys) == (f"room: not shared: the room at {url} could not store it (HTTP 507: the store could "
                                 "not write (No space left on device): tell the teacher); tell the teacher; "
                                 "your result is unchanged")


@pytest.fixture(scope="module")
def room():
    started = lesson.simulated_room(("Ann", "Bo", "Cy"))
    yield started
    started.stop()


def _as(room, learner, monkeypatch):
    monkeypatch.setenv(store.KEY_VARIABLE, room.learner_keys[learner])


def test_a_share_lands_in_the_room_under_the_learners_account(room, result, capsys, monkeypatch):
    _as(room, "Ann", monkeypatch)
    assert wb.share(result, room=room.url, name="Ada") is True
    assert _one_line(capsys).startswith(f"room: shared 1 run (CPU ")
    mine = [r for r in room.records() if r["owner"] == "Ann"]
    assert len(mine) == 1 and mine[0]["learner"] == "Ada"
    assert mine[0]["figures"]["samples_per_sec"] == result.samples_per_sec
    monkeypatch.setenv(store.KEY_VARIABLE, "a-guess")
    assert wb.share(result, room=room.url) is False
    assert "does not know this kernel's key: set WORKBENCH_ROOM_KEY" in _one_line(capsys)


def test_a_learner_reads_only_their_own_and_only_the_teacher_deletes(room, result, capsys, monkeypatch):
    _as(room, "Ann", monkeypatch)  # a record of Ann's to protect, whether or not the test above ran first
    assert wb.share(result, room=room.url, name="Ada") is True
    _as(room, "Bo", monkeypatch)
    assert wb.share(result, room=room.url, name="Ann") is True  # Bo writing under Ann's name: filed as Bo's
    capsys.readouterr()
    theirs = store.room_records(room.url)
    assert theirs and {r["owner"] for r in theirs} == {"Bo"}
    victim = next(r for r in room.records() if r["owner"] == "Ann")
    request = urllib.request.Request(f"{room.url}records/{victim['id']}", method="DELETE",
                                     headers={"Authorization": f"token {room.learner_keys['Bo']}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert victim["id"] in {r["id"] for r in room.records()}
    request = urllib.request.Request(f"{room.url}records/{victim['id']}", method="DELETE",
                                     headers={"Authorization": f"token {room.key}"})
    assert urllib.request.urlopen(request, timeout=10).status == 200
    assert victim["id"] not in {r["id"] for r in room.records()}


def test_a_comparison_or_a_monitored_loop_shares_too(room, result, capsys, monkeypatch):
    _as(room, "Cy", monkeypatch)
    loop = dataclasses.replace(result, name="by hand", config=LoopDescription("mlp", "bf16", 64, 1, "none", "cpu"))
    assert wb.share(wb.compare([result, loop]), room=room.url, notebook="01_mixed_precision") is True
    assert _one_line(capsys).startswith("room: shared 2 runs (CPU ")
    mine = {r["run"]: r for r in room.records() if r["owner"] == "Cy"}
    assert sorted(mine) == ["by hand", "mlp fp32 b64"]
    assert mine["by hand"]["config"] == {"model": "mlp", "precision": "bf16", "batch_size": 64, "grad_accum_steps": 1,
                                         "activation_checkpointing": "none", "device": "cpu"}
    url = f"http://127.0.0.1:{_closed_port()}/"
    assert wb.share([result, loop], room=url) is False
    assert _one_line(capsys).endswith("; your results are unchanged")


LEARNER = """
import os, pathlib, sys, time
import workbench as wb
from workbench.classroom import sharing as room
room.fingerprint()  # imports done before the start line, so the learners send together
go = pathlib.Path(sys.argv[1])
pathlib.Path(sys.argv[1] + "." + sys.argv[2]).touch()
while not go.exists():
    time.sleep(0.01)
row = {"notebook": "01", "exercise": "x", "predicted": 1.0, "measured": 1.0, "kind": "ratio", "unit": "x",
       "verdict": "right"}
print(sum(wb.share(predictions=[row], name=sys.argv[2]) for _ in range(int(sys.argv[3]))))
"""


def share_at_once(room, learners: list[str], shares: int, folder: pathlib.Path) -> list[int]:
    """Each learner a process of its own, all released together, each sharing `shares` times."""
    go = folder / "go"
    procs = []
    for who in learners:
        env = {**os.environ, store.ROOM_VARIABLE: room.url, store.KEY_VARIABLE: room.learner_keys[who],
               "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, "-c", LEARNER, str(go), who, str(shares)], env=env,
                                      stdout=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 300
    while not all((folder / f"go.{who}").exists() for who in learners) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    return [int(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]


def test_learners_sharing_at_once_lose_nothing(room, tmp_path):
    before = {r["id"] for r in room.records()}
    assert share_at_once(room, ["Ann", "Bo"], 10, tmp_path) == [10, 10]
    new = sorted(r["owner"] for r in room.records() if r["id"] not in before)
    assert new == ["Ann"] * 10 + ["Bo"] * 10


def _fp(cls: str, bf16: str = "emulated", threads: int = 4, device: str = "cpu") -> dict:
    return {"class": cls, "bf16": bf16, "fp16": "emulated", "int8_kernels": "avx2", "threads": threads,
            "device": device}


def _run(learner: str, fp: dict, samples_per_sec: float, status: str = "ok", **changed) -> dict:
    config = {"model": "mlp", "precision": "fp32", "grad_accum_steps": 1, "batch_size": 64, "log_every": 10,
              **changed}
    return {"workbench": 1, "kind": "run", "learner": learner, "notebook": "01_mixed_precision", "run": "r",
            "fingerprint": fp, "config": config, "figures": {"status": status, "samples_per_sec": samples_per_sec}}


def _room() -> list[dict]:
    laptops = [("anon-1", 1000, 300, 4), ("anon-2", 1000, 320, 4), ("anon-3", 1000, 340, 4), ("anon-4", 1000, 120, 1)]
    records = []
    for learner, base, bf16, threads in laptops:
        fp = _fp("CPU AVX2", threads=threads)
        records += [_run(learner, fp, base), _run(learner, fp, bf16, precision="bf16")]
    xeon = _fp("CPU AVX512-BF16", bf16="native")
    records += [_run("Ada", xeon, 1000), _run("Ada", xeon, 1500, precision="bf16"),
                _run("Ada", xeon, 900, grad_accum_steps=4),
                _run("Ada", xeon, 5000, precision="bf16", grad_accum_steps=4),  # two fields changed: no pair
                _run("Ada", xeon, 9000, status="oom", precision="fp16")]       # failed: not an effect
    records.append({"workbench": 1, "kind": "predictions", "learner": "anon-1", "notebook": "01_mixed_precision",
                    "fingerprint": _fp("CPU AVX2"),
                    "rows": [ROW, {**ROW, "predicted": 1.0}, {**ROW, "exercise": "which", "kind": "choice",
                                                               "predicted": "bf16", "measured": "fp32", "unit": ""}]})
    return records


def test_the_room_groups_effects_by_hardware():
    table = view.room_table(_room())
    assert table.rows == [
        ["grad_accum_steps=4", "CPU AVX512-BF16", 1, "0.90x", "0.90-0.90x"],
        ["precision=bf16", "CPU AVX2", 4, "0.31x", "0.12-0.34x"],
        ["precision=bf16", "CPU AVX512-BF16", 1, "1.50x", "1.50-1.50x"],
    ]
    assert table.caption.startswith("What the room measured: 14 records from 5 learners")


def test_the_room_names_its_outliers_and_why():
    rows = view.outlier_table(_room()).rows
    assert rows == [
        ["precision=bf16", "anon-4", "CPU AVX2", "0.12x", "0.38x the room's median", "threads 1 (others: 4)"],
        ["precision=bf16", "Ada", "CPU AVX512-BF16", "1.50x", "4.69x the room's median",
         "hardware CPU AVX512-BF16 (others: CPU AVX2); bf16 native (others: emulated)"],
    ]


def test_the_room_shows_its_calibration():
    assert view.calibration_table(_room()).rows == [
        ["01_mixed_precision", "bf16 speed-up", "ratio (x)", 2, "median predicted/measured 3.00"],
        ["01_mixed_precision", "which", "choice", 1, "0/1 predicted right"],
    ]


def test_the_room_figure_has_a_panel_per_technique():
    fig = view.room_figure(_room())
    assert [ax.get_title() for ax in fig.axes] == ["grad_accum_steps=4", "precision=bf16"]
