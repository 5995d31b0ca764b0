"""Procedural GSM8K-style word problems (so there is math to train on without data files).

A problem is a short story about one person and a pile of items, changed by
``steps`` operations (buy more, give away, buy packs of m, share equally, a
pile that doubles / triples), then "How many ... now?".  Every intermediate
count is a positive integer; the answer is the final count.  The GSM8K-style
worked solution (ending in ``#### N``) is kept in ``metadata["solution"]`` for
supervised warm-up.

Extraction, verification and prompt formats are those of
`ais_jax.tasks.math_qa` (answer in ``\\boxed{}`` for chat; compact
``"<question>="`` -> ``"<N>"``).
"""

from __future__ import annotations

import random

from ais_jax.tasks import base, math_qa

NAME = "gsm_synth"
_PEOPLE = (
    ("Ava", "she", "her"), ("Ben", "he", "his"), ("Chloe", "she", "her"), ("Dan", "he", "his"),
    ("Emma", "she", "her"), ("Finn", "he", "his"), ("Grace", "she", "her"), ("Hugo", "he", "his"),
    ("Iris", "she", "her"), ("Jack", "he", "his"), ("Lena", "she", "her"), ("Omar", "he", "his"),
)  # fmt: skip
_FRIENDS = ("Sam", "Mia", "Leo", "Zoe", "Noah", "Ruby")
_ITEMS = ("apples", "marbles", "stickers", "books", "cookies", "pencils", "stamps", "shells")
_VERBS = {2: "doubles", 3: "triples", 4: "quadruples"}


def _step(
    rng: random.Random, v: int, max_value: int, who: tuple[str, str, str], item: str
) -> tuple[int, str, str]:
    """One operation on the count ``v``: (new count, sentence, solution line)."""
    name, she, _ = who
    she_cap = she.capitalize()
    kinds = ["add", "packs"]
    if v > 1:
        kinds.append("sub")
    divisors = [k for k in range(2, 10) if v % k == 0 and v // k >= 1]
    if divisors:
        kinds.append("share")
    if v <= max_value:
        kinds.append("times")
    kind = rng.choice(kinds)
    if kind == "add":
        b = rng.randint(1, max_value)
        return v + b, f"{she_cap} buys {b} more {item}.", f"{v}+{b}={v + b}"
    if kind == "sub":
        b = rng.randint(1, v - 1)
        friend = rng.choice(_FRIENDS)
        return v - b, f"{she_cap} gives {b} {item} to {friend}.", f"{v}-{b}={v - b}"
    if kind == "packs":
        k, m = rng.randint(2, 6), rng.randint(2, max(2, max_value // 4))
        total = v + k * m
        return (
            total,
            (f"{she_cap} buys {k} packs with {m} {item} in each pack."),
            f"{k}*{m}={k * m}, {v}+{k * m}={total}",
        )
    if kind == "share":
        k = rng.choice(divisors)
        return (
            v // k,
            (
                f"{she_cap} shares the {item} equally among {k} people, {name} included, "
                f"and keeps one share."
            ),
            f"{v}/{k}={v // k}",
        )
    k = rng.choice(tuple(_VERBS))
    return v * k, f"The number of {item} {name} has {_VERBS[k]}.", f"{v}*{k}={v * k}"


def _draw(rng: random.Random, steps: int, max_value: int) -> tuple[str, base.Problem]:
    who = rng.choice(_PEOPLE)
    item = rng.choice(_ITEMS)
    v = rng.randint(2, max_value)
    sentences = [f"{who[0]} has {v} {item}."]
    lines = []
    for _ in range(steps):
        v, sentence, line = _step(rng, v, max_value, who, item)
        sentences.append(sentence)
        lines.append(line)
    sentences.append(f"How many {item} does {who[0]} have now?")
    question = " ".join(sentences)
    solution = "\n".join(lines) + f"\n#### {v}"
    metadata = {"solution": solution, "steps": steps}
    key = math_qa.canonical_text(question)
    return key, base.Problem(base.problem_id(NAME, key), question, str(v), metadata)


def generate(
    seed: int, n: int, split: str = "train", *, steps: int = 2, max_value: int = 20
) -> list[base.Problem]:
    """Reproducible synthetic word problems.

    Args:
      seed: random seed.
      n: number of problems.
      split: ``"train"`` or ``"eval"``.
      steps: operations applied to the starting count (1..8).
      max_value: scale of the numbers in the story (2..10^4).

    Returns:
      ``n`` problems; ``problem.answer`` is the final count as a string.
    """
    if not 1 <= steps <= 8:
        raise ValueError(f"steps must be in [1, 8], got {steps}.")
    if not 2 <= max_value <= 10**4:
        raise ValueError(f"max_value must be in [2, 10**4], got {max_value}.")
    return base.generate_problems(
        NAME, lambda rng: _draw(rng, steps, max_value), seed=seed, n=n, split=split
    )


TASK = base.Task(
    name=NAME,
    generate=generate,
    compact_prompt=math_qa.compact_prompt,
    chat_messages=math_qa.chat_messages,
    extract=math_qa.extract,
    verify=math_qa.verify,
    format_ok=math_qa.format_ok,
    description="Synthetic GSM8K-style word problems with integer answers.",
)
