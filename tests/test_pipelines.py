"""Input pipelines: image files written from real MNIST, decoded per sample; worker errors
name the sample; run() trains on the files and measures the wait; datasets once vs on the fly."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from workbench import RunConfig, run
from workbench.core.data import (
    DATASETS,
    build_dataloader,
    files,
    image_pixels,
    load_data,
)
from workbench.core.data.catalog import MNIST_MEAN, MNIST_STD
from workbench.core.views.sinks import RecordingSink
from workbench.lessons import input_pipelines as bench
from workbench.lessons import input_pipelines as pl

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def within(seconds: int):
    """Fail instead of hanging: SIGALRM interrupts the main thread after `seconds`."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> pl.ImageFiles:
    pixels, labels = image_pixels("mnist")
    return pl.write_image_files(pixels[:48], labels[:48], tmp_path_factory.mktemp("png"), format="png")


def test_png_files_hold_the_real_digits_exactly_and_jpeg_nearly(tmp_path) -> None:
    pixels, labels = image_pixels("mnist")
    png = pl.write_image_files(pixels[:8], labels[:8], tmp_path / "png", format="png")
    jpeg = pl.write_image_files(pixels[:8], labels[:8], tmp_path / "jpeg")
    assert png.paths[0] == f"{labels[0]}/00000.png" and jpeg.paths[1] == f"{labels[1]}/00001.jpg"
    for i in range(8):
        assert np.array_equal(np.asarray(Image.open(png.root / png.paths[i])), pixels[i])
        decoded = np.asarray(Image.open(jpeg.root / jpeg.paths[i])).astype(int)
        assert np.abs(decoded - pixels[i]).mean() < 3  # quality 95: a few grey levels at most


def test_write_image_files_rejects_unknown_formats_and_mismatched_labels(tmp_path) -> None:
    with pytest.raises(ValueError, match="format='gif' is not known"):
        pl.write_image_files(np.zeros((1, 4, 4), np.uint8), [0], tmp_path, format="gif")
    with pytest.raises(ValueError, match="one label each"):
        pl.write_image_files(np.zeros((2, 4, 4), np.uint8), [0], tmp_path)


def test_mnist_files_are_the_4000_training_digits_in_a_temp_dir_outside_the_repo() -> None:
    files = pl.mnist_image_files()
    pixels, labels = image_pixels("mnist")
    assert len(files) == 4000 and list(files.labels) == labels.tolist()
    assert torch.bincount(torch.tensor(files.labels)).tolist() == [400] * 10
    assert REPO not in files.root.parents and files.root.exists()
    lines = files.take(5).file_list().read_text().splitlines()
    assert lines == [f"{p} {y}" for p, y in zip(files.paths[:5], files.labels[:5])]


