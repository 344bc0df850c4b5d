"""Each CPU class, presented through $WORKBENCH_CPU_CLASS: what the workbench decides on it, that
every report showing a decision says the class was presented, and that no decision moves a shape
notebook 01's checked counts are taken at (issue 35). A second or two: one tiny matmul timing, cached.

CI runs notebook 01 under nbval with the AVX512-FP16 class presented (.ci/run); `make test` runs it
on this machine's class, under CI's AVX2 caps there.
"""

from __future__ import annotations

import pytest

from workbench.machine import cpu_class, hardware
from workbench.machine.cpu_class import CAP_VARIABLES

# class -> (bf16, fp16, int8 kernels): the three decisions a CPU class moves.
DECISIONS = {
    "avx2": ("emulated", "emulated", "avx2"),
    "avx512": ("emulated", "emulated", "avx512"),
    "avx512_vnni": ("emulated", "emulated", "avx512_vnni"),
    "avx512_bf16": ("native", "emulated", "avx512_vnni"),
    "avx512_fp16": ("native", "native", "avx512_vnni"),
}


def _clear() -> None:
    cpu_class.cpu_flags.cache_clear()
    cpu_class.int8_kernels.cache_clear()


@pytest.fixture
def present(monkeypatch):
    """present(cls, **caps): the class presented, with only the caps given (CI's own AVX2 caps dropped)."""
    # oneDNN reads its cap at the process's first reduced-precision matmul and keeps it: take that
    # matmul (measured and cached, as the other tests expect it) while the process's caps are still set.
    for precision in ("bf16", "fp16"):
        hardware.cpu_matmul_slowdown(precision)

    def present(cls: str | None, **caps: str) -> None:
        for name in CAP_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in caps.items():
            monkeypatch.setenv(name, value)
        if cls is None:
            monkeypatch.delenv(cpu_class.CPU_CLASS_ENV_VAR, raising=False)
        else:
            monkeypatch.setenv(cpu_class.CPU_CLASS_ENV_VAR, cls)
        _clear()

    yield present
    monkeypatch.undo()
    _clear()


def test_the_classes_are_the_ones_the_decisions_tell_apart():
    assert set(cpu_class.CPU_CLASSES) == set(DECISIONS)
    assert len(set(DECISIONS.values())) == len(DECISIONS)  # each class decides differently


@pytest.mark.parametrize("cls", DECISIONS)
def test_each_class_decides_its_precisions_and_int8_kernels(present, cls):
    real = cpu_class._proc_cpu_flags()
    present(cls)
    bf16, fp16, int8 = DECISIONS[cls]
    assert (hardware.precision_support("cpu", "bf16"), hardware.precision_support("cpu", "fp16")) == (bf16, fp16)
    assert hardware.int8_kernels() == int8
    assert hardware.int8_speedup_expected("cpu") == (int8 == "avx512_vnni")
    assert hardware.cpu_flags() == cpu_class.CPU_CLASSES[cls]
    assert cpu_class._proc_cpu_flags() == real  # the machine's own flags (and the kernels) untouched


def test_the_caps_still_cap_a_presented_class(present):
    # An AVX512-FP16 Xeon under CI's caps decides as an AVX2 laptop, as it does without the variable.
    present("avx512_fp16", ONEDNN_MAX_CPU_ISA="AVX2", FBGEMM_ENABLE_INSTRUCTIONS="AVX2")
    assert [hardware.precision_support("cpu", p) for p in ("bf16", "fp16")] == ["emulated", "emulated"]
    assert hardware.int8_kernels() == "avx2"
    present("avx512_fp16", ONEDNN_MAX_CPU_ISA="AVX512_CORE_BF16")
    assert [hardware.precision_support("cpu", p) for p in ("bf16", "fp16")] == ["native", "emulated"]


@pytest.mark.parametrize("value", ["avx3", "AVX512-FP16", "native"])
def test_a_class_that_does_not_exist_is_one_line_naming_the_variable_and_the_classes(present, value):
    present(value)
    with pytest.raises(ValueError) as error:
        hardware.precision_support("cpu", "bf16")
    message = str(error.value)
    assert message.startswith(f"WORKBENCH_CPU_CLASS={value!r} is not a CPU class: use one of avx2, avx512, ")
    assert "\n" not in message and message.endswith("or unset it")
    from workbench import ConfigError, RunConfig

    with pytest.raises(ConfigError) as refused:  # a run refuses it before anything runs, even in fp32
        RunConfig(model="mlp", steps=2).resolved()
    assert str(refused.value) == message


