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
import sys
import time
from dataclasses import dataclass, field

import psutil
import torch

from workbench.base.arguments import checked_device
from workbench.base.precisions import DTYPES, PRECISIONS
from workbench.base.report import Report, format_bytes
from workbench.machine import environment

# The CPU's class (flags, caps, int8 kernels) lives in cpu_class; its names are re-exported here,
# where the lessons, the fingerprint and the preflight have always asked for them.
from workbench.machine.cpu_class import cpu_flags, int8_kernels, int8_speedup_expected, presented_note  # noqa: F401


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """A GPU's data-sheet figures: dense peaks (no structured sparsity) and memory bandwidth."""

    tflops: dict[str, float]
    """precision -> dense peak TFLOP/s: 'fp32' plain FP32 (no tensor cores), 'tf32' fp32
    matmuls on TF32 tensor cores, 'bf16'/'fp16' tensor cores with fp32 accumulation (what
    PyTorch's autocast matmuls use). A precision the card lacks is absent."""
    memory_bandwidth: float
    """Bytes per second."""
    compute_capability: tuple[int, int]
    source: str


def _spec(fp32: float, tf32: float | None, half: float | None, bw_gbs: float, cc: tuple[int, int], source: str,
          *, bf16: bool = True) -> GPUSpec:
    tflops = {"fp32": fp32, **({"tf32": tf32} if tf32 else {}), **({"fp16": half} if half else {}),
              **({"bf16": half} if half and bf16 else {})}
    return GPUSpec(tflops, bw_gbs * 1e9, cc, source)


# Data-sheet figures. Where a sheet gives only "with sparsity" figures (marked *), the dense
# peak is half of it; where it gives both (dense | sparse*), the dense one is taken.
GPU_SPECS: dict[str, GPUSpec] = {
    "H100 SXM": _spec(67, 494.5, 989.5, 3350, (9, 0), "NVIDIA H100 data sheet (SXM5): FP32 67, TF32 989*, BF16/FP16 1,979*, 3.35 TB/s"),
    "H100 PCIe": _spec(51, 378, 756.5, 2000, (9, 0), "NVIDIA H100 data sheet (PCIe): FP32 51, TF32 756*, BF16/FP16 1,513*, 2 TB/s"),
    "H100 NVL": _spec(60, 417.5, 835.5, 3900, (9, 0), "NVIDIA H100 data sheet (NVL): FP32 60, TF32 835*, BF16/FP16 1,671*, 3.9 TB/s"),
    "H200": _spec(67, 494.5, 989.5, 4800, (9, 0), "NVIDIA H200 data sheet (SXM): FP32 67, TF32 989*, BF16/FP16 1,979*, 4.8 TB/s"),
    "H200 NVL": _spec(60, 417.5, 835.5, 4800, (9, 0), "NVIDIA H200 data sheet (NVL): FP32 60, TF32 835*, BF16/FP16 1,671*, 4.8 TB/s"),
    "A100 SXM4 40GB": _spec(19.5, 156, 312, 1555, (8, 0), "NVIDIA A100 data sheet: FP32 19.5, TF32 156 | 312*, BF16/FP16 312 | 624*, 1,555 GB/s"),
    "A100 SXM4 80GB": _spec(19.5, 156, 312, 2039, (8, 0), "NVIDIA A100 data sheet: FP32 19.5, TF32 156 | 312*, BF16/FP16 312 | 624*, 2,039 GB/s"),
    "A100 PCIe 40GB": _spec(19.5, 156, 312, 1555, (8, 0), "NVIDIA A100 data sheet: FP32 19.5, TF32 156 | 312*, BF16/FP16 312 | 624*, 1,555 GB/s"),
    "A100 PCIe 80GB": _spec(19.5, 156, 312, 1935, (8, 0), "NVIDIA A100 data sheet: FP32 19.5, TF32 156 | 312*, BF16/FP16 312 | 624*, 1,935 GB/s"),
    "A40": _spec(37.4, 74.8, 149.7, 696, (8, 6), "NVIDIA A40 data sheet: FP32 37.4, TF32 74.8 | 149.6*, BF16/FP16 149.7 | 299.4*, 696 GB/s"),
    "A30": _spec(10.3, 82, 165, 933, (8, 0), "NVIDIA A30 data sheet: FP32 10.3, TF32 82 | 165*, BF16/FP16 165 | 330*, 933 GB/s"),
    "A10": _spec(31.2, 62.5, 125, 600, (8, 6), "NVIDIA A10 data sheet: FP32 31.2, TF32 62.5 | 125*, BF16/FP16 125 | 250*, 600 GB/s"),
    "L4": _spec(30.3, 60, 121, 300, (8, 9), "NVIDIA L4 data sheet: FP32 30.3, TF32 120*, BF16/FP16 242*, 300 GB/s"),
    "L40": _spec(90.5, 90.5, 181.05, 864, (8, 9), "NVIDIA L40 data sheet: FP32 90.5, TF32 90.5 | 181*, BF16/FP16 181.05 | 362.1*, 864 GB/s"),
    "L40S": _spec(91.6, 183, 362.05, 864, (8, 9), "NVIDIA L40S data sheet: FP32 91.6, TF32 183 | 366*, BF16/FP16 362.05 | 733*, 864 GB/s"),
    "T4": _spec(8.1, None, 65, 320, (7, 5), "NVIDIA T4 data sheet: FP32 8.1, FP16 mixed precision 65, 320 GB/s (no BF16, no TF32)", bf16=False),
    "V100 SXM2": _spec(15.7, None, 125, 900, (7, 0), "NVIDIA V100 data sheet (SXM2): FP32 15.7, Tensor 125, 900 GB/s (no BF16, no TF32)", bf16=False),
    "V100 PCIe": _spec(14, None, 112, 900, (7, 0), "NVIDIA V100 data sheet (PCIe): FP32 14, Tensor 112, 900 GB/s (no BF16, no TF32)", bf16=False),
    "V100S PCIe": _spec(16.4, None, 130, 1134, (7, 0), "NVIDIA V100S data sheet: FP32 16.4, Tensor 130, 1,134 GB/s (no BF16, no TF32)", bf16=False),
    "RTX 3090": _spec(35.6, 35.6, 71, 936, (8, 6), "NVIDIA Ampere GA102 whitepaper (RTX 3090): FP32 35.6, TF32 35.6/71*, FP16/BF16 with FP32 accumulate 71/142*, 936 GB/s"),
    "RTX 4090": _spec(82.6, 82.6, 165.2, 1008, (8, 9), "NVIDIA Ada Lovelace whitepaper (RTX 4090): FP32 82.6, TF32 82.6/165.2*, FP16/BF16 with FP32 accumulate 165.2/330.4*, 1,008 GB/s"),
}
"""Spec key -> figures. Not here (so reported as unknown, not guessed): cards without a data
sheet of their own, such as AWS's A10G (an A10 variant whose tensor throughput differs)."""

GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {key: spec.tflops for key, spec in GPU_SPECS.items()}

# The names nvidia-smi and torch.cuda.get_device_name() report, matched exactly (case and
# spacing aside): "NVIDIA H100 PCIe" must not get the SXM figure, "NVIDIA L40" not the L4's.
GPU_NAMES: dict[str, str] = {
    "NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 SXM5 80GB": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL", "NVIDIA H200": "H200", "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA A100-SXM4-40GB": "A100 SXM4 40GB", "NVIDIA A100-SXM4-80GB": "A100 SXM4 80GB",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe 40GB", "NVIDIA A100 80GB PCIe": "A100 PCIe 80GB",
    "NVIDIA A40": "A40", "NVIDIA A30": "A30", "NVIDIA A10": "A10", "NVIDIA L4": "L4", "NVIDIA L40": "L40",
    "NVIDIA L40S": "L40S", "Tesla T4": "T4", "Tesla V100-SXM2-16GB": "V100 SXM2", "Tesla V100-SXM2-32GB": "V100 SXM2",
    "Tesla V100-PCIE-16GB": "V100 PCIe", "Tesla V100-PCIE-32GB": "V100 PCIe", "Tesla V100S-PCIE-32GB": "V100S PCIe",
    "NVIDIA GeForce RTX 3090": "RTX 3090", "NVIDIA GeForce RTX 4090": "RTX 4090",
}


def _normal(name: str) -> str:
    return " ".join(name.split()).casefold()


