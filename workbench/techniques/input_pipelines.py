"""Input pipelines: what the DataLoader knobs do on real image files, and `datasets` beside them.

The data set is `workbench.core.data.files` (4,000 real MNIST digits written as JPEG/PNG and
decoded, resized, cropped and normalised per sample: `data="mnist_files"` in a RunConfig),
so the DataLoader's knobs (num_workers, prefetch_factor, persistent_workers, pin_memory,
batch size) have real work to overlap. The same per-sample work runs through `datasets`
(.map once vs on the fly, here) and NVIDIA DALI (`dali.py`) on the same files;
`pipeline_bench.py` times them all.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from workbench.core.data.files import (  # noqa: F401  (the notebook's names, in one place)
    CROP,
    FORMATS,
    RESIZE,
    ImageFileDataset,
    ImageFiles,
    SampleError,
    augment,
    mnist_image_files,
    prepare_image,
    write_image_files,
)


def release_on_error(loader: Iterable) -> Iterator:
    """Iterate `loader`; if it raises, let its DataLoader workers stop at once.

    torch re-raises a worker's error from a frame that keeps the error in a local: a
    reference cycle that holds the iterator until the garbage collector runs, and a
    collected iterator takes ~10 s to stop its workers (its queues are closed first).
    Clearing the finished frames frees it now. (run() does the same in its loop.)
    """
    try:
        yield from loader
    except Exception as error:
        traceback.clear_frames(error.__traceback__)
        raise


# -- the same work through Hugging Face datasets: once with .map, or on the fly --

def _prepare_batch(batch: dict[str, list]) -> dict[str, Any]:
    # Module level (not a closure) so datasets can send it to num_proc worker processes.
    return {"inputs": np.stack([prepare_image(im).numpy() for im in batch["image"]]), "labels": batch["label"]}


def time_datasets(files: ImageFiles, *, num_procs: Sequence[int] = (1, 2), epochs: int = 2,
                  batch_size: int = 64) -> dict[str, float]:
    """Seconds for: .map(batched, num_proc=n) once each; an epoch read from the mapped,
    torch-formatted set; an epoch decoded on the fly (with_transform). Centre crops only:
    random augmentation cannot be computed once, it belongs on the fly."""
    import datasets

    ds = datasets.Dataset.from_dict({"image": [str(files.root / p) for p in files.paths],
                                     "label": list(files.labels)}).cast_column("image", datasets.Image())
    features = datasets.Features({"inputs": datasets.Array3D((1, CROP, CROP), "float32"),
                                  "labels": datasets.Value("int64")})  # fixed shape: fast reads back
    seconds: dict[str, float] = {}
    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        for n in num_procs:
            start = time.perf_counter()
            mapped = ds.map(_prepare_batch, batched=True, batch_size=100, num_proc=n if n > 1 else None,
                            features=features, remove_columns=ds.column_names)
            seconds[f"map once, num_proc={n}"] = time.perf_counter() - start
        on_the_fly = ds.with_transform(_prepare_batch)
        for label, source in (("epoch, pre-processed", mapped.with_format("torch")),
                              ("epoch, on the fly", on_the_fly)):
            start = time.perf_counter()
            for _ in range(epochs):
                for _batch in source.iter(batch_size=batch_size):
                    pass
            seconds[label] = (time.perf_counter() - start) / epochs
        first = next(on_the_fly.iter(batch_size=batch_size))["inputs"]
        same = torch.equal(next(mapped.with_format("torch").iter(batch_size=batch_size))["inputs"],
                           torch.from_numpy(first))
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()
    if not same:  # the two paths must compute the same tensors, or the timing compares nothing
        raise AssertionError("pre-processed and on-the-fly batches differ")
    return seconds
