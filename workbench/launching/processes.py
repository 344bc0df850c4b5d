"""N processes on this machine for one launch: started so that none inherits a held lock, and
stopped together with every process they started.

Where the children come from. A child forked from the notebook copies every lock its other
threads hold at that instant, never their release. The launcher's own rendezvous store is such
a thread: torch's TCPStore server does a reverse name lookup (glibc's resolver: /etc/hosts, then a
DNS query for 1.0.0.127.in-addr.arpa, seen with strace) for every process that connects, while
the next child is being forked. A child forked then waited in glibc's resolver lock forever (once
14 minutes; a 4-process gloo launch hung about 1 in 10-15 on the loaded 2-core CI machine). So by
default (`auto` on Linux) the children are forked by multiprocessing's fork server: a process
started fresh (fork and exec) that imports torch, accelerate and the training loop once, holds no
thread (`forkserver_threads()`), and forks each child on request, in milliseconds. Where the
platform's default is spawn (macOS, Windows, or a user's choice) the children are spawned. `fork`
stays available (a test's monkeypatch reaches forked children): the store then holds no client
connection while children are forked (each child waits for its siblings before connecting).

Every child runs in a process group of its own (POSIX), so `Children.stop()` reaches what the
ranks started (DataLoader workers, subprocesses) as well as the ranks; descendants seen while the
launch ran are stopped too (one that left the group). Every child also watches the process that
launched it and ends its group when that process is gone without stopping it (a kernel killed or
restarted mid-launch).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import dill
import psutil

from workbench.core.limits import usable_cores
from workbench.machine.cpu_class import CAP_VARIABLES

METHODS = ("auto", "fork", "spawn", "forkserver")

# What the fork server imports once, so that its children start with it loaded (copy-on-write):
# without it every child imports torch, accelerate and the loop itself (seconds each).
PRELOAD = ("torch", "torch.distributed", "accelerate", "accelerate.accelerator", "torch._dynamo",
           "workbench.launching.launch", "workbench.core.engine.train", "workbench.core.data")
# Read once at import by the libraries the server preloads: a server started under other values
# is replaced (CI caps the CPU's instructions in the environment; see machine/cpu_class).
_IMPORT_TIME_ENV = CAP_VARIABLES
_server_env: dict[str, str | None] | None = None


class LaunchError(RuntimeError):
    """A multi-process launch that cannot start or did not finish; says why."""


def free_port() -> int:
    """A TCP port free right now (e.g. for `accelerate launch --main_process_port`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leave_together() -> None:
    """Wait, once this rank's work is done, until every rank of its process group is done too.

    A rank that returned and exited while a peer was still inside `init_process_group` closed a
    connection the peer had yet to take up: gloo reads that as "Connection closed by peer" and the
    peer's init failed, though nothing had crashed. Work that ends in a collective never showed
    it (its ranks wait for each other there); work that uses none did, under load:
    `benchmarks/launch_stress.py --target rank_only` failed 6 of ~480 launches, and 0 of 1,000 with
    this wait (docs/NOTEBOOK_CI.md)."""
    # torch.distributed only here, in a child that has formed a group: launching starts with no torch loaded
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return  # no group, or the work took its group down itself: nothing to wait for
    if dist.get_backend() == "nccl":  # NCCL's barrier needs the device this rank uses
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def check_num_processes(num_processes: Any) -> None:
    """A whole number of processes this machine can run side by side, or one line with the fix."""
    if not isinstance(num_processes, int) or isinstance(num_processes, bool) or num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r} must be a whole number >= 1; pass e.g. num_processes=2")
    # Each process is a full torch (~300 MB) with its own pipe; measured: 10**6 ran out of file
    # descriptors after creating pipes for a while. More processes than cores only share them.
    most = max(2, 2 * usable_cores())
    if num_processes > most:
        raise ValueError(f"num_processes={num_processes} is more processes than this machine can run side by side "
                         f"({usable_cores()} usable cores); pass num_processes <= {most}")


def check_limits(timeout_s: Any, threads_per_process: Any) -> None:
    """A positive finite timeout (or None) and a thread count within the usable cores (or None)."""
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not 0 < timeout_s < float("inf")):
        raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds or None; pass e.g. timeout_s=600")
    if threads_per_process is not None and (isinstance(threads_per_process, bool) or not isinstance(threads_per_process, int)
                                            or not 1 <= threads_per_process <= max(1, usable_cores())):
        raise ValueError(f"threads_per_process={threads_per_process!r} must be a whole number from 1 to "
                         f"{usable_cores()} (the usable cores) or None; pass e.g. threads_per_process=1")