def gpu_spec_key(name: str) -> str | None:
    """The GPU_SPECS key for a reported device name, or a spec key itself; None if unknown.

    Example:
        >>> gpu_spec_key("NVIDIA H100 PCIe"), gpu_spec_key("NVIDIA L40"), gpu_spec_key("NVIDIA A10G")
        ('H100 PCIe', 'L40', None)
    """
    wanted = _normal(name)
    for key in GPU_SPECS:
        if _normal(key) == wanted:
            return key
    return next((key for reported, key in GPU_NAMES.items() if _normal(reported) == wanted), None)


def tf32_enabled() -> bool:
    """Whether fp32 matmuls may use TF32 tensor cores (torch's default: no, 'highest')."""
    return torch.get_float32_matmul_precision() != "highest"


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


GPU_MEMORY_ENV_VAR = "WORKBENCH_GPU_MEMORY_GIB"
MOST_GPU_GIB = 65536
"""A card of more GiB than this (64 TiB) is a typo: the largest sold hold under 300 GB."""


@functools.cache
def _smi_memory_bytes() -> int | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.split()
        return min(int(float(mib)) for mib in out) * 2**20 if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def gpu_memory_bytes() -> tuple[int | None, str]:
    """(total memory of this machine's smallest NVIDIA GPU in bytes, where it was read), or
    (None, why not): $WORKBENCH_GPU_MEMORY_GIB, else nvidia-smi in a subprocess (cached). Never
    torch: asking torch for a card's memory creates a CUDA context, which breaks a forking launcher.

    Example:
        >>> import os; os.environ["WORKBENCH_GPU_MEMORY_GIB"] = "15"
        >>> gpu_memory_bytes()
        (16106127360, '$WORKBENCH_GPU_MEMORY_GIB')
        >>> del os.environ["WORKBENCH_GPU_MEMORY_GIB"]
    """
    gib = environment.decimal(GPU_MEMORY_ENV_VAR, least=2**-10, most=MOST_GPU_GIB,
                              must=f"must be the card's memory in GiB (digits 0-9, up to {MOST_GPU_GIB:,}), e.g. 15 "
                                   "for a 16 GB T4", fix="unset it to read nvidia-smi")
    if gib is not None:
        return int(gib * 2**30), f"${GPU_MEMORY_ENV_VAR}"
    total = _smi_memory_bytes()
    return (total, "nvidia-smi") if total else (None, f"no nvidia-smi answer; set {GPU_MEMORY_ENV_VAR}")


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


AMPERE = (8, 0)
"""The compute capability bf16 and TF32 tensor cores need. torch.cuda.is_bf16_supported() says
True on some older cards (a T4, 7.5; a V100, 7.0), where bf16 is emulated, so the capability decides."""


def precision_support(device: str, precision: str) -> str:
    """'native', 'emulated' or 'unsupported' for this device and format ('fp32', 'fp16', 'bf16',
    or 'tf32': fp32 matmuls on TF32 tensor cores).

    On CPU, bf16/fp16 matmuls are native only with AVX512-BF16/AMX (fp16: AVX512-FP16
    or AMX-FP16); otherwise oneDNN converts and they run many times slower. A CPU has no TF32.
    On CUDA, fp16 needs compute capability >= 5.3 (tensor cores from 7.0); bf16 and TF32
    need >= 8.0 (Ampere).
    """
    if precision == "fp32":
        return "native"
    if precision == "tf32" and device != "cuda":
        return "unsupported"
    if device == "cpu":
        flags = cpu_flags()
        if precision == "bf16":
            return "native" if {"avx512_bf16", "amx_bf16"} & flags else "emulated"
        return "native" if {"avx512_fp16", "amx_fp16"} & flags else "emulated"
    info = gpu_info()
    if info is None:
        return "unsupported"
    cap = info.compute_capability
    if precision in ("bf16", "tf32"):
        return "native" if cap >= AMPERE else "unsupported"
    return "native" if cap >= (5, 3) else "unsupported"


def missing_here(device: str, precision: str) -> str | None:
    """Why `device` cannot run `precision` (see precision_support), in one clause; None where it can.

    Example:
        >>> missing_here("cpu", "tf32")
        'a CPU has no TF32'
        >>> missing_here("cuda", "bf16")  # on a T4  # doctest: +SKIP
        'this card (Tesla T4, compute capability 7.5) has no bf16'
    """
    if precision_support(device, precision) != "unsupported":
        return None
    shown = "TF32" if precision == "tf32" else precision
    if device != "cuda":
        return f"a {device.upper()} has no {shown}"
    info = gpu_info()
    if info is None:
        return "no CUDA GPU is visible"
    return f"this card ({info.name}, compute capability {info.compute_capability[0]}.{info.compute_capability[1]}) has no {shown}"


