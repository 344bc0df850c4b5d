"""Multi-process runs from a notebook: the same RunConfig on N processes.

`launch(config, num_processes=2)` starts N processes on this machine (one per GPU,
or CPU processes over gloo), runs `run()` in each and streams every child's records
back through a pipe, so the live dashboard here shows the run as it trains. It
returns rank 0's RunResult: its loss is the mean over all processes, its throughput
counts every process's samples. (The module is `launcher`, not `launch`: a submodule
named like the function it exports would shadow `workbench.launch` once imported.)

It is accelerate's `notebook_launcher` mechanism (fork the notebook, set the
environment accelerate reads, `PrepareForLaunch`), with what a notebook needs on top:
- every child asserts the world size: on CPU a plain `Accelerator()` under
  `notebook_launcher` silently starts N unconnected world-size-1 processes;
- the parent feeds the children's records to its sinks, on its own main thread;
- a child that raises: its traceback is printed here, the others are stopped and the
  launcher returns a 'failed' result; `timeout_s` bounds a hang;
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
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from workbench.core import custom
from workbench.core.config import RunConfig
from workbench.core.limits import usable_cores
from workbench.measure.recorder import Recorder
from workbench.measure.records import RunEnd, RunStart, Sink, StepRecord
from workbench.measure.result import RunResult

_POLL_S = 0.05  # how often the parent looks at the pipes and the children


class LaunchError(RuntimeError):
    """A multi-process launch that cannot start or did not finish; says why."""


def free_port() -> int:
    """A TCP port free right now (e.g. for `accelerate launch --main_process_port`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _child(target: RunConfig | Callable[..., Any], args: tuple, name: str | None, conns: list,
           num_processes: int, threads: int, cpu: bool) -> None:
    """Runs in each child (after accelerate's PrepareForLaunch set RANK and LOCAL_RANK)."""
    import torch
    from accelerate.state import PartialState

    from workbench.engine.accelerator import reset_accelerate_state

    rank = int(os.environ["RANK"])
    conn = conns[rank]
    for i, other in enumerate(conns):  # keep only this child's pipe end open
        if i != rank:
            other.close()
    torch.set_num_threads(threads)
    try:
        # A forked child inherits the notebook's single-process accelerate state: drop it,
        # then form the process group now, so the world size is known before any work.
        reset_accelerate_state(keep_process_group=False)
        state = PartialState(cpu=cpu)
        check_world_size(state.num_processes, num_processes, rank)
        conn.send(("hello", {"rank": state.process_index, "world_size": state.num_processes,
                             "threads": torch.get_num_threads(), "pid": os.getpid(), "device": str(state.device)}))
        if isinstance(target, RunConfig):
            from workbench.engine.train import run

            value: Any = run(target, sinks=[_PipeSink(conn)], name=name)
        else:
            value = target(*args)
    except BaseException as error:
        # When one process fails, its peers fail next ("Connection closed by peer"):
        # the time says which failure came first, the cause rather than an echo. run()'s note
        # points at this process's .result, which stays here: the cause's line stays the last.
        vars(error).pop("__notes__", None)
        conn.send(("error", {"rank": rank, "time": time.time(), "traceback": traceback.format_exc()}))
        raise
    conn.send(("result", _without_own_objects(value)))
    conn.close()
    # Leave as a forked child does (os._exit). A spawned one otherwise goes through Python's
    # shutdown, where the process group's threads, still running, aborted it ("terminate called
    # without an active exception", SIGABRT: 2 of 12 spawned launches here, 0 of 8 with this).
    # (destroy_process_group first instead: 0 of 16 aborted, but 06 cell 6 then timed out once under
    # make test-spawn, cause not found.)
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


def _check_num_processes(num_processes: Any) -> None:
    if not isinstance(num_processes, int) or isinstance(num_processes, bool) or num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r} must be a whole number >= 1; pass e.g. num_processes=2")
    # Each process is a full torch (~300 MB) with its own pipe; measured: 10**6 ran out of file
    # descriptors after creating pipes for a while. More processes than cores only share them.
    most = max(2, 2 * usable_cores())
    if num_processes > most:
        raise ValueError(f"num_processes={num_processes} is more processes than this machine can run side by side "
                         f"({usable_cores()} usable cores); pass num_processes <= {most}")


