"""Multi-process runs from a notebook: the same RunConfig on N processes.

`launch(config, num_processes=2)` starts N processes on this machine (one per GPU,
or CPU processes over gloo), runs `run()` in each and streams every child's records
back through a pipe, so the live dashboard here shows the run as it trains. It
returns rank 0's RunResult: its loss is the mean over all processes, its throughput
counts every process's samples.

It is accelerate's `notebook_launcher` mechanism (set the environment accelerate reads,
`PrepareForLaunch`), with what a notebook needs on top:
- the children are not forked from the notebook, whose threads may hold a lock at that instant,
  but from a fork server that holds none (launching/processes.py: the hang this removed);
- every child asserts the world size: on CPU a plain `Accelerator()` under
  `notebook_launcher` silently starts N unconnected world-size-1 processes;
- the parent feeds the children's records to its sinks, on its own main thread;
- a child that raises: its traceback is printed here, the others are stopped and the
  launcher returns a 'failed' result; `timeout_s` bounds a hang; Stop stops them at once, and
  whatever ends a launch, what the children started ends with them;
- each child gets its share of the CPU threads (N processes x all cores each would
  oversubscribe the cores and ruin every timing).

Example:
    >>> result = launch(RunConfig(model="mlp", steps=20, batch_size=32), num_processes=2)  # doctest: +SKIP
    >>> result.num_processes, result.status  # doctest: +SKIP
    (2, 'ok')
"""

from __future__ import annotations

import copy
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch
from accelerate.state import PartialState
from accelerate.utils import PrepareForLaunch
from torch.distributed import TCPStore

from workbench.core import custom
from workbench.core.config import RunConfig
from workbench.core.data import load_data
from workbench.core.engine.accelerator import reset_accelerate_state
from workbench.core.engine.train import run
from workbench.core.measure.recorder import Recorder
from workbench.core.measure.records import RunEnd, RunStart, Sink, StepRecord
from workbench.core.measure.result import RunResult
from workbench.launching import processes
from workbench.launching.processes import ByValue, LaunchError, free_port  # noqa: F401  (free_port: re-exported)
from workbench.machine import hardware
from workbench.planner.fit import check_fits

_POLL_S = 0.05  # how often the parent looks at the pipes and the children


def check_world_size(actual: int, expected: int, rank: int) -> None:
    """Fail loudly if the processes did not join one group (one line, with the fix)."""
    if actual != expected:
        raise LaunchError(
            f"process {rank}: {expected} processes were started but they formed a world of "
            f"{actual}; on CPU build the Accelerator with cpu=True (or set ACCELERATE_USE_CPU=1) "
            "so the processes connect over gloo"
        )


class _PipeSink:
    """A child's sink: sends every record to the parent as it happens."""

    def __init__(self, conn: multiprocessing.connection.Connection) -> None:
        self.conn = conn

    def start(self, record: RunStart) -> None:
        self.conn.send(("start", record))

    def log(self, record: StepRecord) -> None:
        self.conn.send(("log", record))

    def end(self, record: RunEnd) -> None:
        self.conn.send(("end", record))


def _child(payload: Any, name: str | None, conn: multiprocessing.connection.Connection, others: list,
           num_processes: int, threads: int, cpu: bool) -> None:
    """Runs in each child (after accelerate's PrepareForLaunch set RANK and LOCAL_RANK)."""
    rank = int(os.environ["RANK"])
    for other in others:  # a forked child's copies of the other pipes: a dead sibling must read as EOF
        other.close()
    torch.set_num_threads(threads)
    try:
        target, args = payload.load() if isinstance(payload, ByValue) else payload
        # A forked child inherits the notebook's single-process accelerate state: drop it,
        # then form the process group now, so the world size is known before any work.
        reset_accelerate_state(keep_process_group=False)
        state = PartialState(cpu=cpu)
        check_world_size(state.num_processes, num_processes, rank)
        conn.send(("hello", {"rank": state.process_index, "world_size": state.num_processes,
                             "threads": torch.get_num_threads(), "pid": os.getpid(), "device": str(state.device)}))
        if isinstance(target, RunConfig):
            value: Any = run(target, sinks=[_PipeSink(conn)], name=name, check_fit=check_fits)
        else:
            value = target(*args)
        processes.leave_together()  # a rank gone before its peers formed the group failed theirs
    except BaseException as error:
        # When one process fails, its peers fail next ("Connection closed by peer"):
        # the time says which failure came first, the cause rather than an echo. run()'s note
        # points at this process's .result, which stays here: the cause's line stays the last.
        vars(error).pop("__notes__", None)
        conn.send(("started", processes.own_descendants()))
        conn.send(("error", {"rank": rank, "time": time.time(), "traceback": traceback.format_exc()}))
        sys.stderr.flush()  # the parent shows it, once: multiprocessing would print it again here
        os._exit(1)
    conn.send(("started", processes.own_descendants()))  # what this rank leaves running: stopped there
    conn.send(("result", _without_own_objects(value)))
    conn.close()
    # Leave as a forked child does (os._exit). A spawned one otherwise goes through Python's
    # shutdown, where the process group's threads, still running, aborted it ("terminate called
    # without an active exception", SIGABRT: 2 of 12 spawned launches here, 0 of 8 with this).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _without_own_objects(value: Any) -> Any:
    """A result whose config names your own module and dataset in words: their tensors would
    cross the pipe through shared memory that is gone once this child exits (measured: the
    parent's recv failed, FileNotFoundError). The parent puts its own objects back (launch()).
    A trained model kept by a run that ended badly after training (`_Run.ended_result`) stays
    here too, for the same reason."""
    if not isinstance(value, RunResult) or not isinstance(value.config, RunConfig):
        return value
    config = copy.copy(value.config)  # not RunConfig(...): a description is no model to check
    config.model, config.data = custom.describe_model(config.model), custom.describe_data(config.data)
    return replace(value, config=config, model=None)


