"""Mixed precision: fp16 really is fp16 on a CPU, the GradScaler's knobs, skipped steps, exact bytes."""

import math

import pytest
import torch
import torch.nn.functional as F

from workbench import ConfigError, RunConfig, run
from workbench.base.precisions import SCALER_DEFAULTS
from workbench.core.engine.accelerator import reset_accelerate_state
from workbench.core.measure.counters import SavedActivationCounter, gpt_activation_bytes_formula
from workbench.core.models import GPT
from workbench.core.presets import get_preset
from workbench.core.switches.precision import enable_fp16_on_cpu
from workbench.core.views.sinks import RecordingSink
from workbench.lessons.mixed_precision import (
    arm_budget,
    autocast_policy,
    gpt_activation_bytes_autocast,
    inspect_model,
    loss_saved_bytes,
)
from workbench.machine import hardware

TINY = dict(model="mlp", data="digits", batch_size=32, steps=4, log_every=1, dims={"hidden": (32,)}, eval_samples=64)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))]


def test_accelerate_alone_leaves_fp16_off_on_a_cpu_and_enable_fp16_on_cpu_turns_it_on():
    from accelerate import Accelerator

    reset_accelerate_state(keep_process_group=False)
    accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    assert accelerator.scaler is None and not accelerator.native_amp  # fp32 under an fp16 label
    assert enable_fp16_on_cpu(accelerator, {"init_scale": 1024.0})
    assert accelerator.native_amp and accelerator.scaler.get_scale() == 1024.0
    with accelerator.autocast():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16


def test_fp16_on_cpu_trains_in_fp16_with_a_grad_scaler():
    sink = RecordingSink()
    fp32 = run(RunConfig(**TINY), sinks=[], name="fp32")
    fp16 = run(RunConfig(**TINY, precision="fp16"), sinks=[sink], name="fp16")
    assert fp16.loss_scales == [65536.0] * 4 and fp16.skipped_steps == 0
    assert fp32.loss_scales == [] and fp32.skipped_steps == 0
    assert fp16.losses != fp32.losses  # not fp32 under an fp16 label
    assert fp16.memory.activation_bytes < fp32.memory.activation_bytes
    assert sink.steps[-1].extra == {"loss_scale": 65536.0, "skipped_steps": 0}
    assert fp16.accuracy is not None  # evaluation (autocast off) ran


def test_a_forced_overflow_is_skipped_counted_and_backs_the_scale_off():
    init = 2.0**40  # far beyond fp16's range: the first steps' gradients overflow
    result = run(RunConfig(**{**TINY, "steps": 30}, precision="fp16", grad_scaler={"init_scale": init}), sinks=[], name="big")
    assert 1 <= result.skipped_steps < 30
    # No growth within 2000 clean steps: every change of scale is one skipped step's backoff.
    assert result.loss_scales[-1] == init * 0.5**result.skipped_steps
    assert all(math.isfinite(loss) for loss in result.losses)


def test_resolved_fp16_config_shows_every_scaler_knob():
    cfg = RunConfig(**TINY, precision="fp16", grad_scaler={"growth_interval": 10}).resolved()
    assert cfg.grad_scaler == {**SCALER_DEFAULTS, "growth_interval": 10}
    assert RunConfig(**TINY, precision="bf16").resolved().grad_scaler is None