# What a lesson runs instead where the card lacks a format: fp16 keeps the 16-bit memory and the
# tensor cores of a pre-Ampere card (a T4's 65 TFLOP/s), only with a GradScaler.
STAND_INS = {"bf16": "fp16", "fp16": "fp32"}


def precision_here(precision: str, device: str = "auto") -> str:
    """`precision` where this device runs it (natively or emulated); where it cannot, its stand-in
    (bf16 -> fp16 on a CUDA card below compute capability 8.0), printing one line why.

    Example:
        >>> precision_here("bf16", "cpu")  # a CPU runs bf16, emulated where it lacks AVX512-BF16
        'bf16'
    """
    device = resolve_device(device)
    why = missing_here(device, precision)
    if why is None:
        return precision
    instead = STAND_INS[precision]
    print(f"{why}: what runs in {precision} here runs in {instead}; on an Ampere or newer GPU "
          f"(compute capability {AMPERE[0]}.{AMPERE[1]}+) it runs in {precision}")
    return instead


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
    """(peak FLOP/s, where the figure comes from) for MFU; (None, why) where there is none.

    On a CPU: measured here, the fp32 matmul rate over the dtype's measured slowdown; None
    where the dtype is emulated (no native peak: an MFU against the emulation's own speed
    would read 500%). On a GPU: its data sheet's dense figure, matched by its exact name;
    fp32 is plain FP32 unless torch lets fp32 matmuls use TF32 (the source says which).

    Example:
        >>> peak_flops("cpu", "fp32")[1]
        'measured here (fp32 matmul, current threads)'
    """
    if device == "cpu":
        if precision != "fp32" and precision_support("cpu", precision) == "emulated":
            return None, (f"n/a: {precision} is emulated on this CPU (no native {precision} matmul), "
                          f"so there is no peak to hold MFU against")
        # Other dtypes: the fp32 peak scaled by their measured matmul speed (faster where
        # native: AMX, AVX512-BF16).
        peak = cpu_peak_flops()
        if precision != "fp32":
            peak /= cpu_matmul_slowdown(precision)
        return peak, f"measured here ({precision} matmul, current threads)"
    info = gpu_info()
    if info is None:
        return None, "no GPU"
    key = gpu_spec_key(info.name)
    if key is None:
        return None, f"unknown GPU {info.name!r}: not in hardware.GPU_SPECS (no data-sheet peak, none guessed)"
    spec = GPU_SPECS[key]
    if precision == "fp32" and tf32_enabled() and "tf32" in spec.tflops:
        return spec.tflops["tf32"] * 1e12, f"{key} data sheet, dense TF32 (fp32 matmuls on TF32: allowed in torch)"
    if precision not in spec.tflops:
        return None, f"{key} has no {precision} tensor cores"
    note = ", dense"
    if precision == "fp32":
        note = " (plain FP32: the card has no TF32)" if "tf32" not in spec.tflops else (
            " (plain FP32: TF32 off, torch's default)")
    return spec.tflops[precision] * 1e12, f"{key} data sheet{note}"


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
    ) + (f" ({note})" if (note := presented_note()) else "")


def cpp_compiler() -> str | None:
    """The C++ compiler torch.compile's inductor would call for CPU code ($CXX, else g++;
    clang++ on macOS), as a path, or None when there is none (then compiling for a CPU fails).

    Example:
        >>> cpp_compiler()  # doctest: +SKIP
        '/usr/bin/g++'
    """
    name = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    return shutil.which(name)


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
    cpu_class_note: str = ""
    """CPU only: where $WORKBENCH_CPU_CLASS presents a class, that the rows above follow it (cpu_class)."""

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
        if self.cpu_class_note:
            rows.append(("CPU class", self.cpu_class_note))
        rows.extend((name, version) for name, version in self.versions.items())
        return rows


def hardware_report(device: str = "auto") -> HardwareReport:
    """Describe this machine for training: measured where it can be.

    Example:
        >>> report = hardware_report("cpu")
        >>> report.precisions["fp32"]
        'native'
    """
    device = checked_device(device)
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
        cpu_class_note=presented_note() if device == "cpu" else "",
    )
