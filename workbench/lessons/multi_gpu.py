"""Notebook 06: accelerate's `notebook_launcher` as a busy machine needs it, and the checks its cells call.

`notebook_launcher(fn, args, num_processes)` forks this process and returns nothing.
`bounded_launch()` wraps one launch the notebook writes itself: a queue the children report on
(`launch.reporting(fn)`), a free port, and a bound on a hang (the children are stopped and
`LaunchHung` says so; nothing is tried again).

Why a forked child could hang, and what `reporting` does about it: the launcher (torch's elastic
agent, in this process) hosts the rendezvous store, whose server thread does a reverse name lookup
(glibc's resolver) for every process that connects. A child forked while that lookup runs copies
the resolver's lock held, never its release, and waits on it forever in its own connect (seen
once for 14 minutes on the loaded 2-core CI machine). The agent's own connection is looked up
before it forks (its next store request waits behind that lookup on the server's one thread), so
the lookups that can overlap a fork are the children's: `reporting(fn)` makes each child wait until
all its siblings exist before `fn` (and its Accelerator's connect) runs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import psutil
from accelerate.utils import patch_environment

from workbench.core.engine.accelerator import reset_accelerate_state
from workbench.launching.processes import free_port, leave_together  # not launch.py: that imports the loop and the planner

__all__ = ["LaunchHung", "bounded_launch", "check_worlds", "same_curve", "check_same_curve"]


# What torch's elastic agent handles by default (TORCHELASTIC_SIGNALS_TO_HANDLE); SIGHUP and SIGQUIT
# do not exist on Windows.
_ELASTIC_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
                         if hasattr(signal, name))


class LaunchHung(RuntimeError):
    """A notebook_launcher launch that did not finish within its timeout; its children were stopped."""


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _stop_children(keep: set[int]) -> None:
    """Kill this process's children started since `keep` was read (the launch's, not older ones)."""
    for pid in _children() - keep:
        with contextlib.suppress(ProcessLookupError):  # it ended by itself meanwhile
            os.kill(pid, signal.SIGKILL)


class BoundedLaunch:
    """One launch: `with bounded_launch(...) as launch:` around `notebook_launcher(...)` stops its
    children after `timeout_s` and raises `LaunchHung` (the stopped launch's own error is its cause)."""

    def __init__(self, timeout_s: float, num_processes: int) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < float("inf"):
            raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds; pass e.g. timeout_s=60")
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise ValueError(f"num_processes={num_processes!r} must be a whole number >= 1; pass e.g. num_processes=2")
        self.timeout_s, self.num_processes, self.hung = timeout_s, num_processes, False
        fork = multiprocessing.get_context("fork")
        self.returns = fork.SimpleQueue()  # shared with the forked children
        self._all_forked = fork.Barrier(num_processes)
        self.port = str(free_port())  # not accelerate's default 29500: other jobs here may hold it
        self._threads = max(1, (os.cpu_count() or 1) // num_processes)

    def reporting(self, fn: Callable[..., Any]) -> Callable[..., None]:
        """`fn` as each child runs it: once every sibling is forked (so no connection reaches the
        store while the launcher forks), its return value put on the queue."""
        def child(*args: Any) -> None:
            self._all_forked.wait(timeout=self.timeout_s)
            value = fn(*args)
            leave_together()  # a rank gone before its peers formed the group failed theirs
            self.returns.put(value)
        return child

    def collect(self) -> list[Any]:  # what each child returned, in the order they finished
        return [self.returns.get() for _ in range(self.num_processes)]

    def __enter__(self) -> BoundedLaunch:
        # notebook_launcher refuses to start once a cell made an Accelerator (wb.run does);
        # the children make their own.
        reset_accelerate_state(keep_process_group=False)
        self._fired, older = threading.Event(), _children()
        self._timer = threading.Timer(self.timeout_s, lambda: (self._fired.set(), _stop_children(older)))
        self._timer.daemon = True
        self._timer.start()
        # Each CPU child's thread count, said up front: left unset, accelerate's PartialState in
        # every child picks one itself and warns on stderr ("OMP_NUM_THREADS/MKL_NUM_THREADS unset").
        self._env = patch_environment(omp_num_threads=self._threads)
        self._env.__enter__()
        # torch's elastic agent (notebook_launcher's launcher) installs its own SIGTERM, SIGINT, SIGHUP
        # and SIGQUIT handlers in this process and never puts them back: the kernel would then answer
        # its manager's SIGTERM with a SignalException traceback instead of exiting.
        self._handlers = ({s: signal.getsignal(s) for s in _ELASTIC_SIGNALS}
                          if threading.current_thread() is threading.main_thread() else {})
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        self._timer.cancel()
        self._env.__exit__(None, None, None)
        for handled, handler in self._handlers.items():
            if handler is not None:  # None: set outside Python, nothing to put back
                signal.signal(handled, handler)
        self.hung = self._fired.is_set()
        if self.hung:
            raise LaunchHung(f"notebook_launcher did not finish within {self.timeout_s:g} s: its processes were "
                             "stopped; run the cell again, or raise timeout_s on a busy machine") from error


def bounded_launch(*, timeout_s: float = 60.0, num_processes: int = 2) -> BoundedLaunch:
    """One notebook_launcher launch, its hang bounded by `timeout_s` (see BoundedLaunch)."""
    return BoundedLaunch(timeout_s, num_processes)


def check_worlds(worlds: dict[bool, list[tuple[int, int]]], num_processes: int = 2) -> None:
    """Trap 1's launches: Accelerator() alone on a CPU makes worlds of one, cpu=True one world."""
    expected = {True: [(rank, num_processes) for rank in range(num_processes)], False: [(0, 1)] * num_processes}
    if any(worlds[cpu] != expected[cpu] for cpu in worlds):
        raise AssertionError(f"(rank, world size) per process: expected {expected}, got {worlds}")
    print(f"plain Accelerator() on CPU: separate worlds of one; Accelerator(cpu=True): one world of {num_processes}")


def same_curve(a: Any, b: Any, *, rtol: float = 0.01) -> str:
    """'within 1%' when every logged loss of run `a` is within `rtol` of `b`'s, else 'more than 1%'."""
    if a.loss_steps != b.loss_steps:
        raise ValueError(f"the runs logged at other steps: {a.loss_steps} and {b.loss_steps}")
    close = all(abs(x - y) <= rtol * abs(y) for x, y in zip(a.losses, b.losses))
    return f"{'within' if close else 'more than'} {rtol:.0%}"


def check_same_curve(one: Any, two: Any, *, rtol: float = 0.01) -> None:
    """1 process x 2b against 2 processes x b: the same curve within `rtol`, held-out accuracy
    within 0.01, the whole model state in every process."""
    if (two.status, same_curve(two, one, rtol=rtol)) != ("ok", f"within {rtol:.0%}") \
            or abs(two.accuracy - one.accuracy) > 0.01 or two.memory.model_state_bytes != one.memory.model_state_bytes:
        raise AssertionError(f"1 process: {one.losses}, accuracy {one.accuracy}; {two.num_processes} processes "
                             f"({two.status}): {two.losses}, accuracy {two.accuracy}")
    print(f"{len(one.losses)} logged losses: 1 process x {one.config.batch_size} = {two.num_processes} processes x "
          f"{two.config.batch_size} within {rtol:.0%}; model state {one.memory.model_state_bytes:,} bytes in each")
