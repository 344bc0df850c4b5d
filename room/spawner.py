"""The room's spawner: JupyterHub's LocalProcessSpawner, plus what a learner's server needs here.

At each spawn, as root, before the learner's server starts:
- their own copies of the notebooks (no outputs, no solutions) in ~/workbench: new ones, and fixed ones
  they have not changed; a notebook they changed is never replaced (room/copies.py), their home 0700;
- their cgroup (CPU and memory limit; room/limits.py), which the server joins before it drops to the
  learner's uid, so that its kernels are counted in it too.
The server runs as the learner (setuid: PAM accounts are real system users), with their key to the
room's store (WORKBENCH_ROOM_KEY: sharing says who they are), the teacher's preset,
one BLAS/OpenMP thread pool the size of the learner's cores, the hubs offline, and the room's kernel
spec (room/kernel_start.py says in the notebook when the memory limit stopped the last kernel).
"""

from __future__ import annotations

import asyncio
import pwd
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from traitlets import Dict, Float, Integer, List, Unicode

from room import copies as deliveries
from room import limits

NOTEBOOKS_FOLDER = "workbench"  # in the learner's home


class RoomSpawner(LocalProcessSpawner):
    copies = Unicode(help="Folder of the learners' copies (scripts/learner_copies.py's), copied at spawn").tag(config=True)
    cores = Float(1.0, help="CPU cores per learner (a cgroup quota) and their thread count").tag(config=True)
    memory_bytes = Integer(help="Memory per learner, all their notebooks together").tag(config=True)
    limit_mode = Unicode("rlimit", help="'cgroup v2', 'cgroup v1' or 'rlimit' (room/limits.py's mode())").tag(config=True)
    room_env = Dict(help="Environment every learner's server gets (the preset, threads, offline hubs)").tag(config=True)
    room_keys = Dict(help="Account -> its key to the room's store (WORKBENCH_ROOM_KEY in their kernels)").tag(config=True)
    state = Unicode(help="The room's state folder (what was delivered to whom)").tag(config=True)
    teachers = List(help="Accounts that get the teacher's copies (the learners' and the room's notebook)").tag(config=True)
    teacher_copies = Unicode(help="Folder of the teacher's copies").tag(config=True)

    def _limits(self) -> limits.Limits:
        return limits.Limits(cores=self.cores, memory_bytes=self.memory_bytes)

    def _give_copies(self) -> Path:
        home = Path(pwd.getpwnam(self.user.name).pw_dir)
        home.chmod(0o700)  # another learner can neither read nor change anything in it
        # new notebooks, and fixed ones the learner has not changed; their own work is never replaced
        source = self.teacher_copies if self.user.name in self.teachers else self.copies
        deliveries.deliver_as(self.user.name, Path(source), Path(self.state), self.cmd[0])
        return home / NOTEBOOKS_FOLDER

    def get_env(self) -> dict:
        env = super().get_env()
        env.update(self.room_env)
        if self.user.name in self.room_keys:  # their key to the room's store: who they are when they share
            env["WORKBENCH_ROOM_KEY"] = self.room_keys[self.user.name]
        return env

    def make_preexec_fn(self, name: str):
        become_learner = set_user_setuid(name)
        how, user_folders, caps = self.limit_mode, self._user_folders, self._limits()

        def preexec() -> None:
            limits.join(how, user_folders, caps)  # as root still: the cgroup's files are root's
            become_learner()

        return preexec

    async def start(self):
        folder = await asyncio.get_running_loop().run_in_executor(None, self._give_copies)  # a process: off the hub's loop
        self.notebook_dir = str(folder)
        self._user_folders = limits.prepare(self.user.name, self._limits(), self.limit_mode)
        self.mem_limit = self.memory_bytes  # JupyterHub passes these on as MEM_LIMIT and CPU_LIMIT
        self.cpu_limit = self.cores
        return await super().start()
