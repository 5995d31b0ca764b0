"""Multi-digit multiplication with a written scratchpad: a task with long worked answers.

A problem is ``a * b`` with ``digits_a``-digit ``a`` and ``digits_b``-digit
``b``.  The worked answer (``problem.answer``, what the supervised warm start
teaches) is a scratchpad of about 64-256 characters for 3 to 5 digits, so
that the character-level model's rollouts are long:

* one partial product per non-zero digit of ``b``, units digit first, with
  the place shift written out in the multiplier: ``347*6=2082;347*80=27760;
  347*200=69400;`` (zero digits of ``b`` contribute nothing and are skipped);
* the running sums of the partial products, left to right:
  ``2082+27760=29842;29842+69400=99242;`` (none when ``b`` has a single
  non-zero digit);
* the final product after the marker ``#``: ``#99242``.

Every character is a digit or one of ``*=;+#``, all in the `CharTokenizer`
alphabet.  Lengths of ``problem.answer`` in characters (one token each with
`CharTokenizer`, plus ``<eos>``), over 1,000 train problems of seed 0, min /
mean / max: 2x2 digits 14 / 35.2 / 39, 3x3 20 / 75.0 / 83, 4x4 26 / 128.6 /
142, 5x5 74 / 192.7 / 216 (the minima come from a ``b`` such as ``1000``
with one non-zero digit).

Prompt formats:

* compact (character model): ``"347*286="`` -> the scratchpad above.
* chat: the problem in words, the final product asked for inside
  ``<answer>...</answer>``.

`verify` reads the answer (the last ``<answer>`` content, else the last
``\\boxed{}``, else the whole completion) and takes the text after its last
``#``, or the whole answer when it has no ``#``.  That text must be the
product as plain ASCII digits (no sign, no leading zero, at most
`MAX_DIGITS` digits; ``1,234,567`` thousands groups are accepted), with
surrounding whitespace allowed.  The scratchpad is *not* checked: a wrong
scratchpad with the right final product is correct, and a bare product
without a scratchpad is correct too.  `scratchpad_ok` checks the scratchpad's
arithmetic separately, for analysis.  Nothing is ever evaluated; the work is
bounded by the answer extraction's scan limits.
"""

from __future__ import annotations

import random
import re

from ais_jax.tasks import base
from ais_jax.tasks.extract import has_answer_tag as format_ok
from ais_jax.tasks.extract import tagged_or_whole

NAME = "multiplication"
MARKER = "#"
MAX_DIGITS = 40  # longer numbers in a completion are malformed (False), never parsed
MAX_OPERAND_DIGITS = 8
MAX_STEPS = 2 * MAX_OPERAND_DIGITS  # scratchpad_ok reads at most this many steps

_NUMBER = re.compile(r"[1-9][0-9]{0,39}|0|[1-9][0-9]{0,2}(?:,[0-9]{3}){1,12}")
_PRODUCT_STEP = re.compile(r"([0-9]{1,40})\*([0-9]{1,40})=([0-9]{1,40})")
_SUM_STEP = re.compile(r"([0-9]{1,40})\+([0-9]{1,40})=([0-9]{1,40})")


def partial_products(a: int, b: int) -> list[tuple[int, int]]:
    """``(shifted multiplier, partial product)`` per non-zero digit of ``b``, units first.

    Args:
      a: the first factor (non-negative).
      b: the second factor (non-negative).

    Returns:
      ``[(d * 10**k, a * d * 10**k), ...]`` for each non-zero digit ``d`` of
      ``b`` at place ``k``; ``[(0, 0)]`` when ``b`` is 0.
    """
    steps = [(int(d) * 10**k, a * int(d) * 10**k) for k, d in enumerate(reversed(str(b)))]
    return [s for s in steps if s[0]] or [(0, 0)]


def _scratchpad(a: int, partials: list[tuple[int, int]]) -> str:
    """The worked answer for ``a`` and the given (multiplier, partial product) steps."""
    lines = [f"{a}*{m}={p};" for m, p in partials]
    total = partials[0][1]
    for _, p in partials[1:]:
        lines.append(f"{total}+{p}={total + p};")
        total += p
    return "".join(lines) + f"{MARKER}{total}"


def scratchpad(a: int, b: int) -> str:
    """The worked answer for ``a * b`` (format in the module doc).

    Args:
      a: the first factor (non-negative).
      b: the second factor (non-negative).

    Returns:
      ``"347*6=2082;347*80=27760;347*200=69400;2082+27760=29842;29842+69400=99242;#99242"``
      for ``a=347, b=286``.
    """
    return _scratchpad(a, partial_products(a, b))


def _draw(rng: random.Random, digits_a: int, digits_b: int) -> tuple[str, base.Problem]:
    a = rng.randint(10 ** (digits_a - 1), 10**digits_a - 1)
    b = rng.randint(10 ** (digits_b - 1), 10**digits_b - 1)
    # a*b and b*a share a key (and so a split): same product, so no eval leak.
    key = f"{min(a, b)}*{max(a, b)}"
    metadata = {"a": a, "b": b, "value": a * b}
    problem = base.Problem(
        base.problem_id(NAME, f"{a}*{b}"), f"Multiply {a} by {b}.", scratchpad(a, b), metadata
    )
    return key, problem


