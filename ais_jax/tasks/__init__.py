"""Verifiable reasoning tasks: generators, prompt formats, verifiers, rewards and evaluation.

Beside the stack: tasks know nothing of models, the method or training, and may import only
`ais_jax.core`; the config checks, training and runs use them. User reward functions by import
path are `user_rewards`; datasets as a task are `user_dataset`.

Built-in tasks (``TASKS``): ``countdown``, ``sudoku``, ``arithmetic``,
``gsm_synth`` (procedural GSM8K-style word problems) and ``multiplication``
(multi-digit products with a long written scratchpad).  GSM8K / MATH files are
loaded with `load_jsonl` and wrapped with `dataset_task`; reasoning-gym
datasets with `reasoning_gym_task` (optional dependency).

Compact prompts (for the character-level model, `CharTokenizer`) and the
expected completion, which is ``problem.answer``:

==============  =====================  ========================
task            compact prompt         completion
==============  =====================  ========================
countdown       ``3 5 7>22:``          ``3*5+7``
sudoku          ``1.3..4..2.....2.=``  ``1234341221434321``
arithmetic      ``12+7*3=``            ``33``
gsm_synth       ``<question>=``        ``21``
multiplication  ``347*286=``           ``347*6=2082;...#99242``
==============  =====================  ========================

Chat prompts (``task.chat_messages(problem)``) ask for ``<answer>...</answer>``
(countdown, sudoku, arithmetic, multiplication) or ``\\boxed{...}`` (gsm_synth,
loaded math).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

from ais_jax.core.errors import UsageError
from ais_jax.core.safe_yaml import clip
from ais_jax.tasks import arithmetic, countdown, gsm_synth, multiplication, sudoku
from ais_jax.tasks.base import Problem, Task, split_of
from ais_jax.tasks.evaluate import EvalResult, evaluate, pass_at_k
from ais_jax.tasks.math_qa import dataset_task, load_jsonl
from ais_jax.tasks.reasoning_gym_task import reasoning_gym_task, task_from_name
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
    t.name: t
    for t in (countdown.TASK, sudoku.TASK, arithmetic.TASK, gsm_synth.TASK, multiplication.TASK)
}


def get_task(name: str) -> Task:
    """The built-in task called ``name``, or the reasoning-gym dataset ``reasoning_gym:<dataset>``.

    Raises:
      ValueError: unknown name; the message lists the valid names and the
        closest match (a `UsageError` for reasoning-gym names).
    """
    if name in TASKS:
        return TASKS[name]
    rg_task = task_from_name(str(name))
    if rg_task is not None:
        return rg_task
    close = difflib.get_close_matches(str(name), list(TASKS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else " (reasoning-gym: reasoning_gym:<dataset>)"
    raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}.{hint}")


_TYPES: dict[str, tuple[str, tuple[type, ...]]] = {
    "int": ("an int", (int,)), "float": ("a number", (int, float)), "str": ("a str", (str,)),
    "bool": ("a bool", (bool,)), "None": ("null", (type(None),)),
}


def _check_type(name: str, key: str, value: Any, param: inspect.Parameter | None) -> None:
    """Refuse a ``task.difficulty`` value whose type the generator's annotation excludes."""
    if param is None or not isinstance(param.annotation, str):
        return
    kinds = [_TYPES.get(t.strip()) for t in param.annotation.split("|")]
    if not kinds or None in kinds:
        return  # an annotation this check does not read: the generator decides
    ok = any(isinstance(value, types) and (bool in types or not isinstance(value, bool))
             for _, types in kinds)
    if not ok:
        want = " or ".join(k[0] for k in kinds)
        raise UsageError(f"task.difficulty.{key}={clip(value)} must be {want} for task {name} "
                         f"(default {param.default!r}); e.g. task.difficulty.{key}="
                         f"{param.default}")


def check_task_settings(name: str, difficulty: Mapping[str, Any], mistake_rate: float) -> None:
    """Check ``task.difficulty`` and ``sft.mistake_rate`` against a built-in task.

    The difficulty is tried by drawing one problem with it: names the
    generator does not take, values it refuses and values it fails on become
    one-line errors at config validation, not tracebacks mid-run.  Tasks other
    than the built-in ones (loaded datasets) are not checked.

    Args:
      name: the task name; nothing is checked unless it is in ``TASKS``.
      difficulty: the generator keyword arguments.
      mistake_rate: ``sft.mistake_rate``; above 0 it needs a task with a ``mistake``.

    Raises:
      UsageError: a mistake rate the task cannot serve, an unknown keyword
        (listing the valid ones) or a bad value.
    """
    task = TASKS.get(name) or task_from_name(name)
    if task is None:
        return
    if mistake_rate > 0 and getattr(task, "mistake", None) is None:
        raise UsageError(f"sft.mistake_rate={mistake_rate} needs a task with a typical mistake, "
                         f"and task {name!r} defines none; set sft.mistake_rate=0")
    if not difficulty:
        return
    params = inspect.signature(task.generate).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        valid = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]
        unknown = sorted(k for k in difficulty if k not in valid)
        if unknown:
            raise UsageError(f"task.difficulty has {unknown[0][:80]!r}, which task {name} does not "
                             f"take; valid keys: {', '.join(valid) or 'none'}")
    for key, value in difficulty.items():
        _check_type(name, key, value, params.get(key))
    try:
        task.generate(seed=0, n=1, split="train", **difficulty)
    except Exception as e:  # any failure here is caused by the user's values
        text = " ".join(str(e).split())[:200]
        raise UsageError(f"task.difficulty is invalid for task {name}: {text}") from None


__all__ = [
    "TASKS",
    "CharTokenizer",
    "EvalResult",
    "Problem",
    "RewardConfig",
    "RewardParts",
    "Task",
    "batch_rewards",
    "check_task_settings",
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
