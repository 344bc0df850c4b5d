"""probe: one step measured outside run(), on the model and data run() would build."""

import pytest
import torch
from torch import nn

from workbench import RunConfig
from workbench.lessons.probe import gradients, make_probe, max_relative_difference, step_peak

TINY_GPT = RunConfig(model="gpt", preset="cpu-quick", seq_len=16, dims={"n_layer": 2, "n_head": 2, "d_model": 32})


def test_a_probe_builds_the_same_weights_every_time_and_a_fixed_batch():
    probe = make_probe(TINY_GPT, samples=4)
    a, b = probe.new_model(), probe.new_model()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert probe.inputs.shape == probe.labels.shape == (4, 16) and a.training


def test_make_probe_rejects_a_sample_count_the_data_cannot_give():
    with pytest.raises(ValueError, match="samples=0 must be a positive"):
        make_probe(TINY_GPT, samples=0)
    with pytest.raises(ValueError, match="pass samples <="):
        make_probe(RunConfig(model="mlp", data="digits", preset="cpu-quick"), samples=10**6)


def test_max_relative_difference_is_per_tensor_against_its_largest_entry():
    reference = [torch.tensor([1000.0, 1.0]), torch.tensor([0.5, 0.0])]
    got = [torch.tensor([1000.0, 2.0]), torch.tensor([0.5, 0.05])]
    # First tensor: error 1 against 1000; second: 0.05 against 0.5, the worst.
    assert max_relative_difference(got, reference) == pytest.approx(0.1)
    assert max_relative_difference(reference, reference) == 0.0
    with pytest.raises(ValueError, match="same model"):
        max_relative_difference(got[:1], reference)


def test_gradients_copies_and_fills_missing_ones_with_zeros():
    model = nn.Linear(2, 1)
    grads = gradients(model)
    assert [g.abs().sum().item() for g in grads] == [0.0, 0.0]
    model(torch.ones(1, 2)).sum().backward()
    copy = gradients(model)
    model.weight.grad.zero_()
    assert copy[0].tolist() == [[1.0, 1.0]]


def test_step_peak_on_cpu_counts_live_tensor_bytes_exactly():
    model = nn.Linear(256, 256, bias=False)  # 256 KiB of weights

    def step():
        big = torch.ones(1024, 256)  # 1 MiB, alive with the weights
        del big

    reading = step_peak(step, track=[model])
    assert reading.kind == "tensor peak (MemTracker)"
    assert reading.bytes == 256 * 256 * 4 + 1024 * 256 * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: reads the CUDA allocator's peak")
def test_step_peak_on_a_gpu_reads_the_allocator_peak():
    model = nn.Linear(256, 256, bias=False).cuda()
    reading = step_peak(lambda: torch.ones(1024, 256, device="cuda"), track=[model], device="cuda")
    assert reading.kind == "CUDA allocator peak" and reading.bytes >= 256 * 256 * 4 + 1024 * 256 * 4
