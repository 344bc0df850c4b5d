"""What kind of machine a result came from, as plain values a room can pool: no name, no host.

The class is what the teacher groups by: the instruction set torch's matmuls (oneDNN) run with on a
CPU, after the caps a learner can set (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY: how one machine
stands in for an AVX2 laptop), or the GPU's name. The other fields say why a result in a class
differs: threads, emulated dtypes, VNNI, memory.
"""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from workbench.machine import hardware
from workbench.machine.cpu_class import CAP_VARIABLES, CPU_CLASS_ENV_VAR

# Highest first: the first flag this process may use names its oneDNN level.
_ONEDNN_LEVELS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX512"), ("avx2", "AVX2"))
_FLAGS_SHOWN = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")

# The switches that make one CPU behave as a lesser one (oneDNN, ATen, FBGEMM: torch's int8 kernels)


def cpu_level(flags: frozenset[str], machine: str = "x86_64") -> str:
    """The instruction set oneDNN's matmuls may use, from the capped flags ('Arm' on an Arm CPU).

    Example:
        >>> cpu_level(frozenset({"avx2", "avx512f", "avx512_bf16"})), cpu_level(frozenset({"sse4_2"}))
        ('AVX512-BF16', 'below AVX2')
        >>> cpu_level(frozenset({"asimd", "sve"}), "aarch64")
        'Arm SVE'
    """
    if machine.lower() in ("arm64", "aarch64"):
        return "Arm SVE" if "sve" in flags else "Arm"
    return next((level for flag, level in _ONEDNN_LEVELS if flag in flags), "below AVX2")


def aten_level() -> str:
    """What ATen's own vector kernels run with ('AVX512', 'AVX2', 'DEFAULT', ...): torch reads
    ATEN_CPU_CAPABILITY, so this is the capped level, not the CPU's."""
    return torch.backends.cpu.get_cpu_capability()


def hardware_class(fp: dict[str, Any]) -> str:
    """The group a fingerprint belongs to: 'GPU <name>', or 'CPU <oneDNN level>' with ATen's level
    when it is lower (ATEN_CPU_CAPABILITY capped alone).

    Example:
        >>> hardware_class({"device": "cpu", "isa": "AVX512-BF16", "aten": "AVX2"})
        'CPU AVX512-BF16 (ATen AVX2)'
        >>> hardware_class({"device": "cpu", "isa": "AVX2", "aten": "AVX2"})
        'CPU AVX2'
    """
    if fp["device"] == "cuda":
        return f"GPU {fp['gpu']}"
    isa, aten = fp["isa"], fp["aten"]
    same = isa.startswith("Arm") or isa.split("-")[0] == aten or (isa == "AMX" and aten == "AVX512")  # AMX CPUs run ATen at AVX512
    return f"CPU {isa}" if same else f"CPU {isa} (ATen {aten})"


def fingerprint(device: str = "auto") -> dict[str, Any]:
    """This process's hardware as a room sees it (caps honoured). Reads no GPU through torch
    (nvidia-smi in a subprocess: no CUDA context).

    Example:
        >>> fp = fingerprint("cpu")
        >>> sorted(fp)[:4], fp["device"]
        (['aten', 'bf16', 'caps', 'class'], 'cpu')
    """
    device = hardware.resolve_device(device)
    flags = hardware.cpu_flags()
    gpu = hardware.gpu_info() if device == "cuda" else None
    fp = {
        "device": device,
        "cpu": hardware.cpu_name(),
        "isa": cpu_level(flags, platform.machine()),
        "aten": aten_level(),
        "flags": [f for f in _FLAGS_SHOWN if f in flags],
        # with a class presented for a test (cpu_class): its flags are not this CPU's, and the fingerprint says so
        "caps": {k: os.environ[k] for k in (*CAP_VARIABLES, CPU_CLASS_ENV_VAR) if os.environ.get(k)},
        "bf16": hardware.precision_support(device, "bf16"),
        "fp16": hardware.precision_support(device, "fp16"),
        "int8_kernels": hardware.int8_kernels(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "gpu": gpu.name if gpu else None,
        "gpu_memory_bytes": gpu.memory_total_bytes if gpu else None,
    }
    fp["class"] = hardware_class(fp)
    return fp
