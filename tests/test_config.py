"""RunConfig: every bad value is refused with one line naming the field and the fix."""

import pytest

from workbench.core.config import ConfigError, RunConfig
from workbench.machine import hardware


def _error(**kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        RunConfig(**kwargs)
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message


def test_defaults_resolve_from_the_quick_preset():
    cfg = RunConfig(model="gpt").resolved()
    assert (cfg.preset, cfg.data, cfg.batch_size, cfg.seq_len, cfg.steps) == (
        "cpu-quick", "rotten_tomatoes_lm", 8, 64, 30)
    assert cfg.dims == {"n_layer": 2, "n_head": 4, "d_model": 128}


def test_explicit_values_win_over_the_preset():
    cfg = RunConfig(model="mlp", batch_size=16, steps=7, dims={"hidden": (32,)}).resolved()
    assert (cfg.batch_size, cfg.steps, cfg.dims["hidden"]) == (16, 7, (32,))


def test_epochs_become_optimizer_steps_with_accumulation():
    cfg = RunConfig(model="mlp", batch_size=100, grad_accum_steps=4, epochs=2).resolved()
    # 4,000 training images -> 40 micro-batches -> 10 optimizer steps an epoch.
    assert (cfg.steps, cfg.epochs) == (20, None)


def test_emulated_reduced_precision_gets_the_short_run(monkeypatch):
    monkeypatch.setattr(hardware, "precision_support", lambda device, p: "emulated" if p != "fp32" else "native")
    assert RunConfig(model="mlp", precision="bf16", device="cpu").resolved().steps == 6
    assert RunConfig(model="mlp", precision="bf16", device="cpu", steps=9).resolved().steps == 9


def test_true_means_checkpoint_every_block():
    assert RunConfig(model="gpt", activation_checkpointing=True).resolved().activation_checkpointing == "all"


@pytest.mark.parametrize("field,value", [("batch_size", 0), ("batch_size", -4), ("steps", 0), ("log_every", 0)])
def test_config_rejects_zero_or_negative_sizes(field, value):
    message = _error(**{field: value})
    assert message.startswith(f"{field}={value}") and "positive" in message


def test_config_rejects_zero_accumulation_steps():
    assert "grad_accum_steps=0 must be at least 1" in _error(grad_accum_steps=0)


def test_config_rejects_unknown_precision():
    assert _error(precision="fp8").startswith("precision='fp8' is not known; use one of: 'fp32', 'fp16', 'bf16'")


def test_config_rejects_unknown_model():
    assert _error(model="resnet").startswith("model='resnet' is not known")


def test_config_rejects_unknown_data_set():
    message = _error(data="mnits")
    assert message.startswith("data='mnits' is not known") and "'mnist'" in message


def test_config_rejects_unknown_optimizer():
    assert "optimizer='lion' is not known" in _error(optimizer="lion")


def test_config_rejects_a_batch_larger_than_the_data_set():
    message = _error(model="mlp", data="digits", batch_size=5000)
    assert message == "batch_size=5000 is larger than data='digits' (1437 training samples); pass batch_size <= 1437"


def test_config_rejects_a_model_and_data_set_that_do_not_fit():
    message = _error(model="gpt", data="mnist")
    assert "model='gpt' needs language_modeling" in message and "data='rotten_tomatoes_lm'" in message


def test_config_rejects_wrong_types_naming_the_fix():
    assert _error(batch_size="32") == "batch_size must be a whole number or None, got str '32'; pass batch_size=<a whole number or None>"
    assert "lr must be a number" in _error(lr="1e-3")


def test_config_types_and_their_words_come_from_the_annotations_and_registries():
    from workbench.core.config import field_types
    from workbench.core.switches.optimizer import OPTIMIZERS

    accepted, words = field_types("optimizer")
    assert accepted == (str,) and words == ", ".join(map(repr, list(OPTIMIZERS)[:-1])) + f" or {list(OPTIMIZERS)[-1]!r}"
    assert len(OPTIMIZERS) == 5 and _error(optimizer=3).startswith(f"optimizer must be {words}, got int 3")
    assert field_types("epochs") == ((int, float, type(None)), "a number or None")
    assert field_types("activation_checkpointing")[0] == (str, bool)


def test_config_rejects_a_bool_posing_as_a_number():
    assert _error(steps=True).startswith("steps must be a whole number")


def test_config_rejects_steps_and_epochs_together():
    assert "conflict; give only one of them" in _error(steps=10, epochs=1)


def test_config_rejects_worker_knobs_without_workers():
    assert _error(prefetch_factor=2).startswith("prefetch_factor needs worker processes; set num_workers >= 1")
    assert _error(persistent_workers=True).startswith("persistent_workers needs worker processes")


def test_config_rejects_checkpointing_a_model_without_blocks():
    assert "needs a model with blocks" in _error(model="mlp", activation_checkpointing="all")


def test_config_rejects_bad_learning_rates():
    assert "lr=0 must be a positive finite number" in _error(lr=0)
    assert "positive finite" in _error(lr=float("nan"))


def test_config_rejects_cuda_when_there_is_none(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _error(device="cuda") == "device='cuda' but no CUDA GPU is visible; use device='auto' or 'cpu'"


def test_config_rejects_a_precision_the_device_cannot_run(monkeypatch):
    # A pre-Ampere GPU (a T4: compute capability 7.5) has no bf16.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo("Tesla T4", 16 * 2**30, (7, 5)))
    message = _error(model="mlp", precision="bf16", device="cuda")
    assert message == ("precision='bf16': this card (Tesla T4, compute capability 7.5) has no bf16; "
                       "use precision='fp16'")


def test_config_rejects_unknown_device_and_preset():
    assert "device='tpu' is not known" in _error(device="tpu")
    assert "preset='huge' is not known" in _error(preset="huge")


def test_config_rejects_negative_workers_and_epochs():
    assert "num_workers=-1 must not be negative" in _error(num_workers=-1)
    assert "epochs=0 must be positive" in _error(epochs=0)


def test_config_rejects_an_accumulation_window_longer_than_an_epoch():
    assert "exceeds one epoch" in _error(model="mlp", data="digits", batch_size=500, grad_accum_steps=4, epochs=1)


def test_bad_preset_environment_variable_is_named(monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESET", "fast")
    with pytest.raises(ValueError, match="WORKBENCH_PRESET='fast' is not a preset"):
        RunConfig().resolved()


def test_the_named_choices_are_read_off_the_annotations_and_the_registries():
    from workbench.base.precisions import PRECISIONS
    from workbench.core.config import field_choices
    from workbench.core.models import MODEL_SPECS
    from workbench.core.presets import PRESETS
    from workbench.core.switches.optimizer import OPTIMIZERS

    assert field_choices("model") == tuple(MODEL_SPECS)
    assert field_choices("optimizer") == tuple(OPTIMIZERS)
    assert field_choices("precision") == PRECISIONS
    assert field_choices("preset") == tuple(PRESETS)
    assert field_choices("activation_checkpointing") == ("none", "all", "every_other", "selective")
    assert field_choices("batch_size") == ()