def test_unset_empty_or_any_case_reads_as_expected(present):
    present("")
    assert cpu_class.presented_class() is None and cpu_class.presented_note() == ""
    present(" AVX512_FP16 ")
    assert cpu_class.presented_class() == "avx512_fp16"


def test_every_report_of_a_decision_says_the_class_was_presented(present):
    from workbench.classroom.fingerprint import fingerprint
    from workbench.preflight import _hardware

    present("avx2")
    note = cpu_class.presented_note()
    assert note.startswith("CPU class avx2 presented by $WORKBENCH_CPU_CLASS") and "kernels" in note
    report = hardware.hardware_report("cpu")
    assert report.precisions["bf16"] == "emulated" and ("CPU class", note) in report.rows()
    assert hardware.emulation_warning("cpu", "bf16").endswith(f"({note})")
    assert any(f.what == "CPU class" and f.detail == note for f in _hardware())
    fp = fingerprint("cpu")
    assert fp["caps"] == {"WORKBENCH_CPU_CLASS": "avx2"} and fp["isa"] == "AVX2" and fp["bf16"] == "emulated"
    present(None)
    assert not any(label == "CPU class" for label, _ in hardware.hardware_report("cpu").rows())


@pytest.mark.parametrize("cls", DECISIONS)
def test_no_class_moves_a_shape_notebook_01_counts_at(present, monkeypatch, capsys, cls):
    # 01's checked cells count saved bytes at its runs' batch, sequence and widths: the cut for an
    # emulated format may shorten the runs, never change those (at half the batch where fp16 is
    # emulated, the committed outputs failed on an AVX512-FP16 Xeon).
    from workbench import RunConfig, get_preset
    from workbench.lessons.mixed_precision import arm_budget

    monkeypatch.setattr(hardware, "cpu_matmul_slowdown", lambda p: 30.0)  # the printed figure only
    present(cls)
    budget = arm_budget(device="cpu")
    emulated = "emulated" in DECISIONS[cls][:2]
    assert bool(budget) == emulated and capsys.readouterr().out.startswith("Cut:" if emulated else "fp32, fp16, bf16 are native")
    preset = get_preset()
    for precision in ("fp32", "fp16", "bf16"):
        c = RunConfig(model="gpt", precision=precision, device="cpu", **budget).resolved()
        assert (c.batch_size, c.seq_len, c.dims) == (preset.batch_size["gpt"], preset.seq_len["gpt"], preset.dims["gpt"])
        assert c.steps == (budget["steps"] if emulated else preset.steps)  # every arm the same steps



def test_05s_int8_speed_is_asserted_on_vnni_only_where_no_class_is_presented(present, monkeypatch):
    # An AVX2 CPU presented as AVX512-FP16 still runs FBGEMM on AVX2: the class's VNNI is not a
    # speed-up its kernels can be held to, so the claim is shown, not asserted.
    from types import SimpleNamespace

    from workbench.lessons import quantization

    monkeypatch.setattr(quantization, "int8_kernels", lambda: "avx512_vnni")
    monkeypatch.setattr(quantization, "int8_speedup_expected", lambda device: True)
    model = SimpleNamespace(latency_s=1.0, size_bytes=100, accuracy=0.9, accuracy_change=lambda other: 0.0,
                            samples=100, correct=None)
    slower = {"MLP": SimpleNamespace(ratio=0.8, core=SimpleNamespace(free=True))}
    rows = lambda: quantization.claims_rows(model, model, model, model, model, slower, trained=False)
    present(None)
    with pytest.raises(AssertionError, match="should speed up the MLP on a CPU with VNNI: 0.80x"):
        rows()
    present("avx512_fp16")
    speed = rows()[0]
    assert speed[3].startswith("does not hold here:") and speed[3].endswith(f"({cpu_class.presented_note()}: not asserted)")
    assert not speed[4].enough and "the kernels timed are this CPU's" in speed[4].short  # wb.claims says "not shown here"
