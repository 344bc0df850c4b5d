"""Exact counts, checked against numbers worked out by hand and against the formulas."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from workbench.core.measure.counters import (
    SavedActivationCounter,
    gpt_activation_bytes_formula,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
)
from workbench.core.measure.flops import FlopCounter as counters_flop
from workbench.core.measure.flops import count_flops, gpt_flops_formula, matmul_parameter_count
from workbench.core.models import GPT
from workbench.core.saved import note_saved

# A small GPT: L=2 layers, h=64 wide, a=4 heads, s=32 positions, batch b=2, vocab V=97.
S, B, H, A, L, V = 32, 2, 64, 4, 2, 97


def make_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(V, S, n_layer=L, n_head=A, d_model=H)


def tokens() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, V, (B, S), generator=g), torch.randint(0, V, (B, S), generator=g)


def test_parameter_bytes_of_a_linear_3_to_4_are_16_floats():
    assert parameter_bytes(nn.Linear(3, 4)) == (3 * 4 + 4) * 4


def test_gradient_bytes_count_existing_grads_or_expected_ones():
    model = nn.Linear(3, 4)
    assert gradient_bytes(model) == 0
    assert gradient_bytes(model, expected=True) == 64
    model(torch.ones(2, 3)).sum().backward()
    assert gradient_bytes(model) == 64


def test_adamw_state_is_two_moments_plus_one_step_tensor_per_parameter():
    model = nn.Linear(3, 4)
    opt = torch.optim.AdamW(model.parameters())
    assert optimizer_state_bytes(opt) == 0  # state is created lazily, at the first step
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    # exp_avg + exp_avg_sq = 2 x 64 B; weight and bias each get a float32 `step` scalar: 2 x 4 B
    assert optimizer_state_bytes(opt) == 2 * 64 + 2 * 4


def test_saved_activations_of_linear_relu_equal_the_hand_count():
    model = nn.Linear(3, 4)
    with SavedActivationCounter(model) as saved:
        model(torch.ones(2, 3)).relu()
    # Linear keeps its input (2x3 floats = 24 B) for the weight gradient; ReLU keeps its
    # output (2x4 floats = 32 B). The weight it also keeps is a parameter: not counted.
    assert (saved.bytes, saved.count, saved.by_dtype) == (24 + 32, 2, {torch.float32: 56})


def test_parameters_and_their_views_are_not_counted_with_or_without_the_model():
    model = nn.Linear(3, 4)
    x = torch.ones(2, 3, requires_grad=True)  # now addmm also keeps weight.t(), a view
    with SavedActivationCounter(model) as with_model:
        model(x)
    with SavedActivationCounter() as without_model:
        model(x)
    assert with_model.bytes == without_model.bytes == 24


def test_buffers_of_the_model_passed_in_are_not_counted():
    model = nn.Module()
    model.register_buffer("scale", torch.ones(3))
    x = torch.ones(2, 3, requires_grad=True)
    with SavedActivationCounter(model) as saved:
        x * model.scale  # mul keeps the buffer for x's gradient
    assert saved.bytes == 0


def test_a_storage_saved_twice_through_two_views_is_counted_once_at_full_size():
    x = torch.ones(4, requires_grad=True)
    with SavedActivationCounter() as saved:
        y = x * 2  # multiplying by a Python number saves nothing
        y[:2].sin()  # keeps a view of y
        y[2:].cos()  # keeps another view of the same storage
    assert (saved.bytes, saved.count) == (4 * 4, 1)


def test_counter_works_on_meta_tensors_and_agrees_with_real_ones():
    with torch.device("meta"):
        model = nn.Linear(3, 4)
        x = torch.ones(2, 3)
    assert x.data_ptr() == 0  # why the counter keys on the storage, not data_ptr
    with SavedActivationCounter(model) as saved:
        model(x).relu()
    assert saved.bytes == 56


def test_note_saved_adds_to_the_innermost_active_counter_only():
    t = torch.ones(5)
    note_saved(t)  # no counter active: a no-op
    with SavedActivationCounter() as outer:
        with SavedActivationCounter() as inner:
            note_saved(t)
            note_saved(t[1:])  # same storage: counted once
        note_saved(torch.ones(2))
    assert (inner.bytes, outer.bytes) == (20, 8)


def test_count_flops_of_a_linear_is_2mnk_forward_and_3x_with_backward():
    model = nn.Linear(3, 4)
    x = torch.ones(2, 3, requires_grad=True)
    assert count_flops(model, x) == 2 * 2 * 3 * 4
    assert count_flops(lambda: model(x).sum().backward()) == 3 * 2 * 2 * 3 * 4


def test_gpt_saved_activations_match_the_korthikanti_formula_without_dropout():
    model = make_gpt()
    x, _ = tokens()
    with SavedActivationCounter(model) as saved:
        model(x)
    # Blocks: L x 4 x (16sbh + as²b + 4sb); around them the token ids (8sb), the final
    # LayerNorm's input and statistics and the lm_head's input. No loss, so no logits.
    expected = gpt_activation_bytes_formula(S, B, H, A, L, vocab_size=V)
    assert abs(saved.bytes - expected) <= 0.001 * expected
    assert saved.bytes == expected  # in fact exact, on CPU
    # The blocks alone, counted from the embedding output on:
    h0 = (model.wte(x) + model.wpe.weight[:S]).detach().requires_grad_()
    with SavedActivationCounter(model) as blocks:
        for block in model.blocks:
            h0 = block(h0)
    assert blocks.bytes == gpt_activation_bytes_formula(S, B, H, A, L)


def test_gpt_saved_activations_on_meta_tensors_equal_the_real_count():
    with torch.device("meta"):
        model = GPT(V, S, n_layer=L, n_head=A, d_model=H)
    with SavedActivationCounter(model) as saved:
        model(torch.zeros(B, S, dtype=torch.long, device="meta"))
    assert saved.bytes == gpt_activation_bytes_formula(S, B, H, A, L, vocab_size=V)


def test_gpt_train_step_flops_equal_6N_per_token_plus_attention_exactly():
    model = make_gpt()
    x, y = tokens()
    n = matmul_parameter_count(model)
    assert n == 12 * L * H * H + V * H  # block matrices + the (tied) lm_head

    def step() -> None:
        F.cross_entropy(model(x).flatten(0, -2), y.flatten()).backward()

    assert count_flops(step) == gpt_flops_formula(n, B * S, L, H, S)


def test_layernorm_statistics_are_about_a_quarter_h_th_of_a_layer_as_the_formula_says():
    model = make_gpt()
    x, _ = tokens()
    block = model.blocks[0]
    h0 = (model.wte(x) + model.wpe.weight[:S]).detach().requires_grad_()
    with SavedActivationCounter(model) as layer:
        block(h0)
    stats = []  # the (b, s, 1) mean and rstd a LayerNorm saves (only the innermost hooks run: a second pass)
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: (stats.append(t) if t.shape == (B, S, 1) else None) or t, lambda t: t):
        block(h0)
    assert len(stats) == 4 and sum(t.numel() * t.element_size() for t in stats) == 4 * 4 * S * B
    share = 4 * 4 * S * B / layer.bytes  # 0.31% here: about 1/(4h) = 0.39%, not 4/h = 6%
    assert share < 1 / (4 * H) < 1.3 * share
    doc = gpt_activation_bytes_formula.__doc__
    assert "1/(4h)" in doc and "4/h" not in doc


def test_a_checkpointed_blocks_input_reaches_the_outer_hooks_and_is_counted_once(monkeypatch):
    from workbench.core.measure import counters
    from workbench.core.switches.activation_checkpointing import set_activation_checkpointing

    model = set_activation_checkpointing(make_gpt(), "all")
    x, _ = tokens()

    def count() -> int:
        with SavedActivationCounter(model) as saved:
            model(x)
        return saved.bytes

    reported = count()  # the hooks and note_saved both see each block's input
    monkeypatch.setattr(counters, "listening", lambda callback: contextlib.nullcontext())
    assert count() == reported  # torch 2.13: the hooks alone see it, so nothing is counted twice
    inputs = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda module, args: inputs.append(args[0].untyped_storage()._cdata))
    seen = set()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.add(t.untyped_storage()._cdata) or t, lambda t: t):
        model(x)
    assert len(inputs) == L and all(i in seen for i in inputs)
    assert "storages are deduplicated" in SavedActivationCounter.__doc__


def test_the_flop_counter_records_each_ops_flops_bytes_and_dtype():
    a, b = torch.ones(4, 8), torch.ones(8, 2)
    with counters_flop(record_ops=True) as flops:
        (a @ b).t().relu()
    matmul, view, relu = flops.ops
    assert matmul == (2 * 4 * 8 * 2, 4 * (32 + 16 + 8), "fp32")  # reads a and b, writes 4x2
    assert view == (0, 0, "fp32") and relu == (0, 4 * (8 + 8), "fp32")
    with counters_flop(record_ops=True) as half:
        a.bfloat16() @ b.bfloat16()
    assert half.ops[-1][2] == "bf16" and flops.total == 128


def test_a_counter_around_an_accumulation_window_counts_every_micro_batch():
    """Micro-batch k+1 may get storages at the addresses micro-batch k's backward freed: each
    forward's are counted all the same (helper measurement before the fix: 8,150,544 bytes for
    4 micro-batches whose one is 2,628,612)."""
    import torch

    from workbench.core.measure.counters import SavedActivationCounter
    from workbench.core.models import GPT, loss_fn

    torch.manual_seed(0)
    model = GPT(64, 16, n_layer=2, n_head=2, d_model=32)
    x = torch.randint(0, 64, (2, 16))
    with SavedActivationCounter(model) as one:
        loss_fn(model(x), x).backward()
    with SavedActivationCounter(model) as window:
        for _ in range(4):
            (loss_fn(model(x), x) / 4).backward()
    assert one.bytes > 0 and window.bytes == 4 * one.bytes and window.count == 4 * one.count
