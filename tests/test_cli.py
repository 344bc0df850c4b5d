"""`python -m workbench`: every RunConfig field a flag; the same run under accelerate launch (torchrun's
two processes: tests/test_two_nodes.py, whose one-machine reference is that run)."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from workbench import RunConfig, run
from workbench.cli import build_parser, config_from_args, field_docs, main
from workbench.launching.launch import free_port

FLAGS = ["--model", "mlp", "--data", "digits", "--steps", "4", "--log-every", "2",
         "--dims", '{"hidden": [32]}', "--eval-samples", "0"]
LAUNCH_TIMEOUT_S = 180  # a bound, not an expectation: these take ~5-15 s on 2 cores


def test_every_config_field_is_a_flag_with_its_docstring_as_help():
    parser = build_parser()
    dests = {action.dest for action in parser._actions}
    assert {f.name for f in dataclasses.fields(RunConfig)} <= dests
    assert "per process" in field_docs(RunConfig)["batch_size"]
    assert "per process" in parser.format_help()


def test_flags_become_a_run_config():
    args = build_parser().parse_args(["--model", "gpt", "--batch_size", "4", "--lr", "3e-4", "--dims",
                                      '{"n_layer": 1}', "--no-pin-memory", "--activation-checkpointing", "all"])
    cfg = config_from_args(args)
    assert (cfg.model, cfg.batch_size, cfg.lr, cfg.dims, cfg.pin_memory, cfg.activation_checkpointing) == (
        "gpt", 4, 3e-4, {"n_layer": 1}, False, "all")
    assert config_from_args(build_parser().parse_args([])) == RunConfig()  # unset flags: the defaults


def test_a_bad_value_is_a_one_line_error_naming_the_field(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--optimizer", "adamm"])
    assert exit_info.value.code == 2
    assert "optimizer='adamm' is not known; use one of: 'adamw'" in capsys.readouterr().err


def test_main_runs_prints_the_log_and_writes_json(tmp_path, capsys):
    assert main([*FLAGS, "--batch-size", "32", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "step 4/4" in out and "1 process(es)" in out
    figures = json.loads((tmp_path / "r.json").read_text())
    assert figures["num_processes"] == 1 and figures["loss_steps"] == [2, 4]


def _env():
    # Two connected CPU processes need ACCELERATE_USE_CPU (accelerate launch --cpu starts one).
    return {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


# The console scripts, run with this interpreter (the venv need not be on PATH).
ACCELERATE_LAUNCH = [sys.executable, "-m", "accelerate.commands.launch"]


def _one_process_reference():
    # 2 processes x batch 16 see the same global batches as 1 process x batch 32.
    return run(RunConfig(model="mlp", data="digits", steps=4, log_every=2, dims={"hidden": (32,)},
                         eval_samples=0, batch_size=32), sinks=[])


def _check(out_json, proc):
    assert proc.returncode == 0, (proc.stdout or "")[-3000:] + (proc.stderr or "")[-3000:]
    figures = json.loads(out_json.read_text())
    assert figures["num_processes"] == 2  # connected: one world of two, not two worlds of one
    assert figures["losses"] == pytest.approx(_one_process_reference().losses, abs=1e-5)
    return figures


def test_accelerate_launch_runs_two_connected_processes(tmp_path):
    # c10d rendezvous on port 0: the launcher takes a free port itself, so a test running
    # beside other programs cannot lose a port it picked in advance.
    cmd = [*ACCELERATE_LAUNCH, "--multi_gpu", "--num_processes", "2", "--rdzv_backend", "c10d",
           "--main_process_port", "0", "-m", "workbench", *FLAGS, "--batch-size", "16",
           "--json", str(tmp_path / "r.json")]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    _check(tmp_path / "r.json", proc)
    assert proc.stdout.count("2 process(es)") == 1  # rank 0 prints; rank 1 trains quietly


def _two_machines(tmp_path, port):
    def machine(rank):
        cmd = [*ACCELERATE_LAUNCH, "--multi_gpu", "--num_machines", "2", "--machine_rank", str(rank),
               "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--num_processes", "2",
               "-m", "workbench", *FLAGS, "--batch-size", "16", "--json", str(tmp_path / f"r{rank}.json")]
        return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    machines = [machine(0), machine(1)]
    try:
        outputs = [m.communicate(timeout=LAUNCH_TIMEOUT_S)[0] for m in machines]
    finally:
        for m in machines:
            m.kill()
    return [m.returncode for m in machines], outputs


def test_two_machines_on_loopback_form_one_run(tmp_path):
    # Machines must agree on the main machine's port in advance; if another program took
    # it meanwhile (tests run beside other things), try once more with another.
    for attempt in range(2):
        codes, outputs = _two_machines(tmp_path, free_port())
        if not any(word in outputs[0] for word in ("already in use", "utilizing it", "EADDRINUSE")):
            break
    assert codes[1] == 0, outputs[1][-3000:]
    _check(tmp_path / "r0.json", subprocess.CompletedProcess([], codes[0], outputs[0], ""))
    assert not (tmp_path / "r1.json").exists()  # only global rank 0 writes


def test_the_named_choices_in_the_help_come_from_the_config_annotations():
    from workbench.core.switches.activation_checkpointing import CHOICES as CHECKPOINTING

    help_text = build_parser().format_help()
    assert "--precision {fp32,fp16,bf16}" in help_text
    assert "--activation-checkpointing {" + ",".join(CHECKPOINTING) + "}" in help_text  # the switch's registry
    assert "--preset {cpu-quick,cpu,gpu}" in help_text
