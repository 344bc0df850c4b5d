"""One machine serves the room: a JupyterHub with an account, a copy of the notebooks and a CPU and
memory limit for each learner (as root; docs/WORKSHOP.md "One machine for the room").

    python scripts/room_hub.py start --learners 8     # make room SEATS=8: accounts, copies, the hub
    python scripts/room_hub.py status                 # is it running, where, whose servers run
    python scripts/room_hub.py update                 # make room-update: the notebooks as they are now, to everyone
    python scripts/room_hub.py restart learner03      # stop and start one learner's server
    python scripts/room_hub.py cert --host room.lan   # make room-cert: a certificate for HTTPS (--https)
    python scripts/room_hub.py stop                   # make room-stop: the hub, every server and kernel
    python scripts/room_hub.py reset                  # make room-reset: stop, delete the accounts and their work

`start` makes system accounts learner01..learnerNN and the teacher's, `teacher` (the hub's admin), each
home 0700, with generated passwords in <state>/roster.txt (mode 0600: root's only), a key to the room's
store for each (<state>/room-keys.json, root's), the learners' copies of the notebooks, the room's kernel
spec, and starts JupyterHub (room/jupyterhub_config.py) in the background with its services (the room's
store, the idle culler), its log in <state>/jupyterhub.log. A learner logs in with their name and
password and gets their own copies in ~/workbench. Starting again keeps the accounts, passwords, keys and
work. Everything it runs comes from the Python environment (the proxy too): no npm, no index.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from room import access, limits  # noqa: E402 (the repository's room/, found through the line above)

DEFAULT_STATE = Path("/var/lib/workbench-room")
SYSTEM_GIB = 4  # left to the system and the hub (docs/WORKSHOP.md's sizing)
PASSWORD_LETTERS = "abcdefghjkmnpqrstuvwxyz23456789"  # none that read alike (l/1, o/0)
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class RoomError(Exception):
    """A one-line reason the room cannot do what was asked, with the fix."""


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.I)
    if not match:
        raise RoomError(f"--memory {text!r}: write a size such as 4G, 1.5G or 512M")
    return int(float(match[1]) * UNITS[match[2].upper()])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(*command: str, stdin: str | None = None) -> None:
    proc = subprocess.run(command, input=stdin, capture_output=True, text=True)
    if proc.returncode:
        raise RoomError(f"{' '.join(command[:2])} failed: {(proc.stderr or proc.stdout).strip()}")


def read_roster(state: Path) -> dict[str, str]:
    roster = state / "roster.txt"
    if not roster.exists():
        return {}
    return dict(line.split(" ", 1) for line in roster.read_text().splitlines() if line and not line.startswith("#"))


def _write_roster(state: Path, accounts: dict[str, str], url: str) -> None:
    roster = state / "roster.txt"
    roster.touch(mode=0o600)
    roster.chmod(0o600)
    lines = [f"# {url}: log in with a name and its password", *(f"{n} {p}" for n, p in accounts.items())]
    roster.write_text("\n".join(lines) + "\n")


def make_accounts(state: Path, names: list[str], url: str) -> dict[str, str]:
    """System accounts for the learners (kept, with their password, if the roster has them)."""
    accounts = read_roster(state)
    for name in names:
        if name in accounts:
            continue
        try:
            pwd.getpwnam(name)
            raise RoomError(f"a user {name!r} exists and is not in this room's roster: "
                            "pass --prefix to name the learners otherwise")
        except KeyError:
            pass
        _run("useradd", "--create-home", "--shell", "/bin/bash", "--user-group", "--groups", access.GROUP, name)
        Path(pwd.getpwnam(name).pw_dir).chmod(0o700)
        accounts[name] = "".join(secrets.choice(PASSWORD_LETTERS) for _ in range(10))
        _run("chpasswd", stdin=f"{name}:{accounts[name]}\n")
        _write_roster(state, accounts, url)  # after each: a failure half way leaves no account unknown
    _write_roster(state, accounts, url)
    return accounts


def room_keys(state: Path, names: list[str], teacher: str) -> dict[str, dict]:
    """One key to the room's store per account (kept across starts), in <state>/room-keys.json (root's)."""
    path = state / "room-keys.json"
    keys = json.loads(path.read_text()) if path.exists() else {}
    have = {who["name"] for who in keys.values()}
    for name in [*names, teacher]:
        if name not in have:
            keys[secrets.token_hex(16)] = {"name": name, "teacher": name == teacher}
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(json.dumps(keys, indent=1))
    return keys


def _admin_token(state: Path) -> str:
    path = state / "admin-token"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path.read_text().strip()


def _hub_pid(state: Path) -> int | None:
    try:
        pid = int((state / "jupyterhub.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def _write_kernel_spec(state: Path, python: str) -> None:
    """A `python3` kernel spec that runs room/kernel_start.py first (JUPYTER_PATH puts it first)."""
    folder = state / "share/jupyter/kernels/python3"
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                     f"--IPKernelApp.exec_files={REPO / 'room/kernel_start.py'}"],
            "display_name": "Python 3 (ipykernel)", "language": "python", "metadata": {"debugger": True}}
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))
    for path in (state / "share", state / "share/jupyter", state / "share/jupyter/kernels", folder):
        path.chmod(0o755)


def _let_learners_run_python(state: Path) -> None:
    """Learners run this Python, read this repository and the room's kernel spec (in the state folder):
    grant search where a folder on the way bars them, and read as well on the repository itself."""
    closed = access.closed_folders([Path(sys.executable), Path(sys.prefix), Path(sys.base_prefix), REPO, state])
    unreadable = access.unreadable_folders([REPO])
    closed = [folder for folder in closed if folder not in unreadable]  # the venv's parents include REPO
    if not closed and not unreadable:
        return
    grants_file = state / "grants.json"
    grants = json.loads(grants_file.read_text()) if grants_file.exists() else []
    grants += access.grant(closed) + access.grant(unreadable, access.READ_AND_SEARCH)
    grants_file.write_text(json.dumps(grants))
    if closed:
        print(f"the learners may now pass (x, not list) {', '.join(map(str, closed))} to run {sys.executable} "
              "(a POSIX ACL for the group workbench-room; make room-reset removes it)")
    if unreadable:
        print(f"the learners may now read (r-x) {REPO} to import the room's code from it "
              "(a POSIX ACL for the group workbench-room; make room-reset removes it)")


def _check_proxy() -> None:
    """The hub's proxy is a Python package (room/proxy.py runs it): there, or one line with the fix."""
    try:
        import configurable_http_proxy  # noqa: F401
        import jupyterhub_idle_culler  # noqa: F401
    except ImportError as e:
        raise RoomError(f"{e.name} is not installed: the room's extra (pip install -e '.[room]', or "
                        "WORKBENCH_WHEELHOUSE=wheelhouse make room)") from None


