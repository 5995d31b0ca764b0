"""Verifiable reasoning tasks: generators, prompt formats, verifiers, rewards and evaluation.

Built-in tasks (``TASKS``): ``countdown``, ``sudoku``, ``arithmetic`` and
``gsm_synth`` (procedural GSM8K-style word problems).  GSM8K / MATH files are
loaded with `load_jsonl` and wrapped with `dataset_task`; reasoning-gym
datasets with `reasoning_gym_task` (optional dependency).

Compact prompts (for the character-level model, `CharTokenizer`) and the
expected completion, which is ``problem.answer``:

=============  ==========================  ==================
task           compact prompt              completion
=============  ==========================  ==================
countdown      ``3 5 7>22:``               ``3*5+7``
sudoku         ``1.3..4..2.....2.=``       ``1234341221434321``
arithmetic     ``12+7*3=``                 ``33``
gsm_synth      ``<question>=``             ``21``
=============  ==========================  ==================

Chat prompts (``task.chat_messages(problem)``) ask for ``<answer>...</answer>``
(countdown, sudoku, arithmetic) or ``\\boxed{...}`` (gsm_synth, loaded math).
"""

from __future__ import annotations

import difflib

from ais_jax.tasks import arithmetic, countdown, gsm_synth, sudoku
from ais_jax.tasks.base import Problem, Task, split_of
from ais_jax.tasks.evaluate import EvalResult, evaluate, pass_at_k
from ais_jax.tasks.math_qa import dataset_task, load_jsonl
from ais_jax.tasks.reasoning_gym_task import reasoning_gym_task
from ais_jax.tasks.rewards import (
    RewardConfig,
    RewardParts,
    batch_rewards,
    reward,
    reward_parts,
    score_batch,
)
from ais_jax.tasks.tokenizer import CharTokenizer

TASKS: dict[str, Task] = {
    t.name: t for t in (countdown.TASK, sudoku.TASK, arithmetic.TASK, gsm_synth.TASK)
}


def get_task(name: str) -> Task:
    """The built-in task called ``name``.

    Raises:
      ValueError: unknown name; the message lists the valid names and the
        closest match.
    """
    if name in TASKS:
        return TASKS[name]
    close = difflib.get_close_matches(str(name), list(TASKS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}.{hint}")


__all__ = [
    "TASKS",
    "CharTokenizer",
    "EvalResult",
    "Problem",
    "RewardConfig",
    "RewardParts",
    "Task",
    "batch_rewards",
    "dataset_task",
    "evaluate",
    "get_task",
    "load_jsonl",
    "pass_at_k",
    "reasoning_gym_task",
    "reward",
    "reward_parts",
    "score_batch",
    "split_of",
]
