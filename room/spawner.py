"""The room's spawner: JupyterHub's LocalProcessSpawner, plus what a learner's server needs here.

At each spawn, as root, before the learner's server starts:
- their own copies of the notebooks (no outputs, no solutions) in ~/workbench, the missing ones only
  (a copy there holds the learner's answers), owned by them, their home 0700;
- their cgroup (CPU and memory limit; room/limits.py), which the server joins before it drops to the
  learner's uid, so that its kernels are counted in it too.
The server runs as the learner (setuid: PAM accounts are real system users), with the teacher's preset,
one BLAS/OpenMP thread pool the size of the learner's cores, the hubs offline, and the room's kernel
spec (room/kernel_start.py says in the notebook when the memory limit stopped the last kernel).
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from traitlets import Dict, Float, Integer, Unicode

from room import limits

NOTEBOOKS_FOLDER = "workbench"  # in the learner's home


class RoomSpawner(LocalProcessSpawner):
    copies = Unicode(help="Folder of the learners' copies (scripts/learner_copies.py's), copied at spawn").tag(config=True)
    cores = Float(1.0, help="CPU cores per learner (a cgroup quota) and their thread count").tag(config=True)
    memory_bytes = Integer(help="Memory per learner, all their notebooks together").tag(config=True)
    limit_mode = Unicode("rlimit", help="'cgroup v2', 'cgroup v1' or 'rlimit' (room/limits.py's mode())").tag(config=True)
    room_env = Dict(help="Environment every learner's server gets (the preset, threads, offline hubs)").tag(config=True)

    def _limits(self) -> limits.Limits:
        return limits.Limits(cores=self.cores, memory_bytes=self.memory_bytes)

    def _give_copies(self) -> Path:
        account = pwd.getpwnam(self.user.name)
        home = Path(account.pw_dir)
        home.chmod(0o700)  # another learner can neither read nor change anything in it
        folder = home / NOTEBOOKS_FOLDER
        folder.mkdir(exist_ok=True)
        os.chown(folder, account.pw_uid, account.pw_gid)
        for notebook in sorted(Path(self.copies).glob("*.ipynb")):
            target = folder / notebook.name
            if not target.exists():  # a copy there is the learner's own work: never replaced
                shutil.copyfile(notebook, target)
                os.chown(target, account.pw_uid, account.pw_gid)
                target.chmod(0o600)
        return folder

    def get_env(self) -> dict:
        env = super().get_env()
        env.update(self.room_env)
        return env

    def make_preexec_fn(self, name: str):
        become_learner = set_user_setuid(name)
        how, user_folders, caps = self.limit_mode, self._user_folders, self._limits()

        def preexec() -> None:
            limits.join(how, user_folders, caps)  # as root still: the cgroup's files are root's
            become_learner()

        return preexec

    async def start(self):
        folder = self._give_copies()
        self.notebook_dir = str(folder)
        self._user_folders = limits.prepare(self.user.name, self._limits(), self.limit_mode)
        self.mem_limit = self.memory_bytes  # JupyterHub passes these on as MEM_LIMIT and CPU_LIMIT
        self.cpu_limit = self.cores
        return await super().start()
