"""Your own model and data: what the workbench knows of an `nn.Module` and a dataset passed in
place of the built-in names, `RunConfig(model=MyNet(), data=my_dataset)`.

- names: `model_name` ('mlp', or the module's class name: results, titles, plan labels and run
  names show it, never a module's repr), `describe_model` / `describe_data` (what a config's
  `to_dict()` holds), `shown_model` / `shown_data` (how error messages name them);
- the data's form: `read_data` checks a torch Dataset, a `(train, test)` pair of them or a
  DataLoader, and reads the shapes and dtypes of one batch of two samples (`OwnData`);
- `own_bundle`: the DataBundle `run()` trains on; `ContractBatches` turns each batch into the
  `{"inputs", "labels"}` contract (docs/CONTRACTS.md), whatever form the items had;
- `model_copy`: every run trains a deep copy, so each arm of a comparison starts from the
  same weights and the learner's module is never changed;
- `check_forward`: does the forward fit the task? Checked on two samples, in eval and train
  mode, before training; `checked_copy` adds the labels' range (`label_range`) and the test set.

Example:
    >>> data = TensorDataset(torch.randn(100, 8), torch.randint(0, 3, (100,)))
    >>> form = read_data(data)
    >>> form.inputs_shape, form.labels_shape, describe_data(data)
    ((8,), (), 'TensorDataset of 100 samples')
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Subset,
    default_collate,
)

from workbench.base import label_range
from workbench.base.errors import ConfigError
from workbench.core.data import DATASETS, DataBundle, load_data, train_size
from workbench.core.models import MODEL_SPECS, ModelSpec, build_model, parameter_count

__all__ = ["ContractBatches", "OwnData", "as_contract", "check_forward", "checked_copy", "describe_data",
           "describe_model", "is_own_data", "load_bundle", "model_copy", "model_name", "model_spec", "own_bundle",
           "preset_key", "read_data", "shown_data", "shown_model", "train_count"]

ITEM_FORM = "items must be {'inputs': tensor, 'labels': tensor} dicts or (inputs, labels) pairs"
WHAT_LOGITS = ("a classifier returns logits (batch, classes) for labels (batch,), a language model "
               "(batch, seq_len, vocab) for labels (batch, seq_len)")

# The preset's batch size and sequence length for a custom model come from the built-in model
# of the data's kind: images like the MLP's, byte text like the GPT's, review labels like MiniLM's.
_PRESET_KEY = {"image_classification": "mlp", "language_modeling": "gpt", "text_classification": "minilm"}


def is_own_data(data: Any) -> bool:
    """A dataset or DataLoader passed in (not a built-in name, 'hub:<name>' or None)."""
    return data is not None and not isinstance(data, str)


def model_name(model: str | nn.Module) -> str:
    """What results, titles and labels call the model: its name, or the module's class name."""
    return model if isinstance(model, str) else type(model).__name__


def model_spec(model: str | nn.Module) -> ModelSpec:
    """What the workbench knows of a model without building it. A custom module: its class
    name, no dims (its size is fixed when the learner builds it), no blocks the workbench can
    checkpoint, a learning rate of 1e-3, and task 'custom' (its forward is checked against
    the data at run time)."""
    if isinstance(model, str):
        return MODEL_SPECS[model]
    return ModelSpec(type(model).__name__, "custom", frozenset(), "", 1e-3, has_blocks=False)


def refuse_for_own_model(r: dict[str, Any], on: bool, what: str, fix: str) -> None:
    """A switch that reaches into a built-in model's architecture, turned on for your own module:
    refused in one line that says what the switch does and how to do it in your module yourself.
    Each such switch calls this first in its own `check` (its refusal lives with it)."""
    if on and isinstance(r["model"], nn.Module):
        raise ConfigError(f"{what}; for model={shown_model(r['model'])} {fix}")


def shown_model(model: str | nn.Module) -> str:
    """The model as error messages write it: model='gpt', or model=MyNet(...)."""
    return repr(model) if isinstance(model, str) else f"{type(model).__name__}(...)"


def describe_model(model: str | nn.Module) -> str:
    """The model as a config's to_dict() holds it: 'mlp', or 'MyNet (12,345 parameters)'."""
    return model if isinstance(model, str) else f"{type(model).__name__} ({parameter_count(model):,} parameters)"


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except Exception:  # no __len__ (TypeError), or one that is not written (NotImplementedError)
        return None


def _sized(dataset: Any) -> str:
    n = _length(dataset)
    return type(dataset).__name__ + ("" if n is None else f" of {n:,} samples")


