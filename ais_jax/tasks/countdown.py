"""Countdown: combine given numbers with + - * / and parentheses to hit a target.

Rules (checked by `verify`):

* The answer is an arithmetic expression over integer literals with ``+ - * /``
  and parentheses (grammar in `ais_jax.tasks.expr`: no unary minus, no
  exponent, no decimals, no concatenating digits of two numbers).  An optional
  ``= <target>`` suffix is allowed (``3*5+7 = 22``); a different stated result
  is wrong.
* ``use_all=True`` (the default, as in TinyZero's and d1's Countdown reward):
  the literals must be exactly the given numbers, each used once.
  ``use_all=False`` (the TV game's rule): each given number at most once (as a
  multiset), no other literals.  The rule is stored per problem in
  ``problem.metadata["use_all"]``.
* Intermediate results may be fractions (exact arithmetic); the final value
  must equal the target exactly.  Division by zero is wrong.

Prompt formats:

* compact (character model): ``"3 5 7>22:"`` -> ``"3*5+7"``.
* chat: the problem in words, the answer asked for inside ``<answer>...</answer>``.

Generation builds a random expression tree over the numbers (every
intermediate a positive integer, so a solution exists) and keeps the draw if
the target lands in ``[1, max_target]``; ``problem.answer`` is that solution.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import NamedTuple

from ais_jax.tasks import base
from ais_jax.tasks.expr import evaluate
from ais_jax.tasks.extract import has_answer_tag as format_ok
from ais_jax.tasks.extract import tagged_or_whole

NAME = "countdown"
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3


class _Node(NamedTuple):
    value: int
    text: str
    prec: int


def _combine(a: _Node, op: str, b: _Node) -> _Node:
    p = _PREC[op]
    left = f"({a.text})" if a.prec < p else a.text
    right = f"({b.text})" if b.prec < p or (b.prec == p and op in "-/") else b.text
    if op == "+":
        value = a.value + b.value
    elif op == "-":
        value = a.value - b.value
    elif op == "*":
        value = a.value * b.value
    else:  # "/": only chosen when b divides a
        value = a.value // b.value
    return _Node(value, f"{left}{op}{right}", p)


def _random_step(rng: random.Random, a: _Node, b: _Node) -> _Node:
    """Combine two nodes with a random operator keeping the result a positive integer."""
    if a.value < b.value:
        a, b = b, a
    ops = ["+", "*"]
    if a.value != b.value:
        ops.append("-")
    if b.value > 1 and a.value % b.value == 0:
        ops.append("/")
    return _combine(a, rng.choice(ops), b)


def _draw(
    rng: random.Random, num_numbers: int, max_number: int, max_target: int, use_all: bool
) -> tuple[str, base.Problem]:
    for _ in range(10_000):
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        k = num_numbers if use_all else rng.randint(2, num_numbers)
        nodes = [
            _Node(numbers[i], str(numbers[i]), _ATOM) for i in rng.sample(range(num_numbers), k)
        ]
        while len(nodes) > 1:
            i, j = rng.sample(range(len(nodes)), 2)
            merged = _random_step(rng, nodes[i], nodes[j])
            nodes = [x for t, x in enumerate(nodes) if t not in (i, j)] + [merged]
        target = nodes[0].value
        if 1 <= target <= max_target:
            return _problem(tuple(numbers), target, nodes[0].text, use_all)
    raise ValueError(
        f"countdown: no target in [1, {max_target}] found; raise max_target or lower num_numbers."
    )


def _problem(
    numbers: tuple[int, ...], target: int, solution: str, use_all: bool
) -> tuple[str, base.Problem]:
    key = f"{sorted(numbers)}|{target}|{use_all}"
    rule = "Use every number exactly once" if use_all else "Use each number at most once"
    prompt = (
        f"Using the numbers {list(numbers)}, create an equation that equals {target}. "
        f"{rule}, with the operations +, -, *, / and parentheses."
    )
    metadata = {"numbers": numbers, "target": target, "use_all": use_all}
    return key, base.Problem(base.problem_id(NAME, key), prompt, solution, metadata)


def generate(
    seed: int,
    n: int,
    split: str = "train",
    *,
    num_numbers: int = 3,
    max_number: int = 99,
    max_target: int = 100,
    use_all: bool = True,
) -> list[base.Problem]:
    """Reproducible Countdown problems.

    Args:
      seed: random seed.
      n: number of problems.
      split: ``"train"`` or ``"eval"`` (disjoint, see `ais_jax.tasks.base`).
      num_numbers: how many numbers are given (2..8).
      max_number: numbers are drawn from ``[1, max_number]`` (<= 10^6).
      max_target: targets lie in ``[1, max_target]``.
      use_all: whether a solution must use every number (see the module doc).

    Returns:
      ``n`` problems; ``problem.answer`` is one valid solution.
    """
    if not 2 <= num_numbers <= 8:
        raise ValueError(f"num_numbers must be in [2, 8], got {num_numbers}.")
    if not 1 <= max_number <= 10**6:
        raise ValueError(f"max_number must be in [1, 10**6], got {max_number}.")
    if max_target < 1:
        raise ValueError(f"max_target must be >= 1, got {max_target}.")
    return base.generate_problems(
        NAME,
        lambda rng: _draw(rng, num_numbers, max_number, max_target, use_all),
        seed=seed,
        n=n,
        split=split,
    )


def compact_prompt(problem: base.Problem) -> str:
    """``"3 5 7>22:"``: the numbers, ``>``, the target, ``:``."""
    numbers = " ".join(str(x) for x in problem.metadata["numbers"])
    return f"{numbers}>{problem.metadata['target']}:"


def chat_messages(problem: base.Problem) -> base.Messages:
    """One user message asking for the expression inside ``<answer>`` tags."""
    return base.user_message(
        f"{problem.prompt} Think step by step, then give only the final expression "
        "inside <answer></answer> tags, for example <answer>(1 + 2) * 3</answer>."
    )


def extract(text: str) -> str | None:
    """The last ``<answer>`` content, else the last ``\\boxed{}``, else the whole text."""
    return tagged_or_whole(text)


def _literals_ok(literals: tuple[int, ...], numbers: tuple[int, ...], use_all: bool) -> bool:
    if use_all:
        return sorted(literals) == sorted(numbers)
    return not Counter(literals) - Counter(numbers)


def verify(text: str, problem: base.Problem) -> bool:
    """Whether the completion's expression hits the target under the problem's rules."""
    answer = extract(text)
    if answer is None:
        return False
    target = problem.metadata["target"]
    lhs, sep, rhs = answer.partition("=")
    if sep:
        rhs = rhs.strip()
        if not (rhs.isascii() and rhs.isdigit() and len(rhs) <= 12 and int(rhs) == target):
            return False
    result = evaluate(lhs)
    if result is None or result.value != target:
        return False
    return _literals_ok(
        result.literals, tuple(problem.metadata["numbers"]), problem.metadata["use_all"]
    )


TASK = base.Task(
    name=NAME,
    generate=generate,
    compact_prompt=compact_prompt,
    chat_messages=chat_messages,
    extract=extract,
    verify=verify,
    format_ok=format_ok,
    description="Countdown: reach the target with + - * / over the given numbers.",
)
