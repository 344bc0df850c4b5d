"""notebook_launch: accelerate's notebook_launcher with return values and a bounded hang."""

import os
import time

import pytest

from workbench.lessons.multi_gpu import LaunchHung, notebook_launch


def _world():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    return accelerator.process_index, accelerator.num_processes


def test_each_process_returns_its_rank_in_one_world_even_after_a_run_here():
    from workbench.core.config import RunConfig
    from workbench.engine.train import run

    run(RunConfig(model="mlp", data="digits", steps=2, eval_samples=0, dims={"hidden": (8,)}))  # makes an Accelerator
    assert sorted(notebook_launch(_world, num_processes=2, timeout_s=120)) == [(0, 2), (1, 2)]


def test_a_hung_launch_is_stopped_and_tried_again(tmp_path):
    flag = tmp_path / "hung once"

    def hangs_the_first_time():
        if not flag.exists():
            flag.write_text(str(os.getpid()))
            time.sleep(600)  # as a child stuck on a lock copied by fork would
        return "ok"

    began = time.monotonic()
    assert notebook_launch(hangs_the_first_time, num_processes=2, timeout_s=8, retries=1) == ["ok", "ok"]
    assert time.monotonic() - began < 60


def test_a_launch_that_always_hangs_says_so():
    with pytest.raises(LaunchHung, match="hung 1 times for 3 s"):
        notebook_launch(time.sleep, 600, num_processes=2, timeout_s=3, retries=0)


def test_the_notebooks_own_launch_loop_collects_each_childs_return_value():
    from accelerate import notebook_launcher

    from workbench.lessons.multi_gpu import launch_attempts

    for attempt in launch_attempts(timeout_s=120):
        with attempt:
            notebook_launcher(attempt.reporting(_world), num_processes=2, use_port=attempt.port)
    assert sorted(attempt.collect(2)) == [(0, 2), (1, 2)]


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
