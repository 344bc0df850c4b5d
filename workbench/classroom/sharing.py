"""Share a run with the room: its figures, its config and the machine's fingerprint, sent to the
room's store on the teacher's machine (workbench/classroom/store.py; `make room` runs it), and read
back by the teacher's notebook. The record format: docs/ROOM_RECORDS.md (record_format.py checks it).

Why a store of our own and not a tracker's server: trackio's remote client went through its
server's private endpoints (`/bulk_log`, `/get_run_configs`), which change between minor releases,
and its one write token let any learner delete another's runs. The store is a plain HTTP server with
one key per account (the room makes them with the accounts), one file per learner, and only the
teacher may read everyone's or delete; `wb.share` speaks to it with the standard library.

Bounds (issue 42): a room is an explicit http:// or https:// URL, checked before any name is looked up
(a bare 'teacher/room' is refused, never resolved); every call returns within SHARE_TIMEOUT_S (reads:
READ_TIMEOUT_S) whatever the server does, slow, stuck or answering garbage, and says in one line which
room failed and what to do.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import secrets
import socket
import ssl
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from workbench.base.report import Results
from workbench.classroom import record_format as record_format
from workbench.classroom.fingerprint import fingerprint
from workbench.classroom.record_format import RecordError
from workbench.core.config import RunConfig
from workbench.core.measure.result import RunResult

ROOM_VARIABLE = "WORKBENCH_ROOM"
KEY_VARIABLE = "WORKBENCH_ROOM_KEY"
CA_VARIABLE = "WORKBENCH_ROOM_CA"
KEY_FILE = Path("~/.workbench-room/key")
SHARE_TIMEOUT_S = 10.0
"""A share's whole exchange with the room (connect, send, answer) at most: then it gives up."""
READ_TIMEOUT_S = 30.0
"""Reading the room's records at most (10,000 records are about 15 MiB)."""
MAX_ANSWER = 256 * 2**20

# One anonymous label per process, so a learner who gives no name is still told apart from others
# sharing under the same account (the store keys records to the account whatever the label).
_ANONYMOUS = f"anon-{secrets.token_hex(3)}"


class RoomUnreadable(RuntimeError):
    """The room's records could not be read (the room down, refusing, slow or not a room)."""


class _Failed(Exception):
    """Why one exchange with the room failed, as the clause a learner reads."""


def room_url(room: str | None) -> str:
    """The room's base URL: `room`, else $WORKBENCH_ROOM; refused in one line unless it is an explicit
    http(s) URL with a host (checked before any name is looked up)."""
    given = room if room is not None else os.environ.get(ROOM_VARIABLE)
    field = "room" if room is not None else ROOM_VARIABLE
    if given is None or given == "":
        raise ValueError(f"no room given: pass room='http://HOST:PORT/services/room/' or set {ROOM_VARIABLE} "
                         "(in a workshop the room sets it for you)")
    if not isinstance(given, str):
        raise ValueError(f"{field}={given!r:.60} must be the room's URL as a string, 'http://HOST:PORT/services/room/'")
    parts = urllib.parse.urlsplit(given.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in given.strip()):
        raise ValueError(f"{field}={given!r:.80} is not a room's address: give its full URL, "
                         "'http://HOST:PORT/services/room/' (`make room` prints it); nothing was sent")
    try:
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        raise ValueError(f"{field}={given!r:.80} has a port that is not a number: give its full URL, "
                         "'http://HOST:PORT/services/room/' (`make room` prints it); nothing was sent") from None
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/", "", ""))


def _key() -> str | None:
    key = os.environ.get(KEY_VARIABLE)
    if key:
        return key.strip()
    try:
        return KEY_FILE.expanduser().read_text().strip() or None
    except (OSError, RuntimeError):  # no such file; no home
        return None


