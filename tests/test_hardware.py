"""What the machine can do: native vs emulated dtypes, peaks, the learner's warning."""

import pytest
import torch

from workbench.machine import cpu_class, hardware


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
    assert hardware.precision_support("cuda", "tf32") == bf16  # TF32 came with bf16, in Ampere
    assert hardware.precision_support("cuda", "fp16") == fp16


def _card(monkeypatch, name, cap):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo(name, 16 * 2**30, cap))


@pytest.mark.parametrize("name,cap", [("Tesla T4", (7, 5)), ("Tesla V100-SXM2-16GB", (7, 0)),
                                      ("NVIDIA GeForce RTX 2080 Ti", (7, 5))])
def test_a_pre_ampere_card_lacks_bf16_and_tf32_and_says_so_in_one_clause(monkeypatch, name, cap):
    _card(monkeypatch, name, cap)
    # Decided from the capability: torch.cuda.is_bf16_supported() says True on some of these (emulated).
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    where = f"this card ({name}, compute capability {cap[0]}.{cap[1]})"
    assert hardware.missing_here("cuda", "bf16") == f"{where} has no bf16"
    assert hardware.missing_here("cuda", "tf32") == f"{where} has no TF32"
    assert hardware.missing_here("cuda", "fp16") is None


def test_an_ampere_card_has_both_and_a_cpu_has_no_tf32_but_runs_bf16(monkeypatch):
    assert hardware.missing_here("cpu", "tf32") == "a CPU has no TF32"
    assert hardware.missing_here("cpu", "bf16") is None  # native or emulated: it runs
    _card(monkeypatch, "NVIDIA A100-SXM4-40GB", (8, 0))
    assert hardware.missing_here("cuda", "bf16") is None and hardware.missing_here("cuda", "tf32") is None


def test_precision_here_stands_fp16_in_for_bf16_on_a_t4_in_one_printed_line(monkeypatch, capsys):
    _card(monkeypatch, "Tesla T4", (7, 5))
    assert hardware.precision_here("bf16") == "fp16"
    assert hardware.precision_here("fp16") == "fp16"
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["this card (Tesla T4, compute capability 7.5) has no bf16: what runs in bf16 here runs in fp16; "
                     "on an Ampere or newer GPU (compute capability 8.0+) it runs in bf16"]
    _card(monkeypatch, "NVIDIA A100-SXM4-40GB", (8, 0))
    assert hardware.precision_here("bf16") == "bf16" and capsys.readouterr().out == ""


# Device names as nvidia-smi and torch.cuda.get_device_name() report them, and the dense
# data-sheet peak (TFLOP/s) each must get: bf16, plain fp32, fp32 on TF32.
REPORTED = {
    "NVIDIA H100 80GB HBM3": (989.5, 67, 494.5),
    "NVIDIA H100 PCIe": (756.5, 51, 378),
    "NVIDIA H100 NVL": (835.5, 60, 417.5),
    "NVIDIA H200": (989.5, 67, 494.5),
    "NVIDIA H200 NVL": (835.5, 60, 417.5),
    "NVIDIA A100-SXM4-40GB": (312, 19.5, 156),
    "NVIDIA A100-SXM4-80GB": (312, 19.5, 156),
    "NVIDIA A100-PCIE-40GB": (312, 19.5, 156),
    "NVIDIA A100 80GB PCIe": (312, 19.5, 156),
    "NVIDIA L4": (121, 30.3, 60),
    "NVIDIA L40": (181.05, 90.5, 90.5),
    "NVIDIA L40S": (362.05, 91.6, 183),
    "NVIDIA A10": (125, 31.2, 62.5),
    "NVIDIA A40": (149.7, 37.4, 74.8),
    "NVIDIA A30": (165, 10.3, 82),
    "NVIDIA GeForce RTX 3090": (71, 35.6, 35.6),
    "NVIDIA GeForce RTX 4090": (165.2, 82.6, 82.6),
    "Tesla T4": (None, 8.1, None),
    "Tesla V100-SXM2-16GB": (None, 15.7, None),
    "Tesla V100-PCIE-32GB": (None, 14, None),
}


