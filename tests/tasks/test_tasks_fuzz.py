"""Fuzzing: random and adversarial completions never raise, give defined rewards, stay fast.

Every task verifier (through `reward`, which also runs the format check) is
fed >= 10,000 seeded random strings built from adversarial fragments and
mutated correct answers, a fixed list of hostile inputs (10^6 characters,
100k nested parentheses, 10^5-digit literals, ``9**9**9**9``, unicode
digits, NaN / inf, division by zero, ...), and hypothesis-generated text.
The worst per-call time is asserted below `BOUND_S`; a call over the bound
is re-timed a few times and the fastest run kept, so that a scheduler hiccup
on a busy machine is not mistaken for a slow input.
"""

import random
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ais_jax.tasks import TASKS, base, math_qa
from ais_jax.tasks.rewards import RewardConfig, reward

BOUND_S = 0.010
FORMAT_W = 0.1
CONFIG = RewardConfig(format_weight=FORMAT_W)
ALLOWED = {0.0, FORMAT_W, 1.0, 1.0 + FORMAT_W}

MATH_TASK = math_qa.dataset_task(
    "fuzz_math",
    [
        base.Problem("m1", "q", "\\frac{3}{4}", {}),
        base.Problem("m2", "q2", "(1, 2)", {}),
    ],
    equivalence="builtin",
)


def _cases():
    cases = []
    for task in TASKS.values():
        for p in task.generate(0, 2):
            cases.append((task, p))
    cases.append((TASKS["sudoku"], TASKS["sudoku"].generate(0, 1, size=9)[0]))
    cases.append((TASKS["countdown"], TASKS["countdown"].generate(0, 1, use_all=False)[0]))
    cases.extend((MATH_TASK, p) for p in MATH_TASK.generate(0, None, "train"))
    cases.extend((MATH_TASK, p) for p in MATH_TASK.generate(0, None, "eval"))
    return cases


CASES = _cases()

FRAGMENTS = [
    "9", "0", "1", "7", "42", "999999999999999", "**", "^", "(", ")", "[", "]", "{", "}",
    "<answer>", "</answer>", "<answer", "answer>", "\\boxed{", "\\boxed ", "\\fbox{", "####",
    "The answer is ", "answer is", "/", "+", "-", "*", "×", "÷", "=", ".", ",", "%", "$",
    "３", "٣", "١٢", "²", "½", "nan", "NaN", "inf", "-inf", "1e309", "0x1F", "1_000",
    "\\frac{", "}{", "\\dfrac", "\\left(", "\\right)", "\\text{", "^\\circ", "\\sqrt",
    "\n", " ", "\t", "x", "\x00", "\ud800", "🙂", "|", "+---+", "..", "1.5", "-0", "00",
]  # fmt: skip

ADVERSARIAL = [
    "9**9**9**9",
    "<answer>9**9**9**9</answer>",
    "\\boxed{9**9**9**9}",
    "1" * 10**6,
    " " * 10**6,
    "(" * 100_000 + "1" + ")" * 100_000,
    "<answer>" + "(" * 100_000 + "1" + ")" * 100_000 + "</answer>",
    "<answer>" + "(" * 1_000 + "1" + ")" * 1_000 + "</answer>",
    "<answer>" + "(" * 40 + "1" + ")" * 40 + "</answer>",
    "(" * 100_000,
    ")" * 100_000,
    "9" * 100_000,
    "<answer>" + "9" * 100_000 + "</answer>",
    "\\boxed{" + "9" * 100_000 + "}",
    "#### " + "9" * 100_000,
    "The answer is " + "9" * 100_000,
    "\\boxed{" * 50_000,
    "\\boxed{" + "{" * 100_000,
    ("\\boxed{" + "{" * 4_100) * 8,  # several long unbalanced boxes: the slowest box scan
    ("\\boxed{" + "{" * 1_100 + "}") * 8,
    "\\boxed" + " " * 100_000 + "{1}",
    "\\boxed" + " " * 100_000,
    ("\\boxed{" + "{" * 100) * 300,
    "<answer>" + "|" * 4_000 + "</answer>",  # separators only: scanned by the sudoku parser
    "<answer>" + "1|" * 2_000 + "</answer>",
    "<answer>" * 100_000,
    "</answer>" * 100_000,
    "<answer></answer>" * 50_000,
    "answer is" + " " * 100_000,
    "The answer is " * 50_000,
    "1," * 300_000,
    "1" + "+1" * 500_000,
    "1" + "*9" * 100_000,
    "\\boxed{" + "1/" * 40_000 + "1}",
    "-" * 10**6,
    "٣" * 100_000,
    "３" * 100_000,
    "<answer>３</answer>",
    "<answer>٣</answer>",
    "\\boxed{３/４}",
    "1/0",
    "<answer>1/0</answer>",
    "<answer>(1+2)/(3-3)</answer>",
    "\\boxed{\\frac{1}{0}}",
    "\\boxed{1/0}",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "<answer>nan</answer>",
    "\\boxed{inf}",
    "\\boxed{1e309}",
    "1e309",
    "\\boxed{" + "9" * 4_000 + "/" + "7" * 4_000 + "}",
    "<answer>" + "1" * 12 + "*" + "9" * 12 + "</answer>",
    "\x00" * 1_000,
    "\ud800",
    "\ud800" * 1000 + "<answer>1</answer>",
    "a" * 10**6 + "\\boxed{5}",
    "\\boxed{5}" + "a" * 10**6,
    "",
    " ",
    "\n" * 10**5,
]


