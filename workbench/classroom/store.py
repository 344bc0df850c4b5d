"""The room's store: a small HTTP server on the teacher's machine that keeps what learners share,
one file per learner (docs/ROOM_RECORDS.md). `make room` runs it as a JupyterHub service; the teacher's
notebook runs one on loopback for its simulated room.

    python -m workbench.classroom.store --store DIR --keys KEYS.json --port 8010 [--prefix /services/room/]

The door: every request carries a key (`Authorization: token KEY`); KEYS.json (root's only) maps each
key to one account and says which are teachers: {"KEY": {"name": "learner01", "teacher": false}, ...}.
A learner may add records (checked at the door: room_records.check) and read their own; only a teacher
reads everyone's and deletes. Each record is stored under the account its key belongs to, whatever name
it carries, so one learner can neither write as another nor touch another's records.

Files: DIR/<account>.jsonl, one record a line, appended under an exclusive lock (fcntl.flock), so
two kernels of one learner sharing at once both land. The server runs as the teacher (root on the hub);
learners cannot read or change DIR.

Bounds: a request body over MAX_BODY is refused (413) unread; a client that sends nothing for
SOCKET_TIMEOUT_S is cut off, so a stuck or slow classmate holds one thread, not the store.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import re
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from workbench.classroom import record_format as room_records

MAX_BODY = 4 * 2**20
"""One share at most: about 60 run records (a notebook shares 2-6)."""
MAX_RECORDS = 200
SOCKET_TIMEOUT_S = 10.0
ACCOUNT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # a file name: no '/' nor '..'


def load_keys(path: Path) -> dict[str, dict[str, Any]]:
    """KEYS.json's {key: {"name": account, "teacher": bool}}, accounts checked to be file names."""
    keys = json.loads(path.read_text())
    for key, who in keys.items():
        if not (isinstance(who, dict) and isinstance(who.get("name"), str) and ACCOUNT.fullmatch(who["name"])):
            raise SystemExit(f"{path}: the entry for key {key[:4]}... needs a 'name' that is an account name")
    return keys


