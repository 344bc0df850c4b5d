"""Notebook 00's helpers: the speed exercise's check and the free-core guard."""

import pytest

from workbench.lessons.exercises import WrongAnswer
from workbench.lessons.tour import check_speed, direction
from workbench.measure.contention import CoreShare

BUSY = CoreShare(cpu_s=0.3, wall_s=1.0, threads=1)  # 30% of a core: other work shared it
FREE = CoreShare(cpu_s=1.0, wall_s=1.0, threads=1)


def test_direction_reads_ten_percent_either_way_as_the_same():
    assert [direction(r) for r in (1.5, 1.09, 0.92, 0.5)] == ["up", "same", "same", "down"]


def test_a_wrong_speed_prediction_fails_on_a_free_core(capsys):
    with pytest.raises(WrongAnswer):
        check_speed("down", 2.0, FREE, device="cpu")
    check_speed("up", 2.0, FREE, device="cpu")
    assert "Correct: 'up'" in capsys.readouterr().out


def test_a_wrong_speed_prediction_on_a_shared_core_is_explained_not_failed(capsys):
    check_speed("up", 1.0, BUSY, device="cpu")
    out = capsys.readouterr().out
    assert "not checked" in out and "30%" in out


def test_on_a_gpu_the_core_share_does_not_excuse_a_wrong_answer():
    with pytest.raises(WrongAnswer):
        check_speed("down", 2.0, BUSY, device="cuda")