def describe_data(data: Any) -> Any:
    """The data as a config's to_dict() holds it: a name as it is, a dataset described in words."""
    if not is_own_data(data):
        return data
    if isinstance(data, DataLoader):
        return f"DataLoader over {_sized(data.dataset)}, batch {data.batch_size}"
    if isinstance(data, tuple):
        train, test = (_length(part) for part in data) if len(data) == 2 else (None, None)
        if train is not None and test is not None and isinstance(data[0], Dataset):
            return f"{type(data[0]).__name__} (train {train:,}, test {test:,})"
        return f"({', '.join(type(part).__name__ for part in data)})"
    return _sized(data)


def shown_data(data: Any) -> str:
    """The data as error messages write it: data='mnist', or data=<TensorDataset of 1,000 samples>."""
    return repr(data) if not is_own_data(data) else f"<{describe_data(data)}>"


@dataclass(frozen=True)
class OwnData:
    """A dataset passed in, checked: its parts and the form of one batch (per sample)."""

    train: Dataset
    test: Dataset | None
    """The held-out set of a (train, test) pair; None for a plain Dataset or DataLoader."""
    collate: Callable[[list], Any]
    """The DataLoader's collate_fn, or torch's default_collate."""
    batch_size: int | None
    """A DataLoader's batch size (the run's when batch_size is unset); None otherwise."""
    num_workers: int
    """A DataLoader's worker processes (the run's when num_workers is left at 0)."""
    inputs_shape: tuple[int, ...]
    inputs_dtype: torch.dtype
    labels_shape: tuple[int, ...]
    labels_dtype: torch.dtype

    @property
    def counts_tokens(self) -> bool:
        """Inputs of an integer dtype are token ids: the run shows tokens/s."""
        return not (self.inputs_dtype.is_floating_point or self.inputs_dtype.is_complex or self.inputs_dtype == torch.bool)

    @property
    def tokens_per_sample(self) -> int | None:
        return math.prod(self.inputs_shape) if self.counts_tokens else None


def as_contract(batch: Any) -> dict[str, Any]:
    """A collated batch as {"inputs", "labels"}: a dict passes (other keys kept), an (inputs,
    labels) pair becomes one; integer labels become int64, which cross-entropy takes."""
    if isinstance(batch, dict):
        batch = dict(batch)
    else:
        inputs, labels = batch
        batch = {"inputs": inputs, "labels": labels}
    labels = batch["labels"]
    if isinstance(labels, torch.Tensor) and labels.dtype in (torch.int8, torch.uint8, torch.int16, torch.int32):
        batch["labels"] = labels.long()
    return batch


class ContractBatches:
    """A collate_fn: the given one, then `as_contract` (a class, so worker processes can pickle it)."""

    def __init__(self, collate: Callable[[list], Any] = default_collate) -> None:
        self.collate = collate

    def __call__(self, items: list) -> dict[str, Any]:
        return as_contract(self.collate(items))


def _item_problem(item: Any, where: str) -> str | None:
    if isinstance(item, dict):
        if "inputs" in item and "labels" in item:
            return None
        return f"{where} is a dict with keys {sorted(map(str, item))}; {ITEM_FORM}"
    if isinstance(item, (tuple, list)):
        values = f"{len(item)} value{'s' if len(item) != 1 else ''}"
        return None if len(item) == 2 else f"{where} is a {type(item).__name__} of {values}; {ITEM_FORM}"
    return f"{where} is a {type(item).__name__}; {ITEM_FORM}"


def _check_part(dataset: Any, part: str) -> None:
    if isinstance(dataset, IterableDataset) or not callable(getattr(dataset, "__getitem__", None)) \
            or _length(dataset) is None:
        kind = "an IterableDataset" if isinstance(dataset, IterableDataset) else f"a {type(dataset).__name__}"
        raise ConfigError(f"its {part} set is {kind}; the workbench shuffles by index with a seed, so it needs a "
                         "map-style torch Dataset (with __len__ and __getitem__), e.g. TensorDataset(inputs, labels)")
    if len(dataset) < 1:
        raise ConfigError(f"its {part} set is empty; pass a Dataset with at least one sample")


