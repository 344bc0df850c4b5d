"""accelerate's `notebook_launcher`, as notebook 06 shows it, with what a busy machine needs.

`notebook_launcher(fn, args, num_processes)` forks the notebook's process and returns nothing, and
refuses to start once any cell made an Accelerator (wb.run does); `notebook_launch(fn, *args)`
collects each process's return value, forgets this process's accelerate state first (it needs
none: the children make their own), and bounds a hang. The hang
is real: on the 2-core CI machine under load, a forked child sat for 14 minutes in glibc's
resolver lock (`getnameinfo`, reached from torch's TCPStore connect), which another thread of
the parent held at the instant of the fork. A fork copies the lock, never its release. So after
`timeout_s` the children are stopped, and the launch is tried again (`retries`).

Example:
    >>> def world():  # doctest: +SKIP
    ...     from accelerate import PartialState
    ...     return PartialState().num_processes
    >>> notebook_launch(world, num_processes=2)  # doctest: +SKIP
    [2, 2]
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from typing import Any


__all__ = ["LaunchHung", "notebook_launch"]


class LaunchHung(RuntimeError):
    """Every try of a notebook_launcher launch hung past its timeout."""


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _stop_children(keep: set[int]) -> None:
    """Kill this process's children started since `keep` was read (the launch's, not older ones)."""
    for pid in _children() - keep:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def notebook_launch(fn: Callable[..., Any], *args: Any, num_processes: int = 2, timeout_s: float = 60.0,
                    retries: int = 1) -> list[Any]:
    """Run `fn(*args)` in `num_processes` processes with accelerate's `notebook_launcher` (fork)
    and return what each returned, in the order they finished. A launch still running after
    `timeout_s` has its processes stopped and is tried again, up to `retries` more times."""
    from accelerate import notebook_launcher

    from workbench.engine.accelerator import reset_accelerate_state
    from workbench.engine.launch import free_port

    reset_accelerate_state(keep_process_group=False)

    for attempt in range(retries + 1):
        queue = multiprocessing.get_context("fork").SimpleQueue()

        def child(*child_args: Any) -> None:
            queue.put(fn(*child_args))

        fired, older = threading.Event(), _children()
        timer = threading.Timer(timeout_s, lambda: (fired.set(), _stop_children(older)))
        timer.daemon = True
        timer.start()
        try:
            notebook_launcher(child, args=args, num_processes=num_processes, use_port=str(free_port()))
        except Exception:
            if not fired.is_set():
                raise
        finally:
            timer.cancel()
        if not fired.is_set():
            return [queue.get() for _ in range(num_processes)]
        print(f"launch {attempt + 1} hung for {timeout_s:g} s (pid {os.getpid()}'s children stopped)"
              + ("; trying again" if attempt < retries else ""), flush=True)
    raise LaunchHung(f"notebook_launcher hung {retries + 1} times for {timeout_s:g} s each")
