"""The loss curves of a run view: points sent to bqplot, and the PNG for readers without a kernel."""

from __future__ import annotations

import math

import pytest

from workbench.core.views.loss_plot import Curve, coincides, thin, tick_decimals, y_axis_range


def test_thin_keeps_short_curves_whole():
    steps, losses = list(range(5)), [1.0, 0.5, 0.4, 0.3, 0.2]
    assert thin(steps, losses, max_points=5) == (steps, losses)


def test_thin_keeps_at_most_max_points_evenly_spaced_and_the_last_one():
    steps = list(range(1, 10_001))
    kept, losses = thin(steps, [float(s) for s in steps], max_points=1000)
    assert len(kept) <= 1000 and kept[0] == 1 and kept[-1] == 10_000
    gaps = {b - a for a, b in zip(kept[:-2], kept[1:-1])}
    assert gaps == {11} and losses == [float(s) for s in kept]


def test_y_axis_has_round_ticks_and_bounds_on_the_tick_grid():
    assert y_axis_range(0.013, 1.37) == (0.0, 1.5, [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5])
    assert y_axis_range(0.013, 1.37) == y_axis_range(0.02, 1.4)  # the axis holds still as the curve moves


def test_ticks_are_written_with_one_number_of_decimals():
    assert tick_decimals([0.0, 0.25, 0.5, 0.75]) == 2
    assert tick_decimals([2.3, 2.302, 2.304]) == 3
    assert tick_decimals([0, 1000, 2000]) == 0


@pytest.mark.parametrize("low, high", [(2.302, 2.302), (0.0, 0.0), (4.8, 5.2), (1e-4, 0.0476), (-3.0, 1e6)])
def test_y_axis_holds_the_curve_with_a_few_ticks_even_when_it_is_flat(low, high):
    bottom, top, ticks = y_axis_range(low, high)
    assert bottom <= low and top >= high and top > bottom
    assert 3 <= len(ticks) <= 8 and ticks[0] == bottom and ticks[-1] == top


def test_curves_coincide_only_when_every_shared_step_has_the_same_loss():
    a, b, c = Curve("fp32", 0), Curve("fp16", 1), Curve("bf16", 2)
    for step, loss in [(5, 2.30), (10, 1.90), (15, 1.51)]:
        a.add(step, loss)
        b.add(step, loss * (1 + 1e-4))
        c.add(step, loss if step < 15 else 1.6)
    assert coincides(b, a) and not coincides(c, a)
    lone = Curve("one point", 3)
    lone.add(5, 2.30)
    assert not coincides(lone, a)  # one shared point says nothing


def test_a_non_finite_loss_becomes_a_gap():
    curve = Curve("x", 0)
    curve.add(1, float("inf"))
    assert math.isnan(curve.losses[0])


def test_the_png_draws_every_curve_and_the_overlaps_are_named():
    pytest.importorskip("bqplot")
    from workbench.core.views.loss_plot import LossPlot

    plot = LossPlot()
    assert plot.png() is None  # nothing to draw: no image at all, never a broken one
    for label in ("fp32", "bf16"):
        curve = plot.add_curve(label)
        for step in range(1, 30):
            curve.add(step, 2.0 / step)
        plot.draw(curve)
    plot.note_overlaps()
    assert plot.overlaps == ["bf16 (dashed, circle markers) lies on fp32"]
    assert plot.png().startswith(b"\x89PNG")
    assert plot.y_axis.tick_values is not None and len(plot.y_axis.tick_values) >= 3
    assert plot.y_axis.tick_format == ".1f"  # ticks 0.0, 0.5, 1.0, ... for losses 0.07-2.0


def test_a_step_interrupted_before_its_loss_was_kept_is_drawn_without_it():
    # CI (865f01a, series run 4): the interrupt reached `add` between its two appends, and the view drawn
    # as the run stopped failed with "x and y must have same first dimension, (23,) and (22,)".
    pytest.importorskip("bqplot")
    from workbench.core.views.loss_plot import LossPlot

    class InterruptedOnce(list):
        def append(self, value):
            if len(self) == 22:
                raise KeyboardInterrupt  # as the kernel raises it, between any two bytecodes
            super().append(value)

    plot = LossPlot()
    curve = plot.add_curve("interrupted")
    curve.losses = InterruptedOnce()
    with pytest.raises(KeyboardInterrupt):
        for step in range(1, 30):
            curve.add(step, 2.0 / step)
    assert (len(curve.steps), len(curve.losses)) == (23, 22)
    plot.draw(curve)
    assert list(curve.mark.x) == list(range(1, 23)) and len(curve.mark.y) == 22
    assert plot.png().startswith(b"\x89PNG")
    assert curve.points() == (list(range(1, 23)), [2.0 / s for s in range(1, 23)])
