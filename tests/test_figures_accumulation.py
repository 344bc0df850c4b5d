import pytest

from workbench.lessons.figures_accumulation import phase_bytes


def _totals(phases):
    return [sum(parts.values()) for _, parts in phases]


def test_one_batch_holds_its_activations_then_its_gradients():
    phases = phase_bytes(parameter_bytes=4, gradient_bytes=4, optimizer_state_bytes=8, activation_bytes=100, accum_steps=1)
    assert [name for name, _ in phases] == ["fwd", "bwd", "step"]
    assert _totals(phases) == [112, 16, 16]


def test_an_accumulated_step_holds_one_micro_batch_and_the_gradients_summed_so_far():
    phases = phase_bytes(parameter_bytes=4, gradient_bytes=4, optimizer_state_bytes=8, activation_bytes=25, accum_steps=4)
    assert len(phases) == 2 * 4 + 1
    assert _totals(phases)[:4] == [37, 16, 41, 16]  # the second forward also holds the first backward's gradients
    assert max(_totals(phases)) == 41


def test_accum_steps_must_be_a_whole_number():
    with pytest.raises(ValueError, match="accum_steps=0"):
        phase_bytes(parameter_bytes=1, gradient_bytes=1, optimizer_state_bytes=1, activation_bytes=1, accum_steps=0)
