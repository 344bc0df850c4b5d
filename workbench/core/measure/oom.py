"""Read an out-of-memory message, and write one for a simulated memory budget.

`parse_oom(text)` reads both formats PyTorch's CUDA caching allocator has used:

- before torch 2.1 (the seed article's): "CUDA out of memory. Tried to allocate 2.34 GiB
  (GPU 0; 40.00 GiB total capacity; 32.54 GiB already allocated; 1.25 GiB free; 34.00 GiB
  reserved in total by PyTorch)";
- since (c10/cuda/CUDACachingAllocator.cpp): "CUDA out of memory. Tried to allocate 1.95 GiB.
  GPU 0 has a total capacity of 14.57 GiB of which 1.58 GiB is free. [Process ... has ...
  memory in use.] ... Of the allocated memory 734.07 MiB is allocated by PyTorch, and
  33.93 MiB is reserved by PyTorch but unallocated. ..."

`check_budget(...)` is what `run()` calls after its first step when a config sets
`memory_budget_bytes`: a CPU has no device memory to run out of, so the workbench compares
its exact counts with the budget and raises `torch.OutOfMemoryError` in the current format
(labelled simulated), so the same OOM path runs: status 'oom', memory freed, kernel alive.

Example:
    >>> report = parse_oom("CUDA out of memory. Tried to allocate 2.34 GiB (GPU 0; 40.00 GiB "
    ...                    "total capacity; 32.54 GiB already allocated; 1.25 GiB free; 34.00 GiB reserved)")
    >>> report.total_bytes == 40 * 2**30, round(report.requested_bytes / 2**30, 2)
    (True, 2.34)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from workbench.base.report import Report

__all__ = ["OOMReport", "parse_oom", "parse_size", "format_size", "oom_message", "check_budget",
           "is_out_of_memory", "describe_out_of_memory"]

_UNITS = {"bytes": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
# Every pattern starts where a run of digits or letters starts ((?<!...) look-behinds), so a
# search is linear in the text: measured, the old `(\w+\s+)?out of memory` took 26 s on a
# 40,000-letter string (each start position re-read the whole run). A real message is a few
# KB; parse_oom reads at most _MAX_CHARS of it.
_SIZE = r"((?<![\d.])\d{1,30}(?:\.\d{1,30})?\s{0,4}(?:bytes|[KMGT]i?B|B))"
_FLAGS = re.IGNORECASE | re.DOTALL
_HEAD = re.compile(r"out of memory\.?\s{0,4}Tried to allocate " + _SIZE, _FLAGS)
_MAX_CHARS = 20_000
# torch < 2.1: "(GPU 0; 40.00 GiB total capacity; 32.54 GiB already allocated; 1.25 GiB free; 34.00 GiB reserved ...)"
_OLD = re.compile(r"\((GPU \d{1,6}|\w{1,40} \w{1,40});\s{0,4}" + _SIZE + r" total capacity;\s{0,4}" + _SIZE
                  + r" already allocated;\s{0,4}" + _SIZE + r" free;\s{0,4}(?:" + _SIZE + r" reserved)?", _FLAGS)
# torch >= 2.1: "GPU 0 has a total capacity of 14.57 GiB of which 1.58 GiB is free."
_NEW = re.compile(r"((?:GPU|Device|MLU) \w{1,40}) has a total capac\w{0,10} of " + _SIZE + r" of which " + _SIZE
                  + r"\s{0,4}is free", _FLAGS)
_NEW_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch", _FLAGS)
_NEW_UNALLOCATED = re.compile(r"and " + _SIZE + r" is reserved by PyTorch but unallocated", _FLAGS)


def parse_size(text: str) -> int:
    """'2.34 GiB' -> bytes (binary units as PyTorch prints them; '512 bytes' too)."""
    match = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([A-Za-z]+)\s*", text) if len(text) < 100 else None
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"size {text[:40]!r} is not a size like '2.34 GiB'; "
                         f"use a number (at most 30 digits) and one of bytes, KiB, MiB, GiB, TiB")
    return round(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_size(n: int) -> str:
    """Bytes as PyTorch's allocator prints them (c10 format_size): two decimals, binary units."""
    if n <= 1024:
        return f"{n} bytes"
    for unit, scale in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30)):
        if n <= scale * 1024 or unit == "GiB":
            return f"{n / scale:.2f} {unit}"
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True, repr=False)
class OOMReport(Report):
    """What an out-of-memory message says, in bytes (None where the format omits it)."""

    header = ("", "size")

    requested_bytes: int
    """'Tried to allocate': the allocation that failed."""
    total_bytes: int
    """The device's total capacity."""
    free_bytes: int
    """Free on the device when it failed (all processes)."""
    allocated_bytes: int
    """Held by this process's live tensors (allocated by PyTorch)."""
    reserved_bytes: int | None
    """Held by PyTorch's caching allocator (allocated + cached but unallocated)."""
    device: str
    format: str
    """'torch<2.1' or 'torch>=2.1' (the message layouts differ)."""
    simulated: bool = False
    """True for the workbench's simulated budget (no device really ran out)."""

    @property
    def shortfall_bytes(self) -> int:
        """How much more free memory the failed allocation needed."""
        return max(0, self.requested_bytes - self.free_bytes)

    @property
    def outside_pytorch_bytes(self) -> int | None:
        """Used by neither this process's allocator nor free: CUDA context, other processes."""
        held = self.reserved_bytes if self.reserved_bytes is not None else self.allocated_bytes
        return max(0, self.total_bytes - self.free_bytes - held)

    def caption(self) -> str:
        return f"out of memory ({'simulated budget' if self.simulated else self.format})"

    def rows(self) -> list[tuple[str, str]]:
        """(what, size) pairs, sizes printed as PyTorch prints them."""
        size = lambda n: "n/a" if n is None else format_size(n)  # noqa: E731
        return [("device", self.device), ("total capacity", size(self.total_bytes)),
                ("allocated by PyTorch", size(self.allocated_bytes)),
                ("reserved by PyTorch", size(self.reserved_bytes)),
                ("free", size(self.free_bytes)), ("tried to allocate", size(self.requested_bytes)),
                ("short by", size(self.shortfall_bytes)),
                ("outside PyTorch (context, other processes)", size(self.outside_pytorch_bytes))]