def _check_limits(timeout_s: Any, threads_per_process: Any) -> None:
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not 0 < timeout_s < float("inf")):
        raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds or None; pass e.g. timeout_s=600")
    if threads_per_process is not None and (isinstance(threads_per_process, bool) or not isinstance(threads_per_process, int)
                                            or not 1 <= threads_per_process <= max(1, usable_cores())):
        raise ValueError(f"threads_per_process={threads_per_process!r} must be a whole number from 1 to "
                         f"{usable_cores()} (the usable cores) or None; pass e.g. threads_per_process=1")


def _start_method(requested: str) -> str:
    import torch

    if requested not in ("auto", "fork", "spawn", "forkserver"):
        raise ValueError(f"start_method={requested!r} is not known; use 'auto', 'fork', 'spawn' or 'forkserver'")
    if requested != "auto":
        return requested
    # CUDA initialised in this process cannot be used by a forked child; the children then start
    # fresh (spawn). So they do where this process's start method is not fork: multiprocessing's
    # default on macOS and Windows (the first of get_all_start_methods), or one a user set.
    default = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return "spawn" if torch.cuda.is_initialized() or default != "fork" else "fork"


class _ByValue:
    """A function defined in a notebook, carried to a spawned child as its code (dill, which
    `datasets` depends on): a fresh process cannot import a notebook's `__main__`. What the
    function uses it imports in its body, or dill carries along (its globals, recurse=True)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        import dill

        try:
            self.code = dill.dumps(fn, recurse=True)
        except Exception as error:  # noqa: BLE001: any pickling failure gets the same fix
            raise LaunchError(f"{fn.__qualname__} (defined in the notebook) cannot be sent to a spawned process "
                              f"({type(error).__name__}: {error}); define it in a .py module and import it") from None

    def __call__(self, *args: Any) -> Any:
        import dill

        return dill.loads(self.code)(*args)


def _launch(target: RunConfig | Callable[..., Any], args: tuple, *, num_processes: int, name: str | None,
            on_record: Callable[[str, Any], None], timeout_s: float | None, start_method: str,
            threads_per_process: int | None, device: str) -> tuple[dict[int, Any], str | None, str]:
    """Start the children, pump their messages until they finish; (values, failure, status)."""
    import torch

    _check_num_processes(num_processes)
    _check_limits(timeout_s, threads_per_process)
    if device != "cpu" and num_processes > torch.cuda.device_count():
        raise ValueError(
            f"num_processes={num_processes} but {torch.cuda.device_count()} GPU(s) are visible; "
            f"pass num_processes <= {torch.cuda.device_count()} or device='cpu'"
        )
    threads = threads_per_process or max(1, torch.get_num_threads() // num_processes)
    method = _start_method(start_method)
    if method != "fork" and getattr(target, "__module__", None) == "__main__":
        target = _ByValue(target)
    context, readers, store = _start_children(target, args, name=name, num_processes=num_processes, threads=threads,
                                              method=method, cpu=device == "cpu")
    try:
        return _gather(context, readers, on_record=on_record, timeout_s=timeout_s)
    finally:
        _stop(context)
        for reader in list(readers):
            reader.close()
        del store


def _start_children(target: RunConfig | Callable[..., Any], args: tuple, *, name: str | None, num_processes: int,
                    threads: int, method: str, cpu: bool) -> tuple[Any, dict[Any, int], Any]:
    """The children, started on a rendezvous store held here; (their context, a pipe reader per
    rank, the store: keep it until they are done)."""
    from accelerate.utils import PrepareForLaunch, patch_environment
    from torch.distributed import TCPStore
    from torch.multiprocessing import start_processes

    ctx = multiprocessing.get_context(method)
    pipes = [ctx.Pipe(duplex=False) for _ in range(num_processes)]
    readers = {reader: rank for rank, (reader, _) in enumerate(pipes)}
    writers = [writer for _, writer in pipes]
    # The rendezvous store lives here, on a port the OS picked and this process holds, so no
    # other program can take it between choosing and binding; the children join it as
    # clients (TORCHELASTIC_USE_AGENT_STORE: how torchrun's agent hosts it too).
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = dict(
        world_size=num_processes, nproc=num_processes, node_rank=0, local_world_size=num_processes,
        master_addr="127.0.0.1", master_port=store.port, torchelastic_use_agent_store="True",
        # OMP_NUM_THREADS set: accelerate then leaves each child's thread count alone.
        omp_num_threads=threads,
    )
    if cpu:
        env["accelerate_use_cpu"] = "true"
    with patch_environment(**env):
        context = start_processes(
            PrepareForLaunch(_child, distributed_type="MULTI_CPU" if cpu else "MULTI_GPU"),
            args=(target, args, name, writers, num_processes, threads, cpu),
            nprocs=num_processes, join=False, start_method=method,
        )
    for writer in writers:  # the children hold them now; closed here, a dead child reads as EOF
        writer.close()
    return context, readers, store


def _gather(context: Any, readers: dict[Any, int], *, on_record: Callable[[str, Any], None],
            timeout_s: float | None) -> tuple[dict[int, Any], str | None, str]:
    """Pass the children's records on and keep their values until they all end, one fails or
    the time is up; (values by rank, failure, status). The readers of ended pipes are dropped."""
    from torch.multiprocessing.spawn import (
        ProcessExitedException,
        ProcessRaisedException,
    )

    values: dict[int, Any] = {}
    errors: list[dict[str, Any]] = []
    failure, status = None, "ok"
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
            elif kind == "error":
                errors.append(payload)
            else:
                on_record(kind, payload)

    try:
        while True:
            pump(_POLL_S)
            try:
                if context.join(timeout=0, grace_period=2.0):
                    break
            except (ProcessRaisedException, ProcessExitedException) as error:
                failure, status = str(error).strip(), "failed"
                break
            if deadline is not None and time.monotonic() > deadline:
                failure, status = f"timed out after {timeout_s:g} s (timeout_s); the children were stopped", "failed"
                break
        # What the children wrote before exiting (after a failure join() has stopped them
        # all, so every pipe ends: a message cut short reads as EOF, never blocks).
        end = time.monotonic() + 2.0
        while readers and time.monotonic() < end:
            pump(_POLL_S)
        if errors and status == "failed" and not failure.startswith("timed out"):
            first = min(errors, key=lambda e: e["time"])
            echoes = [f"process {e['rank']}: {_last_line(e['traceback'])}" for e in errors if e is not first]
            then = f" (failed after it, often as a consequence: {'; '.join(echoes)})" if echoes else ""
            failure = f"process {first['rank']} failed first{then}:\n{first['traceback'].strip()}"
    except KeyboardInterrupt:
        failure, status = "stopped by the user", "interrupted"
    return values, failure, status


def _stop(context: Any) -> None:
    for process in context.processes:
        if process.is_alive():
            process.terminate()
    for process in context.processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()


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
        start_method: 'fork' (fast), 'spawn', or 'auto': fork where it is this process's
            multiprocessing start method (Linux) and CUDA is not initialised here, else spawn.
        threads_per_process: CPU threads per child; default: this process's
            threads divided among the children.

    Example:
        >>> two = launch(RunConfig(model="mlp", steps=20), num_processes=2, name="2 processes")  # doctest: +SKIP
    """
    from workbench.core import hardware
    from workbench.planner.fit import check_fits

    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig, got {type(config).__name__}; use launch_function for a function")
    cfg = config.resolved()  # bad values fail here, before any process starts
    _check_num_processes(num_processes)
    _check_limits(timeout_s, threads_per_process)
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
    if _start_method(start_method) == "fork":
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
    """Import and load here what every child needs: forked children inherit it
    (copy-on-write) instead of each importing accelerate and reading the data again."""
    import accelerate.accelerator  # noqa: F401
    import torch._dynamo  # noqa: F401  (accelerate's prepare() imports it: seconds, per child)

    from workbench.core.data import load_data
    from workbench.engine import train  # noqa: F401  (the loop and what it imports)

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
    `LaunchError` with the child's traceback, after the others are stopped. Spawned
    children (macOS, Windows, CUDA initialised here) get a function defined in the
    notebook as its code: it imports what it uses in its body.

    Example:
        >>> def world():
        ...     from accelerate import PartialState
        ...     return PartialState().num_processes
        >>> launch_function(world, num_processes=2, device="cpu")  # doctest: +SKIP
        [2, 2]
    """
    from workbench.core import hardware

    values, failure, status = _launch(
        fn, args, num_processes=num_processes, name=None, on_record=lambda kind, record: None,
        timeout_s=timeout_s, start_method=start_method, threads_per_process=threads_per_process,
        device=hardware.resolve_device(device),
    )
    if status != "ok" or len(values) != num_processes:
        raise LaunchError(failure or f"{num_processes - len(values)} process(es) exited without a result")
    return [values[rank] for rank in range(num_processes)]
