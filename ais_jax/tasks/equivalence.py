"""Math answer equivalence: exact numbers, light LaTeX normalisation, optional math-verify.

`answers_equal(pred, gold)` decides in this order:

1. Both sides are normalised with `normalize_latex` (drops ``\\left``,
   ``\\right``, spacing commands, ``$``, ``\\text{..}`` wrappers, degree
   signs, percent signs, all whitespace, a trailing period, a leading
   ``x =``; ``\\dfrac`` / ``\\tfrac`` become ``\\frac``; ``\\frac12`` becomes
   ``\\frac{1}{2}``).
2. If both parse as exact numbers (`parse_number`: integers, thousands commas
   ``1,234``, decimals, ``3/4``, ``\\frac{3}{4}``, a leading ``+``) they are
   compared as `fractions.Fraction`, so ``0.75 == 3/4 == \\frac{3}{4}``.
   Percent signs are dropped, so ``50\\% == 50`` (GSM8K convention).
3. Otherwise the normalised strings are compared, then bracketed tuples
   element by element (``(1, 0.5) == (1, \\frac{1}{2})``).
4. Only if all of that says "different" and an extra verifier was given
   (`math_verify_equal`, from the optional ``math-verify`` package), it gets
   the last word.

`answers_match(pred, gold)` is the default checker of the math datasets:
`answers_equal` with math-verify as the extra verifier when it is installed,
the built-in rules alone when it is not.  It is thread-safe: off the main
thread math-verify runs without its ``signal.alarm`` time limits.

Nothing here evaluates model text as code.
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
from collections.abc import Callable
from fractions import Fraction

MAX_NUMBER_CHARS = 64  # longer strings are never read as numbers
MAX_EQUIV_CHARS = 1_024  # longer answers are never equal to anything

_LOG = logging.getLogger(__name__)

_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DROP = (
    "\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "\\ ",
    "^{\\circ}", "^\\circ", "\\circ", "°", "\\%", "%", "\\$", "$",
)  # fmt: skip
_FRAC_SHORT = re.compile(r"\\frac([0-9])([0-9])")
_SQRT_SHORT = re.compile(r"\\sqrt([0-9a-zA-Z])")
_ASSIGN = re.compile(r"^[a-zA-Z]\s*=(?!=)")
_INT = re.compile(r"[0-9]+")
_THOUSANDS = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?")
_DECIMAL = re.compile(r"[0-9]*\.[0-9]+|[0-9]+\.[0-9]*")
_SLASH = re.compile(r"([0-9]+(?:\.[0-9]+)?)/([0-9]+(?:\.[0-9]+)?)")
_FRAC = re.compile(r"\\frac\{([+-]?[0-9]+(?:\.[0-9]+)?)\}\{([+-]?[0-9]+(?:\.[0-9]+)?)\}")
_BRACKETS = {"(": ")", "[": "]", "\\{": "\\}", "{": "}"}


def normalize_latex(s: str) -> str:
    """Light LaTeX / plain-text normalisation of a final answer (see the module doc)."""
    s = s.strip().replace("\u2212", "-")  # unicode minus
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", ",")
    for _ in range(3):  # unwrap \text{..} and friends, a few levels deep
        s = _WRAPPERS.sub(r"\1", s)
    for d in _DROP:
        s = s.replace(d, "")
    s = "".join(s.split())
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = _ASSIGN.sub("", s, count=1)
    while s.endswith("."):
        s = s[:-1]
    return s


def _plain_number(s: str) -> Fraction | None:
    """An unsigned integer, thousands-separated number or decimal; else None."""
    if _INT.fullmatch(s) or _DECIMAL.fullmatch(s):
        return Fraction(s)
    if _THOUSANDS.fullmatch(s):
        return Fraction(s.replace(",", ""))
    return None


def _signed_number(s: str) -> Fraction | None:
    sign = -1 if s.startswith("-") else 1
    value = _plain_number(s[1:] if s[:1] in "+-" and s else s)
    return None if value is None else sign * value


def parse_number(s: str) -> Fraction | None:
    """Read an exact number from a normalised answer string, or None.

    Accepts an optional sign, then an integer, ``1,234`` thousands groups, a
    decimal, ``a/b`` or ``\\frac{a}{b}`` (zero denominators give None), with
    optional surrounding ``$`` / ``%`` / trailing ``.``.  Only ASCII digits.
    """
    s = s.strip().replace("$", "").replace("\\%", "").replace("%", "").rstrip(".")
    if not s or len(s) > MAX_NUMBER_CHARS:
        return None
    sign = 1
    if s[0] in "+-":
        sign, s = (-1 if s[0] == "-" else 1), s[1:]
    value = _plain_number(s)
    if value is None:
        m = _SLASH.fullmatch(s) or _FRAC.fullmatch(s)
        if m is None:
            return None
        num, den = _signed_number(m.group(1)), _signed_number(m.group(2))
        if num is None or den is None or den == 0:
            return None
        value = num / den
    return sign * value


def _split_top_level(s: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return parts


def _unbracket(s: str) -> tuple[str, str] | None:
    for open_, close in _BRACKETS.items():
        if s.startswith(open_) and s.endswith(close) and len(s) >= len(open_) + len(close):
            return open_, s[len(open_) : len(s) - len(close)]
    return None


def _normalized_equal(a: str, b: str, allow_tuple: bool) -> bool:
    na, nb = parse_number(a), parse_number(b)
    if na is not None and nb is not None:
        return na == nb
    if a == b:
        return True
    if not allow_tuple:
        return False
    ua, ub = _unbracket(a), _unbracket(b)
    if ua is not None and ub is not None:
        if ua[0] != ub[0]:
            return False
        a, b = ua[1], ub[1]
    pa, pb = _split_top_level(a), _split_top_level(b)
    if len(pa) < 2 or len(pa) != len(pb):
        return False
    return all(_normalized_equal(x, y, allow_tuple=False) for x, y in zip(pa, pb, strict=True))


def answers_equal(
    pred: str | None,
    gold: str,
    *,
    extra: Callable[[str, str], bool] | None = None,
) -> bool:
    """Whether a predicted final answer equals the reference answer.

    Args:
      pred: the extracted answer (None: no answer, never equal).
      gold: the reference answer.
      extra: optional fallback judge ``(pred, gold) -> bool`` consulted only
        when the built-in rules say "different" (e.g. `math_verify_equal`).

    Returns:
      True when equivalent under the rules of the module doc.  Never raises
      for any ``pred`` string (``extra`` is the caller's responsibility).
    """
    if pred is None or len(pred) > MAX_EQUIV_CHARS:
        return False
    if _normalized_equal(normalize_latex(pred), normalize_latex(gold), allow_tuple=True):
        return True
    return bool(extra(pred, gold)) if extra is not None else False


_PLAIN_PI = re.compile(r"(?<![\\A-Za-z])pi(?![A-Za-z])")
_PLAIN_POWER = re.compile(r"\^([+-]?[0-9]+(?:\.[0-9]+)?)")


def _as_latex(s: str) -> str:
    """Plain-text math read as LaTeX: ``pi`` -> ``\\pi``, ``10^-2`` -> ``10^{-2}``, in ``$..$``."""
    s = _PLAIN_POWER.sub(r"^{\1}", _PLAIN_PI.sub(r"\\pi ", s.strip()))
    return f"${s}$"


def math_verify_equal() -> Callable[[str, str], bool]:
    """A thread-safe ``(pred, gold) -> bool`` judge backed by the optional ``math-verify`` package.

    Both sides are read as LaTeX (plain ``pi`` and ``a^-2`` are rewritten
    first) and compared with ``math_verify.verify(parse(gold), parse(pred))``.
    On the main thread math-verify's own default time limits apply (they use
    ``signal.alarm``); on any other thread they are switched off
    (``parsing_timeout=None``, ``timeout_seconds=None``), since signals only
    work on the main thread.  The length cap `MAX_EQUIV_CHARS`, applied by
    `answers_equal`, bounds the work there.  Text math-verify cannot parse
    is "not equal" (math-verify logs it at debug level); any other error is
    logged as a warning with its traceback and counts as "not equal", so one
    malformed completion cannot stop a training run.

    Returns:
      The judge.

    Raises:
      ImportError: math-verify is not installed.
    """
    try:
        mv = importlib.import_module("math_verify")
    except ImportError as e:
        raise ImportError(
            "math-verify is not installed; `pip install math-verify[antlr4_13_2]` to use it, "
            "or use the built-in equivalence (equivalence='builtin')."
        ) from e

    def equal(pred: str, gold: str) -> bool:
        # math-verify's defaults (signal.alarm time limits) on the main thread, none elsewhere
        main = threading.current_thread() is threading.main_thread()
        parse_kw = {} if main else {"parsing_timeout": None}
        verify_kw = {} if main else {"timeout_seconds": None}
        try:
            gold_parsed = mv.parse(_as_latex(gold), **parse_kw)
            pred_parsed = mv.parse(_as_latex(pred), **parse_kw)
            if not gold_parsed or not pred_parsed:
                return False
            return bool(mv.verify(gold_parsed, pred_parsed, **verify_kw))
        except Exception:
            _LOG.warning(
                "math-verify failed on pred=%.80r gold=%.80r; counted as not equal",
                pred, gold, exc_info=True,
            )  # fmt: skip
            return False

    return equal


def _default_judge() -> Callable[[str, str], bool] | None:
    """`math_verify_equal` when math-verify is installed, else None (built-in rules only)."""
    try:
        return math_verify_equal()
    except ImportError:
        return None


def answers_match(pred: str | None, gold: str) -> bool:
    """Whether ``pred`` equals the reference ``gold``: the checker for math datasets.

    The built-in rules of `answers_equal` first, then, only if they say
    "different" and ``math-verify`` is installed, math-verify
    (`math_verify_equal`).  Safe to call from any thread.

    Args:
      pred: the extracted answer (None: no answer, never equal).
      gold: the reference answer.

    Returns:
      True when the answers are equivalent.
    """
    return answers_equal(pred, gold, extra=_default_judge())


def resolve_equivalence(equivalence: str) -> Callable[[str, str], bool] | None:
    """The ``extra`` judge for an equivalence setting.

    Args:
      equivalence: ``"builtin"`` (own rules only), ``"math_verify"`` (own rules,
        then math-verify; ImportError if missing) or ``"auto"`` (math-verify
        when installed, else own rules only).
    """
    if equivalence == "builtin":
        return None
    if equivalence == "math_verify":
        return math_verify_equal()
    if equivalence == "auto":
        return _default_judge()
    raise ValueError(
        f"equivalence must be 'auto', 'builtin' or 'math_verify', got {equivalence!r}."
    )
