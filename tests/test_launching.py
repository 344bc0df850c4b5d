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
