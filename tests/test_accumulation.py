"""accumulation: k micro-batches equal one batch of k·b, memory follows the micro-batch, the token fix."""

import pytest

from workbench import RunConfig
from workbench.lessons import accumulation
from workbench.lessons.probe import make_probe

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
        accumulation.window_peak(gpt_probe, micro_batch=2, accum_steps=0)


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


def test_claim_rows_hold_for_an_accumulated_run_and_its_big_batch_twin():
    import dataclasses

    from workbench import run
    big = dataclasses.replace(TINY_GPT, batch_size=8, steps=3, eval_samples=0)
    baseline = run(big, sinks=[])
    accumulated = run(dataclasses.replace(big, batch_size=2, grad_accum_steps=4), sinks=[])
    rows = accumulation.claim_rows(baseline, accumulated)
    assert [r[3].split(":")[0] for r in rows] == ["holds", "holds in part", "holds", "does not hold here"]
    assert rows[3][2] == "0 optimizer steps in 12 micro-batches"
