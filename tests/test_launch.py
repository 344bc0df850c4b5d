"""launch(): the same RunConfig on N processes from a notebook, records back to the parent."""

import contextlib
import multiprocessing.context
import os
import time

import accelerate.utils
import pytest

from workbench import RunConfig, run
from workbench.core.engine import train
from workbench.core.views.sinks import RecordingSink
from workbench.launching import launch as launch_module
from workbench.launching.launch import LaunchError, check_world_size, launch, launch_function

TINY = dict(model="mlp", data="digits", steps=8, log_every=2, dims={"hidden": (32,)}, eval_samples=100)


def test_two_processes_of_batch_b_train_like_one_process_of_batch_2b():
    one = run(RunConfig(**TINY, batch_size=32), sinks=[], name="1 x 32")
    sink = RecordingSink()
    two = launch(RunConfig(**TINY, batch_size=16), num_processes=2, sinks=[sink], name="2 x 16")
    assert two.status == "ok" and two.num_processes == 2 and one.num_processes == 1
    # The same global batches in the same order; only the summation order of the
    # gradient differs (two halves all-reduced), so the curves agree to float rounding.
    assert two.loss_steps == one.loss_steps == [2, 4, 6, 8]
    assert two.losses == pytest.approx(one.losses, abs=1e-5)
    assert two.eval_loss == pytest.approx(one.eval_loss, abs=1e-5)
    assert two.accuracy == one.accuracy  # every held-out sample counted once, none twice
    # The parent's sinks saw rank 0's records, live: its loss is the mean over both processes.
    assert [r.step for r in sink.steps] == [2, 4, 6, 8] and {r.rank for r in sink.steps} == {0}
    assert [r.loss for r in sink.steps] == two.losses
    assert len(sink.starts) == 1 and sink.ends[-1].status == "ok"
    processes = two.extra["processes"]
    assert [p["rank"] for p in processes] == [0, 1] and {p["world_size"] for p in processes} == {2}
    assert {p["threads"] for p in processes} == {1}  # OMP_NUM_THREADS=1 shared by two children


class _EachAWorldOfOne(accelerate.utils.PrepareForLaunch):
    """What a plain Accelerator() on CPU gets under notebook_launcher: every process rank 0 of a
    world of one (with WORLD_SIZE=1 below)."""

    def __call__(self, index, *args):
        os.environ.update(LOCAL_RANK="0", RANK="0", FORK_LAUNCHED="1")
        self.launcher(*args)


def test_processes_that_do_not_form_one_world_fail_loudly(monkeypatch):
    real = launch_module._child_env
    monkeypatch.setattr(launch_module, "_child_env", lambda *args, **kwargs: {**real(*args, **kwargs), "WORLD_SIZE": "1"})
    monkeypatch.setattr(launch_module, "PrepareForLaunch", _EachAWorldOfOne)  # what launch.py calls
    sink = RecordingSink()
    result = launch(RunConfig(**TINY, batch_size=16), num_processes=2, sinks=[sink], timeout_s=60)
    assert result.status == "failed" and "formed a world of 1" in result.message
    assert "cpu=True" in result.message and result.steps_done == 0
    assert sink.ends[-1].status == "failed"


def test_check_world_size_names_the_fix():
    check_world_size(2, 2, rank=0)
    with pytest.raises(LaunchError, match="2 processes were started but they formed a world of 1; .*ACCELERATE_USE_CPU=1"):
        check_world_size(1, 2, rank=1)


def test_a_child_that_raises_returns_a_failed_result_with_its_traceback(monkeypatch, capsys):
    real_loss = train.loss_fn
    calls = []

    def loss_fn(logits, labels):  # rank 1 fails at its third micro-batch; rank 0 is mid all-reduce
        import torch.distributed as dist

        calls.append(1)
        if dist.get_rank() == 1 and len(calls) == 3:
            raise ValueError("rank 1 read a corrupt batch")
        return real_loss(logits, labels)

    monkeypatch.setattr(train, "loss_fn", loss_fn)  # forked children inherit it
    sink = RecordingSink()
    began = time.monotonic()
    result = launch(RunConfig(**{**TINY, "log_every": 1}, batch_size=16), num_processes=2, sinks=[sink],
                    timeout_s=60, name="flaky", start_method="fork")
    assert time.monotonic() - began < 30  # returned on the failure, long before the timeout
    assert result.status == "failed" and result.message == "ValueError: rank 1 read a corrupt batch"
    assert "Traceback" in result.extra["traceback"] and "loss_fn" in result.extra["traceback"]
    # The cause, not its echo: rank 0 then fails too, in the all-reduce rank 1 never joins.
    assert result.extra["traceback"].startswith("process 1 failed first")
    assert result.loss_steps == [1, 2]  # the curve up to the failure came back
    assert sink.ends[-1].status == "failed"
    assert "Traceback" in capsys.readouterr().err  # shown where the learner looks


