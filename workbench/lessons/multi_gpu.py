"""Notebook 06: accelerate's `notebook_launcher` as a busy machine needs it, and the checks its cells call.

`notebook_launcher(fn, args, num_processes)` forks this process and returns nothing.
`launch_attempts()` yields tries of a launch the notebook writes itself, each with a queue the
children report on (`attempt.reporting(fn)`), a free port and a bound on a hang. The hang is real:
on the 2-core CI machine under load a forked child sat 14 minutes in glibc's resolver lock (reached
from torch's TCPStore connect), held by another thread of the parent at the instant of the fork: a
fork copies the lock, never its release. `notebook_launch(fn, *args)` is that loop in one call.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


__all__ = ["LaunchHung", "launch_attempts", "notebook_launch", "check_worlds", "same_curve", "check_same_curve"]


class LaunchHung(RuntimeError):
    """Every try of a notebook_launcher launch hung past its timeout."""


def _children() -> set[int]:
    import psutil
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _stop_children(keep: set[int]) -> None:
    """Kill this process's children started since `keep` was read (the launch's, not older ones)."""
    for pid in _children() - keep:
        with contextlib.suppress(ProcessLookupError):  # it ended by itself meanwhile
            os.kill(pid, signal.SIGKILL)


class Attempt:
    """One try of a launch: `with attempt:` around `notebook_launcher(...)` stops its children
    after `timeout_s` and marks it hung (the exception the stopped launch raises is swallowed)."""

    def __init__(self, timeout_s: float, num_processes: int) -> None:
        from workbench.engine.launch import free_port
        self.timeout_s, self.hung = timeout_s, False
        self.returns = multiprocessing.get_context("fork").SimpleQueue()  # shared with the forked children
        self.port = str(free_port())  # not accelerate's default 29500: other jobs here may hold it
        self._threads = max(1, (os.cpu_count() or 1) // num_processes)

    def reporting(self, fn: Callable[..., Any]) -> Callable[..., None]:  # fn, its return value put on the queue
        def child(*args: Any) -> None:
            self.returns.put(fn(*args))
        return child

    def collect(self, num_processes: int) -> list[Any]:  # what each child returned, in the order they finished
        return [self.returns.get() for _ in range(num_processes)]

    def __enter__(self) -> Attempt:
        from accelerate.utils import patch_environment

        self._fired, older = threading.Event(), _children()
        self._timer = threading.Timer(self.timeout_s, lambda: (self._fired.set(), _stop_children(older)))
        self._timer.daemon = True
        self._timer.start()
        # Each CPU child's thread count, said up front: left unset, accelerate's PartialState in
        # every child picks one itself and warns on stderr ("OMP_NUM_THREADS/MKL_NUM_THREADS unset").
        self._env = patch_environment(omp_num_threads=self._threads)
        self._env.__enter__()
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> bool:
        self._timer.cancel()
        self._env.__exit__(None, None, None)
        self.hung = self._fired.is_set()
        return self.hung


def launch_attempts(*, timeout_s: float = 60.0, retries: int = 1, num_processes: int = 2) -> Iterator[Attempt]:
    """Tries of a launch, until one does not hang (at most `retries` + 1); raises LaunchHung
    when every one did. Forgets this process's accelerate state first: notebook_launcher refuses
    to start once a cell made an Accelerator (wb.run does), and the children make their own."""
    from workbench.engine.accelerator import reset_accelerate_state

    reset_accelerate_state(keep_process_group=False)
    for number in range(retries + 1):
        attempt = Attempt(timeout_s, num_processes)
        yield attempt
        if not attempt.hung:
            return
        print(f"launch {number + 1} hung for {timeout_s:g} s (pid {os.getpid()}'s children stopped)"
              + ("; trying again" if number < retries else ""), flush=True)
    raise LaunchHung(f"notebook_launcher hung {retries + 1} times for {timeout_s:g} s each")


def notebook_launch(fn: Callable[..., Any], *args: Any, num_processes: int = 2, timeout_s: float = 60.0,
                    retries: int = 1) -> list[Any]:
    """Run `fn(*args)` in `num_processes` processes with accelerate's `notebook_launcher` (fork)
    and return what each returned, in the order they finished; a hung launch is stopped after
    `timeout_s` and tried again, up to `retries` more times."""
    from accelerate import notebook_launcher

    for attempt in launch_attempts(timeout_s=timeout_s, retries=retries, num_processes=num_processes):
        with attempt:
            notebook_launcher(attempt.reporting(fn), args=args, num_processes=num_processes, use_port=attempt.port)
    return attempt.collect(num_processes)


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