def _one_batch(dataset: Dataset, collate: Callable[[list], Any], part: str) -> dict[str, Any]:
    """Two samples (one if that is all), collated and in the contract; a wrong form is named."""
    items = [dataset[i] for i in range(min(2, len(dataset)))]
    name = type(dataset).__name__
    if collate is default_collate and (problem := _item_problem(items[0], f"item 0 of its {part} set ({name})")):
        raise ConfigError(problem)
    try:
        batch = collate(items)
        problem = _item_problem(batch, f"a batch of its {part} set")
        if problem is None:
            batch = as_contract(batch)
    except Exception as error:  # the learner's collate_fn or items that cannot be stacked
        raise ConfigError(f"two items of its {part} set ({name}) could not be batched "
                         f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                         f"{ITEM_FORM}") from None
    if problem:
        raise ConfigError(problem)
    for key in ("inputs", "labels"):
        value = batch.get(key)
        if not isinstance(value, torch.Tensor) or value.dim() < 1 or len(value) != len(items):
            got = type(value).__name__ if not isinstance(value, torch.Tensor) else f"a tensor of shape {tuple(value.shape)}"
            raise ConfigError(f"a batch of {len(items)} from its {part} set has {key!r} as {got}, not a tensor of "
                             f"{len(items)} rows; each item's {key} must be a tensor (or a number)")
    labels = batch["labels"]
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ConfigError(f"its {part} set has labels of dtype {str(labels.dtype).removeprefix('torch.')}; the loss is "
                         "cross-entropy over class indices: labels must be whole numbers (e.g. torch.long)")
    return batch


def read_data(data: Any) -> OwnData:
    """Check a dataset passed as `data=` and read its form; ConfigError (one line) when it cannot work.

    Accepts a map-style torch Dataset whose items are {"inputs", "labels"} dicts or (inputs,
    labels) pairs; a (train, test) tuple of two such Datasets; or a DataLoader (its dataset,
    batch_size, num_workers and collate_fn are kept; the run makes its own seeded loader).
    """
    batch_size, workers, collate, test = None, 0, default_collate, None
    if isinstance(data, DataLoader):
        if data.batch_size is None:
            raise ConfigError("data=<DataLoader> batches nothing (batch_size=None); pass a DataLoader with a "
                             "batch_size, or its dataset")
        train, collate, batch_size, workers = data.dataset, data.collate_fn, data.batch_size, data.num_workers
    elif isinstance(data, tuple):
        kinds = ", ".join(type(part).__name__ for part in data)
        if len(data) != 2 or not all(isinstance(part, Dataset) for part in data):
            fix = ("wrap tensors as TensorDataset(inputs, labels)" if any(isinstance(p, torch.Tensor) for p in data)
                   else "pass data=(train_dataset, test_dataset)")
            raise ConfigError(f"data=({kinds}) must be a (train, test) pair of torch Datasets; {fix}")
        train, test = data
    elif isinstance(data, Dataset):
        train = data
    else:
        raise ConfigError(f"data={type(data).__name__} is not a data set; pass a name such as 'mnist', a torch Dataset, "
                         "(train, test) Datasets or a DataLoader")
    try:
        _check_part(train, "training")
        first = _one_batch(train, collate, "training")
        if test is not None:
            _check_part(test, "test")
            _one_batch(test, collate, "test")
    except ConfigError as error:
        raise ConfigError(f"data={shown_data(data)}: {error}") from None
    inputs, labels = first["inputs"], first["labels"]
    return OwnData(train=train, test=test, collate=collate, batch_size=batch_size, num_workers=workers,
                   inputs_shape=tuple(inputs.shape[1:]), inputs_dtype=inputs.dtype,
                   labels_shape=tuple(labels.shape[1:]), labels_dtype=labels.dtype)


def train_count(data: Any, seq_len: int | None) -> int | None:
    """Training samples of `data` (a name at `seq_len`, or a dataset); None for a hub set."""
    if is_own_data(data):
        return len(data.dataset if isinstance(data, DataLoader) else data[0] if isinstance(data, tuple) else data)
    return train_size(data, seq_len)


def preset_key(model: str | nn.Module, data: Any) -> str:
    """Which built-in model's preset sizes a run: the model's own, or for a custom module the
    one of its data's kind (a custom dataset: the MLP's)."""
    if isinstance(model, str):
        return model
    info = DATASETS.get(data) if isinstance(data, str) else None
    return _PRESET_KEY[info.task] if info is not None else "mlp"


def load_bundle(cfg: Any) -> DataBundle:
    """The data a run of `cfg` (resolved) trains on: a built-in set loaded by name, or the dataset
    passed in (`own_bundle`)."""
    if is_own_data(cfg.data):
        return own_bundle(cfg.data, eval_samples=cfg.eval_samples)
    return load_data(cfg.data, seq_len=cfg.seq_len or 128, max_test=cfg.eval_samples or None, seed=cfg.seed)


