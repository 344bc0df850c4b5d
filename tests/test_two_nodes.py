"""Two "nodes" on one machine (scripts/two_nodes.sh: two torchrun agents, c10d rendezvous on
loopback) train the same run as one machine's two processes, and a rank killed on purpose is
restarted by torchrun (--max-restarts 1) and resumes from the last save, ending where an unbroken
run ends: the same losses and the same final weights, bit for bit on CPU."""

import dataclasses
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from workbench import run
from workbench.cli import build_parser, config_from_args, latest_save, main
from workbench.core.config import ConfigError
from workbench.launching.launch import free_port

ROOT = pathlib.Path(__file__).resolve().parent.parent
TORCHRUN = f"{sys.executable} -m torch.distributed.run"  # the venv need not be on PATH
# README's commands, as written (tests/test_readme_commands.py); only OUT goes to a test folder.
UNBROKEN = "scripts/two_nodes.sh /tmp/wb-nodes --model mlp --data digits --batch-size 32 --steps 12 --log-every 2 --save-every 4"
RESTART = "scripts/two_nodes.sh /tmp/wb-restart --model mlp --data digits --batch-size 32 --steps 12 --log-every 2 --save-every 4 --fail-at-step 10"
FLAGS = shlex.split(UNBROKEN)[2:]
TIMEOUT_S = 180  # a bound, not an expectation: ~20-30 s on 2 busy cores


def _env(**extra):
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TORCHRUN": TORCHRUN, **extra}


def two_nodes(command, out):
    """A README command of scripts/two_nodes.sh, writing to `out`, on a free port; once more if
    another program took the port between choosing and binding it."""
    script, _, *flags = shlex.split(command)
    for attempt in range(2):
        proc = subprocess.run(["bash", script, str(out), *flags], cwd=ROOT, capture_output=True, text=True,
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
    result, logs = two_nodes(UNBROKEN, out)
    return out, result, logs


def test_two_nodes_train_as_one_machine_with_two_processes(unbroken, tmp_path):
    out, result, logs = unbroken
    assert result["num_processes"] == 2 and result["status"] == "ok" and result["loss_steps"] == [2, 4, 6, 8, 10, 12]
    one = tmp_path / "one"
    one.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "workbench",
           *FLAGS, "--save-state-dir", str(one / "saves"), "--json", str(one / "result.json")]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    one_machine = json.loads((one / "result.json").read_text())
    assert one_machine["losses"] == result["losses"]
    assert_same_weights(final_weights(one), final_weights(out))
    # torchrun's two processes are one world of two (README's `torchrun --nproc_per_node 4 -m
    # workbench`, here with two CPU processes): together they train what one process trains on
    # their two batches at once, up to the order the gradient average adds in.
    saving = FLAGS.index("--save-every")  # saving changes no loss; without its folder it is refused
    cfg = config_from_args(build_parser().parse_args(FLAGS[:saving] + FLAGS[saving + 2:]))
    alone = run(dataclasses.replace(cfg, batch_size=2 * cfg.batch_size), sinks=[])
    assert one_machine["num_processes"] == 2
    assert one_machine["losses"] == pytest.approx(alone.losses, abs=1e-5)


def test_a_killed_rank_is_restarted_and_resumes_from_the_last_save(unbroken, tmp_path):
    out, result, _ = unbroken
    restarted, logs = two_nodes(RESTART, tmp_path / "restarted")
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


def _torchrun_words(path):
    """The words after `torchrun` in a script's one torchrun command (continuation lines joined,
    `${NAME:-default}` read as its default)."""
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", re.sub(r"\\\n\s*", " ", path.read_text()))
    found = [m for line in text.splitlines() if not line.lstrip().startswith("#")
             for m in [re.search(r"torchrun\}? (.*)", line)] if m]
    assert len(found) == 1, f"{path.name}: {len(found)} torchrun commands, not 1"
    return shlex.split(found[0].group(1))


def test_the_slurm_script_parses_and_runs_the_tested_torchrun_command():
    """No Slurm here: the sbatch file is checked to parse as bash and to give torchrun and workbench
    the same options as scripts/two_nodes.sh (the endpoint: the first node's hostname)."""
    sbatch, tested = ROOT / "scripts" / "slurm_two_nodes.sbatch", ROOT / "scripts" / "two_nodes.sh"
    subprocess.run(["bash", "-n", str(sbatch)], check=True)
    slurm, local = _torchrun_words(sbatch), _torchrun_words(tested)
    options = [w for w in local if w.startswith("-")]
    assert [w for w in slurm if w.startswith("-")] == options
    same = ("--nnodes", "--rdzv-backend", "--max-restarts", "--resume-from")
    assert {o: slurm[slurm.index(o) + 1] for o in same} == {o: local[local.index(o) + 1] for o in same} == {
        "--nnodes": "2", "--rdzv-backend": "c10d", "--max-restarts": "1", "--resume-from": "auto"}
    assert slurm[slurm.index("--rdzv-endpoint") + 1] == "$head_node:29400"  # two_nodes.sh: 127.0.0.1:29400
    assert "head_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)" in sbatch.read_text()
    assert "#SBATCH --nodes=2" in sbatch.read_text() and "#SBATCH --ntasks-per-node=1" in sbatch.read_text()


def test_a_two_process_resume_past_the_first_epoch_is_exact(tmp_path):
    """digits at 2 x 128 samples a step: 5 steps an epoch; resumed from step 6 (epoch 1). Before the
    fix in resume._shuffle_generator no shuffle state was saved with 2 processes, and the resumed
    curve differed from step 7 on (1.86243 against 1.86095), while a resume in epoch 0 was exact."""
    import workbench as wb

    base = dict(model="mlp", data="digits", batch_size=128, eval_samples=0, log_every=1, device="cpu")
    unbroken = wb.launch(wb.RunConfig(steps=8, **base), num_processes=2, sinks=[])
    wb.launch(wb.RunConfig(steps=6, save_state_dir=str(tmp_path), **base), num_processes=2, sinks=[])
    data = json.loads((tmp_path / "step_000006" / "workbench_loop.json").read_text())["data"]
    assert (data["epoch"], data["batches_in_epoch"]) == (1, 1) and data["shuffle_state"] is not None
    resumed = wb.launch(wb.RunConfig(steps=8, resume_from=str(tmp_path), save_state_dir=str(tmp_path), **base),
                        num_processes=2, sinks=[])
    assert resumed.status == unbroken.status == "ok"
    assert resumed.losses == unbroken.losses
