"""Training fewer bytes: freezing, LoRA, the optimizers' state, sharding across processes.

Every byte count here is derived by hand from the model's shape and asserted exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch

from workbench import ConfigError, RunConfig
from workbench.core.data import load_data
from workbench.core.engine.train import run as train_run
from workbench.core.measure.counters import optimizer_state_bytes, shard_rows, sharded_bytes
from workbench.core.models import build_model
from workbench.core.switches.optimizer import make_optimizer
from workbench.core.switches.trainable import add_lora, freeze_parts, lora_parameter_count, model_parts
from workbench.launching.launch import launch_function
from workbench.planner.communication import CollectiveCounter, wire_bytes
from workbench.planner.estimate import estimate
from workbench.planner.fit import check_fits

run = functools.partial(train_run, check_fit=check_fits)  # as wb.run does, without its default view

D, L, S, V = 32, 2, 16, 256  # tiny GPT: width, blocks, sequence, byte vocabulary
TINY_GPT = dict(model="gpt", dims={"n_layer": L, "n_head": 2, "d_model": D}, seq_len=S, batch_size=4,
                steps=2, log_every=1, eval_samples=0)
BLOCK = 12 * D * D + 13 * D  # ln_1, c_attn, c_proj, ln_2, mlp in, mlp out: weights and biases
BLOCK_TENSORS = 12
ALL = V * D + S * D + L * BLOCK + 2 * D  # wte (= lm_head, tied), wpe, blocks, ln_f


def _bytes(result):
    m = result.memory
    return m.parameter_bytes, m.gradient_bytes, m.optimizer_state_bytes


def _adamw(trainable: int, tensors: int) -> int:
    """AdamW: exp_avg and exp_avg_sq (fp32) per value, a 4-byte step per tensor."""
    return 8 * trainable + 4 * tensors


# -- freezing --

def test_the_tiny_gpt_has_the_parameters_derived_by_hand():
    bundle = load_data("rotten_tomatoes_lm", seq_len=S)
    model = build_model("gpt", data=bundle, dims=TINY_GPT["dims"])
    assert sum(p.numel() for p in model.parameters()) == ALL


def test_freezing_embeddings_and_the_first_block_drops_their_gradients_and_optimizer_state_exactly():
    result = run(RunConfig(**TINY_GPT, freeze="embeddings", freeze_layers=1), sinks=[])
    trainable = BLOCK + 2 * D  # block 1 and ln_f; wte froze the tied lm_head with it
    assert _bytes(result) == (4 * ALL, 4 * trainable, _adamw(trainable, BLOCK_TENSORS + 2))


def test_freezing_all_but_the_head_of_the_mlp_trains_its_last_layer_only():
    result = run(RunConfig(model="mlp", data="digits", dims={"hidden": (32,)}, steps=2, eval_samples=0,
                           freeze="all_but_head"), sinks=[])
    head = 32 * 10 + 10
    assert _bytes(result)[1:] == (4 * head, _adamw(head, 2))


def test_the_seeds_layer1_filter_freezes_nothing_in_minilm_and_its_real_layer_name_freezes_one_layer():
    bundle = load_data("rotten_tomatoes", seq_len=16, max_test=8)
    model = build_model("minilm", data=bundle, dims={})
    for name, param in model.named_parameters():  # seed 004 §6.1, as written (a ResNet's name)
        if "layer1" in name:
            param.requires_grad = False
    assert all(p.requires_grad for p in model.parameters())
    for name, param in model.named_parameters():
        if "layer.1." in name:  # BERT's name for its second layer
            param.requires_grad = False
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert frozen == sum(p.numel() for p in model_parts(model)["blocks"][1].parameters()) == 12 * 384 * 384 + 13 * 384


# -- LoRA --

def test_lora_trains_rank_times_in_plus_out_per_adapted_layer_and_nothing_else():
    r = 4
    result = run(RunConfig(**TINY_GPT, lora_rank=r), sinks=[])
    lora = L * r * ((D + 3 * D) + (D + D))  # c_attn (D -> 3D) and attn.c_proj (D -> D) per block
    assert _bytes(result) == (4 * (ALL + lora), 4 * lora, _adamw(lora, 4 * L))


def test_lora_parameter_count_matches_peft_on_minilm():
    bundle = load_data("rotten_tomatoes", seq_len=16, max_test=8)
    model = build_model("minilm", data=bundle, dims={})
    expected = lora_parameter_count(model, rank=8, targets="attention_mlp")
    assert expected == 6 * 8 * (4 * (384 + 384) + (384 + 1536) + (1536 + 384))
    adapted = add_lora(model, rank=8, targets="attention_mlp")
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert trainable == expected + 384 * 2 + 2  # and the fresh classifier, whole


def test_merged_lora_weights_give_the_adapted_models_outputs():
    bundle = load_data("rotten_tomatoes_lm", seq_len=S)
    model = add_lora(build_model("gpt", data=bundle, dims=TINY_GPT["dims"], seed=0), rank=4)
    for name, p in model.named_parameters():  # B starts at zero: give the adapters something to add
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    x = torch.randint(0, V, (3, S))
    model.eval()
    adapted = model(x)
    base_only = model.get_base_model()
    with model.disable_adapter():
        assert not torch.allclose(base_only(x), adapted, atol=1e-4)  # the adapters matter
    merged = model.merge_and_unload()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(merged(x), adapted, atol=1e-5, rtol=1e-5)


# -- optimizers --

def _state_after_one_step(optimizer: str, model: torch.nn.Module) -> int:
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt = make_optimizer(model, RunConfig(model="mlp", optimizer=optimizer).resolved())
    opt.step()
    return optimizer_state_bytes(opt)


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "adafactor", "adamw8bit"])
def test_each_optimizers_state_bytes_follow_its_formula(name):
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 24))  # 8,192 and 3,072 weights
    shapes = [tuple(p.shape) for p in model.parameters()]  # (128, 64), (128,), (24, 128), (24,)
    numels = [torch.Size(s).numel() for s in shapes]
    if name == "sgd":  # a momentum buffer, no step count
        expected = 4 * sum(numels)
    elif name in ("adam", "adamw"):
        expected = 8 * sum(numels) + 4 * len(shapes)
    elif name == "adafactor":  # a row and a column mean per matrix, a full vector per vector, a step each
        expected = sum(4 * (s[0] + s[1]) if len(s) == 2 else 4 * s[0] for s in shapes) + 4 * len(shapes)
    else:  # 8 bits a value, a 4-byte scale per 256, a 256-entry fp32 table; small tensors fp32
        def moment(n):
            return n + 4 * (n // 256) + 4 * 256 if n >= 4096 and n % 256 == 0 else 4 * n

        expected = sum(2 * moment(n) for n in numels) + 4 * len(shapes)
    assert _state_after_one_step(name, model) == expected


def test_lamb_is_not_in_torch_optim():
    assert not hasattr(torch.optim, "Lamb")  # seed 004 §6.2 calls torch.optim.Lamb


@pytest.mark.parametrize("changes", [dict(freeze="embeddings", freeze_layers=1), dict(lora_rank=4),
                                     dict(optimizer="adafactor"), dict(optimizer="adamw8bit"),
                                     dict(freeze="all_but_head", optimizer="sgd")])
def test_the_estimate_counts_the_model_state_run_measures(changes):
    cfg = RunConfig(**TINY_GPT, **changes)
    est = estimate(cfg)
    assert (est.parameter_bytes, est.gradient_bytes, est.optimizer_state_bytes) == _bytes(run(cfg, sinks=[]))


# -- sharding --

def _sharded_and_plain(cfg: RunConfig):
    """In each of 2 processes: what accelerate does with its FSDP plugin on CPU, then a plain
    data-parallel run and a sharded one, each counting the collectives it calls."""
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    from workbench.core.engine.accelerator import reset_accelerate_state

    reset_accelerate_state()
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    wrapped = type(accelerator.prepare(torch.nn.Linear(4, 4))).__name__
    out = {"plugin": (str(accelerator.distributed_type), wrapped)}
    for sharding in ("none", "full"):
        with CollectiveCounter() as comm:
            result = run(dataclasses.replace(cfg, sharding=sharding), sinks=[])
        out[sharding] = (result.losses, _bytes(result), comm.bytes)
    return out


def test_a_sharded_run_holds_its_share_of_the_model_state_and_learns_like_data_parallel():
    cfg = RunConfig(**{**TINY_GPT, "steps": 3}, device="cpu")
    ranks = launch_function(_sharded_and_plain, cfg, num_processes=2, device="cpu", timeout_s=240)
    bundle = load_data("rotten_tomatoes_lm", seq_len=S)
    params = list(build_model("gpt", data=bundle, dims=TINY_GPT["dims"]).parameters())
    for rank, out in enumerate(ranks):
        # accelerate 1.15 on CPU processes: the FSDP plugin is dropped, the model wrapped in DDP
        assert out["plugin"] == ("DistributedType.MULTI_CPU", "DistributedDataParallel")
        plain, sharded = out["none"], out["full"]
        assert plain[1] == (4 * ALL, 4 * ALL, _adamw(ALL, len(params)))
        share = sharded_bytes(params, processes=2, rank=rank)
        assert sharded[1] == (share, share, 2 * share + 4 * len(params))  # steps stay whole
        torch.testing.assert_close(sharded[0], plain[0], atol=1e-5, rtol=0)
    assert ranks[0]["full"][1][0] + ranks[1]["full"][1][0] == 4 * ALL  # the shares add up to the model
    assert estimate(dataclasses.replace(cfg, sharding="full"), processes=2).parameter_bytes == ranks[0]["full"][1][0]
    # Communication per run: the gradients reduce-scattered each step, the parameters gathered
    # before each forward and again (blocks only: the root stays gathered) before each backward.
    steps, root = cfg.steps, 4 * (V * D + S * D + 2 * D)
    comm = ranks[0]["full"][2]
    assert comm["reduce_scatter"] == steps * 4 * ALL
    assert comm["all_gather"] == steps * (2 * 4 * ALL - root)
    assert wire_bytes("all_reduce", 4 * ALL, 2) == 4 * ALL


def test_sharding_in_one_process_says_how_to_launch():
    with pytest.raises(ValueError, match=r"start it with wb.launch\(config, num_processes=2\)"):
        run(RunConfig(**TINY_GPT, sharding="full"), sinks=[])


def test_shard_rows_split_a_first_dimension_as_fsdp2_does():
    assert [shard_rows(7, 2, r) for r in (0, 1)] == [4, 3]
    assert [shard_rows(5, 4, r) for r in range(4)] == [2, 2, 1, 0]


# -- validation --

@pytest.mark.parametrize("changes, message", [
    (dict(model="mlp", dims=None, freeze="embeddings"), r"freeze='embeddings' needs a model with embeddings"),
    (dict(freeze="everything"), r"freeze='everything' is not known"),
    (dict(freeze_layers=3), r"freeze_layers=3 must be 0..2 for model='gpt'"),
    (dict(freeze_layers=-1), r"freeze_layers=-1 must be 0..2"),
    (dict(freeze="all_but_head", freeze_layers=1), r"nothing left to freeze"),
    (dict(model="mlp", dims=None, lora_rank=8), r"lora_rank=8 adapts transformer layers"),
    (dict(lora_rank=8, freeze="embeddings"), r"leave freeze='none'"),
    (dict(lora_rank=-1), r"lora_rank=-1 must not be negative"),
    (dict(lora_alpha=16.0), r"lora_alpha=16.0 needs lora_rank >= 1"),
    (dict(lora_rank=8, lora_targets="mlp"), r"lora_targets='mlp' is not known"),
    (dict(sharding="zero2"), r"sharding='zero2' is not known"),
    (dict(sharding="full", precision="bf16"), r"use precision='fp32'"),
    (dict(sharding="full", save_state_dir="somewhere"), r"does not support save_state_dir"),
    (dict(lora_rank="8"), r"lora_rank must be a whole number"),
])
def test_config_rejects_what_cannot_train_fewer_bytes_in_one_line(changes, message):
    with pytest.raises(ConfigError, match=message) as error:
        RunConfig(**{**TINY_GPT, **changes})
    assert "\n" not in str(error.value)


def test_freeze_parts_rejects_a_layer_count_the_model_lacks():
    bundle = load_data("rotten_tomatoes_lm", seq_len=S)
    with pytest.raises(ValueError, match="the model has 2 blocks"):
        freeze_parts(build_model("gpt", data=bundle, dims=TINY_GPT["dims"]), "none", first_layers=5)


def test_estimate_of_a_sharded_config_needs_the_process_count():
    with pytest.raises(ValueError, match="pass processes=2 or more"):
        estimate(RunConfig(**TINY_GPT, sharding="full"))


def test_the_planner_offers_freezing_lora_and_sharding_with_their_costs():
    from workbench.planner.planning import Target, plan

    base = RunConfig(**TINY_GPT)
    plain = estimate(base)
    budget = plain.counted_bytes - 1  # the baseline does not fit; training fewer bytes does
    plans = plan(base, target=Target.this_machine(memory_budget_bytes=budget), precisions=["fp32"],
                 checkpointing=["none"], micro_batches=[4], trainable=[{}, {"lora_rank": 4}],
                 sharding=["none", "full"], processes=2)
    assert len(plans) == 4 and not plans.where(lora_rank=0, sharding="none")[0].fits
    lora = plans.where(lora_rank=4, sharding="none")[0]
    assert lora.fits and "LoRA rank 4 on attention" in lora.label and "trains" in lora.cost
    sharded = plans.where(lora_rank=0, sharding="full")[0]
    assert sharded.estimate.model_state_bytes == (plain.model_state_bytes - 4 * 28) // 2 + 4 * 28
    assert "sharded over 2 processes" in sharded.label and "gather parameters" in sharded.cost


# -- the lesson module's counters (notebook 09) -------------------------------------------------------

def test_one_step_bytes_counts_no_gradient_and_no_state_for_a_frozen_part():
    from workbench.lessons.fewer_bytes import one_step_bytes

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    model[0].requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    batch = {"inputs": torch.ones(2, 4), "labels": torch.zeros(2, dtype=torch.long)}
    held = one_step_bytes(model, optimizer, batch)
    trained = 8 * 3 + 3
    assert (held.parameter_bytes, held.gradient_bytes) == (4 * (4 * 8 + 8 + trained), 4 * trained)
    assert held.optimizer_state_bytes == 8 * trained + 4 * 2  # two moments, a step count per tensor
    assert all(p.grad is None for p in model.parameters())  # zeroed after counting


def test_state_bytes_counts_each_optimizer_after_one_step_including_torchao_8bit_eagerly():
    from workbench.lessons.fewer_bytes import quiet_torchao, state_bytes

    with quiet_torchao():
        from torchao.optim import AdamW8bit
    layer = torch.nn.Linear(64, 64, bias=False)  # 4,096 values: the smallest tensor torchao quantizes
    make = lambda cls, **kw: cls(copy.deepcopy(layer).parameters(), lr=1e-3, **kw)
    counted = state_bytes({"sgd": make(torch.optim.SGD, momentum=0.9), "adamw": make(torch.optim.AdamW),
                           "adamw8bit": make(AdamW8bit)})
    n = 64 * 64
    assert counted["sgd"] == 4 * n and counted["adamw"] == 8 * n + 4
    assert counted["adamw8bit"] == 2 * (n + 4 * (n // 256) + 4 * 256) + 4  # codes, a scale per 256, a table; step
