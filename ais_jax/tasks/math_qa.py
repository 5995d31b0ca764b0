"""GSM8K / MATH style question answering: JSONL loaders, final-answer extraction, verifier.

File formats (one JSON object per line; blank lines are skipped):

* GSM8K: ``{"question": str, "answer": str}`` where the answer ends with
  ``#### <final answer>``.
* MATH: ``{"problem": str, "solution": str}`` with the final answer in the
  last ``\\boxed{...}`` of the solution, or ``{"problem": str, "answer": ...}``
  (MATH500, AIME, AMC, OlympiadBench style; a number or a string).  When both
  are present ``answer`` wins.

A malformed row (non-finite numeric answers such as ``1e400`` included) raises
``UsageError("<file>:<line>: <what is wrong>")`` (a ``ValueError``); the CLI
prints it as one line and exits 2.

Final-answer extraction from a completion (`extract`), first hit wins:

1. the last ``\\boxed{...}`` (nested braces; ``\\fbox`` too),
2. the last ``<answer>...</answer>``,
3. the text after the last ``####`` (GSM8K style),
4. what follows the last "the answer is", up to the end of its line or sentence,
5. the whole completion when it is a short bare answer (at most 64 characters,
   one line, no letters outside LaTeX commands: ``\\frac{3}{4}``, ``(1, 2)``); with an
   ``=`` in it (``8 + 6 = 14``), what follows the last ``=``,
6. the last number in the text (fallback).

Equivalence is `ais_jax.tasks.equivalence.answers_equal` (exact numbers,
light LaTeX normalisation, optional math-verify).

Prompt formats: compact ``"<question>="`` -> ``"<answer>"``; chat: the question
and "put your final answer within \\boxed{}".
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ais_jax.core.errors import UsageError
from ais_jax.tasks import base
from ais_jax.tasks.equivalence import answers_equal, resolve_equivalence
from ais_jax.tasks.extract import after_hashes, answer_is, last_boxed, last_number, last_tag

FORMATS = ("auto", "gsm8k", "math")
_ID_SPACE = "math"  # loaded problems get ids "math-<hash of the question>"
_BARE_MAX_CHARS = 64
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_LETTERS = re.compile(r"[a-zA-Z]")


def _bare_answer(text: str) -> str | None:
    """The whole completion if it is short and has no words (a bare compact answer), or None;
    a bare worked line ``"8 + 6 = 14"`` gives its right-hand side ``"14"``."""
    if len(text) > 4 * _BARE_MAX_CHARS:
        return None
    whole = text.strip()
    if not whole or len(whole) > _BARE_MAX_CHARS or "\n" in whole:
        return None
    if _LETTERS.search(_LATEX_COMMAND.sub("", whole)):
        return None
    if "=" in whole:  # a worked bare line, "8 + 6 = 14": its right-hand side
        return whole.rsplit("=", 1)[1].strip() or None
    return whole


def extract(text: str) -> str | None:
    """The final answer of a completion (order in the module doc), or None."""
    for find in (last_boxed, last_tag, after_hashes, answer_is, _bare_answer, last_number):
        found = find(text)
        if found:
            return found
    return None


def verify(text: str, problem: base.Problem) -> bool:
    """Whether the completion's final answer equals ``problem.answer`` (built-in rules only)."""
    return answers_equal(extract(text), problem.answer)


def format_ok(text: str) -> bool:
    """Whether the completion puts its final answer in a ``\\boxed{}``."""
    return bool(last_boxed(text))


def compact_prompt(problem: base.Problem) -> str:
    """``"<question>="``."""
    return f"{problem.prompt}="


def chat_messages(problem: base.Problem) -> base.Messages:
    """One user message asking for step-by-step reasoning and a ``\\boxed{}`` answer."""
    return base.user_message(
        f"{problem.prompt}\nPlease reason step by step, "
        "and put your final answer within \\boxed{}."
    )


def canonical_text(text: str) -> str:
    """Whitespace-collapsed question text: the key for ids and splits."""
    return " ".join(text.split())


def _text_field(row: Mapping[str, Any], name: str) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"field {name!r} must be a non-empty string, got {value!r:.80}")
    return value


def _answer_field(row: Mapping[str, Any]) -> str:
    value = row["answer"]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"field 'answer' must be a string or a number, got {value!r:.80}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"field 'answer' must be a finite number, got {value}")
    text = str(value).strip()
    if not text:
        raise ValueError("field 'answer' is empty")
    return text


