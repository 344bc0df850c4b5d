"""Mixed precision: fp16 really is fp16 on a CPU, the GradScaler's knobs, skipped steps, exact bytes."""

import math

import pytest
import torch
import torch.nn.functional as F

from workbench import ConfigError, RunConfig, run
from workbench.core import hardware
from workbench.core.models import GPT
from workbench.core.precisions import SCALER_DEFAULTS
from workbench.measure.counters import (
    SavedActivationCounter,
    gpt_activation_bytes_formula,
)
from workbench.lessons import mixed_precision as precision_module
from workbench.lessons.mixed_precision import (
    autocast_policy,
    inspect_model,
    inspect_precision,
)
from workbench.lessons.mixed_precision import (
    accelerate_setup,
    gpt_activation_bytes_autocast,
    loss_saved_bytes,
    simulate_scaler,
    steps_for,
)
from workbench.views.sinks import RecordingSink

TINY = dict(model="mlp", data="digits", batch_size=32, steps=4, log_every=1, dims={"hidden": (32,)}, eval_samples=64)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))]


def test_accelerate_alone_leaves_fp16_off_on_a_cpu_and_the_workbench_turns_it_on():
    rows = dict((what, (alone, ours)) for what, alone, ours in accelerate_setup("fp16", device="cpu"))
    assert rows["autocast"] == ("off", "on, float16")
    assert rows["GradScaler"][0] == "none" and "GradScaler('cpu', init_scale=65536" in rows["GradScaler"][1]


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


def test_the_scale_grows_after_growth_interval_clean_steps_and_halves_on_an_overflow():
    history = simulate_scaler({"init_scale": 1024.0, "growth_interval": 4}, steps=10, overflow_at={3})
    assert history == [1024, 1024, 512, 512, 512, 512, 1024, 1024, 1024, 1024]
    assert simulate_scaler(None, steps=2, overflow_at=set()) == [SCALER_DEFAULTS["init_scale"]] * 2


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


def test_steps_for_gives_every_precision_the_same_fewest_steps():
    emulated = any(hardware.precision_support("cpu", p) == "emulated" for p in ("bf16", "fp16"))
    assert steps_for(("fp32", "bf16", "fp16"), device="cpu", preset="cpu-quick") == (6 if emulated else 30)
    assert steps_for(("fp32",), device="cpu", preset="cpu-quick") == 30


def test_autocast_keeps_losses_in_fp32_and_runs_linear_in_16_bits():
    policy = autocast_policy("cpu", "bf16")
    assert policy["cross_entropy"] == torch.float32
    assert policy["linear (fp32 inputs)"] == torch.bfloat16


def test_inspection_shows_fp32_layer_norms_master_weights_and_gradients():
    report = inspect_precision(RunConfig(model="gpt", precision="bf16", batch_size=2, seq_len=16,
                                         dims={"n_layer": 1, "n_head": 2, "d_model": 16}))
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
    rows = dict((what, ours) for what, _, ours in accelerate_setup("fp16", device="cuda"))
    assert rows["autocast"] == "on, float16" and "GradScaler('cuda', init_scale=65536" in rows["GradScaler"]
    result = run(RunConfig(**TINY, precision="fp16", device="cuda", grad_scaler={"init_scale": 2.0**40}), sinks=[], name="g")
    assert result.skipped_steps >= 1 and result.loss_scales[-1] == 2.0**40 * 0.5**result.skipped_steps


def test_only_unwrapping_evaluates_a_prepared_model_in_fp32():
    ways = dict(precision_module.evaluation_dtypes("bf16", device="cpu"))
    assert list(ways.values()) == ["bfloat16", "bfloat16", "bfloat16", "float32"]
    assert ways["unwrap_model(model, keep_fp32_wrapper=False)"] == "float32"