def load_model(cfg: Any, bundle: DataBundle) -> nn.Module:
    """The model a run of `cfg` (resolved) trains: a built-in one built by name, seeded (every arm
    of a comparison starts from the same weights), or a checked deep copy of the module passed in."""
    if isinstance(cfg.model, str):
        return build_model(cfg.model, data=bundle, dims=cfg.dims, seed=cfg.seed)
    return checked_copy(cfg.model, bundle, seed=cfg.seed)


def own_bundle(data: Any, *, eval_samples: int) -> DataBundle:
    """The DataBundle a run trains on for a dataset passed in: its training set, the first
    `eval_samples` of its test set (in order; none without one), and the collate_fn that puts
    every batch in the {"inputs", "labels"} contract."""
    form = read_data(data)
    test = form.test if form.test is not None else Subset(form.train, [])
    test = Subset(test, range(min(eval_samples, len(test))))
    return DataBundle(name=describe_data(data), task="custom", train=form.train, test=test, num_classes=None,
                      input_shape=form.inputs_shape, vocab_size=None, pad_token_id=None,
                      tokens_per_sample=form.tokens_per_sample, collate_fn=ContractBatches(form.collate))


def model_copy(model: nn.Module, *, seed: int) -> nn.Module:
    """A deep copy of the learner's module, to train: every arm of a comparison starts from the
    same weights, and the module passed in is never changed. The global RNG is seeded first, as
    for a built-in model, so dropout in its forward draws the same numbers run after run."""
    torch.manual_seed(seed)
    try:
        return copy.deepcopy(model).train()
    except Exception as error:
        raise ConfigError(f"model={shown_model(model)} could not be copied ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}); every run trains a deep copy so "
                         "your module stays as it was: keep only copyable things (no open files, locks) on it") from None


def _forward(model: nn.Module, inputs: torch.Tensor, *, training: bool) -> Any:
    """`model`'s output on `inputs` in train or eval mode (eval: without gradients); its mode and
    buffers (BatchNorm's running statistics) are put back after, so the run starts from what it found."""
    was_training = model.training
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.train(training)
    try:
        with torch.enable_grad() if training else torch.no_grad():
            return model(inputs)
    finally:
        model.train(was_training)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])


def _what(value: Any) -> str:
    """What a forward returned, in words: 'a tuple (Tensor, Tensor)', 'a float32 tensor'."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} ({', '.join(type(v).__name__ for v in value[:4])}{', ...' * (len(value) > 4)})"
    return f"a {type(value).__name__}"


def _logits_problem(logits: Any, labels: torch.Tensor, name: str, *, classes: int | None, mode: str) -> str | None:
    """Why `logits` cannot go into the loss with `labels`, or None."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        return f"{name} returned {_what(logits)}{mode}, not floating-point logits; {WHAT_LOGITS}"
    if logits.dim() < 1 or tuple(logits.shape[:-1]) != tuple(labels.shape):
        return (f"{name} returned logits of shape {tuple(logits.shape)}{mode} for labels of shape "
                f"{tuple(labels.shape)}: the logits must have the labels' shape plus a last dimension of class "
                f"scores; {WHAT_LOGITS}")
    scores = logits.shape[-1]
    counted = labels[labels != -100]  # cross-entropy's ignore_index
    low, high = (int(counted.min()), int(counted.max())) if counted.numel() else (0, -1)
    if low < 0 or high >= scores:
        return (f"{name} returns {scores} class score{'s' * (scores != 1)} per prediction (logits of shape "
                f"{tuple(logits.shape)}) but a label "
                f"is {low if low < 0 else high}; labels must be class indices 0..{scores - 1}: give the model's last "
                "layer one output per class")
    if classes is not None and scores < classes:
        return (f"{name} returns {scores} class score{'s' * (scores != 1)} per prediction (logits of shape "
                f"{tuple(logits.shape)}) but the data "
                f"has {classes} classes; give the model's last layer {classes} outputs")
    return None