def test_a_rank_that_died_without_a_traceback_is_named_beside_the_one_that_failed_first():
    # Rank 0's "Connection closed by peer" at the process group's forming (seen once in five
    # clean-clone CI runs) is an echo if rank 1 had died already: both must be in the message.
    reader, writer = multiprocessing.Pipe(duplex=False)
    writer.send(("error", {"rank": 0, "time": 1.0, "traceback": "Traceback ...\nRuntimeError: Connection closed by peer"}))
    writer.close()

    class Ended:  # rank 0 exited 1 after its traceback, rank 1 was killed before writing anything
        exitcodes = [1, -9]
        stopped = 0

        def watch(self): ...

        def adopt(self, started): ...

        def stop(self):
            self.stopped += 1

    children = Ended()
    values, failure, status = launch_module._gather(children, {reader: 0}, on_record=lambda kind, record: None,
                                                    timeout_s=10)
    assert (values, status, children.stopped) == ({}, "failed", 1)
    assert failure.startswith("process 1 was killed by SIGKILL without a traceback, and process 0 failed first:")
    assert failure.endswith("RuntimeError: Connection closed by peer")


class _InterruptAtStep:
    """The learner presses stop (KeyboardInterrupt in the notebook's process) at step `at`."""

    def __init__(self, at):
        self.at = at

    def start(self, record): ...

    def log(self, record):
        if record.step >= self.at:
            raise KeyboardInterrupt

    def end(self, record): ...


def test_an_interrupt_in_the_notebook_stops_the_children_and_keeps_the_curve():
    sink = RecordingSink()
    result = launch(RunConfig(**{**TINY, "steps": 200}, batch_size=16), num_processes=2,
                    sinks=[sink, _InterruptAtStep(4)], timeout_s=60)
    assert result.status == "interrupted" and result.loss_steps == [2, 4]
    assert sink.ends[-1].status == "interrupted"


def _sleep_forever():
    time.sleep(600)


def test_a_hung_child_is_stopped_at_the_timeout():
    began = time.monotonic()
    with pytest.raises(LaunchError, match=r"timed out after 2 s"):
        launch_function(_sleep_forever, num_processes=2, device="cpu", timeout_s=2)
    assert time.monotonic() - began < 15


def _world():
    import os

    from accelerate import PartialState

    state = PartialState()
    return state.process_index, state.num_processes, os.getpid()


def test_launch_function_runs_on_connected_processes_and_returns_their_values():
    import os

    values = launch_function(_world, num_processes=2, device="cpu", timeout_s=60)
    assert [v[:2] for v in values] == [(0, 2), (1, 2)]
    assert os.getpid() not in {v[2] for v in values}


def test_launch_rejects_bad_arguments_before_starting_anything():
    with pytest.raises(ValueError, match="num_processes=0 must be a whole number >= 1"):
        launch(RunConfig(**TINY, batch_size=16), num_processes=0, sinks=[])
    with pytest.raises(ValueError, match="start_method='thread' is not known; use 'auto', 'fork'"):
        launch(RunConfig(**TINY, batch_size=16), num_processes=2, sinks=[], start_method="thread")


