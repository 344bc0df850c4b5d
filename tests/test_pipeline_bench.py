"""pipeline_bench: loader-only epoch timings and the DataLoader sweep through run()."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workbench import RunConfig
from workbench.core.data import build_dataloader, image_pixels
from workbench.lessons import input_pipelines as bench
from workbench.lessons import input_pipelines as pl


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> pl.ImageFiles:
    pixels, labels = image_pixels("mnist")
    return pl.write_image_files(pixels[:48], labels[:48], tmp_path_factory.mktemp("png"), format="png")


def test_sweep_plan_is_sized_to_the_cores_and_pins_only_with_cuda() -> None:
    names = lambda plan: [name for name, _ in plan]  # noqa: E731
    assert names(bench.sweep_plan(cores=2, cuda=False)) == [
        "0 workers", "1 worker", "2 workers", "2 workers, prefetch 4", "2 workers, batch x2"]
    big = bench.sweep_plan(cores=16, cuda=True)
    assert names(big)[-3:] == ["8 workers", "8 workers, batch x2", "8 workers, pinned"]
    assert dict(big)["8 workers, pinned"] == {"num_workers": 8, "pin_memory": True}
    assert names(bench.sweep_plan(cores=4, cuda=False))[-2:] == ["3 workers", "3 workers, batch x2"]


def test_loader_sweep_reuses_done_runs_and_doubles_the_batch() -> None:
    base = RunConfig(model="mlp", data="digits", batch_size=16, steps=2, log_every=1, dims={"hidden": (8,)},
                     eval_samples=0)
    done = SimpleNamespace(name="0 workers")
    results = bench.loader_sweep(base, [("0 workers", {}), ("batch x2", {"batch_size": "x2"})], done=[done], sinks=[])
    assert results[0] is done and results[1].config.batch_size == 32 and results[1].status == "ok"


def _fake(name, wait_fraction, step_s, samples_s, workers=0, batch=64):
    config = SimpleNamespace(num_workers=workers, prefetch_factor=None, batch_size=batch)
    return SimpleNamespace(name=name, data_wait_fraction=wait_fraction, step_time_s=step_s,
                           samples_per_sec=samples_s, config=config)


def test_sweep_view_splits_each_step_into_wait_and_compute_and_draws_the_ceiling() -> None:
    view = bench.SweepView([_fake("0 workers", 0.75, 0.040, 1600), _fake("2 workers", 0.5, 0.020, 3200, workers=2)],
                        _fake("ceiling", 0.0, 0.010, 6400))
    rows = view.rows()
    assert rows[0] == ["0 workers", 0, "-", 64, "30.0", "10.0", "75%", "1,600", "1.00"]
    assert rows[1][2] == 2 and rows[1][-1] == "2.00" and rows[2][-1] == "4.00"
    html = view._repr_html_()
    assert "data wait (ms/step)" in html and "data:image/png;base64," in html
    assert view.figure().axes[1].get_lines()[0].get_xdata()[0] == 6400


def test_time_epochs_counts_every_sample_of_every_epoch(small) -> None:
    loader = build_dataloader(pl.ImageFileDataset(small), batch_size=16, shuffle=True, seed=0)
    timings = bench.time_epochs({"plain": loader}, epochs=2)
    assert [(t.epoch, t.samples) for t in timings] == [(0, 48), (1, 48)]
    assert all(0 < t.first_batch_s <= t.seconds for t in timings)
    assert timings.samples_per_sec("plain") == pytest.approx(48 / timings[1].seconds)
    assert "first batch (ms)" in timings._repr_html_()


def test_parallel_speedup_is_measured_between_no_spare_core_and_two_free_ones() -> None:
    # Two busy processes side by side: ~2x as fast as in turn on two free cores, ~1x on a busy
    # machine; never (beyond noise) more than the processes started. The bound is the spread
    # measured: 20 repeats each on the 2-core machine at load ~23 (other jobs), 3 interleaved
    # rounds: 1.09-2.66 (median 1.60), 1.21-2.21 with a hog; one round, as before: 0.81-3.55
    # (it read 2.90 against the old bound of 2.5). Runs in the serial pass (tests/conftest.py).
    assert 0.5 < bench.parallel_speedup(2, iterations=500_000, rounds=3) < 3.0
