"""Labels out of range, found before training: a data set's labels, read where that is cheap,
against the number of class scores the model's forward returns.

A label at or above that number fails at the step whose batch holds it (torch's IndexError
'Target 10 is out of bounds', a device-side assert on a GPU), or at evaluation after every step
has trained; `first_out_of_range` finds it first. How the labels are read:

- a TensorDataset of (inputs, labels), or a dataset with a `targets` or `labels` attribute of
  one whole number per item (torchvision's sets): all of them at once, from that tensor. The
  item it finds out of range is read through __getitem__ and the collate_fn before it is named
  (a target_transform may map it); when the item disagrees, the items are read instead;
- a Subset of one of these: its indices into it;
- any other dataset: its items, through __getitem__ and the collate_fn, up to the first
  `SCAN_ITEMS`. Each read may load a file or transform an image, so the bound keeps the check
  to what a small set costs: 4,096 in-memory items of 784 floats, read and collated, took
  47-63 ms (a Python Dataset over a TensorDataset, on a loaded, shared 2-core machine), 15% of
  a 30-step cpu-quick run; a file per item at ~1 ms would be ~4 s. A larger set's later items
  are checked only as they train (torch's error at that step).

Example:
    >>> data = TensorDataset(torch.zeros(300, 8), torch.arange(300) % 10)
    >>> data.tensors[1][150] = 10
    >>> pairs = lambda items: {"labels": torch.stack([label for _, label in items])}
    >>> first_out_of_range(data, pairs, classes=10)
    (150, 10)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

__all__ = ["SCAN_ITEMS", "first_out_of_range"]

SCAN_ITEMS = 4096
"""Items read through __getitem__ when the labels cannot be read at once (why: module docstring)."""
_CHUNK = 256  # items collated at a time: a batch's worth, not the whole set's inputs in memory
IGNORED = -100  # cross-entropy's ignore_index: a label the loss skips


def _whole_numbers(values: Any, count: int) -> torch.Tensor | None:
    """`values` as a tensor of `count` whole numbers (item index first), or None."""
    if values is None or isinstance(values, (str, bytes)):
        return None
    try:
        labels = torch.as_tensor(values)
    except Exception:  # a list of strings, of ragged lists, ...: not labels read at once
        return None
    whole = not (labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool)
    return labels if whole and labels.dim() >= 1 and len(labels) == count else None


def _labels_at_once(dataset: Dataset) -> torch.Tensor | None:
    """Every item's labels without calling __getitem__, or None where that cannot be done."""
    if isinstance(dataset, Subset):
        inner = _labels_at_once(dataset.dataset)
        return None if inner is None else inner[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    if isinstance(dataset, TensorDataset):
        return dataset.tensors[1] if len(dataset.tensors) == 2 else None
    for name in ("targets", "labels"):
        if (labels := _whole_numbers(getattr(dataset, name, None), len(dataset))) is not None:
            return labels
    return None


def _first_bad(labels: torch.Tensor, classes: int) -> tuple[int, int] | None:
    """(row, label) of the first row holding a label outside 0..classes-1 (IGNORED passes)."""
    if not labels.numel():
        return None
    rows = labels.reshape(len(labels), -1)
    bad = ((rows < 0) & (rows != IGNORED)) | (rows >= classes)
    found = bad.any(dim=1).nonzero()
    if not len(found):
        return None
    row = int(found[0])
    return row, int(rows[row][bad[row]][0])


def _items_labels(dataset: Dataset, collate: Callable[[list], dict], start: int, stop: int) -> torch.Tensor:
    return collate([dataset[i] for i in range(start, stop)])["labels"]


def first_out_of_range(dataset: Dataset, collate: Callable[[list], dict], *, classes: int) -> tuple[int, int] | None:
    """(item index, label) of the first item of `dataset` with a label the loss cannot take
    when the model returns `classes` class scores, or None. `collate` puts a list of items in
    the {"inputs", "labels"} contract (the run's collate_fn). Items that cannot be batched are
    left to the run, which names them as it reads them."""
    at_once = _labels_at_once(dataset)
    if at_once is not None:
        found = _first_bad(at_once, classes)
        if found is None:
            return None
        try:
            if _first_bad(_items_labels(dataset, collate, found[0], found[0] + 1), classes):
                return found
        except Exception:
            return None
    for start in range(0, min(len(dataset), SCAN_ITEMS), _CHUNK):
        try:
            labels = _items_labels(dataset, collate, start, min(start + _CHUNK, len(dataset), SCAN_ITEMS))
        except Exception:
            return None
        if found := _first_bad(labels, classes):
            return start + found[0], found[1]
    return None
