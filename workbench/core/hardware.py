"""What this machine can do: device, native vs emulated dtypes, peak FLOP/s.

Nothing here runs at import. GPU facts come from `nvidia-smi` in a subprocess
where it exists, so asking for a report does not create a CUDA context in this
process (accelerate's notebook_launcher forks, and CUDA initialised in the parent
breaks the children). The bf16/fp32 matmul ratio is measured once per process
and cached, because a learner's first reduced-precision run on an AVX2-only CPU
is 25-55x slower than fp32 and the workbench should say so before it starts.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass, field

import torch

from workbench.core.precisions import DTYPES, PRECISIONS
from workbench.core.report import Report, format_bytes

# Dense (no sparsity) spec-sheet peaks in TFLOP/s: reference figures from the
# vendors' data sheets, used for MFU. fp32 means plain FP32 (no TF32).
GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
    "H100 SXM": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "fp32": 51.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3},
    "A10": {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2},
    "RTX 4090": {"bf16": 165.0, "fp16": 165.0, "fp32": 82.6},
    "RTX 3090": {"bf16": 71.0, "fp16": 71.0, "fp32": 35.6},
    "V100": {"fp16": 125.0, "fp32": 15.7},
    "T4": {"fp16": 65.0, "fp32": 8.1},
}



@dataclass(frozen=True, slots=True)
class GPUInfo:
    name: str
    memory_total_bytes: int
    compute_capability: tuple[int, int]


@functools.cache
def gpu_info() -> GPUInfo | None:
    """The first visible NVIDIA GPU, read without creating a CUDA context."""
    if not torch.cuda.is_available():  # NVML-based: no context
        return None
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout.splitlines()[0]
            name, mem_mib, cap = (part.strip() for part in out.split(","))
            major, minor = cap.split(".")
            return GPUInfo(name, int(float(mem_mib)) * 2**20, (int(major), int(minor)))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass
    # No nvidia-smi: fall back to torch, which does initialise CUDA here.
    props = torch.cuda.get_device_properties(0)
    return GPUInfo(props.name, props.total_memory, (props.major, props.minor))


@functools.cache
def _proc_cpu_flags() -> frozenset[str]:
    """The instruction-set flags /proc/cpuinfo lists (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags that torch's CPU kernels may use.

    ONEDNN_MAX_CPU_ISA caps what oneDNN (torch's CPU matmul library) uses, e.g. AVX2
    on a CPU that has AVX512-BF16: then bf16 is emulated, whatever /proc/cpuinfo says.
    """
    flags = _proc_cpu_flags()
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap and cap != "ALL" and "AVX512" not in cap and "AMX" not in cap:
        flags = frozenset(f for f in flags if not f.startswith(("avx512", "amx")))
    elif cap and cap != "ALL" and "AMX" not in cap:
        flags = frozenset(f for f in flags if not f.startswith("amx"))
    return flags


# FBGEMM (torch.ao's x86 int8 kernels) picks its own instruction set and ignores
# ONEDNN_MAX_CPU_ISA and ATEN_CPU_CAPABILITY; FBGEMM_ENABLE_INSTRUCTIONS caps it. Measured on a
# 2-core EPYC with AVX512-VNNI, dynamic INT8 Linear over fp32 (one thread, interleaved medians):
# 5.3-7.2x with VNNI, 3.6-4.0x capped to AVX512, 2.1-2.3x capped to AVX2; a real AVX2-only EPYC
# measured 0.5x on MiniLM. So only VNNI makes the int8 speed-up a claim to assert.
_FBGEMM_LEVELS = ("avx2", "avx512", "avx512_vnni")
_FBGEMM_CAPS = {"AVX2": "avx2", "AVX512": "avx512", "AVX512_256": "avx512",
                "AVX512_E1": "avx512_vnni", "AVX512_E1_256": "avx512_vnni"}


@functools.cache
def int8_kernels() -> str:
    """The instructions torch.ao's x86 int8 kernels (FBGEMM) run with on this CPU:
    'avx512_vnni', 'avx512', 'avx2' or 'none', after FBGEMM_ENABLE_INSTRUCTIONS.

    Example:
        >>> int8_kernels() in ("avx512_vnni", "avx512", "avx2", "none")
        True
    """
    flags = _proc_cpu_flags()
    if not {"avx2", "fma"} <= flags:
        return "none"
    level = "avx2"
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        level = "avx512_vnni" if "avx512_vnni" in flags else "avx512"
    cap = _FBGEMM_CAPS.get(os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").strip().upper())
    if cap is not None and _FBGEMM_LEVELS.index(cap) < _FBGEMM_LEVELS.index(level):
        level = cap
    return level


def int8_speedup_expected(device: str) -> bool:
    """Whether dynamic INT8 (torch.ao) should beat fp32 on `device`: on an x86 CPU whose int8
    kernels have VNNI. Elsewhere its speed is measured and shown, not claimed."""
    return device == "cpu" and int8_kernels() == "avx512_vnni"


@functools.cache
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def precision_support(device: str, precision: str) -> str:
    """'native', 'emulated' or 'unsupported' for this device and dtype.

    On CPU, bf16/fp16 matmuls are native only with AVX512-BF16/AMX (fp16: AVX512-FP16
    or AMX-FP16); otherwise oneDNN converts and they run many times slower.
    On CUDA, fp16 needs compute capability >= 5.3 (tensor cores from 7.0) and bf16
    needs >= 8.0 (Ampere).
    """
    if precision == "fp32":
        return "native"
    if device == "cpu":
        flags = cpu_flags()
        if precision == "bf16":
            return "native" if {"avx512_bf16", "amx_bf16"} & flags else "emulated"
        return "native" if {"avx512_fp16", "amx_fp16"} & flags else "emulated"
    info = gpu_info()
    if info is None:
        return "unsupported"
    cap = info.compute_capability
    if precision == "bf16":
        return "native" if cap >= (8, 0) else "unsupported"
    return "native" if cap >= (5, 3) else "unsupported"


def _time_matmul(dtype: torch.dtype, n: int, repeats: int) -> float:
    # A private generator: measuring must not move the global RNG, or the first run
    # in a process (which measures, then caches) would train differently from the next.
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    a @ b  # warm-up: oneDNN picks and caches its kernel on the first call
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def cpu_matmul_slowdown(precision: str, n: int = 256) -> float:
    """Measured time of an n×n matmul in `precision` over fp32 on this CPU (cached).

    Example:
        >>> cpu_matmul_slowdown("bf16") > 1  # on an AVX2-only CPU: about 25-55
        True
    """
    if precision == "fp32":
        return 1.0
    fp32 = _time_matmul(torch.float32, n, 5)
    reduced = _time_matmul(DTYPES[precision], n, 3)
    return reduced / fp32


@functools.cache
def cpu_peak_flops(n: int = 512) -> float:
    """Measured fp32 matmul FLOP/s on this CPU with the current thread count."""
    seconds = _time_matmul(torch.float32, n, 5)
    return 2 * n**3 / seconds


def peak_flops(device: str, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s, where the figure comes from) for MFU."""
    if device == "cpu":
        # Other dtypes: the fp32 peak scaled by their measured matmul speed, which is
        # many times slower where they are emulated and faster where native (AMX, AVX512-BF16).
        peak = cpu_peak_flops()
        if precision != "fp32":
            peak /= cpu_matmul_slowdown(precision)
        return peak, "measured here (matmul in this dtype, current threads)"
    info = gpu_info()
    if info is None:
        return None, "no GPU"
    for key, table in GPU_PEAK_TFLOPS.items():
        if key.lower() in info.name.lower() or key.split()[0].lower() in info.name.lower():
            if precision in table:
                return table[precision] * 1e12, f"{key} spec sheet (dense)"
    return None, f"{info.name} is not in GPU_PEAK_TFLOPS"


def emulation_warning(device: str, precision: str) -> str | None:
    """A sentence for the learner when this device emulates the dtype, else None."""
    if device != "cpu" or precision_support(device, precision) != "emulated":
        return None
    slowdown = cpu_matmul_slowdown(precision)
    missing = "AVX512-BF16/AMX-BF16" if precision == "bf16" else "AVX512-FP16/AMX-FP16"
    return (
        f"{precision} is emulated on this CPU ({cpu_name()}: no {missing}): a {precision} "
        f"matmul measured {slowdown:.0f}x slower than fp32 here, so this run will be slower, "
        f"not faster. Memory effects (activation bytes) still show; speed-ups need a GPU."
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True, slots=True)
class HardwareReport(Report):
    device: str
    device_name: str
    memory_total_bytes: int | None
    cpu_threads: int
    precisions: dict[str, str]
    """precision -> 'native' | 'emulated' | 'unsupported' on this device."""
    matmul_slowdown_vs_fp32: dict[str, float]
    """Measured on CPU only: reduced-precision matmul time / fp32 time."""
    peak_tflops: dict[str, float | None]
    peak_source: str
    versions: dict[str, str] = field(default_factory=dict)
    int8_kernels: str = ""
    """CPU only: what torch.ao's int8 kernels run with ('avx512_vnni', 'avx512', 'avx2', 'none')."""

    def caption(self) -> str:
        return "This machine"

    def rows(self) -> list[tuple[str, str]]:
        rows = [
            ("device", f"{self.device}: {self.device_name}"),
            ("memory", format_bytes(self.memory_total_bytes)),
            ("CPU threads (torch)", str(self.cpu_threads)),
        ]
        for precision, support in self.precisions.items():
            slowdown = self.matmul_slowdown_vs_fp32.get(precision)
            note = f" ({slowdown:.0f}x slower than fp32, measured)" if slowdown and slowdown > 1.5 else ""
            rows.append((f"{precision}", support + note))
        for precision, peak in self.peak_tflops.items():
            rows.append((f"peak {precision}", "n/a" if peak is None else f"{peak:.3g} TFLOP/s"))
        rows.append(("peak source", self.peak_source))
        if self.int8_kernels:
            vnni = self.int8_kernels == "avx512_vnni"
            rows.append(("int8 (torch.ao, FBGEMM)", f"{self.int8_kernels}: " + (
                "VNNI, dynamic INT8 faster than fp32" if vnni else "no VNNI, INT8 speed measured, not assumed")))
        rows.extend((name, version) for name, version in self.versions.items())
        return rows


def hardware_report(device: str = "auto") -> HardwareReport:
    """Describe this machine for training: measured where it can be.

    Example:
        >>> report = hardware_report("cpu")
        >>> report.precisions["fp32"]
        'native'
    """
    import psutil

    device = resolve_device(device)
    precisions = {p: precision_support(device, p) for p in PRECISIONS}
    slowdown = {}
    if device == "cpu":
        slowdown = {p: cpu_matmul_slowdown(p) for p in ("bf16", "fp16")}
        name, memory = cpu_name(), psutil.virtual_memory().total
    else:
        info = gpu_info()
        assert info is not None
        name, memory = info.name, info.memory_total_bytes
    peaks, source = {}, ""
    for p in PRECISIONS:
        value, source_p = (None, "") if precisions[p] == "unsupported" else peak_flops(device, p)
        peaks[p] = None if value is None else value / 1e12
        source = source or source_p
    versions = {
        "python": platform.python_version(),
        **{pkg: _version(pkg) for pkg in ("torch", "accelerate", "datasets", "transformers")},
    }
    return HardwareReport(
        device=device, device_name=name, memory_total_bytes=memory,
        cpu_threads=torch.get_num_threads(), precisions=precisions,
        matmul_slowdown_vs_fp32=slowdown, peak_tflops=peaks, peak_source=source,
        versions=versions, int8_kernels=int8_kernels() if device == "cpu" else "",
    )
