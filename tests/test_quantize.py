"""PTQ and QAT (workbench.lessons.quantization) and their measurements (workbench.lessons.quantization), on CPU."""

import logging
import statistics
import time

import pytest
import torch
from torch import nn

import workbench as wb
from workbench.lessons import quantization as wq
from workbench.lessons.quantization import (
    QuantResult,
    compare_quantized,
    linear_weight_bytes,
    measure,
    size_on_disk,
)
from workbench.machine import torchao_support

pytest.importorskip("torchao", reason="torchao is optional: the 'quantization' extra")

# 64 -> 32 -> 4: 2,176 weights in two Linear layers with 36 output rows between them.
WEIGHTS, ROWS = 64 * 32 + 32 * 4, 32 + 4


class Data:
    """What measure() reads: .inputs and .labels."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.inputs, self.labels = inputs, labels


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4)).eval()


@pytest.fixture(scope="module")
def data(model) -> Data:
    torch.manual_seed(1)
    pool = torch.randn(480, 64)
    with torch.no_grad():
        logits = model(pool)
    # An untrained model's logits lie close together, and how many near-ties int8 rounding
    # flips depends on the CPU's int8 kernels (VNNI or AVX2). Keep the 96 inputs the fp32
    # model answers most clearly (largest top-2 gap): there, quantizing should agree.
    top2 = logits.topk(2, dim=-1).values
    x = pool[(top2[:, 0] - top2[:, 1]).argsort(descending=True)[:96]]
    return Data(x, model(x).argmax(-1).detach())  # labels = the fp32 model's answers: accuracy 1.0


def static_int8(model: nn.Module, calibration: torch.Tensor, *, per_channel: bool = True) -> nn.Module:
    """Static PTQ the way notebook 05 writes it by hand: export, prepare_pt2e, calibrate, convert_pt2e."""
    from torchao.quantization.pt2e import allow_exported_model_train_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    wq.load_torchao()
    graph = torch.export.export(model, (calibration[:2],), dynamic_shapes=({0: torch.export.Dim("b", min=1)},)).module()
    config = x86.get_default_x86_inductor_quantization_config()
    observed = prepare_pt2e(graph, x86.X86InductorQuantizer().set_global(
        config if per_channel else wq.per_tensor_weights(config)))
    with torch.no_grad():
        observed(calibration)
    return allow_exported_model_train_eval(convert_pt2e(observed))


def test_linear_weight_bytes_count_values_scales_and_zero_points_exactly(model):
    assert linear_weight_bytes(model) == 4 * WEIGHTS
    # deprecated torch.ao: one int8 per weight, one per-tensor scale held outside any tensor
    assert linear_weight_bytes(wq.dynamic_int8(model, backend="torch.ao")) == WEIGHTS
    # torchao: int8 values plus an fp32 scale and an int8 zero point per output row
    assert linear_weight_bytes(wq.dynamic_int8(model)) == WEIGHTS + ROWS * (4 + 1)
    # torchao's CPU layout keeps each int4 value in a byte: no smaller than int8
    assert linear_weight_bytes(wq.weight_intx(model, bits=4)) == WEIGHTS + ROWS * (4 + 1)


def test_static_int8_per_channel_adds_a_scale_and_zero_point_per_row(model, data):
    per_tensor = static_int8(model, data.inputs[:16], per_channel=False)
    per_channel = static_int8(model, data.inputs[:16])
    assert linear_weight_bytes(per_tensor) == WEIGHTS  # the scales are constants in the graph
    assert linear_weight_bytes(per_channel) == WEIGHTS + ROWS * (4 + 8)  # fp32 scale, int64 zero point
    # the converted graph keeps its unused fp32 originals; the size counts only what it uses
    assert size_on_disk(per_tensor) < size_on_disk(model) / 2


def test_activation_scales_reads_one_calibrated_scale_per_quantized_activation(model, data):
    scales = wq.activation_scales(static_int8(model, data.inputs))
    assert len(scales) == 2 and all(s > 0 for s in scales)  # the input, and the hidden layer
    with pytest.raises(ValueError, match="needs a model converted by convert_pt2e"):
        wq.activation_scales(model)


def test_every_ptq_path_keeps_the_original_model_and_agrees_with_it(model, data):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    base = measure(model, data, name="fp32", repeats=2)
    variants = [wq.dynamic_int8(model, backend="torch.ao"), wq.dynamic_int8(model),
                wq.weight_intx(model, bits=8), wq.weight_intx(model, bits=4, group_size=32),
                static_int8(model, data.inputs)]
    for i, quantized in enumerate(variants):
        r = measure(quantized, data, name=f"v{i}", baseline=base, repeats=2)
        assert r.agreement >= 0.95, f"variant {i} changed {1 - r.agreement:.0%} of predictions"
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_measure_reports_accuracy_agreement_and_median_latency(model, data):
    threads = torch.get_num_threads()
    r = measure(model, data, name="fp32", batch_size=32, repeats=5, warmup=1, threads=1)
    assert (r.accuracy, r.samples, r.batch_size, r.threads, r.device) == (1.0, 96, 32, 1, "cpu")
    assert len(r.latency_times_s) == 5 and r.latency_s == statistics.median(r.latency_times_s)
    assert r.agreement is None and measure(model, data, name="again", baseline=r, repeats=1).agreement == 1.0
    assert torch.get_num_threads() == threads  # restored


def test_measure_rejects_data_without_inputs_and_labels(model):
    with pytest.raises(TypeError, match="must have .inputs and .labels"):
        measure(model, torch.randn(4, 64), name="x")


def test_quantizing_a_model_without_linear_layers_raises_one_line():
    convs = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU())
    for quantize in (wq.dynamic_int8, lambda m: wq.dynamic_int8(m, backend="torch.ao"),
                     lambda m: wq.weight_intx(m, bits=4)):
        with pytest.raises(ValueError, match="has no nn.Linear layers") as error:
            quantize(convs)
        assert "\n" not in str(error.value)


def test_a_config_the_installed_torchao_cannot_apply_raises_one_line_naming_it(model):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig
    from torchao.quantization.qat import QATConfig

    # torchao QAT has no fake-quantize recipe for this base config ("Unexpected base config")
    with pytest.raises(ValueError, match=r"cannot apply QATConfig\(Int8DynamicActivationInt8WeightConfig\)") as error:
        wq.quantize_with(model, QATConfig(Int8DynamicActivationInt8WeightConfig(), step="prepare"))
    assert "\n" not in str(error.value) and wq.torchao_version() in str(error.value)
    with pytest.raises(ValueError, match="has no quantization config 'Int3MagicConfig'; use one of: "):
        wq.quantize_with(model, "Int3MagicConfig")


def test_bad_bit_widths_group_sizes_and_backends_are_rejected(model):
    with pytest.raises(ValueError, match="bits=9 must be a whole number from 1 to 8"):
        wq.weight_intx(model, bits=9)
    with pytest.raises(ValueError, match="group_size=24 does not divide"):
        wq.weight_intx(model, bits=4, group_size=24)
    with pytest.raises(ValueError, match="backend='onnx' is not known"):
        wq.dynamic_int8(model, backend="onnx")


def test_run_with_qat_trains_fake_quantized_and_converts_to_the_same_predictions():
    cfg = wb.RunConfig(model="mlp", data="digits", qat="int4", steps=4, eval_samples=64, dims={"hidden": (32,)})
    result = wb.run(cfg, sinks=[], keep_model=True)
    fake = result.model
    assert {type(m).__name__ for m in fake.modules()} >= {"FakeQuantizedLinear"}
    data = wb.load_data("digits", max_test=64).test
    trained = measure(fake, data, name="fake-quantized", repeats=1)
    converted = measure(wq.convert_qat(fake, bits=4), data, name="int4", baseline=trained, repeats=1)
    assert trained.accuracy == pytest.approx(result.accuracy)
    assert converted.agreement >= 0.95  # convert applies the rounding training simulated


def test_convert_qat_needs_a_qat_trained_model(model):
    with pytest.raises(ValueError, match="no fake-quantized layers: train it with RunConfig"):
        wq.convert_qat(model, bits=4)


def test_config_rejects_an_unknown_qat_bit_width():
    with pytest.raises(wb.ConfigError, match="qat='int5' is not known; use one of: 'none', 'int8'"):
        wb.RunConfig(model="mlp", qat="int5")


def test_run_hands_back_the_trained_model_only_when_asked():
    cfg = wb.RunConfig(model="mlp", data="digits", steps=2, eval_samples=0, dims={"hidden": (16,)})
    assert wb.run(cfg, sinks=[]).model is None
    model = wb.run(cfg, sinks=[], keep_model=True).model
    assert isinstance(model, nn.Module) and not model.training


def test_missing_torchao_gives_the_install_command(monkeypatch):
    monkeypatch.setattr(torchao_support, "torchao_available", lambda: False)
    with pytest.raises(ImportError, match=r"torchao is not installed; pip install --no-deps 'torchao>=0.18"):
        wq.intx_config(4)


def test_quiet_torchao_logs_silences_only_inside_the_block():
    logger = logging.getLogger("torchao")
    before = logger.level
    with wq.quiet_torchao_logs():
        assert logger.level == logging.ERROR
    assert logger.level == before


def test_compare_quantized_lays_out_ratios_against_the_first():
    def result(name, size, latency, accuracy):
        return QuantResult(name=name, size_bytes=size, linear_weight_bytes=size, latency_s=latency,
                           latency_times_s=[latency], accuracy=accuracy, agreement=None, samples=10,
                           batch_size=2, threads=1, device="cpu")

    cmp = compare_quantized([result("fp32", 400, 0.02, 0.9), result("int8", 100, 0.01, 0.88)])
    assert cmp.ratio("size_bytes", "int8") == 0.25 and cmp.ratio("latency_s", "int8") == 0.5
    row = cmp.table.rows[1]
    assert row[3] == "4.00" and row[6] == "2.00" and row[8] == "-2.0"
    with pytest.raises(ValueError, match="variant names must differ"):
        compare_quantized([result("a", 1, 1, 1), result("a", 1, 1, 1)])


def test_config_with_qat_but_without_torchao_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(wb.ConfigError, match="qat='int4' needs torchao, which is not installed; pip install"):
        wb.RunConfig(model="mlp", qat="int4")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torchao's int8 kernels target GPUs")
def test_torchao_dynamic_int8_runs_and_is_measured_on_a_gpu():
    torch.manual_seed(0)
    gpu = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16)).cuda().eval()
    x = torch.randn(64, 64)
    with torch.no_grad():
        data = Data(x, gpu(x.cuda()).argmax(-1).cpu())
    base = measure(gpu, data, name="fp32", batch_size=32, repeats=2)
    int8 = measure(wq.dynamic_int8(gpu), data, name="int8", baseline=base, batch_size=32, repeats=2)
    assert (base.device, int8.device) == ("cuda", "cuda") and int8.agreement >= 0.85
    assert int8.linear_weight_bytes == (64 * 64 + 64 * 16) + (64 + 16) * (4 + 1)


class _Slow(nn.Module):
    """Wraps a model and sleeps per call: a variant far slower than its baseline."""

    def __init__(self, inner: nn.Module, seconds: float) -> None:
        super().__init__()
        self.inner, self.seconds = inner, seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return self.inner(x)


def test_a_time_budget_scores_a_slow_variant_on_the_examples_it_reached(model, data):
    base = measure(model, data, name="fp32", batch_size=16, repeats=2)
    slow = measure(_Slow(model, 0.05), data, name="slow", baseline=base, batch_size=16, repeats=5, max_seconds=0.12)
    assert 16 <= slow.samples < len(data.labels) and slow.samples % 16 == 0
    assert f"{slow.samples} of {len(data.labels)} examples (time budget)" in slow.note
    assert slow.agreement == 1.0 and slow.accuracy_change(base) == 0.0  # same model, same examples
    assert 1 <= len(slow.latency_times_s) < 5  # the budget also stops the extra timed repeats