def _exchange(url: str, method: str, path: str, body: bytes | None, key: str | None, timeout_s: float,
              answer: dict) -> None:
    """One HTTP exchange; fills `answer` (status, data) or `answer['error']`. Runs in a thread."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=os.environ.get(CA_VARIABLE) or None)
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout_s, context=context)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    answer["conn"] = conn
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if key:
        headers["Authorization"] = f"token {key}"
    try:
        conn.request(method, parts.path + path, body=body, headers=headers)
        response = conn.getresponse()
        answer["status"], answer["data"] = response.status, response.read(MAX_ANSWER + 1)
    except Exception as error:  # noqa: BLE001 - told to the learner in one clause by _call
        answer["error"] = error
    finally:
        conn.close()


def _call(url: str, method: str, path: str, *, body: Any = None, timeout_s: float, key: str | None = None) -> dict[str, Any]:
    """The room's JSON answer to one request, or _Failed with why, within `timeout_s` whatever the
    server does (the exchange runs in a thread; past the deadline its socket is shut)."""
    data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    answer: dict[str, Any] = {}
    # the socket's own timeout a little past the deadline: the deadline below decides, not a race with it
    worker = threading.Thread(target=_exchange, args=(url, method, path, data, key or _key(), timeout_s + 1, answer),
                              daemon=True, name="room-share")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive() or isinstance(answer.get("error"), socket.timeout):
        sock = getattr(answer.get("conn"), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the thread's read fails at once and it ends
            except OSError:
                pass
        raise _Failed(f"the room at {url} did not answer within {timeout_s:g} s (a stuck or overloaded server); "
                      "try again in a minute, or tell the teacher")
    error = answer.get("error")
    if isinstance(error, ssl.SSLError):
        raise _Failed(f"the room at {url} has a certificate this kernel does not trust ({error.reason}): "
                      f"set {CA_VARIABLE} to the room's certificate (docs/WORKSHOP.md, HTTPS)")
    if isinstance(error, (ConnectionError, socket.timeout, socket.gaierror, OSError)):
        raise _Failed(f"the room at {url} is not answering ({type(error).__name__}): is the room running? "
                      f"check {ROOM_VARIABLE} is the address `make room` printed")
    if error is not None:
        raise _Failed(f"the room at {url} answered something that is not HTTP ({type(error).__name__}): "
                      f"check {ROOM_VARIABLE} is the address `make room` printed")
    status, raw = answer["status"], answer["data"]
    try:
        reply = json.loads(raw) if len(raw) <= MAX_ANSWER else None
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise _Failed(f"the room at {url} answered HTTP {status} with something that is not a workbench room's "
                      f"answer ({raw[:40]!r}): check {ROOM_VARIABLE} is the address `make room` printed")
    if status == 401:
        raise _Failed(f"the room at {url} does not know this kernel's key: set {KEY_VARIABLE} to the key the "
                      "teacher gave you (on the room's machine it is set for you)")
    if status >= 400:
        said = str(reply.get("error", ""))[:300].replace("\n", " ")
        raise _Failed(f"the room at {url} refused it (HTTP {status}: {said})" if status < 500 else
                      f"the room at {url} could not store it (HTTP {status}: {said}); tell the teacher")
    return reply


def _notebook(notebook: str | None) -> str:
    # Jupyter's server sets JPY_SESSION_NAME to the notebook's path in the kernels it starts.
    if notebook is not None:
        return notebook
    path = os.environ.get("JPY_SESSION_NAME")
    return Path(path).stem if path else "unknown"


def _plain(value: Any) -> Any:
    """JSON values only (a path or a dtype becomes its text)."""
    return json.loads(json.dumps(value, default=str))


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
    return {"kind": "run", "run": result.name, "figures": _plain(figures), "config": _plain(config)}


def _rows(predictions: Any) -> list[dict[str, Any]]:
    """A Calibration's rows (wb.calibration('00_tour')), or a list of ledger rows, as plain dicts."""
    rows = getattr(predictions, "checked", predictions)
    if not isinstance(rows, (list, tuple)):
        raise TypeError(f"predictions={type(predictions).__name__} must be wb.calibration('NN_name') or a list "
                        "of prediction-ledger rows")
    return [dict(row) if isinstance(row, dict) else row for row in rows]  # checked first, made plain after


def _runs(what: Any) -> list[RunResult]:
    runs = what.items if isinstance(what, Results) else what
    if isinstance(runs, RunResult):
        return [runs]
    if isinstance(runs, (list, tuple)) and all(isinstance(r, RunResult) for r in runs):
        return list(runs)
    raise TypeError(f"share() takes a RunResult, several (a list, or wb.compare's), or predictions=, "
                    f"not {type(what).__name__}")