def test_two_processes_save_and_resume_to_the_same_curve(tmp_path):
    cfg = RunConfig(**{**TINY, "eval_samples": 0}, batch_size=16)
    whole = launch(cfg, num_processes=2, sinks=[])
    first = launch(RunConfig(**{**TINY, "eval_samples": 0, "steps": 4}, batch_size=16, save_state_dir=str(tmp_path)),
                   num_processes=2, sinks=[])
    rest = launch(RunConfig(**{**TINY, "eval_samples": 0}, batch_size=16, resume_from=str(tmp_path)),
                  num_processes=2, sinks=[])
    assert first.status == rest.status == "ok"
    assert sorted(p.name for p in (tmp_path / "step_000004").glob("random_states_*")) == [
        "random_states_0.pkl", "random_states_1.pkl"]  # every process's RNGs
    assert rest.losses == whole.losses  # bit for bit, on CPU


def test_spawned_children_work_too():
    # spawn is what the launcher uses when CUDA is already initialised in the notebook
    values = launch_function(_world, num_processes=2, device="cpu", timeout_s=120, start_method="spawn")
    assert [v[:2] for v in values] == [(0, 2), (1, 2)]


def _defined_in_a_notebook(source: str, name: str, **names):
    """A function as a notebook cell defines it: its module is __main__, which a spawned process
    (macOS's and Windows' start method) cannot import it from."""
    namespace = {"__name__": "__main__", **names}
    exec(source, namespace)
    return namespace[name]


def test_a_function_defined_in_a_notebook_reaches_spawned_children():
    world = _defined_in_a_notebook("def world(offset):\n    from accelerate import PartialState\n"
                                   "    state = PartialState()\n    return state.process_index + offset, state.num_processes\n",
                                   "world")
    assert world.__module__ == "__main__"
    assert launch_function(world, 10, num_processes=2, device="cpu", timeout_s=120, start_method="spawn") == [(10, 2), (11, 2)]


def test_a_notebook_function_that_cannot_be_sent_to_a_spawned_child_says_so_before_starting():
    stuck = _defined_in_a_notebook("def stuck():\n    return next(numbers)\n", "stuck", numbers=(i for i in range(3)))
    with pytest.raises(LaunchError, match=r"^stuck \(defined in the notebook\) cannot be sent to a spawned process "
                                          r"\(.+\); define it in a .py module and import it$"):
        launch_function(stuck, num_processes=2, device="cpu", timeout_s=60, start_method="spawn")


def test_auto_forks_from_the_fork_server_where_this_process_forks_and_spawns_where_it_spawns(monkeypatch):
    import multiprocessing

    from workbench.launching.processes import start_method

    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "spawn")  # macOS, Windows
    assert start_method("auto") == "spawn"
    for default in ("fork", "forkserver"):  # Linux: Python < 3.14, >= 3.14
        monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False, d=default: d)
        assert start_method("auto") == "forkserver"
    assert start_method("fork") == "fork"


def test_the_fork_server_the_children_come_from_holds_no_thread():
    from workbench.launching.processes import forkserver_threads

    # A thread of the notebook's (a rendezvous store's, ipykernel's) can hold a lock at the
    # instant of a fork; the fork server, which forks the children, has none to hold.
    assert launch_function(_world, num_processes=2, device="cpu", timeout_s=120)[0][:2] == (0, 2)
    assert forkserver_threads() == 1


def _siblings_alive_after_a_while():
    import os
    import time

    import psutil
    from accelerate import PartialState

    state = PartialState()
    if state.process_index == 0:
        time.sleep(1.0)  # rank 1 is done by now: under load, rank 0 could still be forming the group
    siblings = [p for p in psutil.Process(os.getppid()).children() if p.pid != os.getpid()]
    return state.process_index, sum(p.status() != psutil.STATUS_ZOMBIE for p in siblings)


def test_no_rank_leaves_before_every_rank_is_done():
    # A rank that returned and exited while its peer was still inside init_process_group failed
    # the peer's init ("Gloo connectFullMesh failed ... Connection closed by peer"): 1 CI run in 4
    # under a busy core, in tests whose children use no collective. Rank 0 here is the slow one:
    # while it works, rank 1, done, must still be there.
    values = dict(launch_function(_siblings_alive_after_a_while, num_processes=2, device="cpu", timeout_s=120))
    assert values[0] == 1, f"rank 1 had left while rank 0 was still working ({values})"


def test_forked_children_still_work_and_connect_only_once_all_are_forked():
    values = launch_function(_world, num_processes=2, device="cpu", timeout_s=120, start_method="fork")
    assert [v[:2] for v in values] == [(0, 2), (1, 2)]


