"""The optional DALI pipeline: a clear message without it; with it, the same work as the
DataLoader's transform, on the CPU here and with "mixed" decoding on a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from workbench.lessons import input_pipelines as dali
from workbench.lessons import input_pipelines as pl

needs_dali = pytest.mark.skipif(not dali.dali_available(),
                                reason=f"NVIDIA DALI is not installed ({dali.INSTALL_COMMAND})")


def test_missing_dali_raises_one_line_naming_the_install_command(monkeypatch) -> None:
    monkeypatch.setattr(dali, "dali_available", lambda: False)
    with pytest.raises(ModuleNotFoundError) as error:
        dali.DaliLoader(pl.mnist_image_files().take(8), batch_size=4)
    message = str(error.value)
    assert "\n" not in message and dali.INSTALL_COMMAND in message and "NVIDIA DALI is not installed" in message


def test_dali_device_names_are_checked_before_anything_is_built() -> None:
    with pytest.raises(ValueError, match="device='tpu' is not known"):
        dali.resolve_device("tpu")
    assert dali.resolve_device("cpu") == "cpu"
    assert dali.resolve_device("auto") == ("gpu" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='gpu' needs a CUDA GPU"):
            dali.resolve_device("gpu")


def test_importing_the_dali_module_does_not_import_dali() -> None:
    code = "import sys, json, workbench.lessons.input_pipelines; print(json.dumps('nvidia.dali' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) is False


@needs_dali
def test_dali_cpu_loader_yields_contract_batches_for_every_full_batch() -> None:
    files = pl.mnist_image_files().take(100)
    loader = dali.DaliLoader(files, batch_size=32, device="cpu", num_threads=1)
    for epoch in range(2):
        batches = list(loader)
        assert len(batches) == len(loader) == 3  # 100 // 32: the partial batch is dropped
        for b in batches:
            assert b["inputs"].shape == (32, 1, 28, 28) and b["inputs"].dtype == torch.float32
            assert b["labels"].shape == (32,) and b["labels"].dtype == torch.int64
            assert b["inputs"].device.type == "cpu"
    assert {int(y) for b in batches for y in b["labels"]} <= set(range(10))


@needs_dali
def test_dali_does_the_same_work_as_the_dataloader_transform() -> None:
    files = pl.mnist_image_files().take(64)
    ours = torch.stack([pl.ImageFileDataset(files, transform=pl.prepare_image)[i]["inputs"] for i in range(64)])
    batch = next(iter(dali.DaliLoader(files, batch_size=64, random_crop=False, shuffle=False, num_threads=1)))
    assert batch["labels"].tolist() == list(files.labels)
    # Same decode, resize, centre crop and normalisation; the two bilinear resizes round
    # differently, so pixels agree to a few grey levels (1/255/0.3081 ~ 0.013 a level).
    diff = (batch["inputs"] - ours).abs()
    assert diff.mean() < 0.05 and diff.max() < 1.0


@needs_dali
def test_leaving_a_dali_epoch_early_starts_the_next_iteration_afresh() -> None:
    loader = dali.DaliLoader(pl.mnist_image_files().take(96), batch_size=32, num_threads=1)
    next(iter(loader))
    assert len(list(loader)) == 3


@needs_dali
@pytest.mark.skipif(not torch.cuda.is_available(), reason="mixed (GPU) decoding needs a CUDA GPU")
def test_dali_gpu_pipeline_decodes_mixed_and_yields_cuda_tensors() -> None:
    loader = dali.DaliLoader(pl.mnist_image_files().take(128), batch_size=64, device="gpu")
    batch = next(iter(loader))
    assert batch["inputs"].is_cuda and batch["inputs"].shape == (64, 1, 28, 28)
    assert batch["labels"].is_cuda and batch["labels"].dtype == torch.int64
