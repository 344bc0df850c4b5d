"""Metric math and memory readings, kept apart from the loop that uses them.

Throughput math is pure: callers pass explicit times and counts, so tests feed
hand-picked numbers. Memory readers say what they read: on a GPU the CUDA
caching allocator; on CPU the process RSS and its high-water mark (VmHWM), reset
per phase through /proc/self/clear_refs. On a CPU build torch's CUDA counters
return 0 silently, so they are never read there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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


def mfu(tflops_per_sec: float | None, peak_flops: float | None) -> float | None:
    """Model FLOP utilisation: achieved over peak (None when either is unknown)."""
    if tflops_per_sec is None or not peak_flops:
        return None
    return tflops_per_sec * 1e12 / peak_flops


def _proc_status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


class MemoryMeter:
    """Reads live and peak memory of the device a run trains on.

    On CUDA: allocated / reserved / peak allocated of the caching allocator
    (reading these counters does not sync the device). On CPU: process RSS (psutil)
    and VmHWM, the resident high-water mark, which `reset_peak()` resets by writing
    '5' to /proc/self/clear_refs (Linux; elsewhere the peak is since process start
    and `peak_is_per_phase` says so).
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.on_cuda = self.device.type == "cuda"
        self.kind = "CUDA allocated" if self.on_cuda else "process RSS"
        self.peak_is_per_phase = self.on_cuda
        self._process = None
        if not self.on_cuda:
            import psutil

            self._process = psutil.Process(os.getpid())

    def reset_peak(self) -> None:
        if self.on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.peak_is_per_phase = True
        except OSError:
            self.peak_is_per_phase = False

    def current_bytes(self) -> int:
        if self.on_cuda:
            return torch.cuda.memory_allocated(self.device)
        assert self._process is not None
        return self._process.memory_info().rss

    def peak_bytes(self) -> int | None:
        if self.on_cuda:
            return torch.cuda.max_memory_allocated(self.device)
        return _proc_status_bytes("VmHWM")

    def reserved_bytes(self) -> int | None:
        return torch.cuda.memory_reserved(self.device) if self.on_cuda else None

    def total_bytes(self) -> int | None:
        if self.on_cuda:
            return torch.cuda.get_device_properties(self.device).total_memory
        import psutil

        return psutil.virtual_memory().total
