"""Your own model and data: an nn.Module and a Dataset (or (train, test), or a DataLoader) in
place of the built-in names, in run(), estimate() and the planner, with one-line refusals."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from workbench import RunConfig, run
from workbench.core.config import ConfigError
from workbench.core.views.sinks import RecordingSink
from workbench.planner.estimate import estimate
from workbench.planner.fit import DoesNotFit, check_fits, floor_bytes

QUICK = dict(steps=4, log_every=2, eval_samples=0)


class MyMLP(nn.Module):
    """The learner's own 784-256-256-10 MLP: the built-in model='mlp' at dims hidden=(256, 256)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                    nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Tiny(nn.Module):
    def __init__(self, features: int = 8, classes: int = 2) -> None:
        super().__init__()
        self.hidden, self.head = nn.Linear(features, 16), nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(x)))


class TinyLM(nn.Module):
    """Token ids (batch, seq) -> (batch, seq, vocab) logits."""

    def __init__(self, vocab: int = 256) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, 16), nn.Linear(16, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def pairs(n: int = 256, seed: int = 0) -> TensorDataset:
    """(x, y) pairs a small model learns: the label is the sign of the first feature."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _error(**kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        RunConfig(**kwargs)
    assert "\n" not in str(info.value), "errors are one line"
    return str(info.value)


def _run_error(config: RunConfig) -> str:
    with pytest.raises(ConfigError) as info:
        run(config, sinks=[])
    assert "\n" not in str(info.value), "errors are one line"
    return str(info.value)


# --- run(): your module trains, measured like a built-in one ----------------------------------

def test_your_own_mlp_counts_exactly_what_the_built_in_mlp_counts():
    mine = run(RunConfig(model=MyMLP(), data="mnist", **QUICK), sinks=[])
    builtin = run(RunConfig(model="mlp", data="mnist", dims={"hidden": (256, 256)}, **QUICK), sinks=[])
    n = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10  # 269,322 parameters
    for result in (mine, builtin):
        m = result.memory
        assert m.parameter_bytes == m.gradient_bytes == 4 * n
        assert m.optimizer_state_bytes == 2 * 4 * n + 6 * 4  # AdamW's two moments, a step per tensor
        # batch 64 (cpu-quick's MLP batch): the flattened images, two ReLU outputs, the log-softmax,
        # the int64 labels and a scalar.
        assert m.activation_bytes == 4 * 64 * (784 + 256 + 256 + 10) + 8 * 64 + 4
        # 2 FLOPs a multiply-add forward, twice that backward, less the first layer's input gradient
        assert result.flops_per_step == 64 * (6 * (784 * 256 + 256 * 256 + 256 * 10) - 2 * 784 * 256)
    assert (mine.memory.activation_bytes, mine.flops_per_step) == (334_852, 77_529_088)
    assert mine.name == "MyMLP fp32 b64" and mine.tokens_per_sec is None


def test_your_model_trains_on_a_dataset_of_pairs():
    sink = RecordingSink()
    result = run(RunConfig(model=Tiny(), data=pairs(), batch_size=32, steps=40, log_every=10, lr=1e-2),
                 sinks=[sink], name="mine")
    assert result.status == "ok" and result.losses[-1] < 0.5 * result.losses[0]
    assert result.accuracy is None  # a plain Dataset holds no test split: nothing evaluated
    start = sink.starts[0].config
    assert start["model"] == "Tiny (178 parameters)" and start["data"] == "TensorDataset of 256 samples"
    json.dumps(start)  # what the sinks (and launch's queue) receive is plain


def test_a_train_test_pair_is_evaluated_on_its_test_set():
    result = run(RunConfig(model=Tiny(), data=(pairs(256), pairs(100, seed=1)), batch_size=32, steps=40,
                           log_every=10, lr=1e-2), sinks=[])
    assert result.config.eval_samples == 500  # the preset's; the test set holds 100: all are scored
    assert result.accuracy > 0.85 and result.eval_loss < result.losses[0]


def test_eval_samples_takes_the_first_test_samples():
    test = pairs(100, seed=1)
    wrong = TensorDataset(test.tensors[0], 1 - test.tensors[1])  # every label flipped from the 11th on
    wrong.tensors[1][:10] = test.tensors[1][:10]
    config = dict(model=Tiny(), batch_size=32, steps=40, log_every=10, lr=1e-2)
    first_ten = run(RunConfig(data=(pairs(256), wrong), eval_samples=10, **config), sinks=[])
    every = run(RunConfig(data=(pairs(256), wrong), **config), sinks=[])
    assert first_ten.accuracy > 0.8 and every.accuracy < 0.3


def test_a_dataloader_lends_its_batch_size_and_collate_and_the_run_reshuffles_with_its_seed():
    seen = []

    def collate(items):  # the learner's own collate_fn: it must be the one used
        seen.append(len(items))
        return {"inputs": torch.stack([x for x, _ in items]), "labels": torch.stack([y for _, y in items])}

    loader = DataLoader(pairs(), batch_size=16, shuffle=True, collate_fn=collate)  # its own shuffle is not used
    cfg = RunConfig(model=Tiny(), data=loader, **QUICK)
    assert cfg.resolved().batch_size == 16
    first, second = (run(cfg, sinks=[]) for _ in range(2))
    assert first.losses == second.losses  # the same seeded order, run after run
    assert 16 in seen
    assert RunConfig(model=Tiny(), data=loader, batch_size=8).resolved().batch_size == 8  # given: it wins


def test_dataloader_workers_batch_your_items_in_the_contract():
    loader = DataLoader(pairs(), batch_size=16, num_workers=2)
    result = run(RunConfig(model=Tiny(), data=loader, **QUICK), sinks=[])
    assert result.config.num_workers == 2 and result.status == "ok"


def test_your_module_trains_data_parallel_under_launch():
    from workbench.launching.launch import launch

    model, data = Tiny(), (pairs(256), pairs(100, seed=1))
    result = launch(RunConfig(model=model, data=data, batch_size=16, lr=1e-2, steps=20, log_every=10),
                    num_processes=2, sinks=[], timeout_s=120)
    assert result.status == "ok" and result.num_processes == 2 and result.name == "Tiny fp32 b16 x2"
    assert result.config.model is model and result.config.data is data  # the children's tensors stayed there
    assert result.accuracy > 0.8


def test_your_module_is_never_changed_and_keep_model_hands_back_the_trained_copy():
    model = Tiny().eval()
    before = copy.deepcopy(model.state_dict())
    result = run(RunConfig(model=model, data=pairs(), batch_size=32, lr=1e-2, **QUICK), sinks=[], keep_model=True)
    assert not model.training  # the mode it was given
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert result.model is not model
    assert not torch.equal(result.model.head.weight, model.head.weight)
    again = run(RunConfig(model=model, data=pairs(), batch_size=32, lr=1e-2, **QUICK), sinks=[])
    assert again.losses == result.losses  # every run starts from your weights


def test_integer_inputs_count_as_tokens():
    tokens = TensorDataset(torch.randint(0, 256, (64, 16)), torch.randint(0, 256, (64, 16)))
    result = run(RunConfig(model=TinyLM(), data=tokens, batch_size=8, **QUICK), sinks=[])
    assert result.tokens_per_sec == pytest.approx(16 * result.samples_per_sec)
    on_bytes = run(RunConfig(model=TinyLM(), data="rotten_tomatoes_lm", batch_size=4, **QUICK), sinks=[])
    assert on_bytes.config.seq_len == 64 and on_bytes.tokens_per_sec == pytest.approx(64 * on_bytes.samples_per_sec)


def test_dict_items_and_small_integer_labels_fit_the_contract():
    class Dicts(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return {"inputs": torch.full((8,), float(i % 2)), "labels": torch.tensor(i % 2, dtype=torch.int32)}

    assert run(RunConfig(model=Tiny(), data=Dicts(), batch_size=16, **QUICK), sinks=[]).status == "ok"


# --- estimate() and the planner on your module ---------------------------------------------------

@pytest.mark.parametrize("changes", [dict(), dict(precision="bf16"), dict(grad_accum_steps=2, batch_size=8)])
def test_estimate_of_your_module_equals_what_its_run_counts(changes):
    cfg = RunConfig(model=TinyLM(), data="rotten_tomatoes_lm", **{"batch_size": 4, **changes}, **QUICK)
    est, result = estimate(cfg), run(cfg, sinks=[])
    m = result.memory
    assert (est.parameter_bytes, est.gradient_bytes, est.optimizer_state_bytes, est.activation_bytes) == (
        m.parameter_bytes, m.gradient_bytes, m.optimizer_state_bytes, m.activation_bytes)
    assert est.flops_per_step == result.flops_per_step
    assert est.method.startswith("whole model replayed") and est.caption().startswith("TinyLM ")


def test_estimate_of_your_mlp_equals_the_built_in_mlps():
    mine = estimate(RunConfig(model=MyMLP(), data="mnist"))
    builtin = estimate(RunConfig(model="mlp", data="mnist", dims={"hidden": (256, 256)}))
    fields = ("parameter_count", "parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "activation_bytes",
              "flops_per_step", "peak_bytes")
    assert [getattr(mine, f) for f in fields] == [getattr(builtin, f) for f in fields]
    assert mine.activation_bytes == 334_852


def test_estimate_reads_a_datasets_shapes_and_leaves_your_module_alone():
    model = Tiny(features=8, classes=2)
    before = copy.deepcopy(model.state_dict())
    est = estimate(RunConfig(model=model, data=pairs(), batch_size=32))
    assert est.parameter_count == 8 * 16 + 16 + 16 * 2 + 2
    assert est.activation_bytes == run(RunConfig(model=model, data=pairs(), batch_size=32, **QUICK),
                                       sinks=[]).memory.activation_bytes
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_forward_that_reads_the_datas_values_cannot_be_estimated_but_still_runs():
    class Branchy(Tiny):
        def forward(self, x):
            return super().forward(x) if x.sum() > 0 else -super().forward(x)

    cfg = RunConfig(model=Branchy(), data=pairs(), batch_size=32, **QUICK)
    with pytest.raises(ValueError) as info:
        estimate(cfg)
    message = str(info.value)
    assert "\n" not in message and message.startswith("estimate() cannot trace model=Branchy(...) on fake tensors")
    assert "run() still trains it" in message
    assert run(cfg, sinks=[]).status == "ok"


def test_the_planner_ranks_plans_for_your_module():
    from workbench.planner.planning import Target, plan

    plans = plan(RunConfig(model=MyMLP(), data="mnist", batch_size=64),
                 target=Target.gpu("A100 SXM4 40GB", memory_bytes=40 * 2**30), effective_batch=64)
    assert plans.best is not None and len(plans) == 2 * 7  # bf16/fp32 x micro-batches 1, 2, 4, ..., 64
    assert {p.estimate.parameter_count for p in plans.plans} == {269_322}
    with pytest.raises(ValueError, match=r"needs a model with blocks; model=MyMLP\(\.\.\.\)"):
        plan(RunConfig(model=MyMLP(), data="mnist"), target=plans.target, checkpointing=["all"])


def test_the_planner_times_your_module_on_this_machine():
    from workbench.planner.planning import Target, plan

    plans = plan(RunConfig(model=Tiny(), data=pairs(), batch_size=32),
                 target=Target.this_machine(memory_budget_bytes=2**20, precisions=("fp32",)), effective_batch=32,
                 micro_batches=[16, 32])
    assert [p.config.batch_size for p in plans.fitting] and all(p.step_time_s > 0 for p in plans.fitting)


def test_the_memory_check_counts_your_modules_real_parameters():
    model = Tiny()
    model.hidden.requires_grad_(False)  # frozen: no gradient, no optimizer state
    need = floor_bytes(RunConfig(model=model, data=pairs(), optimizer="adamw").resolved())
    frozen, trained = 8 * 16 + 16, 16 * 2 + 2
    assert need.model_state == 4 * (frozen + trained) + 4 * trained + 2 * 4 * trained
    huge = nn.Linear(200_000, 200_000, device="meta")  # 40 G parameters, on paper
    with pytest.raises(DoesNotFit, match=r"needs at least .*use a smaller model, or optimizer='sgd'"):
        check_fits(RunConfig(model=huge, data=TensorDataset(torch.zeros(4, 200_000), torch.zeros(4).long())))


# --- refusals: one line, naming the field and the fix -------------------------------------------

@pytest.mark.parametrize("changes, message", [
    (dict(dims={"hidden": (8,)}), "dims ['hidden'] size the built-in models; for model=Tiny(...) your module's size is "
                                  "fixed when you build it: drop dims"),
    (dict(activation_checkpointing="all"), "activation_checkpointing='all' recomputes the built-in models' blocks; for "
     "model=Tiny(...) put torch.utils.checkpoint inside your module's forward, and pass activation_checkpointing='none'"),
    (dict(freeze="all_but_head"), "freeze and freeze_layers pick parts of the built-in models; for model=Tiny(...) call "
     "requires_grad_(False) on what you freeze (the optimizer gets only what trains), and pass freeze='none', "
     "freeze_layers=0"),
    (dict(lora_rank=8), "lora_rank=8 adapts the built-in transformers' layers; for model=Tiny(...) wrap your module "
                        "with peft.get_peft_model yourself, and pass lora_rank=0"),
    (dict(sharding="full"), "sharding='full' is wired for the built-in models; for model=Tiny(...) pass sharding='none'"),
    (dict(attention="sdpa"), "attention='sdpa' switches the built-in GPT's attention; for model=Tiny(...) call "
                             "F.scaled_dot_product_attention in your forward, and pass attention='explicit'"),
    (dict(save_state_dir="checkpoints"), "save_state_dir and resume_from save and restore a built-in model's training "
     "state; for model=Tiny(...) save the model yourself (keep_model=True, then torch.save(result.model.state_dict(), "
     "path)), or use a built-in model name"),
    (dict(eval_samples=100), "eval_samples=100 needs a held-out set and data=<TensorDataset of 256 samples> has none; "
                             "pass data=(train, test), or eval_samples=0"),
    (dict(seq_len=32), "seq_len=32 cuts the built-in text data; your data's items have their own length: leave "
                       "seq_len unset"),
    (dict(batch_size=1000), "batch_size=1000 is larger than data=<TensorDataset of 256 samples> (256 training "
                            "samples); pass batch_size <= 256"),
])
def test_switches_that_assume_a_built_in_model_are_refused_for_yours(changes, message):
    assert _error(**{"model": Tiny(), "data": pairs(), **changes}) == message


@pytest.mark.parametrize("data, message", [
    (TensorDataset(torch.zeros(4, 8)), "data=<TensorDataset of 4 samples>: item 0 of its training set (TensorDataset) "
     "is a tuple of 1 value; items must be {'inputs': tensor, 'labels': tensor} dicts or (inputs, labels) pairs"),
    (TensorDataset(torch.zeros(4, 8), torch.zeros(4), torch.zeros(4)), "is a tuple of 3 values; items must be"),
    ([("a", 1)] * 4, "data must be text, a torch Dataset, a DataLoader, (train, test) Datasets or None, "
                     "got list [('a', 1), ('a', 1), ('a', 1), ('a', 1)]"),
    ((torch.zeros(4, 8), torch.zeros(4)), "data=<(Tensor, Tensor)>: ... "),
    (TensorDataset(torch.zeros(4, 8), torch.zeros(4)), "its training set has labels of dtype float32; the loss is "
                                                       "cross-entropy over class indices"),
    (TensorDataset(torch.zeros(0, 8), torch.zeros(0).long()), "its training set is empty"),
])
def test_a_dataset_of_the_wrong_form_is_refused_naming_what_it_holds(data, message):
    if message == "data=<(Tensor, Tensor)>: ... ":
        message = "must be a (train, test) pair of torch Datasets; wrap tensors as TensorDataset(inputs, labels)"
    assert message in _error(model=Tiny(), data=data)


def test_items_that_are_neither_dicts_nor_pairs_are_refused():
    class Strings(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return "a review"

    class WrongKeys(Strings):
        def __getitem__(self, i):
            return {"x": torch.zeros(8), "y": 0}

    assert _error(model=Tiny(), data=Strings()).endswith(
        "item 0 of its training set (Strings) is a str; items must be {'inputs': tensor, 'labels': tensor} dicts "
        "or (inputs, labels) pairs")
    assert "is a dict with keys ['x', 'y']" in _error(model=Tiny(), data=WrongKeys())


def test_what_needs_the_other_half_is_named():
    assert _error(model=Tiny()) == ("model=Tiny(...) needs data=: pass a torch Dataset, (train, test) Datasets, a "
                                    "DataLoader, or a built-in name such as 'mnist'")
    assert _error(model="mlp", data=pairs()) == (
        "data=<TensorDataset of 256 samples> needs your own model: model='mlp' sizes itself from a built-in data set; "
        "pass model=YourModule(), or data='mnist'")
    assert _error(model=Tiny, data=pairs()) == "model=Tiny is a class; pass an instance, model=Tiny()"
    assert _error(model=nn.ReLU(), data=pairs()).startswith("model=ReLU(...) has no parameters that train")
    assert _error(model=nn.Sequential(nn.Conv1d(1, 1, 1)), data=pairs(), qat="int8") == (
        "qat='int8' fake-quantizes nn.Linear layers and model=Sequential(...) has none; pass qat='none'")


@pytest.mark.parametrize("model, message", [
    (Tiny(classes=1), "model=Tiny(...)'s forward returns 1 class score per prediction (logits of shape (2, 1)) but a "
                      "label is 1; labels must be class indices 0..0: give the model's last layer one output per class"),
    (nn.Sequential(nn.Linear(8, 2), nn.Flatten(0)), "model=Sequential(...)'s forward returned logits of shape (4,) for "
     "labels of shape (2,): the logits must have the labels' shape plus a last dimension of class scores; a classifier "
     "returns logits (batch, classes) for labels (batch,), a language model (batch, seq_len, vocab) for labels "
     "(batch, seq_len)"),
    (Tiny(features=9), "model=Tiny(...)'s forward failed on a batch of inputs of shape (2, 8) (float32): RuntimeError: "
                       "mat1 and mat2 shapes cannot be multiplied (2x8 and 9x16)"),
])
def test_a_forward_that_does_not_fit_the_task_is_refused_before_training(model, message):
    sink = RecordingSink()
    with pytest.raises(ConfigError) as info:
        run(RunConfig(model=model, data=pairs(), batch_size=32, **QUICK), sinks=[sink])
    assert str(info.value) == message and sink.starts == []
    assert model.training  # the check put back the mode it found


def test_a_built_in_data_sets_classes_are_checked_too():
    assert _run_error(RunConfig(model=nn.Sequential(nn.Flatten(), nn.Linear(784, 5)), data="mnist", **QUICK)).endswith(
        "but the data has 10 classes; give the model's last layer 10 outputs")


# --- what a config shows of your model and data -------------------------------------------------

class Uncopyable(Tiny):
    def __deepcopy__(self, memo):
        raise AssertionError("to_dict() must describe the module, not copy it")


def test_to_dict_describes_your_model_and_data_without_copying_them():
    cfg = RunConfig(model=Uncopyable(), data=(pairs(200), pairs(50))).resolved()
    values = cfg.to_dict()
    assert values["model"] == "Uncopyable (178 parameters)" and values["data"] == "TensorDataset (train 200, test 50)"
    assert json.loads(json.dumps(values)) == values
    loader = RunConfig(model=Tiny(), data=DataLoader(pairs(), batch_size=16)).to_dict()["data"]
    assert loader == "DataLoader over TensorDataset of 256 samples, batch 16"


def test_an_uncopyable_module_is_refused_before_training():
    message = _run_error(RunConfig(model=Uncopyable(), data=pairs(), batch_size=32, **QUICK))
    assert message.startswith("model=Uncopyable(...) could not be copied (AssertionError: to_dict() must describe")


def test_the_cli_still_offers_the_built_in_names():
    from workbench.cli import build_parser

    model = next(a for a in build_parser()._actions if a.dest == "model")
    assert model.metavar == "{mlp,cnn,gpt,minilm}" and model.type is str
