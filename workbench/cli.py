"""`python -m workbench ...`: the same runs headless, and under accelerate launch or torchrun.

Every RunConfig field is a flag, read off the dataclass (names, types and the
docstrings under the fields), so a field added to RunConfig is a flag at once:
`--batch-size 32`, `--dims '{"hidden": [64]}'`, `--pin-memory / --no-pin-memory`.
Each process runs the same command; accelerate (started by `accelerate launch`,
`torchrun` or alone) forms the process group from the environment. Rank 0 prints
the text log and the result, and writes `--json` when asked.

Example:
    $ python -m workbench --model mlp --steps 20
    $ ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m workbench --model mlp
    $ torchrun --nproc_per_node 4 -m workbench --model gpt --precision bf16

Elastic (scripts/two_nodes.sh): `--resume-from auto` resumes from the latest complete save in
`--save-state-dir` when there is one, so the command torchrun restarts after a failure (its
`--max-restarts`) continues the job from its last save; `--fail-at-step S` kills one rank on
purpose, on torchrun's first attempt only, to show and test that restart.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import json
import os
import stat
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import torch.distributed as dist

from workbench.base.arguments import label, shown
from workbench.base.atomic_write import write_whole
from workbench.core.config import ConfigError, RunConfig, field_choices


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each dataclass field (the one place they live)."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):  # no source shipped: flags without help text
        return {}
    docs, body = {}, tree.body[0].body
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error.msg}): {text!r}") from None


def _converter(annotation: str) -> Any:
    """argparse `type=` for a field's annotation (a string: `from __future__ import annotations`)."""
    kinds = {part.strip() for part in annotation.split("|")} - {"None"}
    if any(kind.startswith("dict") for kind in kinds):
        return _json_value
    if kinds == {"int"}:
        return int
    if kinds <= {"int", "float"}:
        return float
    return str  # str, paths, and 'str | bool' (activation_checkpointing takes its names)


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line: the usage of every RunConfig field (33 lines) before
    the one line that says what is wrong hid it; `--help` still shows the usage."""

    def error(self, message: str) -> NoReturn:  # argparse's own: a flag unknown, a value of the wrong type
        self.refuse(f"{message} ({self.prog} --help lists the flags)")

    def refuse(self, message: str) -> NoReturn:
        """Exit with status 2 and the one line `prog: error: message` on stderr."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> _Parser:
    parser = _Parser(
        prog="python -m workbench",
        description="Train one workbench run headless. Every RunConfig field is a flag; unset flags "
                    "take the preset's value ($WORKBENCH_PRESET). Works under `accelerate launch` and torchrun.",
    )
    docs = field_docs(RunConfig)
    for field in dataclasses.fields(RunConfig):
        flag = "--" + field.name.replace("_", "-")
        names = [flag, "--" + field.name] if "_" in field.name else [flag]  # accelerate's CLI takes both
        help_text = docs.get(field.name, "")
        if field.type == "bool":
            parser.add_argument(flag, dest=field.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        else:
            # Named choices come off the field's Literal annotation; RunConfig checks them (its
            # one-line error names the field and the choices), argparse only shows them.
            choices = field_choices(field.name)
            metavar = "{" + ",".join(choices) + "}" if choices else field.name.upper()
            parser.add_argument(*names, dest=field.name, type=_converter(str(field.type)), default=None,
                                metavar=metavar, help=help_text)
    parser.add_argument("--name", help="the run's name in the log")
    parser.add_argument("--json", metavar="PATH", help="rank 0 writes the result's figures here as JSON")
    parser.add_argument("--fail-at-step", type=int, metavar="S",
                        help="under torchrun: the last rank exits (status 1) at the first log step >= S, on the "
                             "first attempt only (TORCHELASTIC_RESTART_COUNT=0), so --max-restarts restarts the group")
    return parser


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig the flags describe (unset flags keep the dataclass defaults)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunConfig)
             if getattr(args, f.name) is not None}
    if given.get("resume_from") == "auto":
        given["resume_from"] = latest_save(given.get("save_state_dir"))
    return RunConfig(**given)


def latest_save(folder: str | None) -> str | None:
    """`--resume-from auto`: the latest complete save in the save folder (its step_N folder), else
    None (a fresh start). Every process reads the folder before any writes to it (a
    restarted group's old processes are gone), so all of them decide alike; across machines the
    folder must be on a shared disk."""
    if not folder:
        raise ConfigError("resume_from='auto' resumes from the latest save in save_state_dir; "
                          "pass --save-state-dir DIR with it")
    # lazy: only `train` needs the engine (accelerate); the other commands start faster
    from workbench.core.engine.resume import find

    try:
        return str(find(folder))
    except ConfigError:  # no complete save there yet: start afresh
        return None


class _FailOnce:
    """`--fail-at-step S`: the last rank dies at the first log step >= S, before that step's save,
    on torchrun's first attempt only; the restarted group resumes from the save before it."""

    def __init__(self, step: int) -> None:
        self.step = step

    def start(self, record: Any) -> None:
        pass

    def log(self, record: Any) -> None:
        last = int(os.environ.get("WORLD_SIZE", "1")) - 1
        if record.step >= self.step and record.rank == last and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            print(f"rank {record.rank}: killed on purpose at step {record.step} (--fail-at-step)", flush=True)
            os._exit(1)  # as a crash would: no clean-up, no save

    def end(self, record: Any) -> None:
        pass