def start_method(requested: str) -> str:
    """The start method a launch uses: `requested`, or for 'auto' the fork server where this
    process's multiprocessing default forks (Linux), else that default (spawn on macOS, Windows)."""
    if requested not in METHODS:
        raise ValueError(f"start_method={requested!r} is not known; use 'auto', 'fork', 'spawn' or 'forkserver'")
    if requested != "auto":
        return requested
    default = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return "forkserver" if default in ("fork", "forkserver") else default


def context(method: str) -> multiprocessing.context.BaseContext:
    """multiprocessing's context for `method`; for the fork server, one running with PRELOAD
    imported under this process's import-time environment."""
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        with stop_held():  # a server started but not yet recorded would outlive every launch
            _ensure_forkserver(ctx)
    return ctx


@contextlib.contextmanager
def stop_held() -> Iterator[None]:
    """Ctrl-C (Jupyter's Stop) held while a process is started and recorded, then delivered as it
    would have been. A Stop that landed inside `Process.start()` or the fork server's start left a
    process this launch had not recorded, so could not stop: seen once in five clean-clone CI runs
    under a busy core, a process alive 10 s after a Stop pressed 50 ms into a launch."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield  # only the main thread handles signals; SIG_IGN / SIG_DFL are left as they are
        return
    pressed: list[Any] = []
    signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pressed:
            previous(signal.SIGINT, pressed[0])  # Python's handler: KeyboardInterrupt, now the process is known


def _ensure_forkserver(ctx: Any) -> None:
    # POSIX only: the fork server's module is not for Windows
    from multiprocessing import forkserver

    global _server_env
    server = forkserver._forkserver
    wanted = {key: os.environ.get(key) for key in _IMPORT_TIME_ENV}
    if server._forkserver_pid is not None and _server_env is not None and _server_env != wanted:
        server._stop()  # started under other CPU caps: its preloaded torch would keep them
    if server._forkserver_pid is None:
        ctx.set_forkserver_preload(list(PRELOAD))
        _server_env = wanted
    forkserver.ensure_running()


def forkserver_pid() -> int | None:
    """The running fork server's process id (None before the first launch that uses it)."""
    # POSIX only: the fork server's module is not for Windows
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid


def forkserver_threads() -> int | None:
    """Threads of the running fork server (Linux), the process every child is forked from: 1."""
    pid = forkserver_pid()
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/task")) if pid else None
    return None


def _entry(rank: int, env: dict[str, str], siblings: Any, fn: Callable[..., Any], args: tuple,
           launcher: tuple[int, float] | None = None) -> None:
    """First thing in every child: its own process group, a watch on the launching process, the
    launch's environment (a fork server's children start with the server's), the siblings'
    barrier under fork, then `fn`."""
    if hasattr(os, "setpgid"):
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
    if launcher is not None:
        threading.Thread(target=_end_with, args=launcher, name="workbench-launcher-watch", daemon=True).start()
    os.environ.clear()
    os.environ.update(env)
    if siblings is not None:  # fork: nobody connects to the store while a sibling is being forked
        siblings.wait(timeout=120)
    fn(rank, *args)


def _alive(pid: int, began: float) -> bool:
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        return process.create_time() == began and process.status() != psutil.STATUS_ZOMBIE
    return False


def _end_with(pid: int, began: float, every_s: float = 1.0) -> None:
    """End this rank, and its process group, once the process that launched it is gone. A
    launcher killed without its cleanup (a kernel restarted or killed mid-launch) used to leave
    its ranks for good: their own process groups are out of a group kill's reach, their parent
    is the fork server (alive as long as they are), and a rank waiting to connect to the dead
    launcher's store retried for 45+ minutes (seen here, gdb: c10d::TCPStore's connect)."""
    while _alive(pid, began):
        time.sleep(every_s)
    if hasattr(os, "killpg") and os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)  # the group this rank leads: what it started too
    os._exit(1)


def launcher_identity() -> tuple[int, float]:
    """This process as its children watch it: (pid, start time), so a reused pid does not count."""
    return os.getpid(), psutil.Process().create_time()