def make_copies(state: Path) -> None:
    """The learners' copies (no outputs, no solutions) and the teacher's (those and the room's notebook)."""
    copies, teacher = state / "copies", state / "teacher-copies"
    for folder, notebooks in ((copies, []), (teacher, [REPO / "notebooks/teacher/room.ipynb"])):
        extra = ["--notebooks", *map(str, sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))),
                 *map(str, notebooks)] if notebooks else []
        subprocess.run([sys.executable, str(REPO / "scripts/learner_copies.py"), "--force", "--out", str(folder), *extra],
                       check=True, stdout=subprocess.DEVNULL)
        folder.chmod(0o755)  # read by the learners' own processes (room/copies.py runs as them)
        for path in folder.iterdir():
            path.chmod(0o644)


def make_certificate(state: Path, host: str, days: int = 30) -> tuple[Path, Path]:
    """A self-signed certificate for `host` (and loopback), made with openssl, in <state>/tls/."""
    folder = state / "tls"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    cert, key = folder / "room.crt", folder / "room.key"
    names = f"DNS:{host},DNS:localhost,IP:127.0.0.1" if not re.fullmatch(r"[\d.]+", host) else f"IP:{host},DNS:localhost,IP:127.0.0.1"
    if not shutil.which("openssl"):
        raise RoomError("openssl not found: apt-get install openssl, or pass --ssl-cert/--ssl-key of your own")
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", str(days),
         "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={host}", "-addext", f"subjectAltName={names}")
    key.chmod(0o600)
    cert.chmod(0o644)
    return cert, key


