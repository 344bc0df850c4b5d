"""bounded_launch: accelerate's notebook_launcher, as notebook 06 calls it, with return values and a bounded hang."""

import functools
import threading
import time

import psutil
import pytest

from workbench.lessons.multi_gpu import LaunchHung, bounded_launch


def _notebook_launch(fn, *args, num_processes=2, timeout_s=60.0):
    """Notebook 06's launch cell: notebook_launcher inside bounded_launch, each child's return value collected."""
    from accelerate import notebook_launcher

    with bounded_launch(timeout_s=timeout_s, num_processes=num_processes) as launch:
        notebook_launcher(launch.reporting(fn), args=args, num_processes=num_processes, use_port=launch.port)
    return launch.collect()


def _world():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    return accelerator.process_index, accelerator.num_processes


def test_each_process_returns_its_rank_in_one_world_even_after_a_run_here():
    from workbench.core.config import RunConfig
    from workbench.core.engine.train import run as train_run
    from workbench.planner.fit import check_fits

    run = functools.partial(train_run, check_fit=check_fits)  # as wb.run, without its default view

    run(RunConfig(model="mlp", data="digits", steps=2, eval_samples=0, dims={"hidden": (8,)}))  # makes an Accelerator
    assert sorted(_notebook_launch(_world, num_processes=2, timeout_s=120)) == [(0, 2), (1, 2)]


def test_a_hung_launch_is_stopped_at_its_timeout_and_says_so_without_trying_again():
    calls = []
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    began = time.monotonic()
    with pytest.raises(LaunchHung, match=r"^notebook_launcher did not finish within 3 s: its processes were stopped"):
        _notebook_launch(time.sleep, 600, num_processes=2, timeout_s=3)
    calls.append(1)
    assert time.monotonic() - began < 60 and calls == [1]
    time.sleep(0.5)
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()  # none left


def test_each_child_starts_its_function_only_once_every_sibling_exists():
    # The launcher's store looks up the name of each process that connects; a child forked
    # during such a lookup could inherit the resolver's lock held. So no child connects (its
    # function runs) until all are forked: here, threads standing in for the forked children.
    launch = bounded_launch(timeout_s=30, num_processes=2)
    started = []
    first = threading.Thread(target=launch.reporting(lambda: started.append(time.monotonic())))
    first.start()
    time.sleep(0.5)
    assert started == []  # alone: it waits for its sibling
    second_at = time.monotonic()
    launch.reporting(lambda: started.append(time.monotonic()))()
    first.join(timeout=10)
    assert len(started) == 2 and min(started) >= second_at
    assert launch.collect() == [None, None]


@pytest.mark.parametrize("kwargs, message", [
    ({"timeout_s": 0}, "timeout_s=0 must be a positive number of seconds"),
    ({"timeout_s": float("nan")}, "timeout_s=nan must be a positive number of seconds"),
    ({"num_processes": 0}, "num_processes=0 must be a whole number >= 1"),
    ({"num_processes": True}, "num_processes=True must be a whole number >= 1"),
])
def test_a_bounded_launch_refuses_bounds_that_bound_nothing(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bounded_launch(**kwargs)


def test_the_notebooks_own_launch_cell_collects_each_childs_return_value_and_leaves_the_signals_as_they_were():
    import signal

    from accelerate import notebook_launcher

    handled = [getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, name)]
    before = {s: signal.getsignal(s) for s in handled}
    with bounded_launch(timeout_s=120) as launch:
        notebook_launcher(launch.reporting(_world), num_processes=2, use_port=launch.port)
        # torch's elastic agent took them over for the launch (what this test checks is undone)
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert sorted(launch.collect()) == [(0, 2), (1, 2)]
    # A kernel asked to stop by SIGTERM exits, rather than raising torch's SignalException
    assert {s: signal.getsignal(s) for s in handled} == before


def test_same_curve_says_within_or_more_than_the_tolerance_and_refuses_other_steps():
    from types import SimpleNamespace

    from workbench.lessons.multi_gpu import check_worlds, same_curve

    a = SimpleNamespace(loss_steps=[5, 10], losses=[2.0, 1.0])
    assert same_curve(SimpleNamespace(loss_steps=[5, 10], losses=[2.01, 1.009]), a) == "within 1%"
    assert same_curve(SimpleNamespace(loss_steps=[5, 10], losses=[2.0, 1.02]), a) == "more than 1%"
    with pytest.raises(ValueError, match="other steps"):
        same_curve(SimpleNamespace(loss_steps=[5], losses=[2.0]), a)
    check_worlds({False: [(0, 1), (0, 1)], True: [(0, 2), (1, 2)]})
    with pytest.raises(AssertionError, match="rank, world size"):
        check_worlds({True: [(0, 1), (0, 1)]})
