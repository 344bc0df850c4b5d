"""A computation that takes long says so while it runs: what it is doing, how far it is, how long.

The planner's replays cost from a fraction of a second (a small GPT on 8 ranks) to minutes (a
GPT of width 12,288; FSDP over thousands of ranks), and a cell that sits silent for two
minutes looks hung. `Heartbeat` prints nothing for a quick computation; once one has run
`quiet_s` seconds it prints a line every `every_s` seconds from a background thread (so a line
comes even while one long replay runs): the step in progress, the steps done and left, the
time so far, and, once a step has finished, the time left at the pace so far.

Example:
    >>> with Heartbeat("plan_parallel", total=3) as beat:  # doctest: +SKIP
    ...     for part in ("dp", "fsdp", "tp"):
    ...         beat.now(f"replaying {part} x 8 (rank 0)"); replay(part); beat.done()
    plan_parallel: replaying fsdp x 8 (rank 0): 1 of 3 done, 12 s so far; about 24 s left
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType

__all__ = ["Heartbeat"]


class Heartbeat:
    """Says, every `every_s` seconds after the first `quiet_s`, what `total` steps have come to
    (`total` may be set once known: until then the line says the step and the time so far)."""

    quiet_s = 5.0
    every_s = 10.0

    def __init__(self, what: str, *, total: int | None = None, clock=time.monotonic) -> None:
        self.what, self.total, self.clock = what, total, clock
        self.finished, self.current = 0, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"{what} heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.started = self.clock()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def now(self, step: str) -> None:
        """The step that starts now."""
        self.current = step

    def done(self) -> None:
        """The current step has finished."""
        self.finished += 1

    def line(self) -> str:
        """Where the computation stands, in one line."""
        spent = self.clock() - self.started
        if self.total is None:  # not known yet
            return f"{self.what}: {self.current or 'starting'}: {_seconds(spent)} so far"
        left = f"; about {_seconds(spent / self.finished * (self.total - self.finished))} left" if self.finished else ""
        return (f"{self.what}: {self.current or 'starting'}: {self.finished} of {self.total} done, "
                f"{_seconds(spent)} so far{left}")

    def _beat(self) -> None:
        wait = self.quiet_s
        while not self._stop.wait(wait):
            print(self.line(), file=sys.stdout, flush=True)
            wait = self.every_s


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"
