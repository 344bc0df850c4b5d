"""Notebook 00's helpers: the two batch sizes timed in turns, the speed exercise's check and the
free-core guard."""

import dataclasses

import pytest

from workbench.lessons.contention import CoreShare
from workbench.lessons.exercises import WrongAnswer
from workbench.lessons.tour import BatchSpeed, batch_speed, check_speed, direction

BUSY = CoreShare(cpu_s=0.3, wall_s=1.0, threads=1)  # 30% of a core: other work shared it
FREE = CoreShare(cpu_s=1.0, wall_s=1.0, threads=1)


def speed(ratio, core, device="cpu"):
    """A BatchSpeed as batch_speed returns it, with the ratio and guard a test needs."""
    return BatchSpeed(batch_sizes=(2, 8), ratio=ratio, ratios=[ratio], samples_per_sec=(100.0, 100.0 * ratio),
                      steps=5, device=device, core=core)


@pytest.fixture(autouse=True)
def _uncapped(monkeypatch):
    monkeypatch.delenv("WORKBENCH_MAX_STEPS", raising=False)  # a capped smoke run never asserts a timing
    monkeypatch.delenv("WORKBENCH_MAX_EVAL_SAMPLES", raising=False)


def test_direction_reads_ten_percent_either_way_as_the_same():
    assert [direction(r) for r in (1.5, 1.09, 0.92, 0.5)] == ["up", "same", "same", "down"]


def test_a_wrong_speed_prediction_fails_on_a_free_core(capsys):
    with pytest.raises(WrongAnswer):
        check_speed("down", speed(2.0, FREE))
    check_speed("up", speed(2.0, FREE))
    assert "Correct: 'up'" in capsys.readouterr().out


def test_a_wrong_speed_prediction_on_a_shared_core_is_explained_not_failed(capsys):
    check_speed("up", speed(1.0, BUSY))
    out = capsys.readouterr().out
    assert "not checked" in out and "30%" in out


def test_on_a_gpu_the_core_share_does_not_excuse_a_wrong_answer():
    with pytest.raises(WrongAnswer):
        check_speed("down", speed(2.0, BUSY, device="cuda"))


def _fake(batch, activation_bytes, hidden=(8, 8)):
    from types import SimpleNamespace

    h1, h2 = hidden
    flops = batch * (6 * (784 * h1 + h1 * h2 + h2 * 10) - 2 * 784 * h1)
    return SimpleNamespace(config=SimpleNamespace(batch_size=batch, dims={"hidden": hidden}), device="cpu",
                           memory=SimpleNamespace(activation_bytes=activation_bytes), flops_per_step=flops)


def test_claim_rows_show_a_timing_from_a_shared_core_without_asserting_it():
    from workbench.lessons.exercises import claims
    from workbench.lessons.tour import claim_rows

    per_sample = 4 * (784 + 8 + 8 + 10) + 8
    base, big = _fake(2, 2 * per_sample + 4), _fake(8, 8 * per_sample + 4)
    rows = claims("00", "cpu", claim_rows(base, big, speed(1.2, BUSY))).checked
    assert rows[0][3].startswith("not shown here: this process had 30% of a core; 1.20x is within 4x of the claim's 1x")
    assert "not asserted" in rows[0][2] and rows[1][2].startswith(f"{per_sample:,} bytes a sample")
    # On a free core: 1.2x is graded "holds in part"; slower per sample is refused.
    free = claim_rows(base, big, speed(1.2, FREE))
    assert claims("00", "cpu", free).checked[0][3] == "holds in part: 1.20x, the matmuls were already large (a free core)"
    with pytest.raises(AssertionError, match="should not be slower"):
        claim_rows(base, big, speed(0.9, FREE))


def test_claim_rows_refuse_saved_bytes_that_are_not_linear_in_the_batch():
    from workbench.lessons.tour import claim_rows

    with pytest.raises(AssertionError):
        claim_rows(_fake(2, 100), _fake(8, 1000), speed(4.0, FREE))


def test_batch_speed_times_both_batch_sizes_in_turns_under_one_guard(monkeypatch):
    import workbench as wb

    monkeypatch.setenv("WORKBENCH_PRESET", "cpu-quick")
    config = wb.RunConfig(model="mlp", data="mnist", batch_size=16, dims={"hidden": (32, 32)})
    measured = batch_speed(wb.training_parts(config), wb.training_parts(dataclasses.replace(config, batch_size=64)),
                           rounds=3, steps=2)
    assert measured.batch_sizes == (16, 64) and measured.steps == 2 and len(measured.ratios) == 3
    assert measured.core.wall_s > 0 and measured.others.wall_s > 0  # the guard covered the turns
    # the ratio is the median of the rounds' ratios, each a quotient of samples per second
    assert measured.ratio == sorted(measured.ratios)[1] and all(r > 0 for r in measured.ratios)
    assert "median of 3 rounds of 2 steps each, in turns" in str(measured)


def test_a_capped_smoke_run_times_one_step_and_never_asserts(monkeypatch):
    import workbench as wb

    monkeypatch.setenv("WORKBENCH_PRESET", "cpu-quick")
    monkeypatch.setenv("WORKBENCH_MAX_STEPS", "2")
    config = wb.RunConfig(model="mlp", data="mnist", batch_size=16, dims={"hidden": (32, 32)})
    measured = batch_speed(wb.training_parts(config), wb.training_parts(dataclasses.replace(config, batch_size=64)))
    assert (len(measured.ratios), measured.steps, measured.counts) == (1, 1, False)
    assert "WORKBENCH_MAX_STEPS=2" in measured.why_not()


def test_batch_speed_refuses_no_rounds():
    import workbench as wb

    with pytest.raises(ValueError, match="rounds=0"):
        parts = wb.training_parts(wb.RunConfig(model="mlp", preset="cpu-quick"))
        batch_speed(parts, parts, rounds=0)
