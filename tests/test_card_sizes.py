"""The gpu preset sized to the card: every notebook's largest run, replayed on fake CUDA tensors,
fits 8, 12, 16, 24, 80 and 141 GB cards with headroom; no GPU needed (scripts/card_sizes.py)."""

import importlib.util
import json
import pathlib
import re
import stat

import pytest

from workbench.core.presets import CARD_HEADROOM, GPU_CARDS, PRESETS, UNKNOWN_CARD_GIB, get_preset
from workbench.machine import hardware

ROOT = pathlib.Path(__file__).resolve().parent.parent
GIB = 2**30
_spec = importlib.util.spec_from_file_location("card_sizes", ROOT / "scripts" / "card_sizes.py")
card_sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(card_sizes)


@pytest.fixture
def card(monkeypatch):
    """Set the card's memory (GiB) as a user would; None: a machine whose card cannot be read."""

    def choose(gib):
        if gib is None:
            monkeypatch.delenv(hardware.GPU_MEMORY_ENV_VAR, raising=False)
            monkeypatch.setattr(hardware, "_smi_memory_bytes", lambda: None)
        else:
            monkeypatch.setenv(hardware.GPU_MEMORY_ENV_VAR, str(gib))
        return get_preset("gpu")

    return choose


def test_the_largest_runs_cover_every_notebook():
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(card_sizes.LARGEST_RUNS) == notebooks


@pytest.mark.parametrize("nominal", list(card_sizes.CARDS_GIB))
def test_every_notebooks_largest_run_fits_the_card_with_headroom(card, nominal):
    gib = card_sizes.CARDS_GIB[nominal]
    preset = card(gib)
    peaks = card_sizes.peaks(preset)
    over = {nb: f"{peak / GIB:.2f} GiB" for nb, peak in peaks.items() if peak > CARD_HEADROOM * gib * GIB}
    assert not over, f"{nominal} GB card ({gib} GiB, {preset.sized}): over {CARD_HEADROOM:.0%}: {over}"
    assert f"{gib:.1f} GiB card" in preset.sized and "$WORKBENCH_GPU_MEMORY_GIB" in preset.sized


def test_the_card_table_is_what_the_replay_computes():
    assert card_sizes.computed_cards() == GPU_CARDS, "stale: run `python scripts/card_sizes.py` and copy its rows"


def test_a_card_of_unknown_size_gets_the_presets_defaults_which_fit_16_gb(card):
    preset = card(None)
    row = next(r for r in GPU_CARDS if r.min_gib == UNKNOWN_CARD_GIB)
    gpu = PRESETS["gpu"]
    assert (preset.batch_size, preset.seq_len) == (gpu.batch_size, gpu.seq_len)
    assert (gpu.batch_size["gpt"], gpu.seq_len["gpt"]) == (row.gpt_batch, row.gpt_seq_len)
    assert "memory is unknown" in preset.sized and str(preset).startswith("gpu (GPT batch 24 x seq 512 ")
    fp32_baseline = card_sizes.peak_bytes(card_sizes.LARGEST_RUNS["01_mixed_precision"](preset))
    assert fp32_baseline <= 14.5 * GIB  # the bar; batch 32 replayed at 14.82 GiB
    assert max(card_sizes.peaks(preset).values()) <= CARD_HEADROOM * 15.0 * GIB  # a T4's 15 GiB


def test_big_cards_keep_the_batch_checked_on_the_h200_and_say_so(card):
    for gib in (22.49, 79.6, 139.8):
        preset = card(gib)
        assert (preset.batch_size["gpt"], preset.seq_len["gpt"]) == (32, 512)
        assert "checked at on an H200" in preset.sized


def test_a_card_below_the_smallest_class_is_told_it_may_not_fit(card):
    preset = card(6)
    assert preset.seq_len["gpt"] == GPU_CARDS[0].gpt_seq_len
    assert "6.0 GiB card" in preset.sized and "may not fit; WORKBENCH_PRESET=cpu" in preset.sized


def test_the_cpu_presets_are_not_sized_and_print_as_their_names(card):
    card(8)
    for name in ("cpu-quick", "cpu"):
        assert get_preset(name) is PRESETS[name] and str(get_preset(name)) == name and not PRESETS[name].sized


@pytest.mark.parametrize("value", ["0", "sixteen", "-8"])
def test_a_bad_card_size_is_named_in_one_line(monkeypatch, value):
    monkeypatch.setenv(hardware.GPU_MEMORY_ENV_VAR, value)
    with pytest.raises(ValueError, match=f"WORKBENCH_GPU_MEMORY_GIB='{value}' must be the card's memory in GiB"):
        get_preset("gpu")


def test_the_card_is_read_from_nvidia_smi_the_smallest_of_several_without_torch(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '81559\\n15360\\n'\n")  # an H100 and a T4
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(hardware.GPU_MEMORY_ENV_VAR, raising=False)
    import torch

    def no_context(*args, **kwargs):
        raise AssertionError("asked torch: that creates a CUDA context")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_context)
    monkeypatch.setattr(torch.cuda, "mem_get_info", no_context)
    hardware._smi_memory_bytes.cache_clear()
    try:
        assert hardware.gpu_memory_bytes() == (15360 * 2**20, "nvidia-smi")
        assert get_preset("gpu").batch_size["gpt"] == 24
        monkeypatch.setenv("PATH", str(tmp_path / "none"))
        hardware._smi_memory_bytes.cache_clear()
        total, why = hardware.gpu_memory_bytes()
        assert total is None and "set WORKBENCH_GPU_MEMORY_GIB" in why
    finally:
        hardware._smi_memory_bytes.cache_clear()


def test_every_notebook_prints_the_preset_with_its_sizing_note():
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        prints = [line for cell in cells for line in cell.splitlines() if re.search(r"print\(.*preset", line)]
        assert prints and not any(".name" in line for line in prints), (path.name, prints)
