"""Timing claims that survive a busy machine: interleaved ratios and a free-core guard.

A CPU timing is only evidence when the code timed had its core to itself. On a 2-core
machine a second busy process (a parallel job, another notebook, CI's load test) takes
turns with it, and a ratio of two timings taken a few seconds apart can then read
anything: notebook 05's int8 speed-up read 1.1x instead of 3x that way. Two remedies, and a
measure of free cores:

* `interleaved_speedup` times the two variants alternately, round after round, and takes
  the median of the per-round ratios: slow drift and bursts of other work hit both sides.
* `core_share` measures the share of a core this process got while a block ran: process
  CPU time over wall time (per torch thread). Below `FREE_SHARE` the core was shared and a
  timing claim is shown, not asserted (`CoreShare.free`).
* `parallel_speedup` measures how much two busy processes gain side by side: whether free
  cores are there at all.

Example:
    >>> with core_share() as share:
    ...     _ = sum(range(10**6))
    >>> 0 < share.share <= 1.5
    True
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psutil

# A block that got at least this share of its core(s) ran on a free one. A pure-Python loop
# alone on a core of the 2-core CI machine reads 0.97-1.00; with a busy process pinned to the
# same core, ~0.5.
FREE_SHARE = 0.8


@dataclass(slots=True)
class CoreShare:
    """Process CPU seconds and wall seconds over a block, and the threads it could use."""

    cpu_s: float = 0.0
    wall_s: float = 0.0
    threads: int = 1

    @property
    def share(self) -> float:
        """CPU time per thread over wall time: 1.0 when every thread had a core to itself."""
        return self.cpu_s / (self.wall_s * self.threads) if self.wall_s > 0 else 0.0

    @property
    def free(self) -> bool:
        """Whether the block ran on free cores (share >= FREE_SHARE)."""
        return self.share >= FREE_SHARE

    def note(self) -> str:
        """One sentence for the notebook: why a timing claim is or is not asserted here."""
        if self.free:
            return f"this process had {self.share:.0%} of its core(s) while measuring: the timing is asserted"
        return (f"this process had only {self.share:.0%} of its core(s) while measuring (other work shares "
                f"the CPU): the timing is shown, not asserted; rerun on a quiet machine")


def _threads() -> int:
    import torch  # lazy: the tour imports this module without torch

    return max(1, torch.get_num_threads())


@contextmanager
def core_share(*, threads: int | None = None) -> Iterator[CoreShare]:
    """Measure the share of a core this process gets while the block runs.

    `threads`: how many threads the block keeps busy (default: torch's thread count). Work
    done in other processes (DataLoader workers, launched children) is not counted: use it
    around single-process compute.
    """
    result = CoreShare(threads=threads or _threads())
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        yield result
    finally:
        result.cpu_s = time.process_time() - cpu0
        result.wall_s = time.perf_counter() - wall0


# Other processes using at most this many cores' worth of CPU during a block left a 2-core
# machine's second core free for this process's own children (DataLoader workers, ranks).
OTHER_WORK_LIMIT = 0.25


@dataclass(slots=True)
class OtherWork:
    """CPU time that processes other than this one and its children used while a block ran."""

    cpu_s: float | None = None
    """Their CPU seconds (None: neither /proc/stat nor psutil could read the machine's)."""
    wall_s: float = 0.0
    own_s: float = 0.0
    """CPU seconds of this process and its finished children over the block (not counted above)."""

    @property
    def cores(self) -> float | None:
        """How many cores they kept busy on average."""
        return None if self.cpu_s is None or self.wall_s <= 0 else self.cpu_s / self.wall_s

    @property
    def quiet(self) -> bool:
        """Nothing else used more than OTHER_WORK_LIMIT cores (unknown counts as quiet)."""
        return self.cores is None or self.cores <= OTHER_WORK_LIMIT

    def __str__(self) -> str:
        if self.cores is None:
            return "other work on the CPU: unknown (no /proc/stat, and psutil could not read it)"
        return f"other processes kept {self.cores:.2f} core(s) busy meanwhile"


def _machine_busy_s() -> float | None:
    """CPU seconds all cores have spent busy since boot (user, nice, system, irq, softirq, steal):
    /proc/stat on Linux, psutil's cpu_times() without it (macOS, Windows; None if it fails too)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()[1:]
    except OSError:
        try:
            times = psutil.cpu_times()
        except Exception:  # noqa: BLE001: psutil's own reading failed: unknown, said so
            return None
        return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal",
                                                          "interrupt", "dpc"))  # the last two: Windows'
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_tree_s() -> float:
    """CPU seconds of this process and of its children that have ended (DataLoader workers,
    launched ranks: they are waited for before a run returns). Windows has no getrusage: psutil's
    figures there count this process only."""
    try:
        # not on Windows
        import resource
    except ImportError:
        times = psutil.Process().cpu_times()
        return times.user + times.system + times.children_user + times.children_system
    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


@contextmanager
def other_work() -> Iterator[OtherWork]:
    """Measure what other processes took of the CPU while the block ran: the machine's busy time
    minus this process tree's. The guard for a claim about this process's own parallelism (workers
    on the second core): a core-share check before and after cannot see a burst in between.

    Children still running when the block ends are counted as other work (a conservative error).
    """
    result = OtherWork()
    busy0, own0, wall0 = _machine_busy_s(), _own_tree_s(), time.perf_counter()
    try:
        yield result
    finally:
        result.wall_s = time.perf_counter() - wall0
        busy1, result.own_s = _machine_busy_s(), _own_tree_s() - own0
        if busy0 is not None and busy1 is not None:
            result.cpu_s = max(0.0, (busy1 - busy0) - result.own_s)


@dataclass(frozen=True, slots=True)
class Speedup:
    """How many times faster `fn` ran than `baseline`, from interleaved rounds."""

    ratio: float
    """Median over rounds of (baseline seconds / fn seconds)."""
    ratios: list[float]
    baseline_s: float
    """Median seconds of one baseline call."""
    seconds: float
    """Median seconds of one `fn` call."""
    core: CoreShare = field(default_factory=CoreShare)
    """The share of a core this process got while measuring: the guard for asserting."""


def interleaved_speedup(baseline: Callable[[], object], fn: Callable[[], object], *, rounds: int = 9,
                        warmup: int = 1) -> Speedup:
    """Time `baseline()` and `fn()` alternately for `rounds` rounds (after `warmup` untimed
    calls of each) and return the median per-round speed-up, with the core share.

    Example:
        >>> s = interleaved_speedup(lambda: sum(range(20000)), lambda: sum(range(2000)), rounds=5)
        >>> s.ratio > 1
        True
    """
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds={rounds} must be >= 1 and warmup={warmup} >= 0")
    for _ in range(warmup):
        baseline()
        fn()
    base_times, times = [], []
    with core_share() as share:
        for i in range(rounds):
            # Alternate which goes first, so neither always runs on a cache the other warmed.
            order = ((baseline, base_times), (fn, times)) if i % 2 == 0 else ((fn, times), (baseline, base_times))
            for call, into in order:
                start = time.perf_counter()
                call()
                into.append(time.perf_counter() - start)
    ratios = [b / t for b, t in zip(base_times, times) if t > 0]
    return Speedup(ratio=statistics.median(ratios), ratios=ratios, baseline_s=statistics.median(base_times),
                   seconds=statistics.median(times), core=share)


@contextmanager
def busy_core(core: int | None = None) -> Iterator[subprocess.Popen]:
    """Keep one CPU core busy with another process while the block runs: a busy machine on
    demand. `core`: which one (default: the last this process may use). CI runs the notebooks
    once more inside it (`pytest --hog`); `benchmarks/notebook_times.py --hog` times them so.

    Example:
        >>> with busy_core() as hog:  # doctest: +SKIP
        ...     result = run(config)
    """
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    target = cores[-1] if core is None else core
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
    try:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(hog.pid, {target})
        yield hog
    finally:
        hog.kill()
        hog.wait()


def _spin(iterations: int, ready: Any) -> None:
    # A child started with spawn (macOS, Windows) imports the module its target lives in: here, so
    # not input_pipelines. This module imports no torch: 0.1 CPU-seconds a child, against 3.3 for
    # input_pipelines' training stack (2-core AVX2-only EPYC), nine children a call.
    ready.wait()  # every process started: the timing leaves out start-up (seconds of imports under spawn)
    total = 0
    for i in range(iterations):  # pure Python: one core, no BLAS threads
        total += i


def parallel_speedup(processes: int = 2, *, iterations: int = 1_000_000, rounds: int = 3) -> float:
    """How much faster `processes` CPU-bound processes finish side by side than one after
    another, measured now: about `processes` on idle cores, about 1 when other work holds
    them. Whether DataLoader workers can help depends on this, not on the core count alone.
    One after another and side by side take turns, `rounds` times; the median of the rounds'
    ratios counts (a burst of other work then hits both sides; one round of each read 2.90 for
    two processes, beyond what two processes can give).

    Example:
        >>> 0.5 < parallel_speedup(2) < 2.5
        True
    """
    # this process's start method (spawn on macOS and Windows), named so as not to fix the default
    context = multiprocessing.get_context(multiprocessing.get_start_method(allow_none=True)
                                          or multiprocessing.get_all_start_methods()[0])

    def timed(count: int) -> float:
        ready = context.Barrier(count + 1)
        workers = [context.Process(target=_spin, args=(iterations, ready)) for _ in range(count)]
        for w in workers:
            w.start()
        ready.wait()
        start = time.perf_counter()
        for w in workers:
            w.join()
        return time.perf_counter() - start

    ratios = []
    for _ in range(rounds):
        one = timed(1)
        ratios.append(processes * one / timed(processes))
    return statistics.median(ratios)
