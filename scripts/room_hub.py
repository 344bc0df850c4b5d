"""One machine serves the room: a JupyterHub with an account, a copy of the notebooks and a CPU and
memory limit for each learner (as root; docs/WORKSHOP.md "One machine for the room").

    python scripts/room_hub.py start --learners 8     # make room SEATS=8: accounts, copies, the hub
    python scripts/room_hub.py status                 # is it running, where, with what limits
    python scripts/room_hub.py stop                   # make room-stop: the hub, every server and kernel
    python scripts/room_hub.py reset                  # make room-reset: stop, delete the accounts and their work

`start` makes system accounts learner01..learnerNN (home 0700) with generated passwords in
<state>/roster.txt (mode 0600: root's only), the learners' copies of the notebooks, the room's
kernel spec, and starts JupyterHub (room/jupyterhub_config.py) in the background, its log in
<state>/jupyterhub.log. A learner logs in with their name and password and gets their own copies in
~/workbench at their first login. Starting again keeps the accounts, passwords and work.
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
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from room import access, limits  # noqa: E402 (the repository's room/, found through the line above)

DEFAULT_STATE = Path("/var/lib/workbench-room")
PROXY = REPO / "room/node_modules/.bin/configurable-http-proxy"
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
    grant search where a folder bars them."""
    closed = access.closed_folders([Path(sys.executable), Path(sys.prefix), Path(sys.base_prefix), REPO, state])
    if not closed:
        return
    grants_file = state / "grants.json"
    grants = json.loads(grants_file.read_text()) if grants_file.exists() else []
    grants += access.grant(closed)
    grants_file.write_text(json.dumps(grants))
    print(f"the learners may now pass (x, not list) {', '.join(map(str, closed))} to run {sys.executable} "
          "(a POSIX ACL for the group workbench-room; make room-reset removes it)")


def _install_proxy() -> None:
    if PROXY.exists():
        return
    if not shutil.which("npm"):
        raise RoomError("npm not found: install Node.js 20 (apt-get install nodejs npm) for the hub's proxy")
    print("installing configurable-http-proxy (npm ci in room/) ...")
    _run("npm", "ci", "--prefix", str(REPO / "room"), "--no-audit", "--no-fund")


def _wait_for_hub(url: str, hub: subprocess.Popen, log: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if hub.poll() is not None:
            raise RoomError(f"JupyterHub exited with {hub.returncode}; its log {log} ends:\n"
                            + log.read_text(errors="replace")[-2000:])
        try:
            with urllib.request.urlopen(f"{url}/hub/health", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RoomError(f"JupyterHub did not answer at {url} within {timeout_s:.0f} s: see {log}") from None
            time.sleep(0.3)


def start(args: argparse.Namespace) -> int:
    state: Path = args.state
    if _hub_pid(state):
        raise RoomError(f"the room is running already ({state / 'room.json'}): `make room-stop` first")
    cpus, total = os.cpu_count() or 1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    n = args.learners
    if n < 1:
        raise RoomError(f"--learners {n}: pass how many learners the room has, 1 or more (make room SEATS=8)")
    cores = args.cores or max(1.0, float(cpus // n))
    memory = parse_bytes(args.memory) if args.memory else (total - SYSTEM_GIB * 2**30) // n
    if memory < 512 * 2**20:
        raise RoomError(f"{n} learners leave {memory / 2**20:.0f} MiB each on this machine ({total / 2**30:.1f} GiB): "
                        "fewer learners, or --memory")
    _install_proxy()
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)  # the kernel spec must be readable by the learners; the roster and db are 0600
    host = socket.gethostname() if args.ip == "0.0.0.0" else args.ip
    url = f"http://{host}:{args.port}"
    names = [f"{args.prefix}{i:02d}" for i in range(1, n + 1)]
    try:
        import grp

        grp.getgrnam(access.GROUP)
    except KeyError:
        _run("groupadd", access.GROUP)
    make_accounts(state, names, url)
    _let_learners_run_python(state)
    copies = state / "copies"
    subprocess.run([sys.executable, str(REPO / "scripts/learner_copies.py"), "--force", "--out", str(copies)],
                   check=True, stdout=subprocess.DEVNULL)
    _write_kernel_spec(state, sys.executable)
    how = limits.mode()
    room = {"learners": names, "preset": args.preset, "cores": cores, "memory_bytes": memory, "ip": args.ip,
            "port": args.port, "hub_port": _free_port(), "proxy_api_port": _free_port(), "limit_mode": how,
            "python": sys.executable, "url": url}
    (state / "room.json").write_text(json.dumps(room, indent=1))
    log = state / "jupyterhub.log"
    log.touch(mode=0o600)
    with log.open("ab") as out:
        hub = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(REPO / "room/jupyterhub_config.py")],
                               cwd=state, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                               umask=0o077,  # the hub's database and files: root's only
                               env={**os.environ, "WORKBENCH_ROOM_STATE": str(state)})
    _wait_for_hub(f"http://{'127.0.0.1' if args.ip == '0.0.0.0' else args.ip}:{args.port}", hub, log)
    print(f"room open at {url}/ for {n} learners ({names[0]} .. {names[-1]}); names and passwords: "
          f"{state / 'roster.txt'} (root only)")
    print(f"each learner: {cores:g} core(s), {memory / 2**30:.1f} GiB ({how}), preset {args.preset}, "
          f"{max(1, int(cores))} thread(s); stop: make room-stop")
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
    """Stop the hub (it stops the servers it started), then any process of a learner left."""
    import psutil

    state: Path = args.state
    pid = _hub_pid(state)
    if pid:
        os.kill(pid, signal.SIGTERM)
        try:
            psutil.Process(pid).wait(timeout=30)
        except psutil.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    names = json.loads((state / "room.json").read_text())["learners"] if (state / "room.json").exists() else []
    left = _learner_processes(names)
    for process in left:  # kernels live in their own sessions: a server's end may leave them
        process.terminate()
    gone, alive = psutil.wait_procs(left, timeout=5)
    for process in alive:
        process.kill()
    psutil.wait_procs(alive, timeout=5)
    stuck = limits.remove()
    print(f"room stopped ({'hub ended' if pid else 'no hub was running'}; {len(left)} learner process(es) ended)"
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
          f"{room['memory_bytes'] / 2**30:.1f} GiB each ({room['limit_mode']}), preset {room['preset']}")
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
    for name in ("stop", "reset", "status"):
        commands.add_parser(name)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: the room makes system accounts and cgroups: run it as root (sudo make room SEATS=8)",
              file=sys.stderr)
        return 2
    try:
        return {"start": start, "stop": stop, "reset": reset, "status": status}[args.command](args)
    except RoomError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
