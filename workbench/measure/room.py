"""Share a run with the room: its figures, its config and the machine's fingerprint, sent to the
teacher's trackio server (the store accelerate's `log_with="trackio"` writes to), and read back.

Why trackio's HTTP client and not accelerate's TrackioTracker: the tracker's run sends from a
background thread that retries and buffers what fails on the learner's disk, to resend at the
next `trackio.init` (measured with trackio 0.43: a refused write_token took 37 s and printed four
warnings; the records were kept to be sent again). A share is one record, so it is sent once,
synchronously, to the same endpoint (`/api/bulk_log`) that thread uses, then read back: trackio's
server answered 200 when its SQLite store dropped the write (measured on a store in a 300 KB tmpfs:
'write queue: non-retryable error (database or disk is full), dropping entry'; a 2 MB store filled
after its first record answered HTTP 500 instead), so only a read-back says a record landed. It
lands or the learner reads one line why, and nothing is left behind to be sent twice. Reading uses
the server's `/api/get_run_configs`, what trackio's own dashboard reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
import uuid
from typing import Any

from workbench.core.config import RunConfig
from workbench.core.fingerprint import fingerprint
from workbench.core.report import Results
from workbench.measure.result import RunResult

ROOM_VARIABLE = "WORKBENCH_ROOM"
PROJECT = "workbench-room"
TIMEOUT_S = 10.0
CONFIRM_S = 3.0
"""How long a share waits to read its records back from the store (the server may queue a write)."""
LEDGER_KEYS = {"notebook", "exercise", "predicted", "measured", "kind", "unit"}

# One anonymous id per process, so the teacher can pair a learner's baseline with its technique
# run (both from the same machine) without knowing who it is.
_ANONYMOUS = f"anon-{secrets.token_hex(3)}"


def _plain(value: Any) -> Any:
    """JSON values only (a path or a dtype becomes its text)."""
    return json.loads(json.dumps(value, default=str))


def _notebook(notebook: str | None) -> str | None:
    # Jupyter server sets JPY_SESSION_NAME to the notebook's path in the kernels it starts.
    path = notebook or os.environ.get("JPY_SESSION_NAME")
    return os.path.basename(path) if path else None


def run_record(result: RunResult) -> dict[str, Any]:
    """What a room keeps of a run: its headline figures and every config value."""
    config = result.config
    config = config.to_dict() if isinstance(config, RunConfig) else dataclasses.asdict(config)
    memory = result.memory
    figures = {
        "status": result.status, "steps": result.steps_done, "final_loss": result.final_loss,
        "samples_per_sec": result.samples_per_sec, "tokens_per_sec": result.tokens_per_sec,
        "step_time_s": result.step_time_s, "peak_bytes": memory.peak_bytes if memory else None,
        "device": result.device,
    }
    return {"kind": "run", "run": result.name, "figures": figures, "config": _plain(config)}


def ledger_record(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Prediction-ledger rows (dicts with notebook, exercise, predicted, measured, kind, unit)."""
    for i, row in enumerate(rows):
        missing = LEDGER_KEYS - set(row) if isinstance(row, dict) else LEDGER_KEYS
        if missing:
            raise ValueError(f"ledger row {i} lacks {', '.join(sorted(missing))}: share the ledger's own rows")
    return {"kind": "predictions", "rows": _plain(rows)}


def record(what: RunResult | list[dict[str, Any]], *, name: str | None, notebook: str | None) -> dict[str, Any]:
    """The record a share sends: the run's or the ledger's, with the fingerprint and who shared it."""
    if isinstance(what, RunResult):
        body = run_record(what)
    elif isinstance(what, list):
        body = ledger_record(what)
    else:
        raise TypeError(f"share() takes a RunResult or a list of prediction-ledger rows, not {type(what).__name__}")
    return {"workbench": 1, **body, "learner": name or _ANONYMOUS, "named": name is not None,
            "notebook": _notebook(notebook), "fingerprint": fingerprint()}


def _client(room: str):
    from trackio.remote_client import RemoteClient  # lazily: trackio loads gradio_client and httpx

    return RemoteClient(room, hf_token=None, httpx_kwargs={"timeout": TIMEOUT_S})


class NotStored(RuntimeError):
    """The server answered but its store does not hold the records (trackio's server answers 200
    and drops a write its SQLite store refuses: 'database or disk is full', measured here)."""


class RoomUnreadable(RuntimeError):
    """The room's records could not be read (the server down, refusing, or its store broken)."""