def _fail_at_step_problem(args: argparse.Namespace) -> str | None:
    if args.fail_at_step is None:
        return None
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return ("--fail-at-step kills a rank on torchrun's first attempt only; run the command under "
                "torchrun with --max-restarts 1 (or more)")
    if args.fail_at_step < 1:
        return f"--fail-at-step {args.fail_at_step} must be a step >= 1"
    return None


class _MainProcessOnly:
    """Passes rank 0's records on: every process logs, one prints."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def start(self, record: Any) -> None:
        if record.rank == 0:
            self.sink.start(record)

    def log(self, record: Any) -> None:
        if record.rank == 0:
            self.sink.log(record)

    def end(self, record: Any) -> None:
        if record.rank == 0:
            self.sink.end(record)


def _json_path_problem(path: str) -> str | None:
    """Why --json could not be written after the run (checked first: nothing trained is lost)."""
    if not path.strip():
        return f"--json {path!r} names no file; pass a file path such as result.json"
    try:
        found = os.stat(path)  # through a link (/dev/stdout), as writing would go
    except FileNotFoundError:
        found = None
    except OSError as error:  # a name too long, a folder in the path that is a file, ...
        return f"--json {shown(path)} cannot be a file here ({error.strerror}); pass a file path such as result.json"
    if found is not None and (problem := _existing_file_problem(path, found)):
        return problem
    folder = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(folder):
        return f"--json {path!r}: the folder {folder!r} does not exist; create it or pass another path"
    if not os.access(folder, os.W_OK):
        return f"--json {path!r}: the folder {folder!r} is not writable; pass another path"
    return None


def _existing_file_problem(path: str, found: os.stat_result) -> str | None:
    """A --json path that exists must be a plain file, and not the one the text log goes to: the
    figures replace the file whole, so `--json /dev/stdout > log.txt` replaced the log with them."""
    if stat.S_ISDIR(found.st_mode):
        return f"--json {path!r} is a folder; pass a file path such as result.json"
    if not stat.S_ISREG(found.st_mode):
        return (f"--json {path!r} is not a regular file (a terminal, pipe or device, like /dev/stdout); "
                "pass a file path such as result.json")
    for stream, fd in (("stdout", 1), ("stderr", 2)):
        with contextlib.suppress(OSError):
            log = os.fstat(fd)
            if (log.st_dev, log.st_ino) == (found.st_dev, found.st_ino):
                return f"--json {path!r} is the file {stream} (the text log) goes to; pass another path such as result.json"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags, run, print; the process's exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        if args.name is not None:
            label("--name", args.name, example="--name baseline")
    except ConfigError as error:
        parser.refuse(str(error))  # one line, exit status 2
    if args.json is not None and (problem := _json_path_problem(args.json)):
        parser.refuse(problem)  # before training, so the figures are not lost after it
    if problem := _fail_at_step_problem(args):
        parser.refuse(problem)
    # lazy: only `train` needs the engine (accelerate); the other commands start faster
    from workbench.core.engine.train import RunInterrupted, run
    from workbench.core.views.sinks import TextSink
    from workbench.planner.fit import check_fits

    try:
        if config.resume_from and int(os.environ.get("RANK", "0")) == 0:
            print(f"resuming from {config.resume_from}", flush=True)
        failing = [] if args.fail_at_step is None else [_FailOnce(args.fail_at_step)]
        result = run(config, sinks=[_MainProcessOnly(TextSink()), *failing], name=args.name, check_fit=check_fits)
    except RunInterrupted as stopped:  # Ctrl-C: the log said so; report what was done, exit 130
        result = stopped.result
    except ConfigError as error:  # refused before step 1 (memory, saves): one line, exit 2
        parser.refuse(str(error))
    code = {"ok": 0, "interrupted": 130}.get(result.status, 1)  # 'oom', 'diverged': 1
    # RANK is set by every launcher (accelerate launch, torchrun); absent: one process.
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{result!r}; {result.num_processes} process(es); accuracy "
              f"{'n/a' if result.accuracy is None else f'{result.accuracy:.4f}'}", flush=True)
        if args.json:
            figures = {**result.summary(), "name": result.name, "num_processes": result.num_processes,
                       "loss_steps": result.loss_steps, "losses": result.losses,
                       "eval_loss": result.eval_loss}
            try:  # whole or not at all: a full disk leaves the file that was there
                write_whole(args.json, json.dumps(figures, indent=1))
            except OSError as error:
                print(f"{parser.prog}: error: --json {args.json!r} could not be written ({error.strerror or error}); "
                      "the file there, if any, is unchanged", file=sys.stderr)
                code = code or 1
    _leave_process_group()
    return code


def _leave_process_group() -> None:
    """Under `accelerate launch`, take the process group down before the interpreter exits. Left
    up, gloo's threads meet C++ static destruction: 1 launch in 10 here ended with a rank aborting
    ('terminate called without an active exception', SIGABRT) after its run had finished, so the
    launcher exited 1. The barrier first: no rank tears its side down while another still sends."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
