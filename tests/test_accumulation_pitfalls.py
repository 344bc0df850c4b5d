"""accumulation_pitfalls: each way accumulation stops equalling one big batch, measured."""

import pytest

from workbench import RunConfig
from workbench.lessons import accumulation as pitfalls
from workbench.lessons.probe import make_probe


def test_batchnorm_breaks_accumulation_and_layernorm_does_not():
    images = make_probe(RunConfig(model="mlp", data="digits", preset="cpu-quick"), samples=16)
    rows = pitfalls.batchnorm_check(images, accum_steps=4)
    assert rows.value("BatchNorm1d", "gradient max relative difference") > 0.05
    assert rows.value("LayerNorm", "gradient max relative difference") <= 1e-5


def test_accelerates_scheduler_counts_optimizer_steps_not_micro_batches():
    rows = pitfalls.lr_schedule_check(accum_steps=2, optimizer_steps=3, warmup_steps=2)
    per_micro, per_step, accel = ([r[i] for r in rows.rows] for i in (2, 3, 4))
    assert per_step == accel == [0.5, 0.5, 1.0, 1.0, 1.0, 1.0]
    assert per_micro == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_a_short_last_window_is_scaled_by_its_size_over_k():
    rows = pitfalls.partial_window_check(micro_batches=7, accum_steps=3)
    third = pytest.approx(1 / 3, rel=1e-6)  # the gradient is a float32: 1/3 to rounding
    assert [r[1:] for r in rows.rows] == [(3, 1.0, 1.0), (3, 1.0, 1.0), (1, third, pytest.approx(1.0, rel=1e-6))]


def test_gating_the_step_by_hand_inside_accumulate_never_steps():
    rows = pitfalls.stepping_check(micro_batches=8, accum_steps=4)
    assert [r[1:] for r in rows.rows] == [(2, 2), (2, 0)]


def test_no_sync_all_reduces_once_per_window_with_the_same_gradients():
    rows = pitfalls.allreduce_check(accum_steps=3)
    (_, calls_each, bytes_each, same_each), (_, calls_once, bytes_once, same_once) = rows.rows
    assert (calls_each, calls_once) == (3, 1) and bytes_each == 3 * bytes_once
    assert same_each and same_once
    import torch.distributed as dist

    assert not dist.is_initialized()  # the group it made is gone


def test_batchnorm_check_explains_it_needs_images():
    text = make_probe(RunConfig(model="gpt", preset="cpu-quick", seq_len=16,
                                dims={"n_layer": 1, "n_head": 2, "d_model": 16}), samples=4)
    with pytest.raises(ValueError, match="needs image inputs"):
        pitfalls.batchnorm_check(text, accum_steps=2)