def _why(error: Exception, room: str) -> str:
    """One clause: why the room did not take the record."""
    import httpx

    if isinstance(error, NotStored):
        return f"the room answered but did not store {error} records (its store may be full); tell the teacher"
    if isinstance(error, httpx.HTTPStatusError):
        code, text = error.response.status_code, error.response.text[:200]
        if code == 507 or "full" in text.lower():
            return f"the room's store is full (HTTP {code}); tell the teacher"
        if code in (400, 401, 403):
            return f"the room refused it (HTTP {code}): check the write_token in {ROOM_VARIABLE}"
        if code >= 500:
            return f"the room failed (HTTP {code}: a full or broken store answers so); tell the teacher"
        return f"the room answered HTTP {code}"
    if isinstance(error, (ConnectionError, httpx.TransportError, OSError)):
        return f"the room at {room.split('?')[0]} is not answering (is the teacher's trackio server running?)"
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def _log(entry: dict[str, Any]) -> dict[str, Any]:
    """One record as one trackio run: its config is the record; its figures are also logged as
    metrics, for trackio's own dashboard."""
    return {"project": PROJECT, "run": f"{entry['learner']} {entry.get('run', 'predictions')}",
            "run_id": uuid.uuid4().hex, "step": 0, "config": entry,
            "metrics": {k: v for k, v in entry.get("figures", {}).items() if isinstance(v, (int, float))}}


def _send(room: str, logs: list[dict[str, Any]]) -> None:
    """Send, then read back until every run is in the store; what is missing is sent once more
    (under the same run ids: a late first copy cannot make a second record), then NotStored."""
    client = _client(room)
    missing = logs
    for _ in range(2):
        client.predict(logs=missing, hf_token=None, api_name="/bulk_log")
        deadline = time.monotonic() + CONFIRM_S
        while missing and time.monotonic() < deadline:
            stored = {run.get("id") for run in client.predict(PROJECT, api_name="/get_runs_for_project") or []}
            missing = [log for log in missing if log["run_id"] not in stored]
            if missing:
                time.sleep(0.2)
        if not missing:
            return
    raise NotStored(f"{len(missing)} of {len(logs)}")


def share(what: RunResult | Results | list[RunResult] | list[dict[str, Any]], *, name: str | None = None,
          room: str | None = None, notebook: str | None = None) -> bool:
    """Send a run, several (a list, or wb.compare's), or prediction-ledger rows to the room;
    anonymous unless `name` is given.

    `room` (or $WORKBENCH_ROOM) is the teacher's trackio server with its write token,
    'http://HOST:PORT/?write_token=TOKEN'. Returns whether the room took everything. A room that is
    down, refusing or full prints one line and returns False: the results and the notebook go on.
    """
    runs = what.items if isinstance(what, Results) else what
    if isinstance(runs, list) and runs and all(isinstance(r, RunResult) for r in runs):
        entries = [record(r, name=name, notebook=notebook) for r in runs]
    else:
        entries = [record(what, name=name, notebook=notebook)]  # a wrong argument is the caller's error: raise
    room = room or os.environ.get(ROOM_VARIABLE)
    if not room:
        print(f"room: not shared: no room given (pass room= or set {ROOM_VARIABLE}=http://HOST:PORT/?write_token=...)")
        return False
    logs = [_log(entry) for entry in entries]
    try:
        _send(room, logs)
    except Exception as error:  # noqa: BLE001 - the room failing must never stop the learner's notebook
        print(f"room: not shared: {_why(error, room)}; your result{'s are' if len(entries) > 1 else ' is'} unchanged")
        return False
    names = [log["run"] for log in logs]
    shown = repr(names[0]) if len(names) == 1 else f"{len(names)} runs ({', '.join(names)})"
    print(f"room: shared {shown} ({entries[0]['fingerprint']['class']})")
    return True


def room_records(room: str | None = None) -> list[dict[str, Any]]:
    """Every record shared with the room, read from the teacher's trackio server."""
    room = room or os.environ.get(ROOM_VARIABLE)
    if not room:
        raise ValueError(f"room_records() needs room= or {ROOM_VARIABLE}: the trackio server's URL")
    try:
        configs = _client(room).predict(PROJECT, api_name="/get_run_configs") or {}
    except Exception as error:  # noqa: BLE001 - one line for the teacher, not trackio's traceback
        raise RoomUnreadable(f"room_records: {_why(error, room).replace('; tell the teacher', '')}") from None
    return [config for config in configs.values() if isinstance(config, dict) and config.get("workbench")]