def test_an_epoch_on_two_processes_is_one_pass_over_the_data_by_both():
    # digits: 1,437 images, 22 batches of 64: one process takes 22 steps, two take 11 each.
    cfg = RunConfig(model="mlp", data="digits", epochs=1, batch_size=64, log_every=11, dims={"hidden": (32,)},
                    eval_samples=0)
    assert cfg.resolved().steps == 22
    assert launch(cfg, num_processes=2, sinks=[]).steps_done == 11


def _sleep_in_child(rank: int, seconds: float) -> None:
    time.sleep(seconds)


def _stopped_while_starting(base: type) -> type:
    """`base` (a multiprocessing Process class) whose start() gets a Stop once the child exists."""
    import signal

    def start(self) -> None:
        base.start(self)
        os.kill(os.getpid(), signal.SIGINT)  # the child exists; its Process is not yet recorded
        time.sleep(0.2)  # the handler runs here, inside start()

    return type(f"StoppedWhileStarting{base.__name__}", (base,), {"start": start, "__module__": __name__})


_STOPPED = {cls.__name__: cls for cls in (_stopped_while_starting(multiprocessing.context.ForkProcess),
                                          _stopped_while_starting(multiprocessing.context.ForkServerProcess))}
globals().update(_STOPPED)  # picklable by name: the fork server receives the Process object


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_stop_inside_process_start_reaches_the_child_it_started(method):
    # A Stop (SIGINT) that lands inside Process.start(), once the child exists: KeyboardInterrupt is
    # raised only after the child is recorded, so stop() ends it (before, start() raised with the
    # child alive and unrecorded: no launch could stop it).
    import signal

    import psutil

    from workbench.launching import processes

    children = processes.Children(method)
    stopped = _STOPPED[f"StoppedWhileStarting{children.ctx.Process.__name__}"]
    children.ctx = type("Ctx", (), {"Process": stopped, "Barrier": children.ctx.Barrier})()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a notebook kernel
    try:
        with pytest.raises(KeyboardInterrupt):
            children.start(_sleep_in_child, [(60,)], dict(os.environ))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(children.processes) == 1, "the child started is recorded"
    pid = children.processes[0].pid
    assert psutil.pid_exists(pid)
    children.stop(grace_s=1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert multiprocessing.parent_process() is None


_ORPHAN_LAUNCHER = '''
import os, subprocess, sys, time
from workbench.launching import processes

def rank_that_waits(rank, folder):
    helper = subprocess.Popen(["sleep", "120"])  # in the rank's process group, as a DataLoader worker is
    with open(os.path.join(folder, f"rank{rank}"), "w") as f:
        f.write(f"{os.getpid()} {helper.pid}")
    time.sleep(120)  # as a rank waiting on the launcher's store does

if __name__ == "__main__":
    from launcher import rank_that_waits
    children = processes.Children(sys.argv[1])
    children.start(rank_that_waits, [(sys.argv[2],), (sys.argv[2],)], dict(os.environ))
    time.sleep(120)  # killed here, without its cleanup
'''


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_ranks_end_when_their_launcher_is_killed_without_its_cleanup(tmp_path, method):
    # A kernel killed mid-launch (SIGKILL: no finally runs) used to leave its ranks running for good:
    # they were in process groups of their own and, under the fork server, children of a server that
    # lives as long as they do. Each rank now watches its launcher and ends its group when it is gone.
    import signal
    import subprocess
    import sys

    import psutil

    (tmp_path / "launcher.py").write_text(_ORPHAN_LAUNCHER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    launcher = subprocess.Popen([sys.executable, str(tmp_path / "launcher.py"), method, str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("rank*"))) < 2 or any(not p.read_text() for p in tmp_path.glob("rank*")):
            assert launcher.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.2)
        pids = [int(pid) for path in tmp_path.glob("rank*") for pid in path.read_text().split()]
        assert all(psutil.pid_exists(pid) for pid in pids)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()

        def running(pid):
            try:
                return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False

        deadline = time.monotonic() + 15
        while any(running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in pids if running(pid)], "a rank or what it started outlived its launcher"
    finally:
        launcher.kill()
        for pid in [int(p) for path in tmp_path.glob("rank*") for p in path.read_text().split()]:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
