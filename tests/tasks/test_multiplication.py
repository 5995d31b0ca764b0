"""Multiplication with a scratchpad: format, verifier, generator, splits and registration."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ais_jax.core.errors import UsageError
from ais_jax.tasks import TASKS, CharTokenizer, base, check_task_settings, multiplication

M = multiplication


def _problem(a: int, b: int) -> base.Problem:
    return base.Problem("t", f"Multiply {a} by {b}.", M.scratchpad(a, b),
                        {"a": a, "b": b, "value": a * b})  # fmt: skip


P = _problem(347, 286)
# Worked by hand: 347*6 = 2082, 347*80 = 27760, 347*200 = 69400.
P_ANSWER = "347*6=2082;347*80=27760;347*200=69400;2082+27760=29842;29842+69400=99242;#99242"
# A zero digit of b is skipped: 58*7 = 406, 58*4000 = 232000.
Q = _problem(58, 4007)
Q_ANSWER = "58*7=406;58*4000=232000;406+232000=232406;#232406"


def _steps_consistent(a: int, b: int, text: str) -> bool:
    """Independent check of a scratchpad's arithmetic with plain Python integers."""
    *steps, final = text.split(";")
    products = [s for s in steps if "*" in s]
    sums = [s for s in steps if "+" in s]
    assert steps == products + sums, text  # all products first, then the sums
    multipliers, partials = [], []
    for s in products:
        lhs, rhs = s.split("=")
        x, m = lhs.split("*")
        assert int(x) == a and int(rhs) == a * int(m), s
        assert re.fullmatch(r"[1-9]0*", m), s  # one digit of b, shifted by zeros
        multipliers.append(int(m))
        partials.append(int(rhs))
    assert sum(multipliers) == b and multipliers == sorted(multipliers)
    total = partials[0]
    for s, p in zip(sums, partials[1:], strict=True):
        lhs, rhs = s.split("=")
        x, y = map(int, lhs.split("+"))
        assert (x, y, int(rhs)) == (total, p, total + p), s
        total += p
    return final == f"#{total}" and total == a * b


def test_known_scratchpads():
    assert P.answer == P_ANSWER and Q.answer == Q_ANSWER
    assert M.compact_prompt(P) == "347*286="
    assert M.verify(P_ANSWER, P) and M.verify(Q_ANSWER, Q)
    assert M.scratchpad_ok(P_ANSWER, P) and M.scratchpad_ok(Q_ANSWER, Q)
    assert _steps_consistent(347, 286, P_ANSWER) and _steps_consistent(58, 4007, Q_ANSWER)
    assert M.scratchpad(12, 3) == "12*3=36;#36"  # one partial product, no sums


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(1, 8), st.integers(1, 8), st.sampled_from(base.SPLITS))
def test_generated_answers_verify(seed, digits_a, digits_b, split):
    tok = CharTokenizer()
    for p in M.generate(seed, 3, split, digits_a=digits_a, digits_b=digits_b):
        a, b = p.metadata["a"], p.metadata["b"]
        assert (len(str(a)), len(str(b))) == (digits_a, digits_b)
        assert p.metadata["value"] == a * b
        assert M.verify(p.answer, p) and M.verify(f"<answer>{p.answer}</answer>", p)
        assert M.scratchpad_ok(p.answer, p) and _steps_consistent(a, b, p.answer)
        assert base.split_of(M.NAME, f"{min(a, b)}*{max(a, b)}") == split
        text = M.compact_prompt(p) + p.answer
        assert tok.decode(tok.encode(text)) == text
        assert set(p.answer) <= set("0123456789*=;+#")


def test_reproducible():
    a = M.generate(5, 40, digits_a=4, digits_b=4)
    assert a == M.generate(5, 40, digits_a=4, digits_b=4)
    assert a != M.generate(6, 40, digits_a=4, digits_b=4)
    assert all(p.id.startswith("multiplication-") for p in a)


@pytest.mark.parametrize(
    "text",
    ["#99242", "99242", " 99242\n", "<answer>99242</answer>", "<answer> 99,242 </answer>",
     "\\boxed{99242}", "347*286=99242 wrong;#99242", "<answer>1;#99242</answer>",
     P_ANSWER.replace("27760", "27770")],  # a wrong scratchpad is not checked
)  # fmt: skip
def test_correct(text):
    assert M.verify(text, P)
    assert M.extract(text).replace(",", "") == "99242"


