"""Each learner's CPU and memory limit: a cgroup of their own, or rlimits where none can be made.

Three ways, the first this machine allows:
- cgroup v2 (one tree at /sys/fs/cgroup, today's systemd distributions): /sys/fs/cgroup/workbench-room/<user>
  with memory.max, memory.swap.max = 0 and cpu.max;
- cgroup v1 (separate `memory` and `cpu` trees, older hosts and some VMs): the same folder in each, with
  memory.limit_in_bytes (and memsw, so swap is no way round it) and cpu.cfs_quota_us;
- neither writable (an unprivileged container): RLIMIT_DATA on each process. An rlimit is per process,
  not per learner, and counts reserved address space, not memory used: weaker, and said so.

The learner's single-user server joins its cgroup before it drops to the learner's uid (in the spawn's
preexec function), so every kernel it starts is in it too and counted together. When the group goes
over its memory limit the kernel's OOM killer stops a process in that group only (the largest: the
kernel that allocated), never another learner's. workbench's `free_bytes()` reads the same limit, so
`wb.run` refuses a run that cannot fit before it allocates (workbench/planner/fit.py).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "workbench-room"
PERIOD_US = 100_000  # the CFS period a CPU quota is a share of


@dataclass(frozen=True)
class Limits:
    cores: float
    memory_bytes: int


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK)


def mode(root: Path = ROOT) -> str:
    """'cgroup v2', 'cgroup v1' or 'rlimit': what this machine lets the room enforce."""
    controllers = root / "cgroup.controllers"
    if controllers.is_file() and {"memory", "cpu"} <= set(controllers.read_text().split()) and _writable(root):
        return "cgroup v2"
    if _writable(root / "memory") and _writable(root / "cpu") and (root / "memory/memory.limit_in_bytes").exists():
        return "cgroup v1"
    return "rlimit"


def folders(user: str, how: str, root: Path = ROOT) -> list[Path]:
    """The learner's cgroup folders (one in v2, one per controller in v1; none for rlimits)."""
    if how == "cgroup v2":
        return [root / GROUP / user]
    if how == "cgroup v1":
        return [root / "memory" / GROUP / user, root / "cpu" / GROUP / user]
    return []


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def prepare(user: str, limits: Limits, how: str, root: Path = ROOT) -> list[Path]:
    """Make the learner's cgroup with its limits (as root, before the spawn); their folders."""
    quota = str(int(limits.cores * PERIOD_US))
    if how == "cgroup v2":
        group = root / GROUP
        group.mkdir(exist_ok=True)
        for parent in (root, group):  # a child can have a controller only if its parent hands it down
            _write(parent / "cgroup.subtree_control", "+memory +cpu")
        mine = group / user
        mine.mkdir(exist_ok=True)
        _write(mine / "memory.max", str(limits.memory_bytes))
        if (mine / "memory.swap.max").exists():
            _write(mine / "memory.swap.max", "0")
        _write(mine / "cpu.max", f"{quota} {PERIOD_US}")
    elif how == "cgroup v1":
        memory, cpu = folders(user, how, root)
        for folder in (memory, cpu):
            folder.mkdir(parents=True, exist_ok=True)
        _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
        if (memory / "memory.memsw.limit_in_bytes").exists():  # memory + swap: no way round through swap
            _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        _write(cpu / "cpu.cfs_period_us", str(PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", quota)
    for folder in folders(user, how, root):  # readable by the learner whatever the hub's umask: workbench
        for made in (folder.parent, folder):     # reads its limit there (free_bytes) and the kernel its OOM count
            made.chmod(0o755)
    return folders(user, how, root)


def join(how: str, user_folders: list[Path], limits: Limits) -> None:
    """Put the calling process in the learner's cgroup, or under rlimits (in the spawn's preexec)."""
    procs = "cgroup.procs"
    for folder in user_folders:
        with open(folder / procs, "w") as f:
            f.write(str(os.getpid()))
    if how == "rlimit":
        resource.setrlimit(resource.RLIMIT_DATA, (limits.memory_bytes, limits.memory_bytes))


def remove(root: Path = ROOT) -> list[str]:
    """Remove the room's cgroups (empty ones: their processes stopped first); what could not be."""
    left = []
    for tree in (root, root / "memory", root / "cpu"):
        group = tree / GROUP
        if not group.is_dir():
            continue
        for folder in sorted(group.iterdir()):
            if folder.is_dir():
                try:
                    folder.rmdir()
                except OSError as e:
                    left.append(f"{folder} ({e.strerror})")
        try:
            group.rmdir()
        except OSError as e:
            left.append(f"{group} ({e.strerror})")
    return left


def oom_kills(pid: int | str = "self", root: Path = ROOT) -> int | None:
    """How many processes the OOM killer stopped in this process's memory cgroup (None: no cgroup)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            events = root / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            events = root / "memory" / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        try:
            fields = dict(line.split() for line in events.read_text().splitlines())
        except (OSError, ValueError):
            continue
        if "oom_kill" in fields:
            return int(fields["oom_kill"])
    return None