class Store:
    """The records on disk: DIR/<account>.jsonl, appended under a lock."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def _file(self, account: str) -> Path:
        return self.folder / f"{account}.jsonl"

    def add(self, account: str, records: list[dict[str, Any]]) -> list[str]:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        stored = [{**r, "id": secrets.token_hex(8), "owner": account, "received": now} for r in records]
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in stored)
        with open(self._file(account), "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # held until closed: one writer at a time, whole lines
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        return [r["id"] for r in stored]

    def read(self, account: str | None = None) -> tuple[list[dict[str, Any]], int]:
        """(records, lines that are not JSON objects) of one account, or of all."""
        files = [self._file(account)] if account else sorted(self.folder.glob("*.jsonl"))
        records, unreadable = [], 0
        for path in files:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    fcntl.flock(f, fcntl.LOCK_SH)
                    lines = f.read().splitlines()
            except FileNotFoundError:
                continue
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                if isinstance(record, dict):
                    records.append(record)
                elif line.strip():
                    unreadable += 1
        return records, unreadable

    def delete(self, record_id: str) -> bool:
        for path in sorted(self.folder.glob("*.jsonl")):
            with open(path, "r+", encoding="utf-8", errors="replace") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                lines = f.read().splitlines(keepends=True)
                kept = [line for line in lines if _id(line) != record_id]
                if len(kept) != len(lines):
                    f.seek(0)
                    f.truncate()
                    f.write("".join(kept))
                    return True
        return False


def _id(line: str) -> str | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record.get("id") if isinstance(record, dict) else None


class Handler(BaseHTTPRequestHandler):
    server_version = "workbench-room/1"
    timeout = SOCKET_TIMEOUT_S  # per socket operation: a trickling client is cut off
    store: Store
    keys: dict[str, dict[str, Any]]
    prefix = "/"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        sys.stderr.write(f"room store: {self.address_string()} {format % args}\n")

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> str | None:
        path = self.path.split("?", 1)[0]
        if not path.startswith(self.prefix.rstrip("/")):
            return None
        return "/" + path[len(self.prefix.rstrip("/")):].strip("/")

    def _who(self) -> dict[str, Any] | None:
        header = self.headers.get("Authorization", "")
        key = header[len("token "):].strip() if header.startswith("token ") else ""
        who = self.keys.get(key) if key else None
        if who is None:
            self._answer(401, {"error": "no key or an unknown key: set WORKBENCH_ROOM_KEY to the key the teacher gave you"})
        return who

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        route = self._route()
        if route == "/":
            return self._answer(200, {"workbench_room": room_records.VERSION})
        if route != "/records":
            return self._answer(404, {"error": f"no such path {self.path[:80]!r}"})
        who = self._who()
        if who:
            records, unreadable = self.store.read(None if who.get("teacher") else who["name"])
            self._answer(200, {"records": records, "unreadable_lines": unreadable})

    def do_POST(self) -> None:  # noqa: N802
        if self._route() != "/records":
            return self._answer(404, {"error": f"no such path {self.path[:80]!r}"})
        who = self._who()
        if not who:
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._answer(411, {"error": "a share needs a Content-Length"})
        if not 0 < length <= MAX_BODY:
            self.close_connection = True
            return self._answer(413, {"error": f"a share is at most {MAX_BODY // 2**20} MiB; share fewer runs at once"})
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError:
            return self._answer(400, {"error": "the body is not JSON: share with wb.share"})
        records = body.get("records") if isinstance(body, dict) else None
        if not isinstance(records, list) or not 0 < len(records) <= MAX_RECORDS:
            return self._answer(400, {"error": f"the body needs 'records': a list of 1 to {MAX_RECORDS} records"})
        for i, record in enumerate(records):
            problem = room_records.check(record)
            if problem is None and len(json.dumps(record)) > room_records.MAX_RECORD_BYTES:
                problem = f"it is over {room_records.MAX_RECORD_BYTES // 1024} KiB"
            if problem:
                return self._answer(400, {"error": f"record {i}: {problem}", "record": i})
        clean = [{k: v for k, v in r.items() if k not in room_records.STORE_FIELDS} for r in records]
        try:
            ids = self.store.add(who["name"], clean)
        except OSError as error:
            return self._answer(507, {"error": f"the store could not write ({error.strerror}): tell the teacher"})
        self._answer(200, {"stored": ids, "owner": who["name"]})

    def do_DELETE(self) -> None:  # noqa: N802
        route = self._route() or ""
        who = self._who()
        if not who:
            return
        if not who.get("teacher"):
            return self._answer(403, {"error": "only the teacher deletes records"})
        record_id = route.rpartition("/")[2] if route.startswith("/records/") else ""
        if not re.fullmatch(r"[0-9a-f]{16}", record_id):
            return self._answer(404, {"error": "DELETE /records/<id>, the id a record was stored under"})
        self._answer(200 if self.store.delete(record_id) else 404, {"deleted": record_id})


class _Server(ThreadingHTTPServer):
    # A room's learners share together (Run All ends at about the same time): socketserver's backlog of 5
    # drops the rest of a burst's connections, which the kernel retries 1, 3, 7 s later, past a share's
    # deadline under load (tests/test_room_scale.py lost 3 of 20 learners so in CI).
    request_queue_size = 128
    daemon_threads = True


def serve(store: Path, keys: dict[str, dict[str, Any]], *, ip: str = "127.0.0.1", port: int = 0,
          prefix: str = "/") -> ThreadingHTTPServer:
    """The store's server, bound (port 0: a free one) and serving in a daemon thread."""
    handler = type("RoomHandler", (Handler,), {"store": Store(store), "keys": keys, "prefix": prefix})
    server = _Server((ip, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="room-store").start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="folder of the records, one file per account")
    parser.add_argument("--keys", type=Path, required=True, help="JSON: {key: {name, teacher}}")
    parser.add_argument("--ip", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefix", default=os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/"),
                        help="URL path it serves under (a JupyterHub service: /services/room/)")
    args = parser.parse_args(argv)
    server = serve(args.store, load_keys(args.keys), ip=args.ip, port=args.port, prefix=args.prefix)
    print(f"room store: serving {args.store} on http://{args.ip}:{server.server_port}{args.prefix}", flush=True)
    threading.Event().wait()  # until the hub (or the teacher's notebook) ends it
    return 0


if __name__ == "__main__":
    sys.exit(main())