def _check_digits(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int in [1, {MAX_OPERAND_DIGITS}], got {value!r}.")
    if not 1 <= value <= MAX_OPERAND_DIGITS:
        raise ValueError(f"{name} must be in [1, {MAX_OPERAND_DIGITS}], got {value}.")


def generate(
    seed: int,
    n: int,
    split: str = "train",
    *,
    digits_a: int = 3,
    digits_b: int = 3,
) -> list[base.Problem]:
    """Reproducible multiplication problems with scratchpad answers.

    Args:
      seed: random seed.
      n: number of problems.
      split: ``"train"`` or ``"eval"`` (disjoint, see `ais_jax.tasks.base`;
        ``a*b`` and ``b*a`` are always in the same split).
      digits_a: digits of the first factor (1..8, leading digit non-zero).
      digits_b: digits of the second factor (1..8); it sets the number of
        partial products, so the answer length grows about as
        ``digits_b * (digits_a + digits_b)``.

    Returns:
      ``n`` problems; ``problem.answer`` is the scratchpad ending in ``#<product>``.

    Raises:
      ValueError: a bad ``digits_a`` / ``digits_b`` / ``split`` / ``n``, or
        too few problems of the split exist (1x1 digits, eval split).
    """
    _check_digits("digits_a", digits_a)
    _check_digits("digits_b", digits_b)
    return base.generate_problems(
        NAME, lambda rng: _draw(rng, digits_a, digits_b), seed=seed, n=n, split=split
    )


def compact_prompt(problem: base.Problem) -> str:
    """``"347*286="``."""
    return f"{problem.metadata['a']}*{problem.metadata['b']}="


def chat_messages(problem: base.Problem) -> base.Messages:
    """One user message asking for the product inside ``<answer>`` tags."""
    b = problem.metadata["b"]
    return base.user_message(
        f"{problem.prompt} Work it out step by step: write one partial product for each "
        f"digit of {b}, shifted to its place value, then add the partial products. "
        "Give only the final product, as an integer, inside <answer></answer> tags."
    )


def extract(text: str) -> str | None:
    """The final answer: the text after the last ``#`` of the answer, or the whole answer.

    The answer is the last ``<answer>`` content, else the last ``\\boxed{}``,
    else the whole completion.  Returns the stripped final-answer text, or
    None when there is none (it is not checked to be a number here).
    """
    answer = tagged_or_whole(text)
    if answer is None:
        return None
    final = answer[answer.rfind(MARKER) + 1 :].strip()
    return final or None


def parse_final(final: str) -> int | None:
    """The integer a final-answer text states, or None when malformed.

    Accepts ASCII digits without sign or leading zeros (at most `MAX_DIGITS`),
    or correctly grouped thousands (``1,234,567``).
    """
    if len(final) > MAX_DIGITS + MAX_DIGITS // 3 or _NUMBER.fullmatch(final) is None:
        return None
    return int(final.replace(",", ""))


def verify(text: str, problem: base.Problem) -> bool:
    """Whether the completion's final answer is exactly ``a * b`` (scratchpad not checked)."""
    final = extract(text)
    if final is None:
        return False
    return parse_final(final) == problem.metadata["value"]


def scratchpad_ok(text: str, problem: base.Problem) -> bool:
    """Whether a compact completion's scratchpad is complete and its arithmetic right.

    For analysis only (not part of `verify`).  The completion must be the
    scratchpad itself (no tags): partial products ``a*m=p;`` whose
    multipliers are the shifted non-zero digits of ``b`` in order, each
    product right, then the running sums ``s+p=t;`` of those products, each
    right, then ``#`` and the product.

    Args:
      text: the completion.
      problem: a multiplication problem.

    Returns:
      True iff every step is present, in order, and correct.
    """
    a, b = problem.metadata["a"], problem.metadata["b"]
    expected = partial_products(a, b)
    steps = text.strip().split(";", MAX_STEPS + 1)
    if len(steps) != 2 * len(expected):
        return False
    products = []
    for step, (multiplier, _) in zip(steps, expected, strict=False):
        m = _PRODUCT_STEP.fullmatch(step)
        if m is None or int(m[1]) != a or int(m[2]) != multiplier or int(m[3]) != a * multiplier:
            return False
        products.append(int(m[3]))
    total = products[0]
    for step, p in zip(steps[len(expected) : -1], products[1:], strict=True):
        m = _SUM_STEP.fullmatch(step)
        if m is None or int(m[1]) != total or int(m[2]) != p or int(m[3]) != total + p:
            return False
        total += p
    final = steps[-1]
    return final.startswith(MARKER) and parse_final(final[1:]) == a * b == total


def forgotten_shift(problem: base.Problem) -> str:
    """The scratchpad of a solver that forgets the place shifts of the partial products.

    Each partial product is written as ``a`` times the bare digit while the
    multiplier still shows the shift (``347*80=2776``), and the unshifted
    products are summed, so the final answer is ``a * (digit sum of b)``.
    When ``b`` has a single non-zero digit in the units place the mistake
    does not arise and the correct answer is returned.

    Args:
      problem: a multiplication problem.

    Returns:
      The flawed worked answer, in the format of ``problem.answer``.
    """
    a, b = problem.metadata["a"], problem.metadata["b"]
    flawed = [(m, p // 10 ** (len(str(m)) - 1)) for m, p in partial_products(a, b)]
    return _scratchpad(a, flawed)


TASK = base.Task(
    name=NAME,
    generate=generate,
    compact_prompt=compact_prompt,
    chat_messages=chat_messages,
    extract=extract,
    verify=verify,
    format_ok=format_ok,
    mistake=forgotten_shift,
    description="Multi-digit multiplication with a written scratchpad (long answers).",
)