def _mutate(rng: random.Random, s: str) -> str:
    chars = list(s)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(3)
        pos = rng.randint(0, len(chars))
        if op == 0:
            chars.insert(pos, rng.choice(FRAGMENTS))
        elif chars:
            pos = min(pos, len(chars) - 1)
            if op == 1:
                del chars[pos]
            else:
                chars[pos] = rng.choice("0123456789+-*/() ")
    return "".join(chars)


def random_corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    answers = [p.answer for _, p in CASES]
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            s = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 40)))
        elif kind == 1:
            s = _mutate(rng, rng.choice(answers))
            s = rng.choice(["{}", "<answer>{}</answer>", "\\boxed{{{}}}", "#### {}"]).format(s)
        elif kind == 2:
            s = "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 60)))
        else:
            s = rng.choice(answers)
            s = (
                rng.choice(FRAGMENTS) * rng.randint(0, 3)
                + s
                + rng.choice(FRAGMENTS) * rng.randint(0, 3)
            )
        out.append(s)
    return out


def _timed_reward(task, text, problem):
    t0 = time.perf_counter()
    r = reward(task, text, problem, CONFIG)
    return r, time.perf_counter() - t0


def _check_all(texts):
    """Run every case on every text; return the worst per-call seconds (outliers re-timed)."""
    worst = 0.0
    for text in texts:
        for task, problem in CASES:
            r, dt = _timed_reward(task, text, problem)
            assert r in ALLOWED, (task.name, text[:80], r)
            if dt > BOUND_S:
                dt = min(_timed_reward(task, text, problem)[1] for _ in range(5))
            worst = max(worst, dt)
    return worst


def test_random_corpus_never_raises_and_is_fast():
    corpus = random_corpus(10_000)
    assert len(corpus) >= 10_000
    worst = _check_all(corpus)
    assert worst < BOUND_S, f"worst call took {worst * 1e3:.2f} ms"


def test_adversarial_inputs_never_raise_and_are_fast():
    worst = _check_all(ADVERSARIAL)
    assert worst < BOUND_S, f"worst call took {worst * 1e3:.2f} ms"


def test_correct_answers_still_score_in_the_corpus():
    # The fuzz harness is not vacuous: reference answers (bare or tagged) get full reward.
    for task, problem in CASES:
        assert reward(task, problem.answer, problem, CONFIG) == 1.0
        tagged = (
            f"\\boxed{{{problem.answer}}}"
            if task.format_ok("\\boxed{1}")
            else f"<answer>{problem.answer}</answer>"
        )
        assert reward(task, tagged, problem, CONFIG) == 1.0 + FORMAT_W


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_hypothesis_text(text):
    for task, problem in CASES:
        assert reward(task, text, problem, CONFIG) in ALLOWED


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join))
def test_hypothesis_fragments(text):
    for task, problem in CASES:
        for wrapped in (text, f"<answer>{text}</answer>", f"\\boxed{{{text}}}"):
            assert reward(task, wrapped, problem, CONFIG) in ALLOWED