def records(what: Any = None, *, predictions: Any = None, name: str | None = None,
            notebook: str | None = None) -> list[dict[str, Any]]:
    """The records a share sends, each checked (RecordError, one line, naming the field)."""
    if name is not None and record_format.check_name(name):
        raise RecordError(record_format.check_name(name))
    if notebook is not None and not isinstance(notebook, str):
        raise RecordError(f"notebook={notebook!r:.40} must be the notebook's name, e.g. notebook='00_tour'")
    if isinstance(what, (list, tuple)) and what and all(isinstance(r, dict) for r in what) or hasattr(what, "checked"):
        what, predictions = None, what  # wb.share(rows) as before: the ledger's rows
    bodies = [] if what is None else [run_record(r) for r in _runs(what)]
    where = _notebook(notebook)
    if predictions is not None:
        rows = [dict(row, notebook=row.get("notebook") or where) if isinstance(row, dict) else row
                for row in _rows(predictions)]
        if rows:
            bodies.append({"kind": "predictions", "rows": rows})
    if not bodies:
        raise TypeError("share() needs something to share: a run, several, or predictions=wb.calibration('NN_name')")
    base = {"workbench": record_format.VERSION, "learner": name or _ANONYMOUS, "notebook": where,
            "fingerprint": fingerprint()}
    made = [{**base, **body} for body in bodies]
    for record in made:
        label = f"run {record['run']!r:.60}" if record["kind"] == "run" else "predictions"
        record_format.require(record, label)
    return _plain(made)  # a numpy float in a row becomes a float; nothing checked above changes


def share(what: Any = None, *, predictions: Any = None, name: str | None = None, room: str | None = None,
          notebook: str | None = None) -> bool:
    """Send runs (a RunResult, a list, or wb.compare's) and/or prediction-ledger rows to the room.

    `room` (or $WORKBENCH_ROOM) is the room's URL, 'http://HOST:PORT/services/room/'; the key that says
    who you are is $WORKBENCH_ROOM_KEY (the room sets both in its learners' kernels). Anonymous (one label
    per process) unless `name` is given. Returns whether the room stored everything. A record the room
    could not show raises RecordError (ValueError) naming its field; a room that is down, slow, refusing
    or not a room prints one line naming the room and what to do, and returns False within
    SHARE_TIMEOUT_S: the results and the notebook go on.

    Example:
        >>> wb.share([baseline, bf16], predictions=wb.calibration("01_mixed_precision"))  # doctest: +SKIP
        room: shared 2 runs and 3 predictions (CPU AVX2) with the room at http://127.0.0.1:8000/services/room/
    """
    made = records(what, predictions=predictions, name=name, notebook=notebook)
    runs = sum(r["kind"] == "run" for r in made)
    rows = sum(len(r.get("rows", [])) for r in made)
    plural = "s are" if runs + rows > 1 else " is"
    try:
        url = room_url(room)
    except ValueError as error:
        if room is None and not os.environ.get(ROOM_VARIABLE):
            print(f"room: not shared: {error}; your result{plural} unchanged")
            return False
        raise
    try:
        reply = _call(url, "POST", "records", body={"records": made}, timeout_s=SHARE_TIMEOUT_S)
        stored = reply.get("stored")
        if not isinstance(stored, list) or len(stored) != len(made):
            raise _Failed(f"the room at {url} answered without storing all {len(made)} records; tell the teacher")
    except _Failed as why:
        print(f"room: not shared: {why}; your result{plural} unchanged")
        return False
    said = [f"{runs} run{'s' * (runs != 1)}" if runs else "", f"{rows} prediction{'s' * (rows != 1)}" if rows else ""]
    print(f"room: shared {' and '.join(s for s in said if s)} ({made[0]['fingerprint']['class']}) "
          f"as {reply.get('owner', '?')} with the room at {url}")
    return True


def room_records(room: str | None = None, *, key: str | None = None) -> list[dict[str, Any]]:
    """Every record the room holds (with the teacher's key), or this learner's own (a learner's key;
    default: $WORKBENCH_ROOM_KEY), as stored: unchecked, so the views can say which they skip and why."""
    url = room_url(room)
    try:
        reply = _call(url, "GET", "records", timeout_s=READ_TIMEOUT_S, key=key)
    except _Failed as why:
        raise RoomUnreadable(f"room_records: {why}") from None
    found = reply.get("records")
    if not isinstance(found, list):
        raise RoomUnreadable(f"room_records: the room at {url} answered without a list of records; tell the teacher")
    return found
