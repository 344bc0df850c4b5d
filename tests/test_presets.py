"""The presets: three shape sets, and caps that shorten a preset without changing its shapes."""

import pytest

from workbench.core.config import RunConfig
from workbench.core.models import MODELS
from workbench.core.presets import PRESETS, get_preset


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("model", MODELS)
def test_every_preset_resolves_every_model_within_its_data(preset, model):
    cfg = RunConfig(model=model, preset=preset).resolved()  # validation checks the batch fits the data
    assert cfg.batch_size == PRESETS[preset].batch_size[model] and cfg.steps == PRESETS[preset].steps


def test_the_presets_differ_in_every_shape_a_notebook_could_hard_code():
    quick, cpu, gpu = PRESETS["cpu-quick"], PRESETS["cpu"], PRESETS["gpu"]
    for model in ("mlp", "cnn", "gpt"):
        assert len({str(p.dims[model]) for p in (quick, cpu, gpu)}) == 3, model
    for model in MODELS:
        assert len({p.batch_size[model] for p in (quick, cpu, gpu)}) == 3, model
    assert len({p.seq_len["gpt"] for p in (quick, cpu, gpu)}) == 3


def test_caps_shorten_steps_and_evaluation_but_keep_the_shapes(monkeypatch):
    monkeypatch.setenv("WORKBENCH_MAX_STEPS", "3")
    monkeypatch.setenv("WORKBENCH_MAX_EVAL_SAMPLES", "50")
    capped, full = get_preset("gpu"), PRESETS["gpu"]
    assert (capped.steps, capped.max_eval_samples, capped.max_steps) == (3, 50, 3)
    assert (capped.dims, capped.batch_size, capped.seq_len) == (full.dims, full.batch_size, full.seq_len)
    assert capped.capped == "WORKBENCH_MAX_STEPS=3, WORKBENCH_MAX_EVAL_SAMPLES=50"
    assert capped.cap(300) == 3 and capped.cap(2) == 2
    assert get_preset("cpu").reduced_precision_steps_on_emulated_cpu == 3
    cfg = RunConfig(model="mlp", preset="cpu").resolved()
    assert (cfg.steps, cfg.eval_samples, cfg.batch_size) == (3, 50, PRESETS["cpu"].batch_size["mlp"])
    assert RunConfig(model="mlp", preset="cpu", steps=20).resolved().steps == 20  # explicit steps are the user's


def test_no_cap_leaves_the_preset_as_it_is(monkeypatch):
    monkeypatch.delenv("WORKBENCH_MAX_STEPS", raising=False)
    monkeypatch.delenv("WORKBENCH_MAX_EVAL_SAMPLES", raising=False)
    assert get_preset("cpu") is PRESETS["cpu"] and PRESETS["cpu"].cap(80) == 80


@pytest.mark.parametrize("value", ["0", "ten", "-3"])
def test_a_bad_cap_is_named_in_one_line(monkeypatch, value):
    monkeypatch.setenv("WORKBENCH_MAX_STEPS", value)
    with pytest.raises(ValueError, match=f"WORKBENCH_MAX_STEPS='{value}' must be a whole number"):
        get_preset("cpu")


def test_without_a_gpu_a_learner_runs_the_preset_the_saved_outputs_come_from(monkeypatch):
    """The projector matches the screens (issue 36.6): the committed notebooks hold cpu-quick's outputs
    (what CI's nbval compares), so a CPU without WORKBENCH_PRESET runs cpu-quick (`make learn`, `make lab`);
    `cpu` is the opt-in self-study run."""
    import json
    import pathlib
    import re

    from workbench.core import presets

    monkeypatch.delenv("WORKBENCH_PRESET", raising=False)
    monkeypatch.setattr(presets, "_cuda_available", lambda: False)
    assert presets.default_preset_name() == "cpu-quick" and get_preset().name == "cpu-quick"
    monkeypatch.setattr(presets, "_cuda_available", lambda: True)
    assert presets.default_preset_name() == "gpu"
    printed = {}
    for path in sorted((pathlib.Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
            found = re.search(r"^preset:? (cpu-quick|cpu|gpu)\b", text, re.M)
            if found:
                printed[path.stem] = found.group(1)
                break
    assert len(printed) >= 3 and set(printed.values()) == {"cpu-quick"}, printed
