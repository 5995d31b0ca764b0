"""Optional adapter: any ``reasoning-gym`` dataset as a `Task` (``pip install reasoning-gym``).

Tested against reasoning-gym 0.1.25 (the ``test`` extra installs it).  From
the command line a dataset is a task by name: ``task.name=reasoning_gym:<dataset>``
(e.g. ``reasoning_gym:countdown``), with ``task.difficulty`` passed to
``reasoning_gym.create_dataset`` as the dataset's configuration.  An unknown
dataset name or a configuration the dataset refuses is a one-line `UsageError`.

* Problems: ``create_dataset(dataset, size=..., seed=..., **config)`` items
  (``"question"``, ``"answer"``, ``"metadata"``).  The question text is
  hashed like the built-in tasks, so train and eval never share a question.
* Reference answer (``problem.answer``): the item's ``"answer"``; a few
  datasets have many correct answers and store ``None`` there, with one
  example in the metadata (``example_answer`` for ``propositional_logic``,
  ``possible_answer`` for ``graph_color``, ...), which is used instead.
* Verifier: the dataset's own ``score_answer(answer, entry)``, which knows
  every correct answer (score in ``[0, 1]``, partial credit possible,
  clipped; ``verify`` means score 1).  A scorer that raises scores 0 and the
  error is logged.
* Prompt and extraction agree: the chat prompt asks for the final answer in
  ``<answer></answer>`` tags, and format rules of the question such as
  "Do not include any other text" are restated to apply inside the tags.
  The answer read is the last ``<answer>`` (else the last ``\\boxed{}``,
  else the whole completion, which is what compact prompts produce).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import logging
import math
import random
import re
from collections.abc import Mapping
from typing import Any

from ais_jax.core.errors import UsageError
from ais_jax.tasks import base
from ais_jax.tasks.extract import last_tag, tagged_or_whole

PREFIX = "reasoning_gym:"  # task.name prefix of reasoning-gym datasets
# metadata fields that hold one correct answer when the item's "answer" is None
EXAMPLE_ANSWER_KEYS = ("example_answer", "possible_answer", "example_correct_answer")

_LOG = logging.getLogger(__name__)
_ONLY_ANSWER = re.compile(
    r"(Do not (?:include|add|output) any (?:other|additional) text"
    r"(?: or formatting)?)(?=[.\n]|$)",
    re.IGNORECASE,
)
_TAG_NOTE = (
    "Think step by step, then give only the final answer inside <answer></answer> tags; "
    "the answer format rules above apply to the text inside the tags."
)


def _import_reasoning_gym() -> Any:
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError as e:
        raise ImportError(
            "reasoning-gym is not installed; `pip install reasoning-gym` to use "
            "reasoning_gym_task()."
        ) from e


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())[:200]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _dataset_names() -> list[str]:
    try:
        return sorted(importlib.import_module("reasoning_gym.factory").DATASETS)
    except (ImportError, AttributeError):
        return []


def gold_answer(entry: Mapping[str, Any]) -> str:
    """The reference answer of a reasoning-gym item, as text.

    The item's ``"answer"``, or, where that is None (datasets with many
    correct answers), the first of `EXAMPLE_ANSWER_KEYS` in its metadata
    (JSON text when it is not a string, e.g. ``graph_color``'s mapping);
    ``""`` when there is neither.

    Args:
      entry: a reasoning-gym dataset item.

    Returns:
      The answer text.
    """
    answer = entry.get("answer")
    if answer is None:
        meta = entry.get("metadata") or {}
        answer = next((meta[k] for k in EXAMPLE_ANSWER_KEYS if meta.get(k) is not None), "")
    return answer if isinstance(answer, str) else json.dumps(answer)


def chat_prompt(question: str) -> str:
    """The chat prompt of a question: its rules restated for ``<answer>`` tags, then the note.

    Args:
      question: the reasoning-gym question text.

    Returns:
      The prompt text.
    """
    question = _ONLY_ANSWER.sub(r"\1 inside the <answer></answer> tags", question.rstrip())
    return f"{question}\n{_TAG_NOTE}"


def _creator(rg: Any, dataset: str) -> Any:
    """``create(cfg, size=, seed=)``: reasoning-gym's ``create_dataset`` with one-line errors."""

    def create(cfg: Mapping[str, Any], *, size: int, seed: int) -> Any:
        try:
            return rg.create_dataset(dataset, size=size, seed=seed, **cfg)
        except Exception as e:  # reasoning-gym's own checks: unknown name, bad values
            known = _dataset_names()
            if known and dataset not in known:
                close = difflib.get_close_matches(dataset, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise UsageError(
                    f"reasoning-gym has no dataset {dataset!r}{hint} "
                    f"({len(known)} datasets: {', '.join(known[:8])}, ...)"
                ) from None
            settings = ", ".join(f"{k}={v!r}" for k, v in cfg.items()) or "defaults"
            raise UsageError(
                f"{dataset} refuses {settings} (task.difficulty={{}}: its defaults): {_one_line(e)}"
            ) from None

    return create


def _draw(create: Any, task_name: str, cfg: Mapping[str, Any], seed: int, n: int,
          split: str) -> list[base.Problem]:
    """``n`` problems of ``split`` (the hash split of the question), drawn in seeded chunks."""
    base.check_split(split)
    base.check_count(n)
    out: list[base.Problem] = []
    chunk = max(16, 2 * n)
    for attempt in range(100):
        if len(out) >= n:
            break
        sub_seed = random.Random(f"{seed}/{attempt}").getrandbits(31)
        for entry in create(cfg, size=chunk, seed=sub_seed):
            question = str(entry["question"])
            if base.split_of(task_name, question) != split:
                continue
            out.append(base.Problem(base.problem_id(task_name, question), question,
                                    gold_answer(entry), {"entry": entry, "config": dict(cfg)}))
            if len(out) == n:
                break
    if len(out) < n:
        raise ValueError(f"{task_name}: could only draw {len(out)} of {n} {split!r} problems.")
    return out


def _score(text: str, problem: base.Problem, scorer: Any, task_name: str) -> float:
    """reasoning-gym's ``score_answer`` of the tagged (or whole) answer, in [0, 1]; 0 when it
    fails."""
    answer = tagged_or_whole(text)
    if answer is None:
        return 0.0
    try:
        s = float(scorer.score_answer(answer=answer, entry=problem.metadata["entry"]))
    except Exception:
        _LOG.warning("%s: reasoning-gym's scorer failed on answer %.80r; scored 0", task_name,
                     answer, exc_info=True)
        return 0.0
    return min(max(s, 0.0), 1.0) if math.isfinite(s) else 0.0


def reasoning_gym_task(dataset: str, *, name: str | None = None, **config: Any) -> base.Task:
    """Wrap a reasoning-gym dataset as a `Task`.

    Args:
      dataset: reasoning-gym dataset name, e.g. ``"leg_counting"``.
      name: task name (default ``"rg_<dataset>"``); it seeds the train/eval split.
      **config: dataset configuration passed to ``create_dataset``; keyword
        arguments of ``generate`` are added to it per call.

    Returns:
      A task; ``generate(seed, n, split="train", **config)`` draws ``n``
      problems of the split.

    Raises:
      ImportError: reasoning-gym is not installed.
      UsageError: reasoning-gym refuses the dataset name or the configuration.
    """
    create = _creator(_import_reasoning_gym(), dataset)
    task_name = name or f"rg_{dataset}"
    scorers: dict[str, Any] = {}

    def scorer_for(cfg: Mapping[str, Any]) -> Any:
        key = repr(sorted(cfg.items()))
        if key not in scorers:
            scorers[key] = create(cfg, size=1, seed=0)
        return scorers[key]

    scorer_for(config)  # fail now on a bad name or configuration

    def score(text: str, p: base.Problem) -> float:
        return _score(text, p, scorer_for(p.metadata.get("config", config)), task_name)

    return base.Task(
        name=task_name,
        generate=lambda seed, n, split="train", **more: _draw(
            create, task_name, {**config, **more}, seed, n, split),
        compact_prompt=lambda p: f"{p.prompt}\n",
        chat_messages=lambda p: base.user_message(chat_prompt(p.prompt)),
        extract=tagged_or_whole,
        verify=lambda text, p: score(text, p) >= 1.0,
        format_ok=lambda text: bool(last_tag(text)),
        score=score,
        description=f"reasoning-gym dataset {dataset!r} (scored by its score_answer).",
    )


def task_from_name(name: str) -> base.Task | None:
    """The task a ``reasoning_gym:<dataset>`` task name stands for; None for other names.

    The task is named ``name`` itself (it seeds the train/eval split) and
    uses the dataset's default configuration; ``task.difficulty`` reaches
    the dataset through ``generate``'s keyword arguments.

    Args:
      name: a task name.

    Returns:
      The task, or None when ``name`` does not start with `PREFIX`.

    Raises:
      UsageError: reasoning-gym is not installed, or it has no such dataset.
    """
    if not name.startswith(PREFIX):
        return None
    return _task_for_dataset(name[len(PREFIX) :].strip())


@functools.cache
def _task_for_dataset(dataset: str) -> base.Task:
    if not dataset:
        raise UsageError(f"task.name={PREFIX} needs a dataset name, e.g. {PREFIX}leg_counting")
    try:
        return reasoning_gym_task(dataset, name=PREFIX + dataset)
    except ImportError:
        raise UsageError(
            f"task.name={PREFIX}{dataset} needs reasoning-gym; `pip install reasoning-gym`"
        ) from None