def _open(url: str, state: Path, timeout: float = 2, **kwargs):
    """urlopen that trusts the room's own certificate (HTTPS rooms)."""
    import ssl

    cert = state / "tls/room.crt"
    context = ssl.create_default_context(cafile=str(cert)) if url.startswith("https") and cert.exists() else None
    return urllib.request.urlopen(urllib.request.Request(url, **kwargs), timeout=timeout, context=context)


def _wait_for_hub(url: str, hub: subprocess.Popen, log: Path, state: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if hub.poll() is not None:
            raise RoomError(f"JupyterHub exited with {hub.returncode}; its log {log} ends:\n"
                            + log.read_text(errors="replace")[-2000:])
        try:
            with _open(f"{url}/hub/health", state):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RoomError(f"JupyterHub did not answer at {url} within {timeout_s:.0f} s: see {log}") from None
            time.sleep(0.3)


def _certificate(args: argparse.Namespace, state: Path, host: str) -> tuple[str, str] | tuple[None, None]:
    if args.ssl_cert or args.ssl_key:
        if not (args.ssl_cert and args.ssl_key and Path(args.ssl_cert).is_file() and Path(args.ssl_key).is_file()):
            raise RoomError("--ssl-cert and --ssl-key: pass both, each an existing PEM file")
        return str(Path(args.ssl_cert).resolve()), str(Path(args.ssl_key).resolve())
    if not args.https:
        return None, None
    cert, key = state / "tls/room.crt", state / "tls/room.key"
    if not cert.exists():
        cert, key = make_certificate(state, host)
        print(f"made a certificate for {host}: {cert} (give it to laptops that share: WORKBENCH_ROOM_CA)")
    return str(cert), str(key)


def start(args: argparse.Namespace) -> int:
    state: Path = args.state
    if _hub_pid(state):
        raise RoomError(f"the room is running already ({state / 'room.json'}): `make room-stop` first")
    cpus, total = os.cpu_count() or 1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    n = args.learners
    if n < 1:
        raise RoomError(f"--learners {n}: pass how many learners the room has, 1 or more (make room SEATS=8)")
    if args.cull_idle and args.cull_idle < 20:
        raise RoomError(f"--cull-idle {args.cull_idle}: at least 20 seconds (0 turns culling off)")
    cores = args.cores or max(1.0, float(cpus // n))
    memory = parse_bytes(args.memory) if args.memory else (total - SYSTEM_GIB * 2**30) // n
    if memory < 512 * 2**20:
        raise RoomError(f"{n} learners leave {memory / 2**20:.0f} MiB each on this machine ({total / 2**30:.1f} GiB): "
                        "fewer learners, or --memory")
    _check_proxy()
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)  # the kernel spec must be readable by the learners; the roster, keys and db are 0600
    host = socket.gethostname() if args.ip == "0.0.0.0" else args.ip
    ssl_cert, ssl_key = _certificate(args, state, host)
    url = f"{'https' if ssl_cert else 'http'}://{host}:{args.port}"
    names = [f"{args.prefix}{i:02d}" for i in range(1, n + 1)]
    if args.teacher in names:
        raise RoomError(f"--teacher {args.teacher}: a learner has that name; pass another")
    try:
        import grp

        grp.getgrnam(access.GROUP)
    except KeyError:
        _run("groupadd", access.GROUP)
    make_accounts(state, [*names, args.teacher], url)
    _let_learners_run_python(state)
    make_copies(state)
    room_keys(state, names, args.teacher)
    _admin_token(state)
    _write_kernel_spec(state, sys.executable)
    how = limits.mode()
    cull_every = max(5, min(60, args.cull_idle // 4)) if args.cull_idle else 0
    room = {"learners": names, "teacher": args.teacher, "preset": args.preset, "cores": cores, "memory_bytes": memory,
            "ip": args.ip, "port": args.port, "hub_port": _free_port(), "proxy_api_port": _free_port(),
            "store_port": _free_port(), "limit_mode": how, "python": sys.executable, "url": url,
            "ssl_cert": ssl_cert, "ssl_key": ssl_key, "cull_idle_s": args.cull_idle, "cull_every_s": cull_every,
            # a server tells the hub it was active this often: well inside the culler's timeout
            "activity_interval_s": max(5, min(300, args.cull_idle // 6)) if args.cull_idle else 300}
    (state / "room.json").write_text(json.dumps(room, indent=1))
    log = state / "jupyterhub.log"
    log.touch(mode=0o600)
    with log.open("ab") as out:
        hub = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(REPO / "room/jupyterhub_config.py")],
                               cwd=state, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                               umask=0o077,  # the hub's database and files: root's only
                               env={**os.environ, "WORKBENCH_ROOM_STATE": str(state)})
    local = f"{'https' if ssl_cert else 'http'}://{'127.0.0.1' if args.ip == '0.0.0.0' else args.ip}:{args.port}"
    _wait_for_hub(local, hub, log, state)
    print(f"room open at {url}/ for {n} learners ({names[0]} .. {names[-1]}) and the teacher ({args.teacher}, the "
          f"hub's admin: {url}/hub/admin); names and passwords: {state / 'roster.txt'} (root only)")
    print(f"each learner: {cores:g} core(s), {memory / 2**30:.1f} GiB ({how}), preset {args.preset}, "
          f"{max(1, int(cores))} thread(s); idle servers stopped after "
          f"{f'{args.cull_idle} s' if args.cull_idle else 'never (culling off)'}; stop: make room-stop")
    print(f"the room's store: {url}/services/room/ (learners' kernels share to it: wb.share)")
    return 0


def _hub_api(state: Path, method: str, path: str) -> Any:
    """The hub's REST API with the room's admin token (root's), on the address room.json names."""
    room = json.loads((state / "room.json").read_text())
    local = f"{'https' if room.get('ssl_cert') else 'http'}://{'127.0.0.1' if room['ip'] == '0.0.0.0' else room['ip']}:{room['port']}"
    token = (state / "admin-token").read_text().strip()
    try:
        with _open(f"{local}/hub/api{path}", state, timeout=30, method=method,
                   headers={"Authorization": f"token {token}"}) as answer:
            body = answer.read()
    except urllib.error.HTTPError as e:
        raise RoomError(f"the hub refused {method} {path}: HTTP {e.code} {e.read()[:200]!r}") from None
    except OSError as e:
        raise RoomError(f"the hub is not answering at {local} ({e}): is the room running? (make room)") from None
    return json.loads(body) if body else None


def restart(args: argparse.Namespace) -> int:
    """Stop one learner's server and start it again (what the teacher's /hub/admin page does)."""
    name = args.name
    user = _hub_api(args.state, "GET", f"/users/{name}")
    if user.get("servers", {}).get(""):
        _hub_api(args.state, "DELETE", f"/users/{name}/server")
        deadline = time.monotonic() + 120
        while _hub_api(args.state, "GET", f"/users/{name}").get("servers", {}).get(""):
            if time.monotonic() > deadline:
                raise RoomError(f"{name}'s server did not stop within 120 s")
            time.sleep(1)
    _hub_api(args.state, "POST", f"/users/{name}/server")
    print(f"{name}: server restarted (their notebooks and files are as they were; their kernels start afresh)")
    return 0


def update(args: argparse.Namespace) -> int:
    """The notebooks as they are now (or --from FOLDER's) to every learner, never over their work."""
    state: Path = args.state
    room = json.loads((state / "room.json").read_text())
    if args.source:
        for folder in (state / "copies", state / "teacher-copies"):
            for notebook in sorted(args.source.glob("*.ipynb")):
                if folder.name == "teacher-copies" or notebook.name != "room.ipynb":
                    shutil.copyfile(notebook, folder / notebook.name)
                    (folder / notebook.name).chmod(0o644)
    else:
        make_copies(state)
    from room import copies

    totals: dict[str, int] = {}
    for name in [*room["learners"], room["teacher"]]:
        source = state / ("teacher-copies" if name == room["teacher"] else "copies")
        done = copies.deliver_as(name, source, state, room["python"])
        for what, names in done.items():
            totals[what] = totals.get(what, 0) + len(names)
        if done["beside"]:
            print(f"{name}: a new version beside their own: {', '.join(done['beside'])}")
    print(f"notebooks updated for {len(room['learners'])} learners and the teacher: {totals.get('updated', 0)} replaced "
          f"(unchanged by their learner), {totals.get('beside', 0)} put beside the learner's own (update N), "
          f"{totals.get('new', 0)} new; no learner's work was changed")
    return 0


def certificate(args: argparse.Namespace) -> int:
    cert, key = make_certificate(args.state, args.host, args.days)
    print(f"certificate for {args.host} ({args.days} days): {cert} (give it to laptops: WORKBENCH_ROOM_CA), key {key} "
          "(root only); start the room with ROOM_ARGS=--https")
    return 0


def _learner_processes(names: list[str]) -> list:
    import psutil

    uids = set()
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            pass
    return [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in uids]


def stop(args: argparse.Namespace) -> int:
    """Stop the hub (it stops the servers it started), then any process of a learner left, and any
    of the hub's own (its proxy, its services) that outlived it."""
    import psutil

    state: Path = args.state
    pid = _hub_pid(state)
    started: list = []
    if pid:
        try:  # what the hub runs: its cleanup stops them; a hub killed after 30 s leaves them running
            started = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        os.kill(pid, signal.SIGTERM)
        try:
            psutil.Process(pid).wait(timeout=30)
        except psutil.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    # The teacher's account too: its server and kernels are the hub's like the learners' (a teacher's
    # kernel left running made reset's userdel fail, once in CI: "user ... is currently used by process").
    room = json.loads((state / "room.json").read_text()) if (state / "room.json").exists() else {}
    names = [*room.get("learners", []), *([room["teacher"]] if room.get("teacher") else [])]
    learners = _learner_processes(names)
    # The hub's proxy and idle culler outlived a stopped hub (seen after CI's room test: both still
    # running minutes later, the proxy on the room's port). is_running() also checks the start time: a
    # process id reused since is left alone.
    learner_pids = {q.pid for q in learners}
    outlived = [p for p in started if p.is_running() and p.pid not in learner_pids]
    left = learners + outlived
    for process in left:  # kernels live in their own sessions: a server's end may leave them
        process.terminate()
    gone, alive = psutil.wait_procs(left, timeout=5)
    for process in alive:
        process.kill()
    psutil.wait_procs(alive, timeout=5)
    stuck = limits.remove()
    print(f"room stopped ({'hub ended' if pid else 'no hub was running'}; {len(learners)} learner or teacher process(es) ended"
          + (f"; {len(outlived)} of the hub's own that outlived it ended" if outlived else "") + ")"
          + (f"; cgroups left: {', '.join(stuck)}" if stuck else ""))
    return 0


def reset(args: argparse.Namespace) -> int:
    """Stop, then delete the learners' accounts with their homes (their work) and the room's state."""
    stop(args)
    state: Path = args.state
    accounts = read_roster(state)
    for name in accounts:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        _run("userdel", "--remove", name)
    try:
        import grp

        if not grp.getgrnam(access.GROUP).gr_mem:  # no learner of any room left in it
            _run("groupdel", access.GROUP)
    except KeyError:
        pass
    grants_file = state / "grants.json"
    if grants_file.exists():
        access.revoke(json.loads(grants_file.read_text()))
    shutil.rmtree(state, ignore_errors=True)
    print(f"room reset: {len(accounts)} account(s) and their work deleted, {state} removed")
    return 0


def status(args: argparse.Namespace) -> int:
    state: Path = args.state
    if not (state / "room.json").exists():
        print(f"no room here ({state}): make room SEATS=8")
        return 1
    room = json.loads((state / "room.json").read_text())
    running = "running" if _hub_pid(state) else "stopped"
    print(f"room {running} at {room['url']}/: {len(room['learners'])} learners, {room['cores']:g} core(s) and "
          f"{room['memory_bytes'] / 2**30:.1f} GiB each ({room['limit_mode']}), preset {room['preset']}, "
          f"teacher {room.get('teacher', '?')}")
    if running == "running":
        for user in sorted(_hub_api(state, "GET", "/users"), key=lambda u: u["name"]):
            server = user.get("servers", {}).get("")
            print(f"  {user['name']:<14} {'server running' if server else 'no server':<15} last active "
                  f"{(server or user).get('last_activity') or 'never'}")
    return 0 if running == "running" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, default=Path(os.environ.get("WORKBENCH_ROOM_STATE", DEFAULT_STATE)),
                        help="the room's files (default: $WORKBENCH_ROOM_STATE, else %s)" % DEFAULT_STATE)
    commands = parser.add_subparsers(dest="command", required=True)
    begin = commands.add_parser("start", help="accounts, copies and the hub, in the background")
    begin.add_argument("--learners", type=int, required=True)
    begin.add_argument("--preset", default="cpu-quick", help="WORKBENCH_PRESET for every learner (default %(default)s)")
    begin.add_argument("--cores", type=float, help="CPU cores per learner (default: the cores / learners, at least 1)")
    begin.add_argument("--memory", help="memory per learner, e.g. 4G (default: (memory - 4 GiB) / learners)")
    begin.add_argument("--ip", default="0.0.0.0", help="address to serve on (default: every interface)")
    begin.add_argument("--port", type=int, default=8000)
    begin.add_argument("--prefix", default="learner", help="account names: PREFIX01, PREFIX02, ...")
    begin.add_argument("--teacher", default="teacher", help="the teacher's account, the hub's admin (default %(default)s)")
    begin.add_argument("--cull-idle", type=int, default=3600, metavar="SECONDS",
                       help="stop a server idle this long (JupyterHub's idle culler; 0: never; default %(default)s)")
    begin.add_argument("--https", action="store_true",
                       help="serve HTTPS with the room's certificate (made if missing: the `cert` command)")
    begin.add_argument("--ssl-cert", help="serve HTTPS with this certificate (PEM) instead of the room's own")
    begin.add_argument("--ssl-key", help="... and its key (PEM)")
    again = commands.add_parser("restart", help="stop and start one learner's server (their files are kept)")
    again.add_argument("name")
    fresh = commands.add_parser("update", help="the notebooks as they are now, to every learner, never over their work")
    fresh.add_argument("--from", dest="source", type=Path,
                       help="a folder of ready copies to deliver instead of notebooks/ (learner_copies.py's)")
    cert = commands.add_parser("cert", help="a self-signed certificate for HTTPS, in <state>/tls/")
    cert.add_argument("--host", default=socket.gethostname(), help="the name learners type (default: this host's)")
    cert.add_argument("--days", type=int, default=30)
    for name in ("stop", "reset", "status"):
        commands.add_parser(name)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: the room makes system accounts and cgroups: run it as root (sudo make room SEATS=8)",
              file=sys.stderr)
        return 2
    try:
        commands = {"start": start, "stop": stop, "reset": reset, "status": status, "restart": restart,
                    "update": update, "cert": certificate}
        return commands[args.command](args)
    except RoomError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
