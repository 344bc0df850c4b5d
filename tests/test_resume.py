"""Save and resume: a run stopped and resumed continues the very same loss curve."""

import json

import pytest

from workbench import ConfigError, RunConfig, run

# digits: 1,437 training images, 22 batches of 64 per epoch, so 30 steps cross an epoch end.
BASE = dict(model="mlp", data="digits", batch_size=64, log_every=5, dims={"hidden": (32,)}, eval_samples=100)
QUICK = {**BASE, "eval_samples": 0}


def test_a_resumed_run_continues_the_same_curve_bit_for_bit(tmp_path):
    whole = run(RunConfig(**BASE, steps=30), sinks=[], name="whole")
    first = run(RunConfig(**BASE, steps=20, save_state_dir=tmp_path, save_every=10), sinks=[], name="first")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000010", "step_000020"]
    rest = run(RunConfig(**BASE, steps=30, resume_from=tmp_path), sinks=[], name="rest")  # the latest step
    assert rest.losses == whole.losses and rest.loss_steps == whole.loss_steps  # the whole curve, exactly
    assert rest.eval_loss == whole.eval_loss and rest.accuracy == whole.accuracy
    assert rest.flops_per_step == whole.flops_per_step  # counted at step 1, carried in the checkpoint
    # From an earlier save, mid-epoch: the same shuffle, the seen batches skipped.
    again = run(RunConfig(**BASE, steps=30, resume_from=tmp_path / "step_000010"), sinks=[], name="again")
    assert again.losses == whole.losses
    assert first.losses == whole.losses[:4]


def test_resuming_through_gradient_accumulation_and_an_epoch_end(tmp_path):
    acc = dict(BASE, grad_accum_steps=3, log_every=2)
    whole = run(RunConfig(**acc, steps=12), sinks=[])
    run(RunConfig(**acc, steps=6, save_state_dir=tmp_path), sinks=[])  # saved at the end only
    rest = run(RunConfig(**acc, steps=12, resume_from=tmp_path / "step_000006"), sinks=[])
    assert rest.losses == whole.losses


def test_the_checkpoint_folder_holds_accelerates_files_and_the_loop_position(tmp_path):
    run(RunConfig(**QUICK, steps=5, save_state_dir=tmp_path), sinks=[])
    folder = tmp_path / "step_000005"
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "workbench_loop.json"} <= names
    loop = json.loads((folder / "workbench_loop.json").read_text())
    assert loop["loop"]["step"] == 5 and (loop["data"]["epoch"], loop["data"]["batches_in_epoch"]) == (0, 5)
    assert loop["num_processes"] == 1 and loop["config"]["batch_size"] == 64


def test_resuming_with_another_batch_size_is_refused_naming_the_field(tmp_path):
    run(RunConfig(**QUICK, steps=5, save_state_dir=tmp_path), sinks=[])
    with pytest.raises(ConfigError, match="saved with batch_size=64, this run has batch_size=32; resume with the same batch_size"):
        run(RunConfig(**{**QUICK, "batch_size": 32}, steps=10, resume_from=tmp_path), sinks=[])


def test_resuming_a_run_that_is_already_done_asks_for_more_steps(tmp_path):
    run(RunConfig(**QUICK, steps=5, save_state_dir=tmp_path), sinks=[])
    with pytest.raises(ConfigError, match="is at step 5 already; pass steps > 5"):
        run(RunConfig(**QUICK, steps=5, resume_from=tmp_path), sinks=[])


def test_resume_from_must_name_a_saved_run(tmp_path):
    with pytest.raises(ConfigError, match="resume_from='/no/such/folder' is not a folder"):
        RunConfig(**BASE, resume_from="/no/such/folder")
    with pytest.raises(ConfigError, match="holds no saved run"):
        run(RunConfig(**QUICK, steps=5, resume_from=tmp_path), sinks=[])


def test_save_every_needs_a_folder_and_a_multiple_of_log_every():
    with pytest.raises(ConfigError, match="save_every=10 needs a folder to save in; pass save_state_dir="):
        RunConfig(**BASE, save_every=10)
    with pytest.raises(ConfigError, match="save_every=12 must be a multiple of log_every=5; pass save_every=10"):
        RunConfig(**BASE, save_every=12, save_state_dir="x")
    with pytest.raises(ConfigError, match="save_state_dir must be text, a path or None"):
        RunConfig(**BASE, save_state_dir=3)
