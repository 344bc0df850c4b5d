import pytest

from workbench.lessons.figures_memory import MIB, stored_vs_recomputed, weight_grid


def test_stored_vs_recomputed_draws_each_block_saved_kept_and_rebuilt():
    pic = stored_vs_recomputed(["block 0", "block 1"], stored=[4 * MIB, 6 * MIB], kept=[MIB, 2 * MIB])
    heights = [round(b.get_height(), 3) for b in pic.figure.axes[0].patches]
    assert heights == [4.0, 6.0, 1.0, 2.0, 3.0, 4.0]  # saved, then kept, then rebuilt
    assert pic._repr_png_().startswith(b"\x89PNG")


def test_stored_vs_recomputed_rejects_mismatched_or_impossible_counts():
    with pytest.raises(ValueError, match="equally long"):
        stored_vs_recomputed(["a"], stored=[1, 2], kept=[1])
    with pytest.raises(ValueError, match="cannot keep more"):
        stored_vs_recomputed(["a"], stored=[1], kept=[2])


def test_weight_grid_marks_the_range_ends_and_one_line_per_integer_in_the_zoom():
    pic = weight_grid([-0.5, 0.0, 0.25, 0.5], scale=0.5 / 127, zero_point=0, zoom_steps=3)
    whole, zoom = pic.figure.axes
    assert [round(line.get_xdata()[0], 6) for line in whole.lines] == [round(-128 * 0.5 / 127, 6), 0.5]
    assert len(zoom.lines) == 7
    with pytest.raises(ValueError, match="scale"):
        weight_grid([0.0], scale=0, zero_point=0)


def test_step_timeline_figure_draws_a_line_per_setting_and_the_model_state():
    from types import SimpleNamespace as T

    from workbench.lessons.figures_memory import step_timeline_figure

    pic = step_timeline_figure({"none": T(levels=(2 * MIB, 6 * MIB, 3 * MIB), forward_end=2, resident_bytes=MIB),
                                "all": T(levels=(2 * MIB, 3 * MIB, 4 * MIB, 2 * MIB), forward_end=2, resident_bytes=MIB)})
    ax = pic.figure.axes[0]
    lines = [line for line in ax.lines if line.get_label().startswith(("none", "all"))]
    assert [list(line.get_ydata()) for line in lines] == [[2.0, 6.0, 3.0], [2.0, 3.0, 4.0, 2.0]]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["none: peak 6.0 MiB", "all: peak 4.0 MiB", "model state 1.0 MiB"]
    with pytest.raises(ValueError, match="at least one timeline"):
        step_timeline_figure({})
