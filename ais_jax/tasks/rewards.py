"""Rewards from a task's verifier: correctness, an optional format bonus, user reward functions.

    reward = correct_weight * correctness            # 1/0 (or the task's score in [0, 1])
           + format_weight  * task.format_ok(text)   # answer in the requested form
           + sum(fn(text, problem) for fn in user_fns)

Built-in terms never raise for any completion string.  User functions are the
caller's code: an exception inside one is re-raised as a RuntimeError that
names the function (the original is chained as ``__cause__``), and a
non-numeric or non-finite return value is a TypeError / ValueError naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ais_jax.tasks.base import Problem, Task

UserReward = Callable[[str, Problem], float]


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the reward terms.

    Attributes:
      correct_weight: weight of correctness (1.0: reward 1 for a correct answer).
      format_weight: bonus when the answer is in the requested form (e.g. 0.1);
        0 disables it.  Meaningful for chat prompts only: compact completions
        are bare answers.
      user_fns: extra ``fn(completion, problem) -> float`` terms, summed.
    """

    correct_weight: float = 1.0
    format_weight: float = 0.0
    user_fns: tuple[UserReward, ...] = ()

    def __post_init__(self) -> None:
        for name in ("correct_weight", "format_weight"):
            w = getattr(self, name)
            if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
                raise ValueError(f"RewardConfig.{name} must be a finite number, got {w!r}.")
        if not isinstance(self.user_fns, tuple) or not all(callable(f) for f in self.user_fns):
            raise ValueError(
                "RewardConfig.user_fns must be a tuple of callables fn(completion, problem)."
            )


class RewardParts(NamedTuple):
    """One completion's reward and its terms (already weighted)."""

    total: float
    correct: float
    format: float
    user: tuple[float, ...]


def _fn_name(fn: Callable[..., object]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def call_user_reward(fn: UserReward, completion: str, problem: Problem) -> float:
    """Call a user reward function and check that it returned a finite number.

    Raises:
      RuntimeError: the function raised (chained, message names the function).
      TypeError: it returned something that is not a number.
      ValueError: it returned NaN or an infinity.
    """
    name = _fn_name(fn)
    try:
        value = fn(completion, problem)
    except Exception as e:
        raise RuntimeError(f"user reward function {name} raised {type(e).__name__}: {e}") from e
    if isinstance(value, str | bytes) or value is None:
        raise TypeError(f"user reward function {name} returned {_shown(value)}; expected a float.")
    try:
        out = float(value)
    except OverflowError:  # an int beyond float64, e.g. 10**400
        raise ValueError(f"user reward function {name} returned {_shown(value)}, beyond float32; "
                         "expected a finite float.") from None
    except Exception:  # not a number, or a __float__ that raises
        raise TypeError(
            f"user reward function {name} returned {_shown(value)}; expected a float."
        ) from None
    if not math.isfinite(out):
        raise ValueError(f"user reward function {name} returned {out}; expected a finite float.")
    if abs(out) > FLOAT32_MAX:  # rewards are float32 on the device: 1e308 would become inf
        raise ValueError(f"user reward function {name} returned {out:g}, beyond float32 "
                         f"(|r| <= {FLOAT32_MAX:.4g}); expected a finite float.")
    return out


def _shown(value: Any) -> str:
    """``repr(value)`` cut to 80 characters, or its type when even repr fails."""
    try:
        return f"{value!r:.80}"
    except Exception:
        return f"a {type(value).__name__}"


def correctness(task: Task, completion: str, problem: Problem,
                verified: bool | None = None) -> float:
    """The task's score in ``[0, 1]`` (``float(verify)`` unless the task has a score).

    ``verified``: the result of ``task.verify`` if the caller already has it.
    """
    if task.score is None:
        ok = task.verify(completion, problem) if verified is None else verified
        return 1.0 if ok else 0.0
    s = float(task.score(completion, problem))
    return min(max(s, 0.0), 1.0) if math.isfinite(s) else 0.0


def reward_parts(
    task: Task,
    completion: str,
    problem: Problem,
    config: RewardConfig = RewardConfig(),
    verified: bool | None = None,
) -> RewardParts:
    """The reward of one completion, term by term (formula in the module doc).

    ``verified``: the result of ``task.verify`` if the caller already has it.
    """
    correct = config.correct_weight * correctness(task, completion, problem, verified)
    fmt = config.format_weight * float(task.format_ok(completion)) if config.format_weight else 0.0
    user = tuple(call_user_reward(fn, completion, problem) for fn in config.user_fns)
    return RewardParts(correct + fmt + sum(user), correct, fmt, user)


def reward(
    task: Task, completion: str, problem: Problem, config: RewardConfig = RewardConfig()
) -> float:
    """The total reward of one completion."""
    return reward_parts(task, completion, problem, config).total


def batch_rewards(
    task: Task,
    completions: Sequence[str],
    problems: Sequence[Problem],
    config: RewardConfig = RewardConfig(),
) -> np.ndarray:
    """Rewards of paired completions and problems.

    Args:
      task: the task.
      completions: ``[B]`` decoded completions.
      problems: ``[B]`` the problem of each completion (repeat a problem G
        times for a group of G samples).
      config: reward weights and user functions.

    Returns:
      ``[B]`` float32 rewards (reshape to ``[P, G]`` for `group_advantages`).
    """
    if len(completions) != len(problems):
        raise ValueError(
            f"got {len(completions)} completions for {len(problems)} problems; "
            "pass one problem per completion."
        )
    return np.asarray(
        [reward(task, c, p, config) for c, p in zip(completions, problems, strict=True)],
        dtype=np.float32,
    )


def score_batch(
    task: Task,
    completions: Sequence[str],
    problems: Sequence[Problem],
    config: RewardConfig = RewardConfig(),
) -> tuple[np.ndarray, np.ndarray]:
    """Rewards and verifier verdicts of paired completions, verifying each completion once.

    Args:
      task: the task.
      completions: ``[B]`` decoded completions.
      problems: ``[B]`` the problem of each completion.
      config: reward weights and user functions.

    Returns:
      ``(rewards [B] float32, correct [B] bool)``.
    """
    if len(completions) != len(problems):
        raise ValueError(
            f"got {len(completions)} completions for {len(problems)} problems; "
            "pass one problem per completion."
        )
    correct = [bool(task.verify(c, p)) for c, p in zip(completions, problems, strict=True)]
    rewards = [
        reward_parts(task, c, p, config, ok).total
        for c, p, ok in zip(completions, problems, correct, strict=True)
    ]
    return np.asarray(rewards, np.float32), np.asarray(correct, np.bool_)
