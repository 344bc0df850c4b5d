"""Notebook 00's helpers: the speed exercise's check and the free-core guard."""

import pytest

from workbench.lessons.contention import CoreShare
from workbench.lessons.exercises import WrongAnswer
from workbench.lessons.tour import check_speed, direction

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


def _fake(batch, activation_bytes, samples_per_sec, hidden=(8, 8)):
    from types import SimpleNamespace

    h1, h2 = hidden
    flops = batch * (6 * (784 * h1 + h1 * h2 + h2 * 10) - 2 * 784 * h1)
    return SimpleNamespace(config=SimpleNamespace(batch_size=batch, dims={"hidden": hidden}), device="cpu",
                           memory=SimpleNamespace(activation_bytes=activation_bytes), flops_per_step=flops,
                           samples_per_sec=samples_per_sec)


def test_claim_rows_show_a_timing_from_a_shared_core_without_asserting_it():
    from workbench.lessons.exercises import claims
    from workbench.lessons.tour import claim_rows

    per_sample = 4 * (784 + 8 + 8 + 10) + 8
    rows = claims("00", "cpu", claim_rows(_fake(2, 2 * per_sample + 4, 100.0), _fake(8, 8 * per_sample + 4, 120.0), BUSY)).checked
    assert rows[0][3].startswith("not shown here: this process had 30% of a core; 1.20x is within 4x of the claim's 1x")
    assert "not asserted" in rows[0][2] and rows[1][2].startswith(f"{per_sample:,} bytes a sample")
    # On a free core: 1.2x is graded "holds in part"; slower per sample is refused.
    free = claim_rows(_fake(2, 2 * per_sample + 4, 100.0), _fake(8, 8 * per_sample + 4, 120.0), FREE)
    assert claims("00", "cpu", free).checked[0][3] == "holds in part: 1.20x, the matmuls were already large (a free core)"
    with pytest.raises(AssertionError, match="should not be slower"):
        claim_rows(_fake(2, 2 * per_sample + 4, 100.0), _fake(8, 8 * per_sample + 4, 90.0), FREE)


def test_claim_rows_refuse_saved_bytes_that_are_not_linear_in_the_batch():
    from workbench.lessons.tour import claim_rows

    with pytest.raises(AssertionError):
        claim_rows(_fake(2, 100, 100.0), _fake(8, 1000, 400.0), FREE)
