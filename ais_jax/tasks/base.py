"""Common data types of the tasks: `Problem`, `Task`, and the hash-based train / eval split.

A task is a frozen bundle of plain functions (generator, prompt formats,
answer extractor, verifier).  Every task module builds one module-level
`Task` value; nothing here holds mutable state.

Splits.  Whether a problem belongs to ``"train"`` or ``"eval"`` is a pure
function of its *canonical key* (a string chosen by each task so that two
problems that are "the same" share a key, e.g. Countdown sorts its numbers).
The key is hashed with SHA-256 together with the task name and about
``EVAL_PER_MILLE / 1000`` of all keys are ``"eval"``.  Generators draw
problems and keep only those of the requested split, so the two splits never
share a problem, whatever the seeds used to draw them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SPLITS = ("train", "eval")
EVAL_PER_MILLE = 100  # share of keys (in 1/1000) that belong to the eval split

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Problem:
    """One task instance.

    Attributes:
      id: stable content id, ``"<task>-<12 hex digits>"`` of a hash of the
        problem's canonical text (`problem_id`).
      prompt: the problem statement in plain words (no answer-format
        instructions; those are added by the task's prompt functions).
      answer: a reference answer (for tasks with many correct answers, such
        as Countdown, one known solution).
      metadata: task-specific data the verifier needs (numbers, grid, ...).
        Not part of the hash; treat it as read-only.
    """

    id: str
    prompt: str
    answer: str
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Task:
    """A verifiable task: a named bundle of plain functions.

    Attributes:
      name: task name (the key in ``ais_jax.tasks.TASKS``).
      generate: ``generate(seed, n, split="train", **difficulty) -> list[Problem]``;
        reproducible for a given seed and difficulty.
      compact_prompt: ``Problem -> str``, the short prompt for the tiny
        character-level model; the expected completion is ``problem.answer``.
      chat_messages: ``Problem -> [{"role", "content"}, ...]`` for
        ``tokenizer.apply_chat_template``; asks for the answer in a fixed form.
      extract: ``completion -> str | None``, the answer text found in a
        completion (``None`` when there is none).
      verify: ``(completion, problem) -> bool``; total: never raises for any
        string.
      format_ok: ``completion -> bool``, whether the answer is given in the
        form the chat prompt asks for.
      score: optional ``(completion, problem) -> float`` in ``[0, 1]`` for
        tasks with partial credit; ``None`` means ``float(verify(...))``.
      mistake: optional ``Problem -> str``, the answer a typical flawed solver
        writes (arithmetic: every carry forgotten); may equal ``problem.answer``
        when the mistake does not arise.  Used by the supervised warm start to
        imitate an imperfect demonstrator (``sft.mistake_rate``).
      description: one line for listings.
      pool: for a task over a finite set of problems (a dataset file), ``() ->
        list[Problem]``: every problem ``generate`` can return, both splits, so
        a run can check them all when it is built (prompt length, characters);
        ``None`` for generated tasks.
    """

    name: str
    generate: Callable[..., list[Problem]]
    compact_prompt: Callable[[Problem], str]
    chat_messages: Callable[[Problem], Messages]
    extract: Callable[[str], str | None]
    verify: Callable[[str, Problem], bool]
    format_ok: Callable[[str], bool]
    score: Callable[[str, Problem], float] | None = None
    mistake: Callable[[Problem], str] | None = None
    description: str = ""
    pool: Callable[[], list[Problem]] | None = None


def key_hash(task_name: str, key: str) -> str:
    """Hex SHA-256 of a task name and a canonical problem key."""
    return hashlib.sha256(f"{task_name}\x00{key}".encode()).hexdigest()


def problem_id(task_name: str, key: str) -> str:
    """Stable content id of the problem with this canonical key."""
    return f"{task_name}-{key_hash(task_name, key)[:12]}"


def split_of(task_name: str, key: str) -> str:
    """The split (``"train"`` or ``"eval"``) a canonical problem key belongs to."""
    bucket = int(key_hash(task_name, key)[:8], 16) % 1000
    return "eval" if bucket < EVAL_PER_MILLE else "train"


def check_split(split: str) -> None:
    """Raise a ValueError unless ``split`` is ``"train"`` or ``"eval"``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")


def check_count(n: int) -> None:
    """Raise a ValueError unless ``n`` is a non-negative int."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}.")


def generate_problems(
    task_name: str,
    draw: Callable[[random.Random], tuple[str, Problem]],
    *,
    seed: int,
    n: int,
    split: str,
    max_draws: int | None = None,
) -> list[Problem]:
    """Draw problems until ``n`` of them belong to ``split``.

    Args:
      task_name: the task's name (part of the split hash).
      draw: ``rng -> (canonical key, problem)``; must only use ``rng`` for
        randomness so that the result is reproducible.
      seed: seed of the ``random.Random`` stream.
      n: number of problems wanted.
      split: ``"train"`` or ``"eval"``.
      max_draws: give up after this many draws (default ``100 * n + 1000``).

    Returns:
      ``n`` problems of the requested split, in draw order (repeats are
      possible when the difficulty settings allow few distinct problems).

    Raises:
      ValueError: bad ``split`` / ``n``, or too few problems of the split exist.
    """
    check_split(split)
    check_count(n)
    rng = random.Random(seed)
    limit = 100 * n + 1000 if max_draws is None else max_draws
    out: list[Problem] = []
    draws = 0
    while len(out) < n:
        if draws >= limit:
            raise ValueError(
                f"{task_name}: found only {len(out)} of {n} {split!r} problems in {limit} "
                "draws; the difficulty settings allow too few distinct problems."
            )
        key, problem = draw(rng)
        draws += 1
        if split_of(task_name, key) == split:
            out.append(problem)
    return out


def user_message(content: str) -> Messages:
    """A single-turn chat: one user message."""
    return [{"role": "user", "content": content}]
