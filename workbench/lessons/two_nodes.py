"""Notebook 11: torchrun "nodes" started from a cell, their logs streamed, their results read back.

The notebook writes the torchrun commands itself (they are the technique); `run_nodes` starts
them, prints the lines worth reading as they arrive (each node's prefix on them), keeps every
line in OUT/nodeN.log, and returns a `Job`: exit codes, rank 0's figures (OUT/result.json), the
step a restart resumed from, the final weights (the last save). `check_same_job` is the
agreement the notebook asserts: a restarted job ends where an unbroken one does.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from workbench.launching.launch import free_port

__all__ = ["Job", "run_nodes", "check_same_job", "free_port"]

# workbench's log lines ("[mlp fp32 b64] step 4/12 ..."), the kill, the resume, the result, and
# torchrun's (LOGLEVEL=INFO) lines on failures and restarts; the rest stays in the log files.
WORTH_SHOWING = re.compile(r"^\[(?!rank\d+\]:)\S+ |killed on purpose|resuming from|RunResult|Worker group FAILED|"
                           r"will restart worker group|restart_count=")
_RESUMED = re.compile(r"resuming from \S*step_(\d+)")
_KILLED = re.compile(r"killed on purpose at step (\d+)")
_TORCH_LOG_PREFIX = re.compile(r"^[IWE]\d{4} [\d:.]+ \d+ \S+\] (\[default\] )?")  # level, time, pid, file:line


@dataclass
class Job:
    """What a multi-node job left: how each node's torchrun ended, and what rank 0 wrote."""

    out: Path
    codes: list[int]
    logs: list[str]
    seconds: float
    result: dict[str, Any] | None

    def _found(self, pattern: re.Pattern) -> int | None:
        found = [int(m.group(1)) for log in self.logs for m in pattern.finditer(log)]
        return found[0] if found else None

    @property
    def resumed_from(self) -> int | None:
        """The step of the save a restarted group resumed from (None: it never restarted)."""
        return self._found(_RESUMED)

    @property
    def killed_at(self) -> int | None:
        return self._found(_KILLED)

    def weights(self) -> dict[str, Any]:
        """The model's tensors in the job's last save."""
        last = sorted((self.out / "saves").glob("step_*[0-9]"))[-1]
        return load_file(last / "model.safetensors")


def run_nodes(commands: list[list[str]], out: str | Path, *, env: dict[str, str] | None = None,
              timeout_s: float = 300) -> Job:
    """Start one process per command (each a torchrun "node"), stream what matters, wait for all."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    env = {**(env or os.environ), "PYTHONUNBUFFERED": "1", "LOGLEVEL": "INFO"}  # INFO: torchrun says when it restarts
    nodes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for c in commands]
    logs: list[list[str]] = [[] for _ in nodes]
    with selectors.DefaultSelector() as selector:
        for i, node in enumerate(nodes):
            selector.register(node.stdout, selectors.EVENT_READ, i)
        open_pipes = len(nodes)
        while open_pipes:
            if time.perf_counter() - began > timeout_s:
                for node in nodes:
                    node.kill()
                raise TimeoutError(f"the nodes did not finish in {timeout_s:.0f} s; their logs are in {out}")
            for key, _ in selector.select(timeout=1.0):
                line = key.fileobj.readline()
                if not line:
                    selector.unregister(key.fileobj)
                    open_pipes -= 1
                    continue
                logs[key.data].append(line)
                if WORTH_SHOWING.search(line):
                    shown = re.sub(r"\s+", " ", _TORCH_LOG_PREFIX.sub("torchrun: ", line.rstrip()))
                    print(f"node {key.data} | {shown[:150]}", flush=True)
    codes = [node.wait() for node in nodes]
    for i, lines in enumerate(logs):
        (out / f"node{i}.log").write_text("".join(lines))
    result_file = out / "result.json"
    result = json.loads(result_file.read_text()) if result_file.is_file() else None
    print(f"exit codes {codes}; every line in {out}/node*.log", flush=True)
    return Job(out, codes, ["".join(lines) for lines in logs], time.perf_counter() - began, result)


def check_same_job(restarted: Job, unbroken: Job) -> None:
    """The restarted job ended where the unbroken one did: both finished, every logged loss equal,
    every final weight bit for bit. One line, or an AssertionError saying what differs."""
    for name, job in (("restarted", restarted), ("unbroken", unbroken)):
        assert job.codes == [0] * len(job.codes) and job.result, f"the {name} job failed: exit codes {job.codes}"
    assert restarted.resumed_from is not None, "the restarted job never resumed: was a rank killed?"
    a, b = restarted.result, unbroken.result
    assert a["loss_steps"] == b["loss_steps"] and a["losses"] == b["losses"], (
        f"logged losses differ: {a['losses']} vs {b['losses']}")
    wa, wb = restarted.weights(), unbroken.weights()
    differ = [k for k in wb if k not in wa or not torch.equal(wa[k], wb[k])]
    assert wa.keys() == wb.keys() and not differ, f"final weights differ: {differ}"
    print("the restarted job ends where the unbroken one does: every logged loss equal, every final weight "
          "bit for bit")
