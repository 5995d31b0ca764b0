"""math-verify as the math checker: held pairs, same verdicts on the main thread and off it."""

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("math_verify")

from ais_jax.tasks import math_qa
from ais_jax.tasks.base import Problem
from ais_jax.tasks.equivalence import answers_equal, answers_match, math_verify_equal

# (prediction, gold, equal)
PAIRS = [
    ("sqrt(2)/2", "\\frac{\\sqrt{2}}{2}", True),
    ("2pi", "2\\pi", True),
    ("(x+1)^2", "x^2+2x+1", True),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("{1, 2}", "{2, 1}", True),
    ("10^-2", "0.01", True),
    ("\\frac{1}{2}", "0.5", True),
    ("3", "4", False),
    ("x+1", "x+2", False),
    ("\\{1,2\\}", "\\{1,3\\}", False),
    ("2pi", "2", False),
    ("\\sqrt{2}", "1.41", False),
    ("(x-1)^2", "x^2+2x+1", False),
    ("not math at all", "7", False),
]


def _verdicts():
    return [answers_match(pred, gold) for pred, gold, _ in PAIRS]


def test_pairs_on_the_main_thread():
    assert threading.current_thread() is threading.main_thread()
    assert _verdicts() == [equal for _, _, equal in PAIRS]


def test_same_verdicts_off_the_main_thread(caplog):
    expected = [equal for _, _, equal in PAIRS]
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("v", _verdicts()))
    with caplog.at_level(logging.WARNING, logger="ais_jax.tasks.equivalence"):
        worker.start()
        worker.join(timeout=60)
        with ThreadPoolExecutor(max_workers=4) as pool:
            pooled = list(pool.map(lambda pg: answers_match(pg[0], pg[1]), PAIRS))
    assert out["v"] == expected
    assert pooled == expected
    assert not [r for r in caplog.records if "math-verify failed" in r.getMessage()]


def test_math_verify_is_what_decides():
    # the built-in rules alone cannot see these; math-verify can
    assert not answers_equal("(x+1)^2", "x^2+2x+1")
    judge = math_verify_equal()
    assert judge("(x+1)^2", "x^2+2x+1")
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(judge, "(x+1)^2", "x^2+2x+1").result()


def test_math_dataset_task_uses_math_verify_by_default():
    problems = [Problem("a", "q", "\\frac{\\sqrt{2}}{2}", {})]
    task = math_qa.dataset_task("m", problems, problems)
    (p,) = task.generate(0, None, "eval")
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(task.verify, "so \\boxed{\\sqrt{2}/2}", p).result()
    assert task.verify("so \\boxed{\\sqrt{2}/2}", p)
    assert not task.verify("so \\boxed{\\sqrt{3}/2}", p)


def test_errors_inside_math_verify_are_logged_not_swallowed(monkeypatch, caplog):
    import math_verify

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(math_verify, "verify", boom)
    with caplog.at_level(logging.WARNING, logger="ais_jax.tasks.equivalence"):
        assert answers_match("(x+1)^2", "x^2+2x+1") is False
    assert any("math-verify failed" in r.getMessage() for r in caplog.records)
