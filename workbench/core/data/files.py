"""Real image files, decoded per sample: the data set behind `data="mnist_files"`.

The in-memory data sets hide the input pipeline: a batch is an index into a tensor. Real
image training reads encoded files (JPEG/PNG) and decodes, resizes, crops and normalises
every sample on the CPU, every epoch. Here the 4,000 real MNIST training digits are
written as image files to a temp dir (removed at exit) and read back that way, so the
DataLoader's knobs have real work to overlap (the input-pipelines technique measures them).

Example:
    >>> files = mnist_image_files()
    >>> ImageFileDataset(files)[0]["inputs"].shape
    torch.Size([1, 28, 28])
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from workbench.core.data.catalog import MNIST_MEAN, MNIST_STD, DataBundle, image_pixels
from workbench.core.data.tables import load_table

RESIZE, CROP = 32, 28  # resize the 28x28 digit to 32x32, then crop 28x28: "resize 256, crop 224" at MNIST scale
FORMATS = {"jpeg": ".jpg", "png": ".png"}


@dataclass(frozen=True)
class ImageFiles:
    """Encoded image files on disk with their labels, and a DALI-style file list."""

    root: Path
    paths: tuple[str, ...]
    """Paths relative to `root`: '<label>/<index>.jpg'."""
    labels: tuple[int, ...]
    format: str

    def __len__(self) -> int:
        return len(self.paths)

    def take(self, n: int) -> ImageFiles:
        """The first n files (the order is the seeded split's, so classes are mixed)."""
        return dataclasses.replace(self, paths=self.paths[:n], labels=self.labels[:n])

    def file_list(self) -> Path:
        """A text file of 'path label' lines (what DALI's file reader takes), written once
        per distinct selection of files (named by a hash of its lines)."""
        text = "".join(f"{p} {y}\n" for p, y in zip(self.paths, self.labels))
        path = self.root / f"files-{hashlib.sha1(text.encode()).hexdigest()[:12]}.txt"
        if not path.exists():
            path.write_text(text)
        return path


def write_image_files(images: np.ndarray, labels: Sequence[int], root: str | Path, *,
                      format: str = "jpeg", quality: int = 95) -> ImageFiles:
    """Encode uint8 greyscale images (N, H, W) as files under root/<label>/<i>.<ext>.

    Example:
        >>> files = write_image_files(np.zeros((2, 28, 28), np.uint8), [0, 1], tempfile.mkdtemp())
        >>> files.paths
        ('0/00000.jpg', '1/00001.jpg')
    """
    # lazy: Pillow only when images are read
    from PIL import Image

    if format not in FORMATS:
        raise ValueError(f"format={format!r} is not known; use one of {', '.join(map(repr, FORMATS))}")
    if images.dtype != np.uint8 or images.ndim != 3 or len(images) != len(labels):
        raise ValueError(f"images must be uint8 (N, H, W) with one label each; got {images.dtype} "
                         f"{images.shape} and {len(labels)} labels")
    root = Path(root)
    for label in set(int(y) for y in labels):
        (root / str(label)).mkdir(parents=True, exist_ok=True)
    options = {"quality": quality} if format == "jpeg" else {}
    paths = []
    for i, (pixels, label) in enumerate(zip(images, labels)):
        rel = f"{int(label)}/{i:05d}{FORMATS[format]}"
        encoded = io.BytesIO()  # encode in memory, write once: ~5x faster than save(path)
        Image.fromarray(pixels).save(encoded, format=format.upper(), **options)
        (root / rel).write_bytes(encoded.getvalue())
        paths.append(rel)
    return ImageFiles(root, tuple(paths), tuple(int(y) for y in labels), format)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_orphans(prefix: str) -> None:
    """Remove file sets whose writer died without its atexit (nbval kills its kernels)."""
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        pid = path.name[len(prefix):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


@functools.cache
def mnist_image_files(format: str = "jpeg") -> ImageFiles:
    """The 4,000 MNIST training digits of data="mnist" as image files in a temp dir (once
    per process; the dir is removed when the process that wrote it exits)."""
    prefix = "workbench-mnist-files-"
    _remove_orphans(prefix)
    pixels, labels = image_pixels("mnist", "train")
    owner = os.getpid()  # in the name, so a later process can tell an orphan
    root = tempfile.mkdtemp(prefix=f"{prefix}{owner}-")
    # Forked DataLoader workers inherit this hook: only the writer deletes the files.
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(root, ignore_errors=True))
    return write_image_files(pixels, labels, root, format=format)


def prepare_image(image: Any, *, top: int | None = None, left: int | None = None) -> torch.Tensor:
    """One image's CPU work after decoding: greyscale, resize to 32x32, crop 28x28
    (centre unless top/left are given), normalise -> float32 (1, 28, 28)."""
    # lazy: Pillow only when images are read
    from PIL import Image

    x = np.asarray(image.convert("L").resize((RESIZE, RESIZE), Image.BILINEAR), dtype=np.float32)
    margin = (RESIZE - CROP) // 2
    top, left = margin if top is None else top, margin if left is None else left
    x = x[top:top + CROP, left:left + CROP]
    return torch.from_numpy((x / 255.0 - MNIST_MEAN) / MNIST_STD).unsqueeze(0)


def augment(image: Any) -> torch.Tensor:
    """prepare_image with a random crop: a translation of up to 4 pixels. torch's RNG is
    seeded per DataLoader worker, so a seeded loader gives the same crops every run."""
    top, left = torch.randint(0, RESIZE - CROP + 1, (2,)).tolist()
    return prepare_image(image, top=top, left=left)


class SampleError(RuntimeError):
    """A sample that could not be loaded; the message's first line names it and its file."""

    def __init__(self, message: str) -> None:
        # A DataLoader re-raises a worker's error in the main process as
        # type(error)("Caught ... in DataLoader worker process N.\nOriginal Traceback ...").
        # Bring the line that names the sample to the front, so a one-line report says which.
        lines = message.splitlines()
        named = [line.split(": ", 1)[1] for line in lines
                 if line.split(": ", 1)[0].endswith("SampleError") and ": sample " in line]
        if lines and lines[0].startswith("Caught") and named:
            where = lines[0].removeprefix(f"Caught {type(self).__name__} ").rstrip(".")
            message = f"{named[-1]} [{where}]\n{message}"
        super().__init__(message)


class ImageFileDataset(Dataset):
    """Reads, decodes and transforms one image file per item, on the CPU, every time.

    Example:
        >>> item = ImageFileDataset(mnist_image_files(), transform=prepare_image)[3]
        >>> item["inputs"].shape, item["labels"].dtype
        (torch.Size([1, 28, 28]), torch.int64)
    """

    def __init__(self, files: ImageFiles, *, transform: Callable[[Any], torch.Tensor] | None = None) -> None:
        self.files, self.transform = files, transform or augment  # default: a random crop

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        # lazy: Pillow only when images are read
        from PIL import Image

        path = self.files.root / self.files.paths[index]
        try:
            with Image.open(path) as image:
                inputs = self.transform(image)
        except Exception as error:  # one bad file must say which, not just "worker 1 failed"
            raise SampleError(f"sample {index} ({path}): {type(error).__name__}: {error}") from error
        return {"inputs": inputs, "labels": torch.tensor(self.files.labels[index])}


def load_image_files(*, max_train: int | None, max_test: int | None, seed: int) -> Any:
    """The DataBundle of data="mnist_files": training images decoded and augmented from
    files per sample; evaluation on the same pre-decoded test digits as data="mnist"."""
    files = mnist_image_files()
    if max_train is not None and max_train < len(files):  # a seeded choice, like load_data's
        keep = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed))[:max_train]
        files = dataclasses.replace(files, paths=tuple(files.paths[i] for i in keep),
                                    labels=tuple(files.labels[i] for i in keep))
    test = load_table("mnist", 0, None, max_test, 0).test
    return DataBundle(name="mnist_files", task="image_classification", train=ImageFileDataset(files),
                      test=test, num_classes=10, input_shape=(1, CROP, CROP), vocab_size=None,
                      pad_token_id=None, tokens_per_sample=None)
