"""Optional integrations: clear errors when missing, fallback path, glue against stand-in modules.

reasoning-gym and math-verify are not installed in the project; the stand-in
modules below only mimic the documented call signatures, so these tests
check ais_jax's glue code, not the real packages.
"""

import importlib.util
import sys
import types

import pytest

from ais_jax.tasks import base, math_qa, reasoning_gym_task
from ais_jax.tasks.equivalence import answers_equal, math_verify_equal, resolve_equivalence

HAVE_MV = importlib.util.find_spec("math_verify") is not None
HAVE_RG = importlib.util.find_spec("reasoning_gym") is not None


@pytest.mark.skipif(HAVE_RG, reason="reasoning-gym is installed here")
def test_reasoning_gym_missing_is_a_clear_error():
    with pytest.raises(ImportError, match="pip install reasoning-gym"):
        reasoning_gym_task("leg_counting")


@pytest.mark.skipif(HAVE_MV, reason="math-verify is installed here")
def test_math_verify_missing():
    with pytest.raises(ImportError, match="pip install math-verify"):
        math_verify_equal()
    with pytest.raises(ImportError, match="math-verify is not installed"):
        math_qa.dataset_task("x", [base.Problem("a", "q", "1", {})], equivalence="math_verify")
    assert resolve_equivalence("auto") is None  # falls back to the built-in rules
    task = math_qa.dataset_task("x", [base.Problem("a", "q", "\\frac{1}{2}", {})])
    (p,) = task.generate(0, None, "train") or task.generate(0, None, "eval")
    assert task.verify("\\boxed{0.5}", p)
    assert not task.verify("\\boxed{0.6}", p)


def test_bad_equivalence_name():
    with pytest.raises(ValueError, match="equivalence must be"):
        resolve_equivalence("sympy")


def _fake_math_verify():
    mod = types.ModuleType("math_verify")
    mod.parse = lambda s: s.strip("$").replace(" ", "")
    mod.verify = lambda gold, pred: {gold, pred} == {"\\sqrt{4}", "2"} or gold == pred

    return mod


def test_math_verify_glue(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", _fake_math_verify())
    judge = resolve_equivalence("auto")
    assert judge is not None
    assert not answers_equal("\\sqrt{4}", "2")  # built-in rules alone: different
    assert answers_equal("\\sqrt{4}", "2", extra=judge)  # the extra judge decides
    assert not answers_equal("3", "2", extra=judge)

    def raising(_):
        raise RuntimeError("boom")

    monkeypatch.setattr(sys.modules["math_verify"], "parse", raising)
    assert judge("\\sqrt{4}", "2") is False  # errors inside math-verify: not equal


def _fake_reasoning_gym():
    mod = types.ModuleType("reasoning_gym")

    class FakeDataset(list):
        def score_answer(self, answer, entry):
            if answer == "boom":
                raise ValueError("scorer failed")
            if answer == "half":
                return 0.5
            return 1.0 if answer == entry["answer"] else 0.0

    def create_dataset(name, size, seed, **config):
        assert name == "adder"
        hi = config.get("hi", 50)
        import random

        rng = random.Random(seed)
        items = []
        for _ in range(size):
            a, b = rng.randint(0, hi), rng.randint(0, hi)
            items.append({"question": f"{a}+{b}?", "answer": str(a + b), "metadata": {}})
        return FakeDataset(items)

    mod.create_dataset = create_dataset
    return mod


def test_reasoning_gym_glue(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", _fake_reasoning_gym())
    task = reasoning_gym_task("adder", hi=99)
    assert task.name == "rg_adder"
    train = task.generate(0, 30)
    assert train == task.generate(0, 30)
    ev = task.generate(1, 10, "eval")
    assert not {p.prompt for p in train} & {p.prompt for p in ev}
    p = train[0]
    assert task.verify(f"<answer>{p.answer}</answer>", p)
    assert task.verify(p.answer, p)
    assert not task.verify("<answer>-1</answer>", p)
    assert task.score("<answer>half</answer>", p) == 0.5
    assert task.score("<answer>boom</answer>", p) == 0.0  # scorer errors count as 0
    assert task.format_ok("<answer>x</answer>") and not task.format_ok("x")
    assert "<answer>" in task.chat_messages(p)[0]["content"]
