"""Countdown: generator, prompts and known-answer verifier tests."""

import pytest

from ais_jax.tasks import base, countdown
from ais_jax.tasks.expr import evaluate


def _problem(numbers, target, use_all=True):
    return base.Problem(
        "t", "p", "", {"numbers": tuple(numbers), "target": target, "use_all": use_all}
    )


P = _problem((3, 5, 7), 22)


@pytest.mark.parametrize(
    "text",
    [
        "3*5+7",
        "7+5*3",
        "(3*5)+7",
        "<answer>3 * 5 + 7</answer>",
        "Let me think. 3*5 = 15, 15+7 = 22. <answer>3*5+7</answer>",
        "<answer>3*5+7 = 22</answer>",
        "<answer>wrong</answer> on second thought <answer>7 + 3 * 5</answer>",
        "\\boxed{3*5+7}",
        "  3*5+7\n",
    ],
)
def test_correct(text):
    assert countdown.verify(text, P)


@pytest.mark.parametrize(
    "text",
    [
        "3*5+5",  # wrong value, reuses 5
        "3*7+5",  # uses all numbers, wrong value (26)
        "3*5+7+0",  # extra literal
        "15+7",  # numbers not given
        "3*5+7*1",
        "<answer>3*5+7 = 23</answer>",  # inconsistent stated result
        "<answer>3*5+7 = 22 = 22</answer>",
        "<answer>7+5*3</answer> extra text <answer>3+5+7</answer>",  # last answer counts
        "The answer is 3*5+7",  # prose without tags is not an expression
        "<answer></answer>",
        "<answer>3*5+7",  # unclosed tag, whole text is not an expression
        "22",
        "",
        "35+7-20",  # digit concatenation is not allowed
        "-3+5*5",
        "3**5+7",
    ],
)
def test_wrong_or_malformed(text):
    assert not countdown.verify(text, P)


def test_partially_correct_number_use():
    # Right target but misses a number: wrong when all must be used, fine when not.
    p_all = _problem((2, 10, 50), 20)
    p_some = _problem((2, 10, 50), 20, use_all=False)
    assert not countdown.verify("2*10", p_all)
    assert countdown.verify("2*10", p_some)
    assert not countdown.verify("10+10", p_some)  # 10 used twice
    assert countdown.verify("50-10*2-10", _problem((2, 10, 10, 50), 20))  # duplicates given
    assert not countdown.verify("50-10*2-10", _problem((2, 10, 50, 7), 20, use_all=False))


def test_fraction_intermediates_allowed():
    assert countdown.verify("(3+1/2)*4", _problem((1, 2, 3, 4), 14))
    assert not countdown.verify("4/0+1", _problem((1, 0, 4), 1))


def test_generator_reproducible_and_solvable():
    a = countdown.generate(3, 40, num_numbers=4, max_target=200)
    b = countdown.generate(3, 40, num_numbers=4, max_target=200)
    assert a == b
    assert [p.id for p in a] != [p.id for p in countdown.generate(4, 40, num_numbers=4)]
    for p in a:
        nums, target = p.metadata["numbers"], p.metadata["target"]
        assert len(nums) == 4 and all(1 <= x <= 99 for x in nums)
        assert 1 <= target <= 200
        assert countdown.verify(p.answer, p), p
        assert sorted(evaluate(p.answer).literals) == sorted(nums)


def test_generator_subset_mode():
    for p in countdown.generate(0, 30, num_numbers=5, use_all=False):
        assert p.metadata["use_all"] is False
        assert countdown.verify(p.answer, p)
        assert "at most once" in p.prompt


def test_prompts():
    p = _problem((3, 5, 7), 22)
    assert countdown.compact_prompt(p) == "3 5 7>22:"
    (msg,) = countdown.chat_messages(countdown.generate(0, 1)[0])
    assert msg["role"] == "user" and "<answer>" in msg["content"]
    assert countdown.format_ok("blah <answer>1+2</answer>")
    assert not countdown.format_ok("1+2")
    assert not countdown.format_ok("<answer> </answer>")


def test_bad_difficulty():
    with pytest.raises(ValueError, match="num_numbers"):
        countdown.generate(0, 1, num_numbers=1)
    with pytest.raises(ValueError, match="max_target"):
        countdown.generate(0, 1, max_target=0)
    with pytest.raises(ValueError, match="split"):
        countdown.generate(0, 1, split="test")
