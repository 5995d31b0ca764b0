"""Optional adapter: any ``reasoning-gym`` dataset as a `Task` (``pip install reasoning-gym``).

Written against reasoning-gym's documented API and tested only against a
stand-in module, not the real package (it is not a dependency):

* ``reasoning_gym.create_dataset(name, size=..., seed=..., **config)`` returns
  a dataset whose items are dicts with ``"question"``, ``"answer"`` and
  ``"metadata"``;
* ``dataset.score_answer(answer=..., entry=...)`` returns a score in ``[0, 1]``.

The completion's answer is the last ``<answer>...</answer>`` (else the last
``\\boxed{}``, else the whole completion).  The score is reasoning-gym's
(partial credit possible), clipped to ``[0, 1]``, 0 if its scorer raises;
``verify`` means score 1.  Splits: the question text is hashed like the
built-in tasks, so train and eval never share a question.
"""

from __future__ import annotations

import importlib
import math
import random
from typing import Any

from ais_jax.tasks import base
from ais_jax.tasks.extract import last_tag, tagged_or_whole


def _import_reasoning_gym() -> Any:
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError as e:
        raise ImportError(
            "reasoning-gym is not installed; `pip install reasoning-gym` to use "
            "reasoning_gym_task()."
        ) from e


def reasoning_gym_task(dataset: str, *, name: str | None = None, **config: Any) -> base.Task:
    """Wrap a reasoning-gym dataset as a `Task`.

    Args:
      dataset: reasoning-gym dataset name, e.g. ``"leg_counting"``.
      name: task name (default ``"rg_<dataset>"``).
      **config: dataset configuration passed to ``create_dataset``; keyword
        arguments of ``generate`` are added to it per call.

    Returns:
      A task; ``generate(seed, n, split="train", **config)`` draws ``n``
      problems of the split.

    Raises:
      ImportError: reasoning-gym is not installed.
    """
    rg = _import_reasoning_gym()
    task_name = name or f"rg_{dataset}"
    scorer = rg.create_dataset(dataset, size=1, seed=0, **config)

    def generate(seed: int, n: int, split: str = "train", **more: Any) -> list[base.Problem]:
        base.check_split(split)
        base.check_count(n)
        out: list[base.Problem] = []
        chunk = max(16, 2 * n)
        for attempt in range(100):
            if len(out) >= n:
                break
            sub_seed = random.Random(f"{seed}/{attempt}").getrandbits(31)
            for entry in rg.create_dataset(
                dataset, size=chunk, seed=sub_seed, **{**config, **more}
            ):
                question = str(entry["question"])
                if base.split_of(task_name, question) != split:
                    continue
                out.append(
                    base.Problem(
                        base.problem_id(task_name, question),
                        question,
                        str(entry["answer"]),
                        {"entry": entry},
                    )
                )
                if len(out) == n:
                    break
        if len(out) < n:
            raise ValueError(f"{task_name}: could only draw {len(out)} of {n} {split!r} problems.")
        return out

    def score(text: str, problem: base.Problem) -> float:
        answer = tagged_or_whole(text)
        if answer is None:
            return 0.0
        try:
            s = float(scorer.score_answer(answer=answer, entry=problem.metadata["entry"]))
        except Exception:
            return 0.0
        return min(max(s, 0.0), 1.0) if math.isfinite(s) else 0.0

    def chat_messages(problem: base.Problem) -> base.Messages:
        return base.user_message(
            f"{problem.prompt}\nThink step by step, then give only the final answer inside "
            "<answer></answer> tags."
        )

    return base.Task(
        name=task_name,
        generate=generate,
        compact_prompt=lambda p: f"{p.prompt}\n",
        chat_messages=chat_messages,
        extract=tagged_or_whole,
        verify=lambda text, p: score(text, p) >= 1.0,
        format_ok=lambda text: bool(last_tag(text)),
        score=score,
        description=f"reasoning-gym dataset {dataset!r}.",
    )
