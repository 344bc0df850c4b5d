"""NVIDIA DALI as an optional input pipeline: file reader -> image decoder -> resize ->
crop-mirror-normalize, handed to PyTorch by DALI's iterator as {"inputs", "labels"} batches.

DALI runs its operators in C++ threads (no Python per sample, no worker processes). On a
CPU (`device="cpu"`: the pipeline gets `device_id=None`, DALI's CPU-only mode) every
operator runs on the host. On a GPU (`device="gpu"`) the decoder runs as `"mixed"`
(nvJPEG: entropy decoding on the host and the rest on the GPU, or the GPU's hardware JPEG
decoder where it has one) and resize and crop-mirror-normalize run on the GPU, so batches
arrive in GPU memory.

DALI is optional: `pip install nvidia-dali-cuda120` (Linux, ~425 MB; or the `dali` extra).
Nothing here imports it until a loader is built; without it, `require_dali()` raises a
one-line error with that command.

Example:
    >>> from workbench.techniques.input_pipelines import mnist_image_files
    >>> loader = DaliLoader(mnist_image_files().take(256), batch_size=64)  # doctest: +SKIP
    >>> next(iter(loader))["inputs"].shape                                  # doctest: +SKIP
    torch.Size([64, 1, 28, 28])
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import torch

from workbench.core.data.catalog import MNIST_MEAN, MNIST_STD
from workbench.techniques.input_pipelines import CROP, RESIZE, ImageFiles

INSTALL_COMMAND = "pip install nvidia-dali-cuda120"
DEVICES = ("auto", "cpu", "gpu")


def dali_available() -> bool:
    """Whether `nvidia.dali` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):  # no `nvidia` namespace package at all
        return False


def require_dali() -> None:
    """Raise a one-line ModuleNotFoundError with the install command when DALI is missing."""
    if not dali_available():
        raise ModuleNotFoundError(
            f"NVIDIA DALI is not installed; install it with: {INSTALL_COMMAND} "
            "(Linux x86_64/aarch64, ~425 MB), or pip install -e '.[dali]'"
        )


def resolve_device(device: str) -> str:
    """'auto' -> 'gpu' when CUDA is available, else 'cpu'; checks the name and the GPU."""
    if device not in DEVICES:
        raise ValueError(f"device={device!r} is not known; use one of {', '.join(map(repr, DEVICES))}")
    if device == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if device == "gpu" and not torch.cuda.is_available():
        raise ValueError("device='gpu' needs a CUDA GPU and none is visible; use device='cpu'")
    return device


def build_pipeline(files: ImageFiles, *, batch_size: int, device: str = "cpu", num_threads: int = 2,
                   seed: int = 0, random_crop: bool = True, shuffle: bool = True) -> Any:
    """The DALI pipeline (built): the same work as pipelines.augment, per batch in C++.

    Reader -> decoder ("cpu", or "mixed" on a GPU) -> resize to 32x32 -> crop 28x28 at a
    random (or the centre) position, normalise, HWC -> CHW float32. No mirroring: a
    mirrored digit is another shape (crop_mirror_normalize's `mirror` stays 0).
    """
    require_dali()
    from nvidia.dali import fn, pipeline_def, types

    device = resolve_device(device)
    if batch_size < 1 or batch_size > len(files):
        raise ValueError(f"batch_size={batch_size} must be between 1 and the {len(files)} files")
    on_gpu = device == "gpu"

    @pipeline_def
    def image_pipeline():
        # A file list, not the folder names: labels are exactly ours (folder order would
        # sort '10' before '2').
        encoded, labels = fn.readers.file(file_root=str(files.root), file_list=str(files.file_list()),
                                          random_shuffle=shuffle, name="Reader")
        images = fn.decoders.image(encoded, device="mixed" if on_gpu else "cpu", output_type=types.GRAY)
        images = fn.resize(images, resize_x=RESIZE, resize_y=RESIZE)  # on the GPU after "mixed"
        where = {"crop_pos_x": fn.random.uniform(range=(0.0, 1.0)),
                 "crop_pos_y": fn.random.uniform(range=(0.0, 1.0))} if random_crop else {}
        images = fn.crop_mirror_normalize(images, crop=(CROP, CROP), mean=[MNIST_MEAN * 255], std=[MNIST_STD * 255],
                                          dtype=types.FLOAT, output_layout="CHW", **where)
        return images, labels.gpu() if on_gpu else labels  # the reader's labels are host data

    # device_id=None: DALI's CPU-only mode (no CUDA needed). On a GPU, the current device.
    device_id = torch.cuda.current_device() if on_gpu else None
    pipe = image_pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
                          prefetch_queue_depth=2)
    pipe.build()
    return pipe


class DaliLoader:
    """DALI's PyTorch iterator over image files, yielding {"inputs", "labels"} dicts (the
    workbench batch contract: labels int64 (B,)). Full batches only, like drop_last=True.

    The pipeline is built on the first iteration, so its start-up shows in the first
    epoch's timing, as DataLoader workers' start-up does.
    """

    def __init__(self, files: ImageFiles, *, batch_size: int, device: str = "cpu", num_threads: int = 2,
                 seed: int = 0, random_crop: bool = True, shuffle: bool = True) -> None:
        require_dali()
        self.device = resolve_device(device)
        if not 1 <= batch_size <= len(files):
            raise ValueError(f"batch_size={batch_size} must be between 1 and the {len(files)} files")
        if num_threads < 1:
            raise ValueError(f"num_threads={num_threads} must be at least 1")
        self.files, self.batch_size, self.num_threads = files, batch_size, num_threads
        self.seed, self.random_crop, self.shuffle = seed, random_crop, shuffle
        self._iterator: Any = None

    def __len__(self) -> int:
        return len(self.files) // self.batch_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        if self._iterator is None:
            pipe = build_pipeline(self.files, batch_size=self.batch_size, device=self.device,
                                  num_threads=self.num_threads, seed=self.seed, random_crop=self.random_crop,
                                  shuffle=self.shuffle)
            self._iterator = DALIGenericIterator([pipe], ["inputs", "labels"], reader_name="Reader",
                                                 last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)
        finished = False
        try:
            for (batch,) in self._iterator:  # one pipeline: a list of one dict per step
                # DALI's file reader gives int32 labels of shape (B, 1); the contract is int64 (B,).
                yield {"inputs": batch["inputs"], "labels": batch["labels"].squeeze(-1).long()}
            finished = True
        finally:
            if not finished:  # left mid-epoch: start the next iteration from a fresh epoch
                self._iterator = None
