"""Sharing with the room (issue 29, points 3 and 5): the fingerprint under caps, anonymity, a room
that is down, refusing or full, two learners at once, the teacher's pooled view, and the teacher's
command in docs/WORKSHOP.md run as written."""

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

import pytest

import workbench as wb
from workbench.core import cpu_class, hardware
from workbench.core.fingerprint import CAP_VARIABLES, cpu_level, hardware_class
from workbench.lessons import room as lesson
from workbench.measure import room as store
from workbench.measure.result import LoopDescription
from workbench.views import room as view

ROOT = pathlib.Path(__file__).resolve().parent.parent
X86_AVX2 = {"avx2", "fma"} <= cpu_class._proc_cpu_flags()
ROW = {"notebook": "01_mixed_precision", "exercise": "bf16 speed-up", "predicted": 2.0, "measured": 0.5,
       "kind": "ratio", "unit": "x"}


def _fingerprint_in(env: dict[str, str]) -> dict:
    code = "import json; from workbench.core.fingerprint import fingerprint; print(json.dumps(fingerprint('cpu')))"
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
    entry = store.record(result, name=None, notebook=None)
    assert entry["learner"].startswith("anon-") and entry["named"] is False
    text = json.dumps(entry)
    for private in {getpass.getuser(), socket.gethostname(), str(pathlib.Path.home())} - {"", "/"}:
        if len(private) > 3:  # a short user name such as 'ci' could occur inside any word
            assert private not in text, f"{private!r} is in an anonymous share"
    named = store.record(result, name="Ada", notebook="notebooks/01_mixed_precision.ipynb")
    assert (named["learner"], named["named"], named["notebook"]) == ("Ada", True, "01_mixed_precision.ipynb")
    assert named["figures"]["samples_per_sec"] == result.samples_per_sec
    assert named["figures"]["steps"] == 3 and named["config"]["precision"] == "fp32"


def test_a_bad_argument_or_ledger_row_is_one_clear_error():
    with pytest.raises(TypeError, match="RunResult or a list of prediction-ledger rows, not dict"):
        wb.share(ROW, room="http://127.0.0.1:9/")
    with pytest.raises(ValueError, match="ledger row 0 lacks measured, unit"):
        wb.share([{k: v for k, v in ROW.items() if k not in ("measured", "unit")}], room="http://127.0.0.1:9/")


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
    url = f"http://127.0.0.1:{_closed_port()}/?write_token=workshop"
    assert wb.share(result, room=url) is False
    line = _one_line(capsys)
    assert line.startswith("room: not shared: the room at http://127.0.0.1:") and "not answering" in line
    assert result.summary() == before
    monkeypatch.delenv(store.ROOM_VARIABLE, raising=False)
    assert wb.share(result) is False
    assert "no room given" in _one_line(capsys)


class _FullStore(http.server.BaseHTTPRequestHandler):
    """Answers like a trackio server whose store has no room left: 507, or (what trackio 0.43's own
    server did on a full disk, measured here) 200 while dropping the write."""

    drops = False

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # trackio's client asks the server's API version first
        from trackio.remote_client import HTTP_API_VERSION

        self._send(200, {"api_version": HTTP_API_VERSION})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self.drops:
            self._send(507, {"error": "database or disk is full"})
        else:  # bulk_log 'succeeds'; the run list read back is empty
            self._send(200, {"data": [] if self.path.endswith("get_runs_for_project") else None})

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("drops, why", [
    (False, "the room's store is full (HTTP 507); tell the teacher"),
    (True, "the room answered but did not store 1 of 1 records (its store may be full); tell the teacher"),
])
def test_a_full_room_is_one_line(result, capsys, monkeypatch, drops, why):
    monkeypatch.setattr(store, "CONFIRM_S", 0.3)
    handler = type("Store", (_FullStore,), {"drops": drops})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert wb.share(result, room=f"http://127.0.0.1:{server.server_port}/?write_token=workshop") is False
    finally:
        server.shutdown()
    assert _one_line(capsys) == f"room: not shared: {why}; your result is unchanged"


@pytest.fixture(scope="module")
def room():
    started = lesson.start_room(token="workshop")
    yield started
    started.stop()


def test_a_share_lands_in_the_room_and_a_wrong_token_is_refused(room, result, capsys):
    assert wb.share(result, room=room.url, name="Ada") is True
    assert _one_line(capsys).startswith("room: shared 'Ada mlp fp32 b64' (CPU ")
    mine = [r for r in lesson.room_records(room.url) if r["learner"] == "Ada"]
    assert len(mine) == 1 and mine[0]["figures"]["samples_per_sec"] == result.samples_per_sec
    assert wb.share(result, room=room.url.replace("workshop", "guess"), name="Eve") is False
    assert "the room refused it (HTTP 400): check the write_token" in _one_line(capsys)
    assert not [r for r in lesson.room_records(room.url) if r["learner"] == "Eve"]


