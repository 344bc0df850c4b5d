"""accumulation: k micro-batches equal one batch of k·b, memory follows the micro-batch, the token fix."""

import pytest

from workbench import RunConfig
from workbench.measure.probe import make_probe
from workbench.lessons import accumulation

TINY_GPT = RunConfig(model="gpt", preset="cpu-quick", seq_len=16, dims={"n_layer": 2, "n_head": 2, "d_model": 32})


@pytest.fixture(scope="module")
def gpt_probe():
    return make_probe(TINY_GPT, samples=8)


def test_accumulated_gradients_equal_one_big_batch_and_undivided_ones_are_k_times_larger(gpt_probe):
    rows = accumulation.accumulation_check(gpt_probe, accum_steps=4)
    assert rows.value("manual: loss / 4, backward per micro-batch", "max relative difference") <= 1e-5
    assert rows.value("accelerate: accumulate() + backward()", "max relative difference") <= 1e-5
    assert rows.value("accelerate: accumulate() + backward()", "optimizer steps") == 1
    assert rows.value("pitfall: loss not divided", "gradient norm / reference") == pytest.approx(4, rel=1e-5)


def test_checks_reject_an_accumulation_that_does_not_divide_the_probe(gpt_probe):
    with pytest.raises(ValueError, match="accum_steps=3 must divide the probe's 8 samples"):
        accumulation.accumulation_check(gpt_probe, accum_steps=3)
    with pytest.raises(ValueError, match="accum_steps=0 must be a whole number >= 1"):
        accumulation.padding_check(gpt_probe, accum_steps=0)


def test_per_micro_batch_token_means_differ_and_the_window_token_count_fixes_it(gpt_probe):
    rows = accumulation.padding_check(gpt_probe, accum_steps=4)
    assert rows.value("pitfall: mean per micro-batch, / 4", "max relative difference") > 0.01
    assert rows.value("fix: token sum / tokens in the window", "max relative difference") <= 1e-5
    assert rows.value("fix with accelerate: token sum / window tokens x 4", "max relative difference") <= 1e-5
    reference = rows.rows[0][2]
    assert rows.value("fix: token sum / tokens in the window", "window loss") == pytest.approx(reference, rel=1e-5)


def test_padding_check_explains_it_needs_token_labels():
    images = make_probe(RunConfig(model="mlp", data="digits", preset="cpu-quick"), samples=4)
    with pytest.raises(ValueError, match="token-level labels"):
        accumulation.padding_check(images, accum_steps=2)


def test_padded_labels_keep_a_prefix_of_each_sequence_longest_first(gpt_probe):
    labels, lengths = accumulation.padded_labels(gpt_probe.labels)
    assert lengths.tolist() == sorted(lengths.tolist(), reverse=True)
    assert ((labels != -100).sum(1) == lengths).all()












def test_the_peak_of_a_window_is_one_micro_batch_peak_plus_at_most_the_gradients_held(gpt_probe):
    one = accumulation.window_peak(gpt_probe, micro_batch=2, accum_steps=1)
    window = accumulation.window_peak(gpt_probe, micro_batch=2, accum_steps=4)
    big = accumulation.window_peak(gpt_probe, micro_batch=8, accum_steps=1)
    grad_bytes = sum(p.numel() * 4 for p in gpt_probe.new_model().parameters())
    assert 0 <= window.bytes - one.bytes <= grad_bytes  # the gradients held across the window, at most
    assert window.bytes < big.bytes
    with pytest.raises(ValueError, match="samples >= 16"):
        accumulation.window_peak(gpt_probe, micro_batch=4, accum_steps=4)


def test_effective_batch_is_the_product_and_rejects_zero():
    assert accumulation.effective_batch(8, 4, 2) == 64
    with pytest.raises(ValueError, match="accum_steps=0"):
        accumulation.effective_batch(8, 0)


def test_effective_batch_table_counts_optimizer_steps_and_left_over_micro_batches():
    rows = accumulation.effective_batch_table([(8, 4), (8, 4, 2)], train_samples=1000)
    # 1000 // 8 = 125 micro-batches: 31 windows of 4, 1 left over; over 2 processes 62 each: 15, 2.
    assert [r[3:] for r in rows.rows] == [(32, 125, 31, 1), (64, 62, 15, 2)]
