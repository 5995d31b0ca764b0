"""Rewards: correctness, format bonus, user reward functions and their error handling."""

import math

import numpy as np
import pytest

from ais_jax.tasks import TASKS, base
from ais_jax.tasks.rewards import (
    RewardConfig,
    batch_rewards,
    call_user_reward,
    correctness,
    reward,
    reward_parts,
)

ARITH = TASKS["arithmetic"]
P = base.Problem("t", "Compute 2+3.", "5", {"expression": "2+3", "value": 5})


def test_correctness_and_format():
    cfg = RewardConfig(format_weight=0.1)
    assert reward(ARITH, "<answer>5</answer>", P, cfg) == pytest.approx(1.1)
    assert reward(ARITH, "5", P, cfg) == 1.0  # correct, not in the requested form
    assert reward(ARITH, "<answer>6</answer>", P, cfg) == pytest.approx(0.1)
    assert reward(ARITH, "6", P, cfg) == 0.0
    assert reward(ARITH, "<answer>5</answer>", P) == 1.0  # format off by default
    assert reward(ARITH, "<answer>5</answer>", P, RewardConfig(correct_weight=2.0)) == 2.0


def test_parts():
    parts = reward_parts(
        ARITH,
        "<answer>5</answer>",
        P,
        RewardConfig(format_weight=0.5, user_fns=(lambda c, p: -0.25,)),
    )
    assert parts.correct == 1.0 and parts.format == 0.5 and parts.user == (-0.25,)
    assert parts.total == pytest.approx(1.25)


def length_penalty(completion, problem):
    return -0.001 * len(completion)


def test_user_fn_added():
    cfg = RewardConfig(user_fns=(length_penalty, lambda c, p: float(p.answer == "5")))
    assert reward(ARITH, "5", P, cfg) == pytest.approx(1.0 - 0.001 + 1.0)


def broken_reward(completion, problem):
    return 1 / 0


def test_user_fn_exception_names_function():
    cfg = RewardConfig(user_fns=(broken_reward,))
    with pytest.raises(RuntimeError, match="broken_reward raised ZeroDivisionError") as info:
        reward(ARITH, "5", P, cfg)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float32("nan")])
def test_user_fn_non_finite(value):
    def nan_reward(completion, problem):
        return value

    with pytest.raises(ValueError, match=r"nan_reward returned .*finite"):
        call_user_reward(nan_reward, "x", P)


@pytest.mark.parametrize("value", [None, "1.0", [1.0], object()])
def test_user_fn_non_numeric(value):
    def odd_reward(completion, problem):
        return value

    with pytest.raises(TypeError, match="odd_reward returned"):
        call_user_reward(odd_reward, "x", P)


def test_user_fn_numeric_types():
    assert call_user_reward(lambda c, p: True, "x", P) == 1.0
    assert call_user_reward(lambda c, p: np.float32(0.5), "x", P) == 0.5
    assert call_user_reward(lambda c, p: 3, "x", P) == 3.0


def test_config_validation():
    with pytest.raises(ValueError, match="format_weight"):
        RewardConfig(format_weight=math.nan)
    with pytest.raises(ValueError, match="user_fns"):
        RewardConfig(user_fns=(1,))
    with pytest.raises(ValueError, match="user_fns"):
        RewardConfig(user_fns=[length_penalty])


def test_batch_rewards():
    problems = [P, P, P]
    r = batch_rewards(
        ARITH, ["5", "<answer>5</answer>", "x"], problems, RewardConfig(format_weight=0.1)
    )
    assert r.dtype == np.float32 and r.shape == (3,)
    np.testing.assert_allclose(r, [1.0, 1.1, 0.0], rtol=1e-6)
    with pytest.raises(ValueError, match="2 completions for 3 problems"):
        batch_rewards(ARITH, ["5", "5"], problems)


def test_task_score_is_clipped():
    def score(text, problem):
        return {"hi": 3.0, "lo": -1.0, "nan": math.nan}.get(text, 0.5)

    task = base.Task(
        name="scored", generate=lambda *a: [], compact_prompt=str, chat_messages=lambda p: [],
        extract=lambda t: t, verify=lambda t, p: False, format_ok=lambda t: False, score=score,
    )  # fmt: skip
    assert [correctness(task, t, P) for t in ("hi", "lo", "nan", "mid")] == [1.0, 0.0, 0.0, 0.5]