def check_forward(model: nn.Module, batch: dict[str, torch.Tensor], *, classes: int | None = None,
                  name: str | None = None, train_mode: bool = True) -> int:
    """The number of class scores `model`'s forward returns on this (small) batch; ConfigError
    (one line) when its output does not fit the task.

    The loss is cross-entropy over the logits' last dimension: the logits must be floating
    point, shaped like the labels plus that last dimension, and the labels class indices below
    its size (and below `classes` when the data's classes are known). Checked in eval mode
    without gradients, then (`train_mode`) in train mode, the mode the loss sees, with them: a
    forward may return more there (an auxiliary output) or cut the graph (detach, no_grad). The
    model's mode and buffers are put back; its weights are not touched.
    """
    name = name or f"model={shown_model(model)}"
    inputs, labels = batch["inputs"], batch["labels"]
    outputs = {}
    for mode in ("eval", "train")[:1 + train_mode]:
        try:
            outputs[mode] = _forward(model, inputs, training=mode == "train")
        except Exception as error:
            reason = str(error).splitlines()[0] if str(error) else ""
            raise ConfigError(f"{name} failed on a batch of inputs of shape {tuple(inputs.shape)} "
                              f"({str(inputs.dtype).removeprefix('torch.')}){' in train mode' * (mode == 'train')}: "
                              f"{type(error).__name__}: {reason}") from None
        if mode == "train" and not isinstance(outputs[mode], torch.Tensor) and isinstance(outputs["eval"], torch.Tensor):
            raise ConfigError(f"{name} returned {_what(outputs[mode])} in train mode ({_what(outputs['eval'])} in eval "
                              "mode); the loss takes one tensor of logits: return only the logits in train mode too "
                              "(keep an auxiliary output inside the model)")
        if problem := _logits_problem(outputs[mode], labels, name, classes=classes,
                                      mode=" in train mode" if mode == "train" else ""):
            raise ConfigError(problem)
    trains = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if train_mode and trains and not outputs["train"].requires_grad:
        raise ConfigError(f"{name} returned logits that do not require grad in train mode, so backward cannot reach "
                          f"its {trains:,} trainable parameters; remove the .detach() or torch.no_grad() that cuts "
                          "the logits off them in forward")
    return outputs["eval"].shape[-1]


def _first_two(dataset: Dataset, collate: Callable[[list], Any], device: torch.device) -> dict[str, Any]:
    batch = collate([dataset[i] for i in range(min(2, len(dataset)))])
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def checked_copy(model: nn.Module, bundle: DataBundle, *, seed: int) -> nn.Module:
    """What `run()` and `training_parts()` train for the learner's module: `model_copy`, checked
    before any training time is spent; ConfigError (one line) when it does not fit the data:

    - its forward on two training samples, in eval and train mode (`check_forward`);
    - a dataset passed in: every label it can read cheaply below the class scores the forward
      returns (`label_range.first_out_of_range`), and its forward on two test samples (a test set
      of another shape would fail at evaluation, after every step has trained).
    """
    copied = model_copy(model, seed=seed)
    collate = bundle.collate_fn or ContractBatches()
    device = next(copied.parameters()).device  # where the learner built it; the run moves it after
    shown = f"model={shown_model(model)}"
    classes = bundle.num_classes or bundle.vocab_size  # a built-in data set's, when known
    train = _first_two(bundle.train, collate, device)
    scores = check_forward(copied, train, classes=classes, name=f"{shown}'s forward")
    if bundle.task == "custom":
        for part, dataset in (("training", bundle.train), ("test", bundle.test)):
            if found := label_range.first_out_of_range(dataset, collate, classes=scores):
                item, label = found
                fix = f"fix that label, or give the model's last layer {label + 1} outputs" if label > 0 else \
                    "fix that label (-100 marks one the loss skips)"
                raise ConfigError(f"data=<{bundle.name}>: item {item} of its {part} set has label {label}, but {shown}'s "
                                  f"forward returns {scores} class score{'s' * (scores != 1)} (labels 0..{scores - 1}); {fix}")
        if len(bundle.test):
            _check_test_forward(copied, bundle, train, _first_two(bundle.test, collate, device), shown)
    # The checks' item reads and train-mode forward (dropout) drew random numbers: the run starts
    # from the seed, as a built-in model's does.
    torch.manual_seed(seed)
    return copied


def _form(inputs: torch.Tensor) -> str:
    return f"{tuple(inputs.shape[1:])} {str(inputs.dtype).removeprefix('torch.')}"


def _check_test_forward(model: nn.Module, bundle: DataBundle, train: dict[str, Any], test: dict[str, Any],
                        shown: str) -> None:
    """The test set's samples go through the forward as the training set's do (in eval mode, as
    evaluation runs it): one of another shape or dtype would fail only after every step trained."""
    try:
        check_forward(model, test, name=f"{shown}'s forward", train_mode=False)
    except ConfigError as error:
        raise ConfigError(f"data=<{bundle.name}>: its test set does not fit the model (a test sample's inputs: "
                          f"{_form(test['inputs'])}, a training sample's: {_form(train['inputs'])}), so evaluation "
                          f"would fail after every step trained: {error}; pass a test set whose samples are shaped "
                          "like the training set's") from None
