import pytest

from workbench.lessons.exercises import WrongAnswer, check


def test_an_unanswered_exercise_does_not_fail(capsys):
    check(None, 10, hint="think")
    assert "Not answered yet" in capsys.readouterr().out


def test_a_right_answer_passes_within_tolerance(capsys):
    check(101, 100, rel_tol=0.02)
    check("bf16", "bf16")
    assert capsys.readouterr().out.count("Correct") == 2


def test_a_wrong_answer_raises_with_the_hint():
    with pytest.raises(WrongAnswer, match="look at the table"):
        check(150, 100, rel_tol=0.1, hint="look at the table")
