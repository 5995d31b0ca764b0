"""``task.name=dataset``: problems from your own JSONL, parquet, CSV or saved Hugging Face dataset.

Files are read offline with the ``datasets`` package: ``.jsonl`` / ``.json``
with ``load_dataset("json")``, ``.parquet`` with ``load_dataset("parquet")``,
``.csv`` with ``load_dataset("csv")``, and a directory with
``load_from_disk`` (a `DatasetDict` contributes its ``train`` split, or its
only split).  A list of dict rows or a ``datasets.Dataset`` can be passed
directly (`ais_jax.run.cli.run(cfg, dataset=...)`).

Columns (``task.*`` keys): the problem is ``row[prompt_key]`` (a string), or
with ``messages_key`` set, ``row[messages_key]``, a list of
``{"role", "content"}`` chat messages (the problem text is then the last user
message).  The reference answer is ``row[answer_key]``; it may be missing
only with ``checker=none``.  Every column of the row is kept in
``problem.metadata["row"]`` and passed to reward functions.

Prompts: compact style (scratch models) is ``"<problem>="``; chat style is
``[system_prompt] + user(problem)`` (or the row's messages, after
``system_prompt`` unless they start with a system message), rendered by the
tokenizer's chat template with the generation prompt.  The prompt text is used
as written: ask for the answer format the checker reads in the prompt itself.

Checkers (``task.checker``), applied to the completion's final answer as
`ais_jax.tasks.math_qa.extract` finds it (``\\boxed{}``, ``<answer>``,
``####``, "the answer is", a bare answer, the last number):

* ``numeric``: both parse as the same exact number (``0.5 == 1/2``);
* ``exact``: the extracted answer, or the whole stripped completion, equals
  the stripped reference;
* ``math_verify``: `ais_jax.tasks.equivalence.answers_match` (built-in
  rules, then math-verify when the package is installed; without it a
  warning, and the built-in rules only);
* ``none``: never correct; rewards come from ``reward.functions`` only.

Splits: with an eval file, train problems whose text also appears there are
dropped; without one, about 10% of the problems (by a hash of their text) are
held out.  Training draws cycle through the shuffled train pool, so a small
file serves any number of steps; evaluation uses at most the whole eval pool.
``task.difficulty`` is ignored.
"""

from __future__ import annotations

import math
import os
import random
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ais_jax.core.errors import UsageError
from ais_jax.core.safe_yaml import clip
from ais_jax.tasks import base, math_qa
from ais_jax.tasks.equivalence import answers_equal, parse_number

CHECKERS = ("numeric", "exact", "math_verify", "none")
NAME = "dataset"
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_rows(path: str, key: str = "task.train_file") -> list[dict[str, Any]]:
    """The rows of a JSONL / JSON / parquet / CSV file or a saved HF dataset directory.

    Raises:
      UsageError: an unknown extension, or a file ``datasets`` cannot read.
    """
    ext = os.path.splitext(path)[1].lower()
    if not os.path.isdir(path) and ext not in _BUILDERS:
        raise UsageError(f"{key} {clip(path)} has an unknown extension; use .jsonl, .json, "
                         ".parquet, .csv or a saved Hugging Face dataset directory")
    try:
        import datasets
    except ImportError:
        raise UsageError("task.name=dataset needs the datasets package; pip install "
                         "datasets") from None
    from datasets.utils import logging as ds_logging

    bars = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()  # stderr stays clean: errors are one line
    try:
        if os.path.isdir(path):
            ds = datasets.load_from_disk(path)
            if isinstance(ds, datasets.DatasetDict):
                ds = ds["train"] if "train" in ds or len(ds) != 1 else next(iter(ds.values()))
        else:
            ds = datasets.load_dataset(_BUILDERS[ext], data_files=path, split="train")
        return [dict(r) for r in ds]
    except Exception as e:  # any reader failure is the file's fault
        text = " ".join(str(e).split())[:160]
        raise UsageError(f"{key} {clip(path)} cannot be read ({type(e).__name__}: "
                         f"{text})") from None
    finally:
        if bars:
            ds_logging.enable_progress_bar()


