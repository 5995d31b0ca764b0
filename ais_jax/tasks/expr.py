"""A small, bounded, exact arithmetic-expression evaluator for untrusted text (no eval).

Grammar (standard precedence, left-associative)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"

INTEGER is a run of ASCII digits.  There is no unary minus, no exponent and
no decimal point.  ``×`` / ``÷`` are read as ``*`` / ``/``; whitespace is
ignored.  The parser is shunting-yard (iterative, no recursion) and
arithmetic is exact (`fractions.Fraction`).  Bounds that keep every call
cheap on adversarial input: the text length, the digits of one literal, the
parenthesis depth and the bit size of every intermediate value; exceeding any
of them, a syntax error, or a division by zero makes `evaluate` return None.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

MAX_EXPR_CHARS = 256
MAX_LITERAL_DIGITS = 12
MAX_DEPTH = 32
MAX_BITS = 256

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_ALIASES = {"×": "*", "÷": "/"}
_DIGITS = frozenset("0123456789")
_SPACE = frozenset(" \t\n\r")


class Evaluated(NamedTuple):
    """Result of `evaluate`: the exact value and the integer literals in order of appearance."""

    value: Fraction
    literals: tuple[int, ...]


def tokenize(text: str, *, max_chars: int = MAX_EXPR_CHARS) -> list[str | int] | None:
    """Split an expression into int literals and one-character operator tokens, or None."""
    if len(text) > max_chars:
        return None
    tokens: list[str | int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _DIGITS:
            j = i
            while j < n and text[j] in _DIGITS:
                j += 1
            if j - i > MAX_LITERAL_DIGITS:
                return None
            tokens.append(int(text[i:j]))
            i = j
            continue
        c = _ALIASES.get(c, c)
        if c in _PRECEDENCE or c in "()":
            tokens.append(c)
        elif c not in _SPACE:
            return None
        i += 1
    return tokens


def _apply(op: str, a: Fraction, b: Fraction) -> Fraction | None:
    if op == "+":
        r = a + b
    elif op == "-":
        r = a - b
    elif op == "*":
        r = a * b
    else:
        if b == 0:
            return None
        r = a / b
    if r.numerator.bit_length() > MAX_BITS or r.denominator.bit_length() > MAX_BITS:
        return None
    return r


def _to_rpn(tokens: list[str | int]) -> list[str | int] | None:
    out: list[str | int] = []
    ops: list[str] = []
    expect_operand = True
    depth = 0
    for t in tokens:
        if isinstance(t, int):
            if not expect_operand:
                return None
            out.append(t)
            expect_operand = False
        elif t == "(":
            if not expect_operand:
                return None
            depth += 1
            if depth > MAX_DEPTH:
                return None
            ops.append(t)
        elif t == ")":
            if expect_operand:
                return None
            while ops and ops[-1] != "(":
                out.append(ops.pop())
            if not ops:
                return None
            ops.pop()
            depth -= 1
        else:
            if expect_operand:
                return None
            while ops and ops[-1] != "(" and _PRECEDENCE[ops[-1]] >= _PRECEDENCE[t]:
                out.append(ops.pop())
            ops.append(t)
            expect_operand = True
    if expect_operand or depth != 0:
        return None
    out.extend(reversed(ops))
    return out


def evaluate(text: str, *, max_chars: int = MAX_EXPR_CHARS) -> Evaluated | None:
    """Exactly evaluate an untrusted arithmetic expression (grammar in the module doc).

    Args:
      text: the expression, e.g. ``"(3 + 5) * 7 / 2"``.
      max_chars: longer texts are rejected before any parsing.

    Returns:
      `Evaluated(value, literals)`, or None for anything invalid (syntax,
      bounds, division by zero).  Never raises for a ``str`` input.
    """
    tokens = tokenize(text, max_chars=max_chars)
    if not tokens:
        return None
    rpn = _to_rpn(tokens)
    if rpn is None:
        return None
    stack: list[Fraction] = []
    literals: list[int] = []
    for t in rpn:
        if isinstance(t, int):
            literals.append(t)
            stack.append(Fraction(t))
        else:
            b, a = stack.pop(), stack.pop()
            r = _apply(t, a, b)
            if r is None:
                return None
            stack.append(r)
    return Evaluated(stack[0], tuple(literals))