def _row_problem(row: Mapping[str, Any], fmt: str, source: str, line: int) -> base.Problem:
    if fmt == "auto":
        if "problem" in row:
            fmt = "math"
        elif "question" in row:
            fmt = "gsm8k"
        else:
            raise ValueError(
                "expected a 'question' (GSM8K format) or 'problem' (MATH format) field, "
                f"got keys {sorted(row)[:10]}"
            )
    if fmt == "gsm8k":
        question, full = _text_field(row, "question"), _text_field(row, "answer")
        solution, sep, final = full.rpartition("####")
        if not sep or not final.strip():
            raise ValueError("field 'answer' has no final answer after '####'")
        answer = final.strip()
    else:
        question = _text_field(row, "problem")
        solution = row.get("solution") if isinstance(row.get("solution"), str) else ""
        if "answer" in row:
            answer = _answer_field(row)
        elif "solution" in row:
            boxed = last_boxed(_text_field(row, "solution"))
            if not boxed:
                raise ValueError("no 'answer' field and no \\boxed{...} answer in 'solution'")
            answer = boxed
        else:
            raise ValueError("MATH format needs an 'answer' or a 'solution' field")
    metadata = {"solution": solution.strip(), "source": source, "line": line}
    pid = base.problem_id(_ID_SPACE, canonical_text(question))
    return base.Problem(pid, question.strip(), answer, metadata)


def load_jsonl(path: str | Path, fmt: str = "auto") -> list[base.Problem]:
    """Load GSM8K- or MATH-format problems from a JSONL file.

    Args:
      path: the file.
      fmt: ``"gsm8k"``, ``"math"`` or ``"auto"`` (per row: ``problem`` ->
        MATH, ``question`` -> GSM8K).

    Returns:
      The problems, in file order.

    Raises:
      ValueError: unknown ``fmt``.
      UsageError: (a ``ValueError``) an empty file or a malformed row; the
        message of a row starts with ``"<path>:<line>:"``.
      OSError: the file cannot be read.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}.")
    path = Path(path)
    with path.open("rb") as f:
        problems = [p for n, raw in enumerate(f, start=1) if (p := _line(raw, n, path, fmt))]
    if not problems:
        raise UsageError(f"{path}: no problems found (empty file).")
    return problems


def _line(raw: bytes, lineno: int, path: Path, fmt: str) -> base.Problem | None:
    """The problem of one JSONL line (None for a blank line); UsageError naming path:line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}:{lineno}: not valid UTF-8 ({e.reason}).") from None
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}:{lineno}: invalid JSON ({e.msg}, column {e.colno}).") from None
    except (ValueError, RecursionError) as e:  # an int of > 4300 digits, deep nesting
        raise UsageError(f"{path}:{lineno}: unreadable JSON ({str(e)[:120]}).") from None
    if not isinstance(row, dict):
        raise UsageError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}.")
    try:
        return _row_problem(row, fmt, str(path), lineno)
    except ValueError as e:
        raise UsageError(f"{path}:{lineno}: {e}.") from None


def _pool_generator(
    name: str, train: Sequence[base.Problem], eval_: Sequence[base.Problem] | None
) -> tuple[Callable[..., list[base.Problem]], Callable[[], list[base.Problem]]]:
    """``(generate, pool)``: the task's ``generate`` and its `base.Task.pool`."""
    if eval_ is None:
        pools = {
            s: [p for p in train if base.split_of(name, canonical_text(p.prompt)) == s]
            for s in base.SPLITS
        }
    else:
        held_out = {canonical_text(p.prompt) for p in eval_}
        pools = {
            "train": [p for p in train if canonical_text(p.prompt) not in held_out],
            "eval": list(eval_),
        }

    def generate(seed: int, n: int | None = None, split: str = "train") -> list[base.Problem]:
        """``n`` problems (None: all) of the split, shuffled reproducibly by ``seed``."""
        base.check_split(split)
        pool = pools[split]
        count = len(pool) if n is None else n
        base.check_count(count)
        if count > len(pool):
            raise ValueError(
                f"{name}: asked for {count} {split!r} problems, only {len(pool)} exist."
            )
        order = list(range(len(pool)))
        random.Random(seed).shuffle(order)
        return [pool[i] for i in order[:count]]

    return generate, lambda: pools["train"] + pools["eval"]


def dataset_task(
    name: str,
    train: Sequence[base.Problem],
    eval_problems: Sequence[base.Problem] | None = None,
    *,
    equivalence: str = "auto",
) -> base.Task:
    """A `Task` over loaded problems (e.g. from `load_jsonl`).

    Args:
      name: task name.
      train: problems for the ``"train"`` split (all problems when
        ``eval_problems`` is None).
      eval_problems: held-out problems for ``"eval"``; train problems whose
        question also appears here are dropped from ``"train"``.  When None, both
        splits come from ``train`` by hashing the question text.
      equivalence: ``"auto"`` (math-verify as a fallback judge when installed),
        ``"builtin"`` or ``"math_verify"`` (ImportError if missing).

    Returns:
      A task whose ``generate(seed, n=None, split="train")`` shuffles a split
      reproducibly and returns ``n`` problems (all when None).
    """
    extra = resolve_equivalence(equivalence)
    generate, pool = _pool_generator(name, train, eval_problems)

    def verify_(text: str, problem: base.Problem) -> bool:
        return answers_equal(extract(text), problem.answer, extra=extra)

    return base.Task(
        name=name,
        generate=generate,
        compact_prompt=compact_prompt,
        chat_messages=chat_messages,
        extract=extract,
        verify=verify_,
        format_ok=format_ok,
        description=f"{name}: {len(train)} loaded math problems.",
        pool=pool,
    )
