"""Two "nodes" on one machine (scripts/two_nodes.sh: two torchrun agents, c10d rendezvous on
loopback) train the same run as one machine's two processes, and a rank killed on purpose is
restarted by torchrun (--max-restarts 1) and resumes from the last save, ending where an unbroken
run ends: the same losses and the same final weights, bit for bit on CPU."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from workbench.cli import build_parser, config_from_args, latest_save, main
from workbench.core.config import ConfigError
from workbench.engine.launch import free_port

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "two_nodes.sh"
TORCHRUN = f"{sys.executable} -m torch.distributed.run"  # the venv need not be on PATH
FLAGS = ["--model", "mlp", "--data", "digits", "--dims", '{"hidden": [32]}', "--eval-samples", "0",
         "--batch-size", "16", "--steps", "12", "--log-every", "2", "--save-every", "4"]
TIMEOUT_S = 180  # a bound, not an expectation: ~20-30 s on 2 busy cores


def _env(**extra):
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TORCHRUN": TORCHRUN, **extra}


def two_nodes(out, *flags):
    """scripts/two_nodes.sh as the README shows it, on a free port; once more if another program
    took the port between choosing and binding it."""
    for attempt in range(2):
        proc = subprocess.run(["bash", str(SCRIPT), str(out), *FLAGS, *flags], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=_env(PORT=str(free_port()), RDZV_ID=f"{out.name}-{attempt}"))
        logs = "".join((out / f"node{n}.log").read_text() for n in (0, 1))
        if proc.returncode == 0 or "address already in use" not in logs.lower():
            break
    assert proc.returncode == 0, proc.stdout + logs[-4000:]
    return json.loads((out / "result.json").read_text()), logs


def final_weights(out):
    return load_file(out / "saves" / "step_000012" / "model.safetensors")


def assert_same_weights(a, b):
    assert a.keys() == b.keys() and a
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"weights differ: {different}"


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    out = tmp_path_factory.mktemp("unbroken")
    result, logs = two_nodes(out)
    return out, result, logs


def test_two_nodes_train_as_one_machine_with_two_processes(unbroken, tmp_path):
    out, result, logs = unbroken
    assert result["num_processes"] == 2 and result["status"] == "ok" and result["loss_steps"] == [2, 4, 6, 8, 10, 12]
    one = tmp_path / "one"
    one.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "workbench",
           *FLAGS, "--save-state-dir", str(one / "saves"), "--json", str(one / "result.json")]
    proc = subprocess.run(cmd, env=_env(ACCELERATE_USE_CPU="1"), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert json.loads((one / "result.json").read_text())["losses"] == result["losses"]
    assert_same_weights(final_weights(one), final_weights(out))


def test_a_killed_rank_is_restarted_and_resumes_from_the_last_save(unbroken, tmp_path):
    out, result, _ = unbroken
    restarted, logs = two_nodes(tmp_path / "restarted", "--fail-at-step", "10")
    assert "rank 1: killed on purpose at step 10" in logs  # the last rank, on the first attempt only
    assert logs.count("killed on purpose") == 1
    assert f"resuming from {tmp_path / 'restarted' / 'saves' / 'step_000008'}" in logs  # the save before step 10
    assert restarted["losses"] == result["losses"] and restarted["loss_steps"] == result["loss_steps"]
    assert_same_weights(final_weights(tmp_path / "restarted"), final_weights(out))


def test_resume_auto_takes_the_latest_complete_save_or_starts_afresh(tmp_path):
    assert latest_save(str(tmp_path)) is None  # nothing saved yet: a fresh start
    for step in (4, 8):
        (tmp_path / f"step_{step:06d}").mkdir()
        (tmp_path / f"step_{step:06d}" / "workbench_loop.json").write_text("{}")
    (tmp_path / "step_000012.partial-run").mkdir()  # a save cut short is no checkpoint
    assert latest_save(str(tmp_path)) == str(tmp_path / "step_000008")
    args = build_parser().parse_args(["--save-state-dir", str(tmp_path), "--resume-from", "auto"])
    assert config_from_args(args).resume_from == str(tmp_path / "step_000008")
    with pytest.raises(ConfigError, match="pass --save-state-dir DIR"):
        config_from_args(build_parser().parse_args(["--resume-from", "auto"]))


def test_fail_at_step_outside_torchrun_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["--fail-at-step", "3"])
    assert exit_info.value.code == 2
    assert "run the command under torchrun with --max-restarts" in capsys.readouterr().err