class Children:
    """The processes of one launch: started one by one (a Stop meanwhile still reaches those
    started), watched for what they start, stopped with it."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.ctx = context(method)
        self.processes: list[Any] = []
        self._seen: dict[int, float] = {}  # the ranks' descendants: pid -> start time
        self._watched_at = 0.0

    def start(self, fn: Callable[..., Any], per_rank: list[tuple], env: dict[str, str]) -> None:
        """Start one child per entry of `per_rank`: `fn(rank, *per_rank[rank])` under `env`."""
        siblings = self.ctx.Barrier(len(per_rank)) if self.method == "fork" else None
        launcher = launcher_identity()
        for rank, args in enumerate(per_rank):
            process = self.ctx.Process(target=_entry, args=(rank, env, siblings, fn, args, launcher), daemon=False,
                                       name=f"workbench-rank-{rank}")
            with stop_held():  # started and recorded, or neither: stop() reaches every child there is
                process.start()
                self.processes.append(process)

    @property
    def exitcodes(self) -> list[int | None]:
        return [process.exitcode for process in self.processes]

    def watch(self, every_s: float = 0.5) -> None:
        """Note the ranks' descendants now (at most every `every_s`): once a rank has ended, what it
        started is no longer found from it."""
        if time.monotonic() - self._watched_at < every_s:
            return
        self._watched_at = time.monotonic()
        for process in self.processes:
            with contextlib.suppress(psutil.Error, ValueError):
                for child in psutil.Process(process.pid).children(recursive=True):
                    self._seen.setdefault(child.pid, child.create_time())

    def adopt(self, started: list[tuple[int, float]]) -> None:
        """Descendants a rank reported itself (pid, start time): one that left its process group
        and outlives the rank is stopped all the same."""
        for pid, began in started:
            self._seen.setdefault(pid, began)

    def stop(self, grace_s: float = 3.0) -> None:
        """Stop every rank, its process group and its descendants: SIGTERM, then SIGKILL after
        `grace_s`. Ranks that ended already get their groups' leftovers stopped."""
        with contextlib.suppress(Exception):
            self._watched_at = 0.0
            self.watch()
        try:
            self._signal(signal.SIGTERM)
            end = time.monotonic() + grace_s
            for process in self.processes:
                process.join(timeout=max(0.0, end - time.monotonic()))
        except KeyboardInterrupt:  # Stop pressed again while stopping: straight to SIGKILL
            pass
        self._signal(getattr(signal, "SIGKILL", signal.SIGTERM))
        for process in self.processes:
            process.join(timeout=5)
        for pid in self.leftovers():
            with contextlib.suppress(OSError):
                os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))

    def _signal(self, sig: int) -> None:
        for process in self.processes:
            if process.pid is None:
                continue
            if hasattr(os, "killpg"):
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, sig)  # the rank's group: what it started too
            if process.exitcode is None:
                with contextlib.suppress(OSError):
                    os.kill(process.pid, sig)
        for pid in self.leftovers():
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    def leftovers(self) -> list[int]:
        """Descendants seen during the launch that still run (the same process: its start time)."""
        return [pid for pid, began in self._seen.items() if _alive(pid, began)]


class ByValue:
    """What a fork server's or a spawned child cannot import, carried as its code and values
    (dill, which `datasets` depends on): a function defined in a notebook, your own model or
    data class from its `__main__`. A fresh process cannot import a notebook's `__main__`; what
    the function uses it imports in its body, or dill carries along (its globals, recurse=True)."""

    def __init__(self, target: Any, args: tuple) -> None:
        blamed = target if isinstance(target, Callable) else None  # type: ignore[arg-type]
        for what, value in (("target", target), ("arguments", args)):
            try:
                code = dill.dumps(value, recurse=True)
            except Exception as error:  # noqa: BLE001: any pickling failure gets the same fix
                error_line = f"{type(error).__name__}: {error}"
                if what == "target" and getattr(blamed, "__module__", None) == "__main__":
                    raise LaunchError(f"{blamed.__qualname__} (defined in the notebook) cannot be sent to a spawned "
                                      f"process ({error_line}); define it in a .py module and import it") from None
                raise LaunchError(f"the launch's {what} cannot be sent to a started process ({error_line}); "
                                  "define what they use in a .py module, or pass start_method='fork' (Linux)") from None
            setattr(self, what, code)

    def load(self) -> tuple[Any, tuple]:
        return dill.loads(self.target), dill.loads(self.arguments)


def own_descendants() -> list[tuple[int, float]]:
    """This process's descendants now, (pid, start time) each: what a rank reports before it ends."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            found.append((child.pid, child.create_time()))
    return found


def describe_exit(rank: int, code: int) -> str:
    """'process 1 was killed by SIGKILL' or 'process 1 exited with status 3'."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"process {rank} was killed by {signal.Signals(-code).name}"
    return f"process {rank} exited with status {code}"