@pytest.mark.parametrize("name", REPORTED)
def test_each_reported_gpu_name_gets_its_own_dense_data_sheet_peak(monkeypatch, name):
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo(name, 2**34, (8, 0)))
    bf16, fp32, tf32 = REPORTED[name]
    peak, source = hardware.peak_flops("cuda", "bf16")
    assert peak == (bf16 and bf16 * 1e12), source
    assert hardware.peak_flops("cuda", "fp32") == (fp32 * 1e12, hardware.peak_flops("cuda", "fp32")[1])
    assert ("TF32 off" if tf32 else "no TF32") in hardware.peak_flops("cuda", "fp32")[1]
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")  # TF32 allowed
    peak, source = hardware.peak_flops("cuda", "fp32")
    assert peak == (tf32 or fp32) * 1e12 and ("dense TF32" in source) == bool(tf32)


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA GeForce RTX 3080", "NVIDIA B200", "NVIDIA H100",
                                  "NVIDIA GeForce RTX 4090 D", "Some GPU"])
def test_a_gpu_not_in_the_table_is_unknown_not_guessed(monkeypatch, name):
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo(name, 2**34, (8, 0)))
    for precision in ("fp32", "bf16", "fp16"):
        peak, source = hardware.peak_flops("cuda", precision)
        assert peak is None and source.startswith("unknown GPU"), (name, precision, source)


def test_every_table_entry_is_dense_sourced_and_reachable_by_a_reported_name():
    for key, spec in hardware.GPU_SPECS.items():
        assert hardware.gpu_spec_key(key) == key and spec.source and spec.memory_bandwidth > 0
        assert spec.tflops["fp32"] <= spec.tflops.get("tf32", spec.tflops["fp32"]) <= spec.tflops.get("fp16", 1e9)
    assert set(hardware.GPU_NAMES.values()) == set(hardware.GPU_SPECS)


def test_an_emulated_precision_has_no_peak_so_its_mfu_is_not_a_number(monkeypatch):
    from workbench import RunConfig, run
    from workbench.core.views.sinks import RecordingSink

    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # no AVX512-BF16/AMX
    peak, source = hardware.peak_flops("cpu", "bf16")
    assert peak is None and source.startswith("n/a: bf16 is emulated")
    assert hardware.peak_flops("cpu", "fp32")[0] > 0
    sink = RecordingSink()
    result = run(RunConfig(model="mlp", data="digits", precision="bf16", steps=4, log_every=2, eval_samples=0,
                           dims={"hidden": (16,)}, batch_size=16), sinks=[sink])
    assert sink.starts[0].peak_flops is None and sink.starts[0].peak_flops_source.startswith("n/a")
    assert [r.mfu for r in sink.steps] == [None, None] and all(r.tflops_per_sec for r in sink.steps[1:])
    assert result.mfu is None and result.peak_flops is None and result.peak_flops_source.startswith("n/a")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cpu_flags_agree_with_the_measured_matmul_speed(monkeypatch, precision):
    # The CPU flags decide 'native' vs 'emulated'; the measurement must agree:
    # emulated dtypes run several times slower than fp32 (25-55x on AVX2-only
    # CPUs), native ones at least not much slower. This CPU's own flags: a class
    # presented for a test ($WORKBENCH_CPU_CLASS) is not what the kernels run.
    monkeypatch.delenv(cpu_class.CPU_CLASS_ENV_VAR, raising=False)
    hardware.cpu_flags.cache_clear()
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
    monkeypatch.setattr(cpu_class, "_proc_cpu_flags", lambda: frozenset(
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
    monkeypatch.setattr(cpu_class, "_proc_cpu_flags", lambda: frozenset({"avx2", "fma"}))
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
