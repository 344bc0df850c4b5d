"""estimate(): memory and FLOPs of a step before running it, on fake tensors, against run()."""

from __future__ import annotations

import time

import pytest

from workbench import RunConfig, run
from workbench.core.data import load_data
from workbench.measure.counters import gpt_activation_bytes_formula, gpt_flops_formula
from workbench.measure.estimate import (
    _freeze,
    _measure,
    _per_micro_batch,
    _spec_key,
    accelerate_estimate,
    estimate,
    input_spec,
)

BIG = dict(n_layer=32, n_head=32, d_model=2560)  # GPT-Neo 2.7B's shape, the seed's "3B"


def test_input_specs_match_what_load_data_builds():
    for cfg in (RunConfig(model="mlp", data="mnist"), RunConfig(model="cnn", data="digits"), RunConfig(model="gpt")):
        spec, r = input_spec(cfg), cfg.resolved()
        # the arguments run() loads with at eval_samples=0, so the runs below reuse the cache
        bundle = load_data(r.data, seq_len=r.seq_len or 128, max_test=None, seed=r.seed)
        assert (spec.task, tuple(spec.input_shape), spec.num_classes, spec.vocab_size) == (
            bundle.task, tuple(bundle.input_shape), bundle.num_classes, bundle.vocab_size)


def test_every_image_data_set_declares_the_shape_load_data_serves():
    from workbench.core.data import DATASETS

    for name, info in DATASETS.items():
        if info.task == "image_classification":
            assert info.input_shape == load_data(name, max_train=64).input_shape, name
    assert input_spec(RunConfig(model="mlp", data="mnist_files")).input_shape == (1, 28, 28)


@pytest.mark.parametrize("changes", [
    dict(model="mlp"),
    dict(model="gpt"),
    dict(model="gpt", precision="bf16"),
    dict(model="gpt", activation_checkpointing="all"),
    dict(model="gpt", precision="bf16", activation_checkpointing="every_other", grad_accum_steps=2, batch_size=5),
], ids=lambda c: "-".join(str(v) for v in c.values()))
def test_estimate_is_within_5_percent_of_the_counts_run_measures(changes):
    cfg = RunConfig(steps=1, eval_samples=0, **changes)
    est, result = estimate(cfg), run(cfg, sinks=[])
    m = result.memory
    pairs = [(est.parameter_bytes, m.parameter_bytes), (est.gradient_bytes, m.gradient_bytes),
             (est.optimizer_state_bytes, m.optimizer_state_bytes), (est.activation_bytes, m.activation_bytes),
             (est.flops_per_step, result.flops_per_step)]
    for predicted, measured in pairs:
        assert abs(predicted - measured) <= 0.05 * measured, pairs
    if cfg.precision == "fp32":  # same counters on fake tensors: exact, not just close
        assert [p for p, _ in pairs] == [q for _, q in pairs]


def test_a_layer_measured_and_scaled_equals_the_whole_model_measured():
    cfg = RunConfig(model="gpt", dims={"n_layer": 3}, activation_checkpointing="every_other", batch_size=3).resolved()
    key = _spec_key(input_spec(cfg))
    scaled = _per_micro_batch(cfg, key, 3)[:2]
    whole = _measure("gpt", key, _freeze(cfg.dims), "fp32", "every_other", 3)[:2]
    assert scaled == whole


def test_a_3b_gpt_is_estimated_from_its_shape_in_seconds_and_matches_the_formulas():
    L, d, a, s, V, b = 32, 2560, 32, 1024, 50257, 4
    start = time.perf_counter()
    est = estimate(RunConfig(model="gpt", dims=BIG, seq_len=s, batch_size=b), vocab_size=V)
    assert time.perf_counter() - start < 30  # ~2 s here; a 2-core CI machine is slower
    assert est.parameter_count == 12 * L * d * d + 13 * L * d + V * d + s * d + 2 * d  # 2.65e9
    assert est.parameter_bytes == est.gradient_bytes == 4 * est.parameter_count
    assert est.optimizer_state_bytes == 8 * est.parameter_count + 4 * (12 * L + 4)  # moments + a step per tensor
    # Korthikanti's per-layer count (counters.gpt_activation_bytes_formula) plus the loss:
    # log_softmax's fp32 output (sbV), the int64 labels and one scalar.
    loss = 4 * s * b * V + 8 * s * b + 4
    assert est.activation_bytes == gpt_activation_bytes_formula(s, b, d, a, L, 4, vocab_size=V) + loss
    assert est.flops_per_step == gpt_flops_formula(12 * L * d * d + V * d, s * b, L, d, s)


def test_accelerate_estimate_is_the_largest_component_without_activations():
    cfg = RunConfig(model="gpt")
    est, acc = estimate(cfg), accelerate_estimate(cfg)
    # accelerate counts buffers too, a bool element as one bit (the causal mask is bool)
    assert acc["total_size"] == est.parameter_bytes + est.buffer_bytes // 8
    assert acc["training"] == acc["step"] == 4 * acc["total_size"]  # fp32 Adam: max, not sum
    bf16 = accelerate_estimate(RunConfig(model="gpt", precision="bf16"))
    assert bf16["training"] == 2 * bf16["total_size"]


def test_estimate_rejects_what_it_cannot_size_with_one_line_errors():
    with pytest.raises(ValueError, match="minilm"):
        estimate(RunConfig(model="minilm"))
    with pytest.raises(ValueError, match="vocab_size=1"):
        estimate(RunConfig(model="gpt"), vocab_size=1)
    with pytest.raises(ValueError, match="built-in data set's shape"):
        estimate(RunConfig(model="mlp", data="hub:someone/images"))