def parse_oom(text: str) -> OOMReport:
    """Read a CUDA (or XPU, or simulated) out-of-memory message into an `OOMReport`.

    Raises ValueError, in one line, when `text` is not such a message.
    """
    if not isinstance(text, str):
        raise ValueError(f"parse_oom needs the error message as text, got {type(text).__name__}; pass str(error)")
    text = text[:_MAX_CHARS]  # a real message is a few KB; bounds the time on anything else
    head = _HEAD.search(text)
    if head is None:
        preview = " ".join(text[:200].split())[:60]
        raise ValueError(f"not an out-of-memory message (no 'out of memory. Tried to allocate <size>'): {preview!r}; "
                         f"pass the text of a torch.OutOfMemoryError")
    requested = parse_size(head.group(1))
    simulated = "simulated" in text.lower()
    if old := _OLD.search(text, head.end()):
        device, total, allocated, free, reserved = old.groups()
        return OOMReport(requested, parse_size(total), parse_size(free), parse_size(allocated),
                         parse_size(reserved) if reserved else None, device, "torch<2.1", simulated)
    new = _NEW.search(text, head.end())
    allocated = _NEW_ALLOCATED.search(text, head.end())
    if new and allocated:
        unallocated = _NEW_UNALLOCATED.search(text, allocated.end())
        alloc_bytes = parse_size(allocated.group(1))
        reserved = alloc_bytes + parse_size(unallocated.group(1)) if unallocated else None
        return OOMReport(requested, parse_size(new.group(2)), parse_size(new.group(3)), alloc_bytes, reserved,
                         new.group(1), "torch>=2.1", simulated)
    raise ValueError("an out-of-memory message without the device figures (total capacity, free, allocated); "
                     "pass the whole message, not only its first line")


