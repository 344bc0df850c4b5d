"""Metric math and memory readings, kept apart from the loop that uses them.

Throughput math is pure: callers pass explicit times and counts, so tests feed
hand-picked numbers. Memory readers say what they read: on a GPU the CUDA
caching allocator; on CPU the process RSS and its high-water mark (VmHWM), reset
per phase through /proc/self/clear_refs. On a CPU build torch's CUDA counters
return 0 silently, so they are never read there.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import psutil
import torch


@dataclass(frozen=True, slots=True)
class Throughput:
    """Rates over an interval: `steps` optimizer steps in `seconds`.

    Example:
        >>> t = Throughput.over(seconds=2.0, steps=10, samples=640, tokens=None, flops=1e12)
        >>> t.samples_per_sec, t.step_time_s, t.tflops_per_sec
        (320.0, 0.2, 0.5)
    """

    step_time_s: float
    samples_per_sec: float
    tokens_per_sec: float | None
    tflops_per_sec: float | None

    @classmethod
    def over(
        cls, *, seconds: float, steps: int, samples: int, tokens: int | None, flops: float | None
    ) -> Throughput:
        if seconds <= 0 or steps <= 0:
            raise ValueError(f"need a positive interval, got seconds={seconds}, steps={steps}")
        return cls(
            step_time_s=seconds / steps,
            samples_per_sec=samples / seconds,
            tokens_per_sec=None if tokens is None else tokens / seconds,
            tflops_per_sec=None if flops is None else flops / seconds / 1e12,
        )


# The loop keeps its losses since the last log step in this many device-side slots (and three
# running figures) for the whole run: constant memory, so the estimate's replay of a step
# (planner/fakestep.py) finds the same live bytes at every step (core/engine/state.LossWindow).
LOSS_WINDOW_SLOTS = 64


class IntervalMeter:
    """The loop's timing bookkeeping between log steps, and the run's timed totals. Pure:
    the caller passes every clock reading, so tests feed hand-picked numbers.

    Per micro-batch the loop adds what it fetched and how long it waited for it; at each
    log step `close()` returns the interval's rates and, unless the interval is left out
    of the run's timings (the probe step: it runs the exact counters and pays one-off
    warm-up), adds it to the totals `run_rates()` reports. `processes` scales samples and
    tokens to the whole data-parallel group (each process counts only its own shard).

    Example:
        >>> meter = IntervalMeter(start=0.0, first_step=1)
        >>> meter.add(samples=32, tokens=None, wait_s=0.1); meter.add(samples=32, tokens=None, wait_s=0.1)
        >>> meter.close(now=2.0, step=2, flops_per_step=None).samples_per_sec
        32.0
        >>> meter.run_rates(flops_per_step=None).step_time_s, meter.data_wait_fraction()
        (1.0, 0.1)
    """

    def __init__(self, *, start: float, first_step: int, processes: int = 1) -> None:
        self.processes = processes
        self.timed_seconds = 0.0
        self.timed_steps = 0
        self.timed_samples = 0
        self.timed_tokens = 0
        self.timed_wait_s = 0.0
        self.interval_times: list[float] = []
        """Mean step time of each timed interval: shows the spread."""
        self.last_wait_s_per_step = 0.0
        self.restart(now=start, next_step=first_step)

    def restart(self, *, now: float, next_step: int) -> None:
        """Begin a new interval at `now`; `next_step` is its first optimizer step."""
        self._start, self._first_step = now, next_step
        self.samples = self.tokens = 0
        self.wait_s = 0.0

    def elapsed(self, *, now: float) -> float:
        """Seconds since the current interval began (the first step's, before any restart)."""
        return now - self._start

    def add(self, *, samples: int, tokens: int | None, wait_s: float) -> None:
        """One micro-batch: its samples (and tokens, for text), and the wait for it."""
        self.samples += samples
        self.tokens += tokens or 0
        self.wait_s += wait_s

    def close(self, *, now: float, step: int, flops_per_step: int | None, timed: bool = True,
              text: bool = False) -> Throughput:
        """End the interval at log step `step`: its rates; `timed` adds it to the run's totals.
        `last_wait_s_per_step` then holds the interval's mean wait for data per step."""
        steps, seconds = step - self._first_step + 1, now - self._start
        samples, tokens = self.samples * self.processes, self.tokens * self.processes
        rates = Throughput.over(seconds=seconds, steps=steps, samples=samples, tokens=tokens if text else None,
                                flops=(flops_per_step or 0) * steps * self.processes or None)
        self.last_wait_s_per_step = self.wait_s / steps
        if timed:
            self.interval_times.append(rates.step_time_s)
            self.timed_seconds += seconds
            self.timed_steps += steps
            self.timed_samples += samples
            self.timed_tokens += tokens
            self.timed_wait_s += self.wait_s
        self.restart(now=now, next_step=step + 1)
        return rates

    def run_rates(self, *, flops_per_step: int | None, text: bool = False) -> Throughput | None:
        """Rates over every timed step so far (None before the first timed interval)."""
        if self.timed_seconds <= 0 or self.timed_steps <= 0:
            return None
        return Throughput.over(seconds=self.timed_seconds, steps=self.timed_steps, samples=self.timed_samples,
                               tokens=self.timed_tokens if text else None,
                               flops=(flops_per_step or 0) * self.timed_steps * self.processes or None)

    def data_wait_fraction(self) -> float | None:
        """Share of the timed seconds spent waiting for the next batch."""
        return self.timed_wait_s / self.timed_seconds if self.timed_seconds > 0 else None


def mfu(tflops_per_sec: float | None, peak_flops: float | None) -> float | None:
    """Model FLOP utilisation: achieved over peak (None when either is unknown)."""
    if tflops_per_sec is None or not peak_flops:
        return None
    return tflops_per_sec * 1e12 / peak_flops


# The /proc/self/status sizes psutil also reads where there is no /proc (macOS, Windows), by
# memory_info()'s names. VmHWM has none: see cpu_peak().
_PSUTIL_NAMES = {"VmRSS": "rss", "VmSize": "vms", "VmData": "data"}


def status_bytes(field: str) -> int | None:
    """A size from /proc/self/status (Linux) in bytes; without /proc psutil's figure of the same
    name where it has one (VmRSS, VmSize; VmData on Linux only); None otherwise."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    if field not in _PSUTIL_NAMES:
        return None

    return getattr(psutil.Process().memory_info(), _PSUTIL_NAMES[field], None)


def cpu_peak() -> tuple[int | None, str]:
    """This process's resident high-water mark in bytes, and what it is. Linux: VmHWM, which
    MemoryMeter resets per phase. Without /proc the OS's peak since the process started: the peak
    working set (psutil, Windows) or getrusage's maxrss (bytes on macOS, kB elsewhere)."""
    hwm = status_bytes("VmHWM")
    if hwm is not None:
        return hwm, "process VmHWM"

    since_start = "process peak RSS since it started (no /proc/self/status)"
    if (peak := getattr(psutil.Process().memory_info(), "peak_wset", None)) is not None:
        return peak, since_start
    try:
        # not on Windows
        import resource
    except ImportError:
        return None, "process peak: not available here"
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss * (1 if sys.platform == "darwin" else 1024), since_start


class MemoryMeter:
    """Reads live and peak memory of the device a run trains on.

    On CUDA: allocated / reserved / peak allocated of the caching allocator
    (reading these counters does not sync the device). On CPU: process RSS (psutil)
    and VmHWM, the resident high-water mark, which `reset_peak()` resets by writing
    '5' to /proc/self/clear_refs (Linux; elsewhere, or where a container forbids that write, the
    peak is since the process started, and `peak_kind`, which results and views show, says so).
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.on_cuda = self.device.type == "cuda"
        self.kind = "CUDA allocated" if self.on_cuda else "process RSS"
        self.peak_kind = "CUDA allocator peak" if self.on_cuda else cpu_peak()[1]
        self._process = None
        if not self.on_cuda:
            self._process = psutil.Process(os.getpid())

    def reset_peak(self) -> None:
        if self.on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:  # the high-water mark cannot be reset: the one since the process started
            if self.peak_kind == "process VmHWM":
                self.peak_kind = "process VmHWM since it started (/proc/self/clear_refs not writable)"

    def current_bytes(self) -> int:
        if self.on_cuda:
            return torch.cuda.memory_allocated(self.device)
        assert self._process is not None
        return self._process.memory_info().rss

    def peak_bytes(self) -> int | None:
        if self.on_cuda:
            return torch.cuda.max_memory_allocated(self.device)
        return cpu_peak()[0]

    def reserved_bytes(self) -> int | None:
        return torch.cuda.memory_reserved(self.device) if self.on_cuda else None

    def total_bytes(self) -> int | None:
        if self.on_cuda:
            return torch.cuda.get_device_properties(self.device).total_memory

        return psutil.virtual_memory().total