def test_a_comparison_or_a_monitored_loop_shares_too(room, result, capsys):
    loop = dataclasses.replace(result, name="by hand", config=LoopDescription("mlp", "bf16", 64, 1, "none", "cpu"))
    assert wb.share(wb.compare([result, loop]), room=room.url, name="Cy") is True
    assert _one_line(capsys).startswith("room: shared 2 runs (Cy mlp fp32 b64, Cy by hand) (CPU ")
    mine = {r["run"]: r for r in lesson.room_records(room.url) if r["learner"] == "Cy"}
    assert sorted(mine) == ["by hand", "mlp fp32 b64"]
    assert mine["by hand"]["config"] == {"model": "mlp", "precision": "bf16", "batch_size": 64, "grad_accum_steps": 1,
                                         "activation_checkpointing": "none", "device": "cpu"}
    url = f"http://127.0.0.1:{_closed_port()}/?write_token=workshop"
    assert wb.share([result, loop], room=url) is False
    assert _one_line(capsys).endswith("; your results are unchanged")


LEARNER = """
import os, pathlib, sys, time
import workbench as wb
from workbench.measure import room
room.fingerprint()  # imports done before the start line, so the two learners send together
go = pathlib.Path(sys.argv[1])
pathlib.Path(sys.argv[1] + "." + sys.argv[2]).touch()
while not go.exists():
    time.sleep(0.01)
row = {"notebook": "01", "exercise": "x", "predicted": 1.0, "measured": 1.0, "kind": "ratio", "unit": "x"}
print(sum(wb.share([row], name=sys.argv[2]) for _ in range(10)))
"""


def test_two_learners_sharing_at_once_lose_nothing(room, tmp_path):
    go = tmp_path / "go"
    env = {**os.environ, store.ROOM_VARIABLE: room.url, "PYTHONPATH": str(ROOT)}
    learners = [subprocess.Popen([sys.executable, "-c", LEARNER, str(go), who], env=env, stdout=subprocess.PIPE,
                                 text=True) for who in ("Ann", "Bo")]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"go.{who}").exists() for who in ("Ann", "Bo")) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    sent = [int(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in learners]
    assert sent == [10, 10]
    landed = [r["learner"] for r in lesson.room_records(room.url)]
    assert (landed.count("Ann"), landed.count("Bo")) == (10, 10)


def _fp(cls: str, bf16: str = "emulated", threads: int = 4, device: str = "cpu") -> dict:
    return {"class": cls, "bf16": bf16, "fp16": "emulated", "int8_kernels": "avx2", "threads": threads,
            "device": device}


def _run(learner: str, fp: dict, samples_per_sec: float, status: str = "ok", **changed) -> dict:
    config = {"model": "mlp", "precision": "fp32", "grad_accum_steps": 1, "batch_size": 64, "log_every": 10,
              **changed}
    return {"workbench": 1, "kind": "run", "learner": learner, "fingerprint": fp, "config": config,
            "figures": {"status": status, "samples_per_sec": samples_per_sec}}


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
    records.append({"workbench": 1, "kind": "predictions", "learner": "anon-1", "fingerprint": _fp("CPU AVX2"),
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


# docs/WORKSHOP.md's "What the room measured": each bash command, and where it runs as written.
DOC_COMMANDS = {
    "TRACKIO_DIR=room-store TRACKIO_WRITE_TOKEN=workshop .venv/bin/trackio show --project workbench-room":
        "test_the_teachers_command_starts_a_room_learners_can_share_with",
}


def test_every_room_command_in_the_workshop_doc_runs_here():
    text = (ROOT / "docs" / "WORKSHOP.md").read_text()
    section = text.split("## What the room measured", 1)[1].split("\n## ", 1)[0]
    shown = {line.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S) for line in block.splitlines()
             if line.strip()}
    assert shown == set(DOC_COMMANDS)
    this = pathlib.Path(__file__).read_text()
    for command, test in DOC_COMMANDS.items():
        assert f"def {test}(" in this


def test_the_teachers_command_starts_a_room_learners_can_share_with(tmp_path, result, capsys):
    (tmp_path / ".venv").symlink_to(pathlib.Path(sys.executable).parent.parent)  # the repo's .venv, here
    command = next(iter(DOC_COMMANDS))
    # BROWSER: the CLI opens a tab; unbuffered: it prints its URL into a pipe, then serves forever
    server = subprocess.Popen(["bash", "-c", command], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "BROWSER": "true", "PYTHONUNBUFFERED": "1"},
                              start_new_session=True)
    try:
        url = None
        for line in server.stdout:  # '* Trackio UI launched at: http://127.0.0.1:7860/'
            found = re.search(r"launched at: (http://\S+/)", line)
            if found:
                url = found.group(1)
                break
        assert url, "trackio show printed no URL"
        assert wb.share(result, room=f"{url}?write_token=workshop", name="Ada") is True
        capsys.readouterr()
        assert [r["learner"] for r in lesson.room_records(url)] == ["Ada"]
        assert (tmp_path / "room-store" / "workbench-room.db").exists()
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # bash and the trackio it started
        server.wait(timeout=30)


def test_reading_a_room_that_is_down_or_full_is_one_line():
    with pytest.raises(store.RoomUnreadable) as down:
        store.room_records(f"http://127.0.0.1:{_closed_port()}/?write_token=workshop")
    assert str(down.value).startswith("room_records: the room at http://127.0.0.1:") and "\n" not in str(down.value)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Store", (_FullStore,), {"drops": False}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(store.RoomUnreadable, match=r"^room_records: the room's store is full \(HTTP 507\)$"):
            store.room_records(f"http://127.0.0.1:{server.server_port}/")
    finally:
        server.shutdown()