@pytest.mark.parametrize(
    "text",
    ["#99243", "#9924", "#099242", "#+99242", "#-99242", "#99242.0", "#99242;", "#99242#",
     "#99 242", "#9,9242", "#99242x", "#", "", "   ", P_ANSWER[:-1], P_ANSWER + "0",
     P_ANSWER.replace("#", ""), P_ANSWER + "#1", "<answer>99242", "<answer></answer>",
     "#٩٩٢٤٢", "#９９２４２", "#" + "9" * 41, "#" + "0" * 60 + "99242", "#99242 * 1",
     "#1e5", "#nan", "#inf", "#0x183AA", "<answer>99242</answer><answer>1</answer>"],
)  # fmt: skip
def test_wrong_or_malformed(text):
    assert not M.verify(text, P)


def test_wrong_final_answers_fail():
    for p in M.generate(1, 50, digits_a=4, digits_b=3):
        head, _, value = p.answer.rpartition("#")
        for wrong in (int(value) + 1, int(value) - 1, int(value) * 10, int(value[::-1]) + 10):
            assert not M.verify(f"{head}#{wrong}", p)
        assert not M.verify(M.forgotten_shift(p), p)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300) | st.text(alphabet="0123456789*=;+#<>/answer ", max_size=300))
def test_garbage_never_raises(text):
    assert M.verify(text, P) is (M.extract(text) is not None and
                                 M.parse_final(M.extract(text)) == 99242)  # fmt: skip
    assert isinstance(M.scratchpad_ok(text, P), bool)
    assert isinstance(M.format_ok(text), bool)


def test_huge_inputs_are_false():
    for text in ("9" * 10**6, "#" + "9" * 10**5, P_ANSWER * 10_000, ";" * 10**6, "*" * 10**5,
                 "1*1=1;" * 10**5 + "#99242"):  # fmt: skip
        assert not M.scratchpad_ok(text, P)
        assert not M.verify(text, P)  # over the extractor's scan limit or malformed


def test_scratchpad_ok_rejects_wrong_steps():
    assert not M.scratchpad_ok(P_ANSWER.replace("27760", "27770"), P)
    assert not M.scratchpad_ok(P_ANSWER.replace("347*80=27760;", ""), P)
    assert not M.scratchpad_ok("#99242", P)
    assert not M.scratchpad_ok(M.forgotten_shift(P), P)


def test_forgotten_shift():
    assert M.TASK.mistake is M.forgotten_shift
    flawed = M.forgotten_shift(P)
    assert flawed == "347*6=2082;347*80=2776;347*200=694;2082+2776=4858;4858+694=5552;#5552"
    assert M.forgotten_shift(_problem(347, 6)) == M.scratchpad(347, 6)  # no shift, no mistake


def test_splits_disjoint():
    # 2x1 digits: 810 ordered pairs, so a seed-based split would collide.
    train, ev = set(), set()
    for seed in range(3):
        train |= {(p.metadata["a"], p.metadata["b"])
                  for p in M.generate(seed, 300, "train", digits_a=2, digits_b=1)}  # fmt: skip
        ev |= {(p.metadata["a"], p.metadata["b"])
               for p in M.generate(seed + 50, 60, "eval", digits_a=2, digits_b=1)}  # fmt: skip
    assert train and ev
    canon = {tuple(sorted(x)) for x in train}
    assert not canon & {tuple(sorted(x)) for x in ev}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"digits_a": 0}, r"digits_a must be in \[1, 8\]"),
     ({"digits_b": 9}, r"digits_b must be in \[1, 8\]"),
     ({"digits_a": 2.0}, "digits_a must be an int"),
     ({"digits_b": True}, "digits_b must be an int"),
     ({"split": "validation"}, "split"), ({"n": -1}, "n must be")],
)  # fmt: skip
def test_bad_arguments(kwargs, match):
    args = {"seed": 0, "n": 1, **kwargs}
    with pytest.raises(ValueError, match=match) as info:
        M.generate(**args)
    assert "\n" not in str(info.value)


def test_registered_and_settings_checked():
    assert TASKS["multiplication"] is M.TASK
    check_task_settings("multiplication", {"digits_a": 4, "digits_b": 4}, mistake_rate=0.1)
    with pytest.raises(UsageError, match="digits_a"):
        check_task_settings("multiplication", {"digits_a": 9}, mistake_rate=0.0)
    with pytest.raises(UsageError, match="valid keys: digits_a, digits_b"):
        check_task_settings("multiplication", {"digits": 4}, mistake_rate=0.0)


def test_chat_prompt_and_format():
    (msg,) = M.chat_messages(P)
    assert msg["role"] == "user" and "347" in msg["content"] and "286" in msg["content"]
    assert "<answer></answer>" in msg["content"]
    assert M.format_ok("so <answer>99242</answer>") and not M.format_ok(P_ANSWER)
