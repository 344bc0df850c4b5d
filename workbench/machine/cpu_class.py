"""The CPU class the workbench's decisions see: this CPU's instruction-set flags, after the caps.

Three things are decided from it: whether bf16 and fp16 are native or emulated
(`hardware.precision_support`, and from it the cuts notebook 01 and RunConfig make for an emulated
format and the claims they assert), which instructions torch.ao's int8 kernels run with
(`int8_kernels`: notebook 05 asserts an int8 speed-up only with VNNI), and the room's fingerprint.

Two kinds of switch move it:

* the caps (ONEDNN_MAX_CPU_ISA for torch's matmuls, FBGEMM_ENABLE_INSTRUCTIONS for its int8
  kernels; ATEN_CPU_CAPABILITY for ATen's own) make the kernels themselves run as a lesser CPU's,
  and the decisions follow them;
* `$WORKBENCH_CPU_CLASS` (avx2, avx512, avx512_vnni, avx512_bf16, avx512_fp16), for tests, puts
  that class's flags where /proc/cpuinfo's would be. It changes what the workbench decides and
  reports, never the kernels: they, and so every timing, stay this CPU's (caps applied), and every
  report that shows a decision says the class was presented. The caps still apply on top of it, as
  on a real CPU of that class. It exists because a developer's machine is one class while a checked
  output must be the same on all of them (issue 35: notebook 01, recorded on a CPU that emulates
  fp16, failed `make test` on an AVX512-FP16 Xeon); a learner has no use for it.
"""

from __future__ import annotations

import functools
import os

from workbench.base.arguments import shown
from workbench.machine import environment
from workbench.machine.compile_cache import cpu_flags_line

CPU_CLASS_ENV_VAR = "WORKBENCH_CPU_CLASS"
CAP_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "FBGEMM_ENABLE_INSTRUCTIONS")
"""The caps: environment variables that make torch's kernels run as a lesser CPU's (read at import)."""

_AVX2 = frozenset({"avx", "avx2", "fma", "f16c"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}
CPU_CLASSES: dict[str, frozenset[str]] = {
    "avx2": _AVX2,  # laptops and desktops, Haswell to Zen 3: bf16 and fp16 emulated, int8 without VNNI
    "avx512": _AVX512,  # Skylake-SP Xeons: AVX-512 without VNNI
    "avx512_vnni": _AVX512 | {"avx512_vnni"},  # Cascade Lake and Ice Lake Xeons: VNNI, no BF16
    "avx512_bf16": _AVX512 | {"avx512_vnni", "avx512_bf16"},  # Zen 4/5 EPYC (this project's), Cooper Lake
    "avx512_fp16": _AVX512 | {"avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                              "amx_int8"},  # Sapphire and Emerald Rapids Xeons: fp16 native too
}
"""Class name -> the flags (as /proc/cpuinfo spells them) a CPU of that class lists, those the
decisions below read and the ones beside them on such a CPU."""


def presented_class() -> str | None:
    """The class $WORKBENCH_CPU_CLASS presents, or None (unset or empty: this CPU's own flags).

    Example:
        >>> import os; os.environ["WORKBENCH_CPU_CLASS"] = "avx512_fp16"
        >>> presented_class()
        'avx512_fp16'
        >>> del os.environ["WORKBENCH_CPU_CLASS"]
    """
    text = environment.text(CPU_CLASS_ENV_VAR)
    if text is None:
        return None
    if text.lower() not in CPU_CLASSES:
        raise ValueError(f"{CPU_CLASS_ENV_VAR}={shown(text)} is not a CPU class: use one of {', '.join(CPU_CLASSES)} "
                         "(a test switch: it changes what the workbench decides, not the kernels), or unset it")
    return text.lower()


def presented_note() -> str:
    """'' for this CPU's own flags; else the clause every report showing a decision adds."""
    cls = presented_class()
    return (f"CPU class {cls} presented by ${CPU_CLASS_ENV_VAR}: what the workbench decides follows it; "
            "the kernels and their timings are this CPU's") if cls else ""


@functools.cache
def _proc_cpu_flags() -> frozenset[str]:
    """The instruction-set flags /proc/cpuinfo lists (empty where there is none)."""
    _, _, flags = cpu_flags_line().partition(":")
    return frozenset(flags.split())


def machine_flags() -> frozenset[str]:
    """The flags the CPU has, before any cap: the presented class's, else /proc/cpuinfo's."""
    cls = presented_class()
    return CPU_CLASSES[cls] if cls else _proc_cpu_flags()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags that torch's CPU kernels may use (cached: call
    `cpu_flags.cache_clear()` after changing a cap or the class in the same process).

    ONEDNN_MAX_CPU_ISA caps what oneDNN (torch's CPU matmul library) uses, e.g. AVX2
    on a CPU that has AVX512-BF16: then bf16 is emulated, whatever /proc/cpuinfo says.
    """
    flags = machine_flags()
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if not cap or cap == "ALL" or "AMX" in cap:
        return flags
    # oneDNN's levels in order: ... AVX2, AVX512_CORE, AVX512_CORE_VNNI, AVX512_CORE_BF16,
    # AVX512_CORE_FP16, AVX512_CORE_AMX: a cap below BF16 makes bf16 emulated on an AVX512-BF16 CPU.
    dropped: tuple[str, ...] = ("amx",)
    if "AVX512" not in cap:
        dropped = ("avx512", "amx")
    elif "BF16" not in cap and "FP16" not in cap:
        dropped = ("amx", "avx512_bf16", "avx512_fp16")
    elif "FP16" not in cap:
        dropped = ("amx", "avx512_fp16")
    return frozenset(f for f in flags if not f.startswith(dropped))


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
    'avx512_vnni', 'avx512', 'avx2' or 'none', after FBGEMM_ENABLE_INSTRUCTIONS (cached, as cpu_flags).

    Example:
        >>> int8_kernels() in ("avx512_vnni", "avx512", "avx2", "none")
        True
    """
    flags = machine_flags()
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
