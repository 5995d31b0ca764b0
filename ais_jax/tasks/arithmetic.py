"""Multi-digit integer arithmetic with exact answers: ``+``, ``-``, ``*`` and exact ``/``.

Expressions use standard precedence (``*`` and ``/`` bind tighter, left to
right) and no parentheses.  Every division is exact: a ``/`` only starts a
term (``a/b``, never ``a*b/c``) and its dividend is built as ``b * q``, so the
dividend may have up to twice the operand digits.  Answers are integers and
can be negative.

Difficulty: ``digits`` per operand and ``num_operands``; ``ops`` restricts the
operators.

Prompt formats:

* compact: ``"12+7*3="`` -> ``"33"``.
* chat: the expression in words-and-symbols, the answer asked for inside
  ``<answer>...</answer>``.

`verify` reads the last ``<answer>`` content (else the last ``\\boxed{}``, else
the whole completion) as an exact number (``1,234`` / ``33.0`` / ``+33``
accepted, see `ais_jax.tasks.equivalence.parse_number`) and compares it with
the value.
"""

from __future__ import annotations

import random

from ais_jax.tasks import base
from ais_jax.tasks.equivalence import parse_number
from ais_jax.tasks.expr import evaluate
from ais_jax.tasks.extract import has_answer_tag as format_ok
from ais_jax.tasks.extract import tagged_or_whole

NAME = "arithmetic"
OPS = "+-*/"


def _draw(rng: random.Random, digits: int, num_operands: int, ops: str) -> tuple[str, base.Problem]:
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    chosen: list[str] = []
    for i in range(num_operands - 1):
        allowed = [o for o in ops if not (o == "/" and i > 0 and chosen[i - 1] in "*/")]
        chosen.append(rng.choice(allowed or [o for o in ops if o != "/"]))
    operands = [rng.randint(lo, hi) for _ in range(num_operands)]
    for i, op in enumerate(chosen):
        if op == "/":
            divisor = rng.randint(max(2, lo), max(2, hi))
            operands[i + 1] = divisor
            operands[i] = divisor * rng.randint(lo, hi)
    expression = str(operands[0]) + "".join(
        f"{o}{x}" for o, x in zip(chosen, operands[1:], strict=True)
    )
    result = evaluate(expression, max_chars=10_000)
    if result is None or result.value.denominator != 1:  # cannot happen by construction
        raise RuntimeError(f"arithmetic generator produced a non-integer: {expression}")
    value = result.value.numerator
    prompt = f"Compute {expression}."
    metadata = {"expression": expression, "value": value}
    return expression, base.Problem(base.problem_id(NAME, expression), prompt, str(value), metadata)


def generate(
    seed: int,
    n: int,
    split: str = "train",
    *,
    digits: int = 2,
    num_operands: int = 2,
    ops: str = OPS,
) -> list[base.Problem]:
    """Reproducible arithmetic problems.

    Args:
      seed: random seed.
      n: number of problems.
      split: ``"train"`` or ``"eval"``.
      digits: digits of every operand (1..6; dividends get up to ``2 * digits``).
      num_operands: operands per expression (2..8).
      ops: the operators to draw from, a non-empty subset of ``"+-*/"``.

    Returns:
      ``n`` problems; ``problem.answer`` is the value as a decimal string.
    """
    if not 1 <= digits <= 6:
        raise ValueError(f"digits must be in [1, 6], got {digits}.")
    if not 2 <= num_operands <= 8:
        raise ValueError(f"num_operands must be in [2, 8], got {num_operands}.")
    if not ops or set(ops) - set(OPS):
        raise ValueError(f"ops must be a non-empty subset of {OPS!r}, got {ops!r}.")
    if set(ops) == {"/"} and num_operands > 2:
        raise ValueError("ops='/' alone allows only num_operands=2 (divisions cannot chain).")
    return base.generate_problems(
        NAME, lambda rng: _draw(rng, digits, num_operands, ops), seed=seed, n=n, split=split
    )


def compact_prompt(problem: base.Problem) -> str:
    """``"12+7*3="``."""
    return f"{problem.metadata['expression']}="


def chat_messages(problem: base.Problem) -> base.Messages:
    """One user message asking for the integer inside ``<answer>`` tags."""
    return base.user_message(
        f"{problem.prompt} Use the usual operator precedence; every division is exact. "
        "Give the final integer inside <answer></answer> tags."
    )


def extract(text: str) -> str | None:
    """The last ``<answer>`` content, else the last ``\\boxed{}``, else the whole text."""
    return tagged_or_whole(text)


def verify(text: str, problem: base.Problem) -> bool:
    """Whether the completion's answer is exactly the expression's value."""
    answer = extract(text)
    if answer is None:
        return False
    value = parse_number(answer)
    return value is not None and value == problem.metadata["value"]


def forgotten_carries(problem: base.Problem) -> str:
    """The answer of a solver that forgets every carry: column sums taken mod 10.

    Defined for pure additions of non-negative operands (``"57+68="`` -> ``"15"``
    instead of ``"125"``); any other expression, and an addition without a
    carry, gets its correct answer.

    Args:
      problem: an arithmetic problem.

    Returns:
      The flawed answer as a decimal string.
    """
    expression = problem.metadata["expression"]
    terms = expression.split("+")
    if not all(t.isdigit() for t in terms):
        return problem.answer
    width = max(len(t) for t in terms)
    columns = [sum(int(t.rjust(width, "0")[i]) for t in terms) % 10 for i in range(width)]
    return str(int("".join(map(str, columns))))


TASK = base.Task(
    name=NAME,
    generate=generate,
    compact_prompt=compact_prompt,
    chat_messages=chat_messages,
    extract=extract,
    verify=verify,
    format_ok=format_ok,
    mistake=forgotten_carries,
    description="Integer arithmetic with + - * and exact /.",
)