def _messages(value: Any, where: str) -> base.Messages:
    ok = isinstance(value, Sequence) and not isinstance(value, str) and value and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str) for m in value)
    if not ok:
        raise UsageError(f"{where}: expected a list of {{role, content}} chat messages, got "
                         f"{clip(value)}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _answer(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return str(value).strip()


def rows_to_problems(rows: Sequence[Mapping[str, Any]], *, prompt_key: str = "prompt",
                     messages_key: str = "", answer_key: str = "answer",
                     checker: str = "numeric", source: str = "dataset") -> list[base.Problem]:
    """Problems of dataset rows (columns as in the module doc).

    Raises:
      UsageError: no rows, a missing column (naming the columns there are) or a
        bad value; one line naming ``source``.
    """
    if not rows:
        raise UsageError(f"{source} has no rows")
    columns = list(rows[0])
    needed = [("task.messages_key" if messages_key else "task.prompt_key",
               messages_key or prompt_key)]
    if checker != "none":
        needed.append(("task.answer_key", answer_key))
    for key, col in needed:
        if col not in columns:
            raise UsageError(f"{key}={clip(col)} is not a column of {source}; its columns: "
                             f"{', '.join(map(str, columns[:20]))}")
    out = []
    for i, row in enumerate(rows):
        where = f"{source} row {i}"
        messages = None
        if messages_key:
            messages = _messages(row.get(messages_key), where)
            users = [m["content"] for m in messages if m["role"] == "user"]
            text = users[-1] if users else messages[-1]["content"]
        else:
            text = row.get(prompt_key)
            if not isinstance(text, str) or not text.strip():
                raise UsageError(f"{where}: column {clip(prompt_key)} must be a non-empty "
                                 f"string, got {clip(text)}")
        answer = _answer(row.get(answer_key))
        if checker != "none" and not answer:
            raise UsageError(f"{where}: column {clip(answer_key)} is empty; fill it or use "
                             "task.checker=none")
        meta = {"row": dict(row), "messages": messages}
        pid = base.problem_id(NAME, math_qa.canonical_text(text))
        out.append(base.Problem(pid, text.strip(), answer, meta))
    return out


def _checker(checker: str) -> Any:
    if checker == "numeric":
        def check(pred: str | None, gold: str) -> bool:
            a, b = parse_number(pred or ""), parse_number(gold)
            return a is not None and a == b
        return check
    if checker == "exact":
        return lambda pred, gold: pred is not None and pred.strip() == gold.strip()
    if checker == "math_verify":
        from ais_jax.tasks import equivalence

        extra = equivalence.resolve_equivalence("auto")
        if extra is None:
            print("warning: task.checker=math_verify: math-verify is not installed; using the "
                  "built-in equivalence rules", file=sys.stderr)
        match = getattr(equivalence, "answers_match", None)  # the thread-safe public checker
        if match is not None:
            return match
        return lambda pred, gold: answers_equal(pred, gold, extra=extra)
    if checker == "none":
        return lambda pred, gold: False
    raise UsageError(f"task.checker must be one of {', '.join(CHECKERS)}, got {clip(checker)}")


def _generator(train: list[base.Problem], eval_: list[base.Problem] | None) -> Any:
    key = lambda p: math_qa.canonical_text(p.prompt)  # noqa: E731
    if eval_ is None:
        pools = {s: [p for p in train if base.split_of(NAME, key(p)) == s] for s in base.SPLITS}
    else:
        held = {key(p) for p in eval_}
        pools = {"train": [p for p in train if key(p) not in held], "eval": list(eval_)}
    for split, pool in pools.items():
        if not pool:
            fix = ("set task.eval_file" if split == "eval" else
                   "use an eval file that does not hold every training problem")
            raise UsageError(f"the dataset task has no {split} problems ({len(train)} rows); "
                             f"{fix}")

    def generate(seed: int, n: int | None = None, split: str = "train",
                 **_difficulty: Any) -> list[base.Problem]:
        """``n`` problems of the split (train: cycling; eval: at most all), shuffled by seed."""
        base.check_split(split)
        pool = pools[split]
        count = len(pool) if n is None else n
        base.check_count(count)
        if split == "eval":
            count = min(count, len(pool))
        order = list(range(len(pool)))
        random.Random(seed).shuffle(order)
        return [pool[order[i % len(pool)]] for i in range(count)]

    return generate


def dataset_task(train: list[base.Problem], eval_problems: list[base.Problem] | None = None,
                 *, checker: str = "numeric", system_prompt: str = "") -> base.Task:
    """A `Task` over problems from `rows_to_problems` (module doc: prompts, checkers, splits).

    Raises:
      UsageError: an unknown checker, or an empty train or eval split.
    """
    equal = _checker(checker)

    def verify(text: str, problem: base.Problem) -> bool:
        pred = math_qa.extract(text)
        if equal(pred, problem.answer):
            return True
        return checker == "exact" and text.strip() == problem.answer

    def chat_messages(problem: base.Problem) -> base.Messages:
        given = problem.metadata.get("messages")
        msgs = list(given) if given else base.user_message(problem.prompt)
        if system_prompt and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": system_prompt}, *msgs]
        return msgs

    return base.Task(
        name=NAME, generate=_generator(train, eval_problems), compact_prompt=math_qa.compact_prompt,
        chat_messages=chat_messages, extract=math_qa.extract, verify=verify,
        format_ok=math_qa.format_ok, description=f"{NAME}: {len(train)} loaded problems.")


def task_from_config(t: Any, rows: Sequence[Mapping[str, Any]] | None = None) -> base.Task:
    """The dataset task of a config's ``task`` section; ``rows`` replace ``task.train_file``.

    Raises:
      UsageError: no train file or rows, unreadable files, missing columns.
    """
    kw = {"prompt_key": t.prompt_key, "messages_key": t.messages_key,
          "answer_key": t.answer_key, "checker": t.checker}
    if rows is None:
        if not t.train_file:
            raise UsageError("task.name=dataset needs task.train_file (a .jsonl, .parquet, .csv "
                             "file or a saved Hugging Face dataset directory)")
        rows, source = load_rows(t.train_file), t.train_file
    else:
        rows, source = [dict(r) for r in rows], "the dataset passed to run"
    train = rows_to_problems(rows, source=source, **kw)
    ev = None
    if t.eval_file:
        ev = rows_to_problems(load_rows(t.eval_file, "task.eval_file"), source=t.eval_file, **kw)
    return dataset_task(train, ev, checker=t.checker, system_prompt=t.system_prompt)