def _launch(target: RunConfig | Callable[..., Any], args: tuple, *, num_processes: int, name: str | None,
            on_record: Callable[[str, Any], None], timeout_s: float | None, start_method: str,
            threads_per_process: int | None, device: str) -> tuple[dict[int, Any], str | None, str]:
    """Start the children, pump their messages until they finish; (values, failure, status).
    Whatever ends it (the children, a failure, the timeout, Stop), nothing they started lives on."""
    processes.check_num_processes(num_processes)
    processes.check_limits(timeout_s, threads_per_process)
    if device != "cpu" and num_processes > torch.cuda.device_count():
        raise ValueError(
            f"num_processes={num_processes} but {torch.cuda.device_count()} GPU(s) are visible; "
            f"pass num_processes <= {torch.cuda.device_count()} or device='cpu'"
        )
    threads = threads_per_process or max(1, torch.get_num_threads() // num_processes)
    method = processes.start_method(start_method)
    payload: Any = (target, args) if method == "fork" else ByValue(target, args)
    children, pipes, store = None, [], None
    try:
        # The rendezvous store lives here, on a port the OS picked and this process holds, so no
        # other program can take it between choosing and binding; the children join it as clients
        # (TORCHELASTIC_USE_AGENT_STORE: how torchrun's agent hosts it too). Its constructor and
        # this round trip return once its server thread has handled this process's connection
        # (a name lookup, strace shows), before any child is forked.
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        store.set("workbench/launch", "ready")
        children = processes.Children(method)
        pipes = [children.ctx.Pipe(duplex=False) for _ in range(num_processes)]
        readers = {reader: rank for rank, (reader, _) in enumerate(pipes)}
        per_rank = []
        for rank, (_, writer) in enumerate(pipes):
            # forked children hold copies of every pipe: each closes all but its own writer
            others = [end for r, pair in enumerate(pipes) for end in pair if not (r == rank and end is writer)]
            per_rank.append((payload, name, writer, others if method == "fork" else [], num_processes, threads,
                             device == "cpu"))
        launcher = PrepareForLaunch(_child, distributed_type="MULTI_CPU" if device == "cpu" else "MULTI_GPU")
        try:
            children.start(launcher, per_rank, _child_env(num_processes, store.port, threads, cpu=device == "cpu"))
        finally:
            for _, writer in pipes:  # the children hold them now; closed here, a dead child reads as EOF
                writer.close()
        return _gather(children, readers, on_record=on_record, timeout_s=timeout_s)
    except KeyboardInterrupt:  # Stop while the children were starting
        return {}, "stopped by the user", "interrupted"
    finally:
        if children is not None:
            children.stop()
        for reader, _ in pipes:
            reader.close()
        del store


def _child_env(num_processes: int, port: int, threads: int, *, cpu: bool) -> dict[str, str]:
    """This process's environment with what accelerate's PrepareForLaunch and torch.distributed
    read in each child (a fork server's child would otherwise have the server's environment)."""
    env = {**os.environ, "WORLD_SIZE": str(num_processes), "NPROC": str(num_processes), "NODE_RANK": "0",
           "LOCAL_WORLD_SIZE": str(num_processes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "TORCHELASTIC_USE_AGENT_STORE": "True",
           "OMP_NUM_THREADS": str(threads)}  # set: accelerate then leaves each child's thread count alone
    if cpu:
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def _gather(children: processes.Children, readers: dict[Any, int], *, on_record: Callable[[str, Any], None],
            timeout_s: float | None) -> tuple[dict[int, Any], str | None, str]:
    """Pass the children's records on and keep their values until they all end, one fails or
    the time is up; (values by rank, failure, status). The readers of ended pipes are dropped."""
    values: dict[int, Any] = {}
    errors: list[dict[str, Any]] = []
    failure, status = None, "ok"
    ended_badly: dict[int, int] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def pump(wait_s: float) -> None:
        for reader in multiprocessing.connection.wait(list(readers), timeout=wait_s):
            try:
                kind, payload = reader.recv()
            except (EOFError, OSError):  # the child closed its end, or died
                del readers[reader]
                continue
            if kind == "result":
                values[readers[reader]] = payload
            elif kind == "started":
                children.adopt(payload)
            elif kind == "error":
                errors.append(payload)
            else:
                on_record(kind, payload)

    try:
        while True:
            pump(_POLL_S)
            children.watch()
            codes = children.exitcodes
            ended_badly = {rank: code for rank, code in enumerate(codes) if code not in (None, 0)}
            if ended_badly:
                failure, status = "; ".join(processes.describe_exit(r, c) for r, c in ended_badly.items()), "failed"
                break
            if all(code == 0 for code in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                failure, status = f"timed out after {timeout_s:g} s (timeout_s); the children were stopped", "failed"
                break
        if status == "failed":  # the others would wait for the failed one in their next collective
            children.stop()
        # What the children wrote before exiting (every pipe ends once they did: a message cut
        # short reads as EOF, never blocks).
        end = time.monotonic() + 2.0
        while readers and time.monotonic() < end:
            pump(_POLL_S)
        if errors and status == "failed" and not failure.startswith("timed out"):
            first = min(errors, key=lambda e: e["time"])
            echoes = [f"process {e['rank']}: {_last_line(e['traceback'])}" for e in errors if e is not first]
            then = f" (failed after it, often as a consequence: {'; '.join(echoes)})" if echoes else ""
            failure = f"process {first['rank']} failed first{then}:\n{first['traceback'].strip()}"
            # A rank that had already ended without a traceback (killed, crashed in C++) when the
            # failure was seen: likely the cause of the others' "Connection closed by peer".
            silent = [processes.describe_exit(r, c) for r, c in ended_badly.items() if r not in {e["rank"] for e in errors}]
            if silent:
                failure = f"{'; '.join(silent)} without a traceback, and {failure}"
    except KeyboardInterrupt:
        failure, status = "stopped by the user", "interrupted"
    return values, failure, status


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


def launch(config: RunConfig, *, num_processes: int = 2, name: str | None = None,
           sinks: Iterable[Sink] = (), timeout_s: float | None = None,
           start_method: str = "auto", threads_per_process: int | None = None) -> RunResult:
    """Run `config` data-parallel on `num_processes` processes and return rank 0's result.

    Each process trains on its own shard of every batch (`batch_size` is per
    process: the global batch is batch_size x num_processes x grad_accum_steps);
    gradients are averaged across processes at each optimizer step.

    Args:
        num_processes: processes to start (GPUs: at most one per GPU).
        sinks: where the records go, here in this process (`workbench.launch` defaults
            them to the live dashboard in a notebook, text elsewhere). Rank 0's records are shown (its
            loss is the mean over all processes, its throughput counts all of them).
        timeout_s: stop the children and return a 'failed' result after this long.
        start_method: 'auto' (the fork server where this process's default forks, Linux; else
            spawn, macOS and Windows), 'forkserver', 'spawn' or 'fork' (launching/processes.py: why
            the children are not forked from the notebook by default).
        threads_per_process: CPU threads per child; default: this process's
            threads divided among the children.

    Example:
        >>> two = launch(RunConfig(model="mlp", steps=20), num_processes=2, name="2 processes")  # doctest: +SKIP
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig, got {type(config).__name__}; use launch_function for a function")
    cfg = config.resolved()  # bad values fail here, before any process starts
    processes.check_num_processes(num_processes)
    processes.check_limits(timeout_s, threads_per_process)
    method = processes.start_method(start_method)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be text, got {type(name).__name__} {name!r}; pass e.g. name='2 processes'")
    check_fits(cfg, processes=num_processes)  # all N on this machine: refused here, before any fork
    name = name or f"{custom.model_name(cfg.model)} {cfg.precision} b{cfg.batch_size} x{num_processes}"
    # What the parent saw of the run: rank 0's records (they already hold the global figures).
    recorder = Recorder(name=name, total_steps=cfg.steps, log_every=cfg.log_every, sinks=sinks, meter=None,
                        device=hardware.resolve_device(cfg.device), num_processes=num_processes)
    hellos: list[dict[str, Any]] = []

    def on_record(kind: str, record: Any) -> None:
        if kind == "hello":
            hellos.append(record)
        elif getattr(record, "rank", 0) == 0:
            recorder.relay(kind, record)

    began = time.perf_counter()
    if method == "fork":
        _warm_up(cfg)
    values, failure, status = _launch(  # the children resolve `config` in their world (epochs)
        config, (), num_processes=num_processes, name=name, on_record=on_record, timeout_s=timeout_s,
        start_method=start_method, threads_per_process=threads_per_process,
        device=recorder.device,
    )
    wall = time.perf_counter() - began
    extra = {"launch_wall_s": wall, "processes": sorted(hellos, key=lambda h: h["rank"])}
    if status == "ok" and 0 in values:
        result = values[0]
        config = copy.copy(result.config)
        config.model, config.data = cfg.model, cfg.data  # your module and dataset, as the children described them
        return replace(result, name=name, config=config, extra={**result.extra, **extra})
    if status == "ok":  # every child exited cleanly but rank 0 sent no result
        status, failure = "failed", "rank 0 exited without a result"
    message = _last_line(failure or status)
    if failure and status == "failed":
        print(f"[{name}] a child process failed:\n{failure}", file=sys.stderr, flush=True)
    if recorder.ended is None or recorder.ended.status == "ok":  # the sinks hear how it ended
        recorder.end(status, message, sinks=recorder.sinks)
    # what the parent saw of a run that did not finish: its curve so far
    return recorder.result(config=cfg, status=status, message=message, wall_s=wall,
                           extra={**extra, "traceback": failure or ""})


def _warm_up(cfg: RunConfig) -> None:
    """Under fork: import and load here what every child needs: forked children inherit it
    (copy-on-write) instead of each importing accelerate and reading the data again. (The fork
    server imports the same modules once: processes.PRELOAD.) The loop and accelerate are
    imported at this module's top already."""
    # Not at the top: seconds to import, and only a forked launch needs it before the fork
    # (accelerate's prepare() imports it in each child otherwise).
    import torch._dynamo  # noqa: F401

    # The same arguments as run() uses, so the children hit this cache (a dataset passed in is in memory).
    if not custom.is_own_data(cfg.data):
        load_data(cfg.data, seq_len=cfg.seq_len or 128, max_test=cfg.eval_samples or None, seed=cfg.seed)


def launch_function(fn: Callable[..., Any], *args: Any, num_processes: int = 2, device: str = "auto",
                    timeout_s: float | None = None, start_method: str = "auto",
                    threads_per_process: int | None = None) -> list[Any]:
    """Call `fn(*args)` on each of `num_processes` connected processes; their return values.

    Like accelerate's `notebook_launcher`, with the process group already formed
    and checked when `fn` starts (so `PartialState()` inside `fn` is connected),
    and with failures that come back: a child that raises makes this raise
    `LaunchError` with the child's traceback, after the others are stopped. Children not
    forked from here (the fork server's, spawned ones) get a function defined in the
    notebook as its code: it imports what it uses in its body. Every argument is checked
    before a process starts.

    Example:
        >>> def world():
        ...     from accelerate import PartialState
        ...     return PartialState().num_processes
        >>> launch_function(world, num_processes=2, device="cpu")  # doctest: +SKIP
        [2, 2]
    """
    if not callable(fn) or isinstance(fn, RunConfig):
        hint = "use launch(config) for a RunConfig" if isinstance(fn, RunConfig) else "pass a function, e.g. launch_function(train, config)"
        raise TypeError(f"fn must be a function to call in each process, got {type(fn).__name__} {_short(fn)}; {hint}")
    processes.check_num_processes(num_processes)
    processes.check_limits(timeout_s, threads_per_process)
    processes.start_method(start_method)
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device={_short(device)} is not known; pass device='auto', 'cpu' or 'cuda'")
    values, failure, status = _launch(
        fn, args, num_processes=num_processes, name=None, on_record=lambda kind, record: None,
        timeout_s=timeout_s, start_method=start_method, threads_per_process=threads_per_process,
        device=hardware.resolve_device(device),
    )
    if status != "ok" or len(values) != num_processes:
        raise LaunchError(failure or f"{num_processes - len(values)} process(es) exited without a result")
    return [values[rank] for rank in range(num_processes)]