def oom_message(*, requested: int, total: int, free: int, allocated: int, reserved: int,
                device: str = "GPU 0", kind: str = "CUDA", note: str = "") -> str:
    """An out-of-memory message in the current PyTorch layout (what `parse_oom` reads back)."""
    return (f"{kind} out of memory. Tried to allocate {format_size(requested)}. {device} has a total capacity of "
            f"{format_size(total)} of which {format_size(free)} is free. {note}Of the allocated memory "
            f"{format_size(allocated)} is allocated by PyTorch, and {format_size(max(0, reserved - allocated))} "
            f"is reserved by PyTorch but unallocated.")


def check_budget(budget_bytes: int, *, model_state_bytes: int, activation_bytes: int) -> None:
    """Raise torch.OutOfMemoryError when a step's exact counts exceed a simulated budget.

    The model state (parameters, gradients, optimizer state) is taken as already allocated,
    and one micro-batch's saved activations as the allocation that fails.

    Example:
        >>> check_budget(10 * 2**20, model_state_bytes=4 * 2**20, activation_bytes=2**20)  # fits: no error
    """
    for name, value in (("budget_bytes", budget_bytes), ("model_state_bytes", model_state_bytes),
                        ("activation_bytes", activation_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "budget_bytes" else 0):
            raise ValueError(f"{name}={value!r} must be a whole number of bytes"
                             f"{' >= 1' if name == 'budget_bytes' else ' >= 0'}; pass e.g. {name}=64 * 2**20")
    if model_state_bytes + activation_bytes <= budget_bytes:
        return
    free = max(0, budget_bytes - model_state_bytes)
    allocated = min(model_state_bytes, budget_bytes)
    note = (f"(Simulated by the workbench: memory_budget_bytes={budget_bytes:,}; the exact counts of this step "
            f"need {model_state_bytes + activation_bytes:,} bytes.) ")
    raise torch.OutOfMemoryError(oom_message(requested=activation_bytes if free else model_state_bytes - allocated
                                             + activation_bytes, total=budget_bytes, free=free, allocated=allocated,
                                             reserved=allocated, device="Device cpu", kind="Simulated CPU", note=note))


# How allocators say they ran out, when they do not raise torch.OutOfMemoryError: c10's CPU
# allocator ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10000000000
# bytes. Error code 12 (Cannot allocate memory)", a RuntimeError), and older CUDA builds.
_CPU_OOM = re.compile(r"can't allocate memory: you tried to allocate (\d{1,30}) bytes")


def is_out_of_memory(error: BaseException) -> bool:
    """True for an allocation that failed: torch.OutOfMemoryError, MemoryError, or the
    RuntimeError c10's CPU allocator raises (measured: a CPU run that runs out gets that)."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(error)[:_MAX_CHARS]
    return isinstance(error, RuntimeError) and (_CPU_OOM.search(text) is not None or "out of memory" in text)


def describe_out_of_memory(error: BaseException) -> str:
    """One line for a RunResult: the allocator's first line, or for the CPU allocator what it
    tried to allocate and what to change.

    Example:
        >>> describe_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
        ...     "can't allocate memory: you tried to allocate 10000000000 bytes. Error code 12"))
        'CPU out of memory. Tried to allocate 9.31 GiB (DefaultCPUAllocator); lower batch_size, seq_len or dims'
    """
    text = str(error)[:_MAX_CHARS]
    if match := _CPU_OOM.search(text):
        # Worded as CUDA's ("... out of memory. Tried to allocate ..."), which tools already read
        # (accelerate's find_executable_batch_size shrinks the batch on " out of memory.").
        return (f"CPU out of memory. Tried to allocate {format_size(int(match.group(1)))} (DefaultCPUAllocator); "
                "lower batch_size, seq_len or dims")
    if isinstance(error, MemoryError):
        return "CPU out of memory. Python could not allocate (MemoryError); lower batch_size, seq_len or dims"
    lines = text.strip().splitlines()
    return lines[0] if lines else type(error).__name__
