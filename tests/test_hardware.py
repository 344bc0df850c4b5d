"""What the machine can do: native vs emulated dtypes, peaks, the learner's warning."""

import pytest

from workbench.core import hardware


def test_fp32_is_always_native():
    assert hardware.precision_support("cpu", "fp32") == "native"


def test_cpu_bf16_is_native_only_with_avx512_bf16_or_amx(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert hardware.precision_support("cpu", "bf16") == "emulated"
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    assert hardware.precision_support("cpu", "bf16") == "native"


@pytest.mark.parametrize("cap,bf16,fp16", [((7, 0), "unsupported", "native"), ((8, 0), "native", "native"), ((5, 0), "unsupported", "unsupported")])
def test_gpu_precisions_follow_compute_capability(monkeypatch, cap, bf16, fp16):
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo("Some GPU", 2**34, cap))
    assert hardware.precision_support("cuda", "bf16") == bf16
    assert hardware.precision_support("cuda", "fp16") == fp16


def test_known_gpus_get_their_spec_sheet_peak(monkeypatch):
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo("NVIDIA H200", 141 * 2**30, (9, 0)))
    peak, source = hardware.peak_flops("cuda", "bf16")
    assert peak == 989e12 and "H200" in source
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo("NVIDIA A100-SXM4-40GB", 40 * 2**30, (8, 0)))
    assert hardware.peak_flops("cuda", "fp32")[0] == 19.5e12


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cpu_flags_agree_with_the_measured_matmul_speed(precision):
    # The CPU flags decide 'native' vs 'emulated'; the measurement must agree:
    # emulated dtypes run several times slower than fp32 (25-55x on AVX2-only
    # CPUs), native ones at least not much slower.
    slowdown = hardware.cpu_matmul_slowdown(precision)
    if hardware.precision_support("cpu", precision) == "emulated":
        assert slowdown > 3, f"{precision} is called emulated but measured only {slowdown:.1f}x slower"
        assert "slower than fp32" in hardware.emulation_warning("cpu", precision)
    else:
        assert slowdown < 3, f"{precision} is called native but measured {slowdown:.1f}x slower"
        assert hardware.emulation_warning("cpu", precision) is None


def test_report_lists_precisions_peaks_and_versions():
    report = hardware.hardware_report("cpu")
    assert report.device == "cpu" and report.precisions["fp32"] == "native"
    assert report.peak_tflops["fp32"] > 0
    assert report.versions["torch"].startswith("2.")
    assert "fp32" in str(report) and "<table>" in report._repr_html_()


def test_measuring_the_machine_leaves_the_global_rng_alone():
    import torch

    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    hardware._time_matmul(torch.float32, 16, 1)
    assert torch.equal(torch.rand(3), expected)


def test_a_onednn_cap_below_avx512_makes_bf16_emulated(monkeypatch):
    hardware.cpu_flags.cache_clear()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    try:
        assert not any(f.startswith(("avx512", "amx")) for f in hardware.cpu_flags())
        assert hardware.precision_support("cpu", "bf16") == "emulated"
    finally:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
        hardware.cpu_flags.cache_clear()


@pytest.mark.parametrize("cap,expected", [(None, "avx512_vnni"), ("AVX2", "avx2"), ("AVX512", "avx512"),
                                          ("AVX512_E1", "avx512_vnni"), ("avx512_256", "avx512")])
def test_int8_kernels_follow_the_cpu_and_fbgemms_own_switch(monkeypatch, cap, expected):
    # FBGEMM ignores ONEDNN_MAX_CPU_ISA; FBGEMM_ENABLE_INSTRUCTIONS is what caps torch.ao's int8 kernels.
    monkeypatch.setattr(hardware, "_proc_cpu_flags", lambda: frozenset(
        {"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"}))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    if cap is None:
        monkeypatch.delenv("FBGEMM_ENABLE_INSTRUCTIONS", raising=False)
    else:
        monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", cap)
    hardware.int8_kernels.cache_clear()
    try:
        assert hardware.int8_kernels() == expected
        assert hardware.int8_speedup_expected("cpu") == (expected == "avx512_vnni")
        assert not hardware.int8_speedup_expected("cuda")
    finally:
        hardware.int8_kernels.cache_clear()


def test_an_avx2_only_cpu_has_no_vnni_whatever_the_switch_asks(monkeypatch):
    monkeypatch.setattr(hardware, "_proc_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX512_E1")
    hardware.int8_kernels.cache_clear()
    try:
        assert hardware.int8_kernels() == "avx2" and not hardware.int8_speedup_expected("cpu")
    finally:
        hardware.int8_kernels.cache_clear()


def test_report_names_the_int8_kernels_on_cpu():
    report = hardware.hardware_report("cpu")
    assert report.int8_kernels in ("avx512_vnni", "avx512", "avx2", "none")
    assert any(label.startswith("int8") for label, _ in report.rows())
