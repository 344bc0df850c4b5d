"""Real data that works offline: the catalog of built-in sets, and how to load them.

Batches are `{"inputs": Tensor, "labels": Tensor}` (see docs/CONTRACTS.md).
"""

from workbench.core.data.catalog import (
           DATASETS,
           DataBundle,
           DatasetInfo,
           image_pixels,
           split_sizes,
           train_size,
)
from workbench.core.data.load import build_dataloader, load_data

__all__ = ["DATASETS", "DataBundle", "DatasetInfo", "build_dataloader", "image_pixels", "load_data", "split_sizes",
           "train_size"]