def test_file_sets_left_by_killed_processes_are_removed_and_live_ones_kept(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(files.tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan, live, other = tmp_path / f"wb-x-{dead.pid}-abc", tmp_path / f"wb-x-{os.getpid()}-def", tmp_path / "wb-x-odd"
    for d in (orphan, live, other):
        d.mkdir()
    files._remove_orphans("wb-x-")
    assert not orphan.exists() and live.exists() and other.exists()


def test_image_pixels_are_the_mnist_tensors_before_normalising() -> None:
    pixels, labels = image_pixels("mnist")
    mnist = load_data("mnist")
    x = (torch.from_numpy(pixels).float() / 255 - MNIST_MEAN) / MNIST_STD
    assert torch.allclose(x.unsqueeze(1), mnist.train.inputs, atol=1e-5)
    assert torch.equal(torch.from_numpy(labels), mnist.train.labels)
    with pytest.raises(ValueError, match="use name 'mnist' or 'digits'"):
        image_pixels("rotten_tomatoes")


def test_centre_crop_of_a_png_is_the_resized_digit_normalised(small) -> None:
    item = pl.ImageFileDataset(small, transform=pl.prepare_image)[0]
    resized = Image.fromarray(image_pixels("mnist")[0][0]).resize((32, 32), Image.BILINEAR)
    expected = (np.asarray(resized, np.float32)[2:30, 2:30] / 255 - MNIST_MEAN) / MNIST_STD
    assert item["inputs"].shape == (1, 28, 28) and item["inputs"].dtype == torch.float32
    assert torch.equal(item["inputs"][0], torch.from_numpy(expected))
    assert item["labels"].dtype == torch.int64 and item["labels"].item() == small.labels[0]


def test_augmented_crops_are_random_but_seeded_per_loader(small) -> None:
    ds = pl.ImageFileDataset(small)
    batch = lambda: next(iter(build_dataloader(ds, batch_size=16, shuffle=False, seed=3)))["inputs"]  # noqa: E731
    torch.manual_seed(0)
    a = batch()
    torch.manual_seed(0)
    assert torch.equal(a, batch())  # 0 workers: torch's global RNG decides the crops
    centre = torch.stack([pl.ImageFileDataset(small, transform=pl.prepare_image)[i]["inputs"] for i in range(16)])
    assert not torch.equal(a, centre)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_corrupt_file_stops_the_loader_with_an_error_naming_the_sample(small, tmp_path, workers) -> None:
    broken = pl.write_image_files(image_pixels("mnist")[0][:32], small.labels[:32], tmp_path)
    (broken.root / broken.paths[9]).write_bytes(b"not an image")
    loader = build_dataloader(pl.ImageFileDataset(broken), batch_size=8, shuffle=False, seed=0, num_workers=workers)
    with within(60), pytest.raises(pl.SampleError) as error:
        for _ in pl.release_on_error(loader):
            pass
    assert multiprocessing.active_children() == []  # the workers stopped with the error
    first = str(error.value).splitlines()[0]
    assert first.startswith(f"sample 9 ({broken.root / broken.paths[9]}): UnidentifiedImageError")
    assert ("[in DataLoader worker process" in first) == (workers > 0)


def test_a_transform_raising_in_a_worker_names_the_sample_not_a_hang(small) -> None:
    target = np.asarray(Image.open(small.root / small.paths[21]))

    def picky(image):
        if np.array_equal(np.asarray(image), target):
            raise ValueError("this digit is not allowed")
        return pl.prepare_image(image)

    loader = build_dataloader(pl.ImageFileDataset(small, transform=picky), batch_size=4, shuffle=True, seed=0,
                              num_workers=2, persistent_workers=True)
    with within(60), pytest.raises(pl.SampleError, match=r"^sample 21 \(.*\): ValueError: this digit is not allowed"):
        for _ in pl.release_on_error(loader):
            pass
    del loader  # persistent workers belong to their DataLoader: they stop when it goes
    assert multiprocessing.active_children() == []


def test_a_run_whose_worker_fails_reports_the_sample_and_stops_its_workers(monkeypatch) -> None:
    def broken(image):
        raise OSError("disk read error")

    monkeypatch.setattr(files, "augment", broken)
    sink = RecordingSink()
    # seed=987: a data set of its own (load_data caches by arguments), built with the broken transform
    config = RunConfig(model="mlp", data="mnist_files", steps=4, num_workers=2, eval_samples=0, seed=987,
                       dims={"hidden": (16,)})
    with within(60), pytest.raises(pl.SampleError, match=r"^sample \d+ \(.*\.jpg\): OSError: disk read error"):
        run(config, sinks=[sink], name="broken")
    assert multiprocessing.active_children() == []
    assert sink.ends[0].status == "failed" and sink.ends[0].message.startswith("SampleError: sample ")


def test_mnist_files_is_a_registered_data_set_run_can_train_on() -> None:
    info = DATASETS["mnist_files"]
    assert (info.task, info.train_size, info.test_size, info.models) == ("image_classification", 4000, 1000, ("mlp", "cnn"))
    bundle = load_data("mnist_files", max_train=100, max_test=50)
    assert len(bundle.train) == 100 and len(bundle.test) == 50 and bundle.input_shape == (1, 28, 28)
    assert torch.equal(bundle.test.inputs, load_data("mnist", max_test=50).test.inputs)
    sink = RecordingSink()
    result = run(RunConfig(model="mlp", data="mnist_files", batch_size=32, steps=6, log_every=3,
                           dims={"hidden": (32,)}, eval_samples=100, num_workers=1), sinks=[sink], name="files")
    assert result.status == "ok" and result.steps_done == 6 and 0 <= result.accuracy <= 1
    assert 0 < result.data_wait_fraction < 1
    assert all(r.data_wait_s > 0 for r in sink.steps)
    wait, compute = bench.step_split(result)
    assert wait > 0 and compute > 0 and wait + compute == pytest.approx(result.step_time_s)


def test_datasets_map_once_gives_the_on_the_fly_tensors_and_reads_faster(small) -> None:
    seconds = pl.time_datasets(small, num_procs=(1,), epochs=2, batch_size=16)
    assert set(seconds) == {"map once, num_proc=1", "epoch, pre-processed", "epoch, on the fly"}
    # A wide bound: reading Arrow tensors vs decoding 48 files (~10x apart here).
    assert seconds["epoch, pre-processed"] < seconds["epoch, on the fly"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pin_memory and non_blocking copies need a CUDA GPU")
def test_pinned_batches_reach_the_gpu_with_non_blocking_copies() -> None:
    result = run(RunConfig(model="mlp", data="mnist_files", device="cuda", num_workers=2, pin_memory=True, steps=6,
                           log_every=3, eval_samples=0), sinks=[], name="pinned")
    assert result.status == "ok" and result.device == "cuda"
