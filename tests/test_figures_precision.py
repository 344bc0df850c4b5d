import pytest

from workbench.lessons.figures_precision import bit_layout_figure, format_layout


def test_the_layouts_are_read_from_torch_finfo():
    assert [(f.bits, f.exponent_bits, f.mantissa_bits) for f in map(format_layout, ("fp32", "fp16", "bf16"))] == [
        (32, 8, 23), (16, 5, 10), (16, 8, 7)]
    fp16 = format_layout("fp16")
    assert fp16.largest == 65504.0 and fp16.smallest_subnormal == 2.0**-24


def test_an_unknown_format_is_a_one_line_error():
    with pytest.raises(ValueError, match="name='fp8'"):
        format_layout("fp8")


def test_the_picture_draws_one_bar_per_field_and_renders_a_png():
    picture = bit_layout_figure(["fp32", "bf16"])
    ax = picture.figure.axes[0]
    assert len(ax.patches) == 6  # sign, exponent, mantissa for each format
    assert sorted(p.get_width() for p in ax.patches) == [1, 1, 7, 8, 8, 23]
    assert picture._repr_png_().startswith(b"\x89PNG")
