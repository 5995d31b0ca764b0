"""Arithmetic: generator (exact integer answers), prompts and verifier."""

import pytest

from ais_jax.tasks import arithmetic, base


def _problem(expression, value):
    return base.Problem(
        "t", f"Compute {expression}.", str(value), {"expression": expression, "value": value}
    )


P = _problem("12+7*3", 33)
NEG = _problem("5-12", -7)


@pytest.mark.parametrize(
    "text",
    ["33", " 33\n", "<answer>33</answer>", "so <answer> 33 </answer>", "\\boxed{33}",
     "<answer>+33</answer>", "<answer>33.0</answer>", "<answer>33.</answer>"],
)  # fmt: skip
def test_correct(text):
    assert arithmetic.verify(text, P)


@pytest.mark.parametrize(
    "text",
    ["34", "-33", "3 3", "33 apples", "<answer>33</answer><answer>34</answer>", "<answer>33",
     "12+7*3", "3.3e1", "３３", "٣٣", "", "<answer></answer>", "The answer is 33", "033x",
     "33/1/0", "nan", "inf"],
)  # fmt: skip
def test_wrong_or_malformed(text):
    assert not arithmetic.verify(text, P)


def test_negative_answers():
    assert arithmetic.verify("-7", NEG)
    assert arithmetic.verify("<answer>-7</answer>", NEG)
    assert not arithmetic.verify("7", NEG)


def test_thousands_separator():
    p = _problem("999+235", 1234)
    assert arithmetic.verify("<answer>1,234</answer>", p)
    assert not arithmetic.verify("<answer>12,34</answer>", p)


@pytest.mark.parametrize(("digits", "num_operands"), [(1, 2), (2, 4), (3, 3), (6, 8)])
def test_generator_exact_and_reproducible(digits, num_operands):
    a = arithmetic.generate(11, 60, digits=digits, num_operands=num_operands)
    assert a == arithmetic.generate(11, 60, digits=digits, num_operands=num_operands)
    for p in a:
        expr = p.metadata["expression"]
        assert arithmetic.verify(p.answer, p)
        assert arithmetic.compact_prompt(p) == expr + "="
        # Independent check with Python integer arithmetic on the generated (trusted) text.
        terms = expr.replace("-", "+-").split("+")
        total = 0
        for term in terms:
            sign = -1 if term.startswith("-") else 1
            factors = term.lstrip("-").replace("/", "*/").split("*")
            value = int(factors[0])
            for f in factors[1:]:
                if f.startswith("/"):
                    assert value % int(f[1:]) == 0, expr  # division is exact
                    value //= int(f[1:])
                else:
                    value *= int(f)
            total += sign * value
        assert p.metadata["value"] == total, expr
        operands = [x for x in expr.replace("-", " ").replace("+", " ").replace("*", " ")
                    .replace("/", " ").split()]  # fmt: skip
        assert len(operands) == num_operands
        assert all(len(x) <= 2 * digits for x in operands)


def test_ops_knob():
    for p in arithmetic.generate(0, 50, ops="*", num_operands=3):
        assert set(p.metadata["expression"]) <= set("0123456789*")
    divs = arithmetic.generate(0, 50, ops="/")
    assert all("/" in p.metadata["expression"] for p in divs)
    with pytest.raises(ValueError, match="ops"):
        arithmetic.generate(0, 1, ops="^")
    with pytest.raises(ValueError, match="digits"):
        arithmetic.generate(0, 1, digits=0)


def test_chat_prompt():
    (msg,) = arithmetic.chat_messages(P)
    assert "12+7*3" in msg["content"] and "<answer>" in msg["content"]


@pytest.mark.parametrize(
    "expression,value,flawed",
    [("57+68", 125, "15"), ("46+27", 73, "63"), ("63+15", 78, "78"), ("99+1", 100, "90"),
     ("5+5+5", 15, "5"), ("12-7", 5, "5"), ("3*4", 12, "12")],
)  # fmt: skip
def test_forgotten_carries(expression, value, flawed):
    # Column sums mod 10 for pure additions; any other expression keeps its answer.
    assert arithmetic.forgotten_carries(_problem(expression, value)) == flawed
    assert arithmetic.TASK.mistake is arithmetic.forgotten_carries
