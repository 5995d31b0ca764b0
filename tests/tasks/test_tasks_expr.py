"""Known-answer tests of the safe expression evaluator (ais_jax/tasks/expr.py)."""

from fractions import Fraction

import pytest

from ais_jax.tasks.expr import MAX_BITS, MAX_DEPTH, MAX_EXPR_CHARS, evaluate


@pytest.mark.parametrize(
    ("text", "value", "literals"),
    [
        ("3*5+7", 22, (3, 5, 7)),
        ("3 + 5 * 7", 38, (3, 5, 7)),
        ("(3 + 5) * 7", 56, (3, 5, 7)),
        ("8 / 4 / 2", 1, (8, 4, 2)),  # left associative
        ("10 - 4 - 3", 3, (10, 4, 3)),
        ("10 - (4 - 3)", 9, (10, 4, 3)),
        ("7 / 2", Fraction(7, 2), (7, 2)),
        ("(1/3)*3", 1, (1, 3, 3)),
        ("12×2÷3", 8, (12, 2, 3)),
        ("((((42))))", 42, (42,)),
        ("\t1\n+\r2 ", 3, (1, 2)),
        ("007", 7, (7,)),
    ],
)
def test_known_values(text, value, literals):
    result = evaluate(text)
    assert result is not None
    assert result.value == value
    assert result.literals == literals


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "-3",  # no unary minus
        "+3",
        "3 +",
        "* 3",
        "3 5",  # juxtaposition
        "2(3)",
        "(3)(4)",
        "()",
        "(3",
        "3)",
        ")3(",
        "9**9",
        "9^9",
        "1/0",
        "1/(2-2)",
        "1.5 + 2",
        "3 % 2",
        "x + 1",
        "３ + 1",  # fullwidth digit
        "٣ + 1",  # arabic-indic digit
        "1" * 13,  # literal too long
        "nan",
        "inf",
        "1e5",
    ],
)
def test_rejected(text):
    assert evaluate(text) is None


def test_bounds():
    assert evaluate("(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH).value == 1
    assert evaluate("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1)) is None
    long_ok = "+".join(["1"] * (MAX_EXPR_CHARS // 2))
    assert len(long_ok) < MAX_EXPR_CHARS and evaluate(long_ok).value == MAX_EXPR_CHARS // 2
    assert evaluate("1" + "+1" * MAX_EXPR_CHARS) is None  # too long: rejected before parsing
    # Intermediate magnitude: 999999999999^k grows by ~40 bits a factor.
    factors = (MAX_BITS // 40) + 2
    assert evaluate("*".join(["999999999999"] * factors)) is None
    assert evaluate("*".join(["999999999999"] * 3)) is not None