@pytest.mark.parametrize("knobs,precision,message", [
    ({"init_scale": 2.0}, "bf16", "grad_scaler applies to precision='fp16' only"),
    ({"growth": 2.0}, "fp16", "not GradScaler knobs"),
    ({"backoff_factor": 1.5}, "fp16", "grad_scaler['backoff_factor']=1.5"),
    ({"growth_factor": 1.0}, "fp16", "grad_scaler['growth_factor']=1.0"),
    ({"growth_interval": 2.5}, "fp16", "grad_scaler['growth_interval']=2.5"),
    ({"init_scale": -1.0}, "fp16", "grad_scaler['init_scale']=-1.0"),
    ({"init_scale": True}, "fp16", "grad_scaler['init_scale']=True"),
])
def test_config_rejects_grad_scaler_knobs_that_cannot_work(knobs, precision, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        RunConfig(**TINY, precision=precision, grad_scaler=knobs)


def test_config_rejects_a_grad_scaler_that_is_not_a_dict():
    with pytest.raises(ConfigError, match="grad_scaler must be"):
        RunConfig(**TINY, precision="fp16", grad_scaler=1024.0)


def test_arm_budget_halves_the_emulated_steps_for_every_arm_keeps_the_batch_and_leaves_native_arms_alone(monkeypatch, capsys):
    monkeypatch.setattr(hardware, "precision_support", lambda device, p: "emulated" if p == "fp16" else "native")
    monkeypatch.setattr(hardware, "cpu_matmul_slowdown", lambda p: 80.0)
    preset = get_preset()
    budget = arm_budget(device="cpu")
    assert budget == {"steps": max(2, preset.reduced_precision_steps_on_emulated_cpu // 2), "log_every": 1,
                      "eval_samples": min(preset.max_eval_samples, 200)}  # no batch_size: 01's counts are taken at it
    out = capsys.readouterr().out
    assert "emulates fp16 (a matmul measured 80x slower" in out and f"at its batch of {preset.batch_size['gpt']}," in out
    assert arm_budget(("fp32", "bf16"), device="cpu") == {}


def test_autocast_keeps_losses_in_fp32_and_runs_linear_in_16_bits():
    policy = autocast_policy("cpu", "bf16")
    assert policy["cross_entropy"] == torch.float32
    assert policy["linear (fp32 inputs)"] == torch.bfloat16


def test_inspection_shows_fp32_layer_norms_master_weights_and_gradients():
    torch.manual_seed(0)
    ids, labels = (torch.randint(0, 64, (2, 16)) for _ in range(2))
    report = inspect_model(GPT(64, 16, 1, 2, 16), ids, labels, precision="bf16")
    by_type = {}
    for _, kind, out, params in report.modules:
        by_type.setdefault(kind, set()).add((out, params))
    assert by_type["LayerNorm"] == {("float32", "float32")}
    assert by_type["Linear"] == {("bfloat16", "float32")}
    assert report.loss_dtype == "float32" and report.grad_dtypes == {"float32"}
    assert report.ops[("_to_copy", "bfloat16")] > 0  # the casts autocast inserted


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gpt_saved_bytes_under_autocast_match_the_formula_exactly(device, precision):
    if device == "cuda" and precision == "bf16" and hardware.precision_support("cuda", "bf16") != "native":
        pytest.skip("this GPU has no bf16")
    V, s, b, h, a, L = 64, 16, 2, 32, 4, 2
    torch.manual_seed(0)
    model = GPT(V, s, L, a, h).to(device)
    ids, labels = (torch.randint(0, V, (b, s), device=device) for _ in range(2))  # two storages
    report = inspect_model(model, ids, labels, precision=precision, device=device)
    softmax_fp32 = autocast_policy(device, precision)["softmax"] == torch.float32
    expected = gpt_activation_bytes_autocast(s, b, h, a, L, softmax_fp32=softmax_fp32, vocab_size=V)
    assert sum(report.saved_bytes_by_dtype.values()) == expected + loss_saved_bytes(s * b, V)
    fp32 = gpt_activation_bytes_formula(s, b, h, a, L, 4, vocab_size=V)
    with SavedActivationCounter(model) as saved:
        F.cross_entropy(model(ids).flatten(0, 1), labels.flatten())
    assert saved.bytes == fp32 + loss_saved_bytes(s * b, V)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fp16_gets_accelerates_grad_scaler_with_the_knobs():
    result = run(RunConfig(**TINY, precision="fp16", device="cuda", grad_scaler={"init_scale": 2.0**40}), sinks=[], name="g")
    assert result.skipped_steps >= 1 and result.loss_scales[-1] == 2.0**40 * 0.5**result.skipped_steps


def _fake_run(precision, step_time_s, activation_bytes, *, loss=2.0, skipped=0, scales=(), preset="cpu-quick",
              device="cpu", peak=None):
    from types import SimpleNamespace

    memory = SimpleNamespace(activation_bytes=activation_bytes, model_state_bytes=1000, peak_bytes=peak)
    config = SimpleNamespace(precision=precision, preset=preset, grad_scaler={"init_scale": 2.0**40} if scales else None,
                             data="rotten_tomatoes_lm", seq_len=16, eval_samples=0, seed=0)
    return SimpleNamespace(config=config, device=device, step_time_s=step_time_s, memory=memory, final_loss=loss,
                           eval_loss=loss, accuracy=0.5, steps_done=3, skipped_steps=skipped, loss_scales=list(scales))


def test_claim_rows_say_holds_in_part_when_one_format_is_native_and_fast_and_the_other_emulated(monkeypatch):
    from workbench.lessons.mixed_precision import claim_rows

    monkeypatch.setattr(hardware, "precision_support", lambda device, p: "emulated" if p == "fp16" else "native")
    forced = _fake_run("fp16", 1.0, 10, skipped=3, scales=(2.0**39, 2.0**38, 2.0**37))
    rows = claim_rows(_fake_run("fp32", 1.0, 300), _fake_run("fp16", 10.0, 200), _fake_run("bf16", 0.5, 200), forced)
    speed, memory, _, scaler = rows
    assert speed[3] == "holds in part: fp16 is emulated on this cpu, 10x slower; bf16 native, 2.00x"
    assert "-33% (fp16)" in memory[2] and scaler[2].startswith("init_scale=2**40: 3 of 3 steps skipped, scale -> 2**37")


def test_claim_rows_refuse_an_emulated_format_that_was_not_slower(monkeypatch):
    from workbench.lessons.mixed_precision import claim_rows

    monkeypatch.setattr(hardware, "precision_support", lambda device, p: "emulated")
    forced = _fake_run("fp16", 1.0, 10, skipped=1, scales=(2.0**39,))
    with pytest.raises(AssertionError, match="emulated fp16 step should be clearly slower"):
        claim_rows(_fake_run("fp32", 1.0, 300), _fake_run("fp16", 1.0, 200), _fake_run("bf16", 5.0, 200), forced)


def test_under_a_presented_cpu_class_no_timing_is_asserted_and_the_verdict_says_why(monkeypatch):
    # The kernels timed are this CPU's: an AVX2 class presented on a CPU whose bf16 is fast must not fail
    # "an emulated bf16 step should be clearly slower" (it did, under WORKBENCH_CPU_CLASS=avx2 on this EPYC).
    from workbench.lessons.mixed_precision import claim_rows

    monkeypatch.setattr(hardware, "precision_support", lambda device, p: "emulated")
    monkeypatch.setenv("WORKBENCH_CPU_CLASS", "avx2")
    forced = _fake_run("fp16", 1.0, 10, skipped=1, scales=(2.0**39,))
    speed = claim_rows(_fake_run("fp32", 1.0, 300), _fake_run("fp16", 1.0, 200), _fake_run("bf16", 0.5, 200), forced)[0]
    assert speed[2] == "fp16 1.00x the speed of fp32, bf16 2.00x the speed of fp32"
    assert speed[3] == f"not shown here: {hardware.presented_note()}"


def test_on_a_t4_the_bf16_arm_runs_in_fp16_and_its_claims_say_not_shown_here(monkeypatch, capsys):
    # Notebook 01 on a card without bf16: cell 5 asks precision_here("bf16") (fp16, one line), the bf16 arms
    # train in fp16, and the claims table says what was not shown and why, instead of crashing.
    from workbench.lessons.mixed_precision import claim_rows, precision_here

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo("Tesla T4", 16 * 2**30, (7, 5)))
    assert precision_here("bf16") == "fp16"
    assert capsys.readouterr().out.startswith("this card (Tesla T4, compute capability 7.5) has no bf16: ")
    cuda = dict(device="cuda", peak=2**30)
    forced = _fake_run("fp16", 1.0, 10, skipped=2, scales=(2.0**39, 2.0**38), **cuda)
    rows = claim_rows(_fake_run("fp32", 1.0, 300, **cuda), _fake_run("fp16", 0.5, 200, **cuda),
                      _fake_run("fp16", 0.5, 200, **cuda), forced)
    speed, memory, accuracy, _ = rows
    assert speed[2] == "fp16 2.00x the speed of fp32, bf16 arm in fp16 2.00x the speed of fp32"
    assert speed[3] == ("holds in part: fp16 native, 2.00x; bf16 not shown here: this card (Tesla T4, compute "
                        "capability 7.5) has no bf16, its arm ran in fp16")
    assert "-33% (bf16 arm in fp16)" in memory[2] and "(fp32 / fp16 / bf16 arm in fp16)" in accuracy[2]


def test_with_bf16_native_the_claim_rows_judge_both_arms(monkeypatch):
    from workbench.lessons.mixed_precision import claim_rows

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo("NVIDIA A100-SXM4-40GB", 40 * 2**30, (8, 0)))
    cuda = dict(device="cuda", peak=2**30)
    forced = _fake_run("fp16", 1.0, 10, skipped=1, scales=(2.0**39,), **cuda)
    speed = claim_rows(_fake_run("fp32", 1.0, 300, **cuda), _fake_run("fp16", 0.5, 200, **cuda),
                       _fake_run("bf16", 0.5, 200, **cuda), forced)[0]
    assert speed[3] == "holds: fp16 native, 2.00x; bf16 native, 2.00x"
