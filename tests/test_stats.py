"""experiments/stats.py: paired t-test / t-interval, exact sign-flip test and Holm, on
hand-computed values (docs/spec.md section 7)."""

import math
import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
import stats


def test_paired_t_known_answer_df2():
    # d = [1, 2, 3]: mean 2, sd 1, se 1/sqrt(3), t = 2 sqrt(3) = 3.4641, df 2.
    # For df = 2 the t CDF is closed-form: F(t) = 1/2 + t / (2 sqrt(2 + t^2)).
    r = stats.paired_t([1.0, 2.0, 3.0], alternative="greater")
    t = 2 * math.sqrt(3)
    assert (r.n, r.df) == (3, 2)
    assert r.mean == pytest.approx(2.0) and r.sd == pytest.approx(1.0)
    assert r.t == pytest.approx(t)
    assert r.p == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)), rel=1e-9)  # 0.037090
    assert r.p == pytest.approx(0.037090, abs=1e-6)
    # 95% interval: t_{0.975, 2} = 4.302653 (tables), 2 +- 4.302653 / sqrt(3).
    half = 4.302653 / math.sqrt(3)
    assert r.ci == pytest.approx((2 - half, 2 + half), abs=1e-5)
    assert r.effect == pytest.approx(2.0)
    two = stats.paired_t([1.0, 2.0, 3.0])
    assert two.p == pytest.approx(2 * r.p)
    assert stats.paired_t([1.0, 2.0, 3.0], alternative="less").p == pytest.approx(1 - r.p)


def test_paired_t_known_answer_df4():
    # d = [0.01, 0.03, -0.01, 0.05, 0.02]: mean 0.02, squared deviations sum to 0.002,
    # sd = sqrt(0.002 / 4) = 0.0223607, se = sd / sqrt 5 = 0.01, t = 2; t_{0.975,4} = 2.776445
    # (tables); the one-sided p from the closed-form CDF for df 4:
    # F(t) = 1/2 + (3/4) u (1 - u^2 / 3), u = t / sqrt(4 + t^2).
    r = stats.paired_t([0.01, 0.03, -0.01, 0.05, 0.02], alternative="greater")
    t = 2.0
    u = t / math.sqrt(4 + t * t)
    assert r.t == pytest.approx(t)
    assert r.p == pytest.approx(0.5 - 0.75 * u * (1 - u * u / 3), rel=1e-9)
    se = 0.01
    assert r.ci == pytest.approx((0.02 - 2.776445 * se, 0.02 + 2.776445 * se), abs=1e-7)


def test_paired_t_zero_spread_and_bad_input():
    r = stats.paired_t([0.5, 0.5, 0.5], alternative="greater")
    assert r.t == math.inf and r.p == 0.0 and r.ci == (0.5, 0.5)
    z = stats.paired_t([0.0, 0.0])
    assert z.p == 1.0
    with pytest.raises(ValueError, match="at least 2"):
        stats.paired_t([1.0])
    with pytest.raises(ValueError, match="alternative"):
        stats.paired_t([1.0, 2.0], alternative="bigger")
    with pytest.raises(ValueError, match="finite"):
        stats.paired_t([1.0, float("nan")])


def test_sign_flip_known_answers():
    # [1, 2, 3]: of the 8 sign assignments only +++ reaches the observed sum 6.
    assert stats.sign_flip_p([1.0, 2.0, 3.0], "greater") == 1 / 8
    assert stats.sign_flip_p([1.0, 2.0, 3.0]) == 2 / 8
    assert stats.sign_flip_p([1.0, 2.0, 3.0], "less") == 1.0
    # [1, -1, 2]: sum 2; sums >= 2 among (+-1 +-1 +-2): (1,1,2)=4, (1,-1,2)=2, (-1,1,2)=2,
    # (-1,-1,2)=0 ... -> 3 of 8.
    assert stats.sign_flip_p([1.0, -1.0, 2.0], "greater") == 3 / 8
    # Five seeds all positive: the smallest one-sided p, 1/32.
    assert stats.sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5], "greater") == 1 / 32
    # Ties at the observed value count, though float sums in another order differ by an ulp:
    # [0.1, 0.2, -0.3] sums to ~0; the 8 sums are {+-0.6, +-0.4, +-0.2, 0, 0}, 5 of them >= 0.
    assert stats.sign_flip_p([0.1, 0.2, -0.3], "greater") == 5 / 8


def test_holm_known_family():
    # p = (0.01, 0.04, 0.03), m = 3: sorted 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 -> max(0.06,
    # 0.04) = 0.06.
    out = stats.holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert out["a"] == (pytest.approx(0.03), True)
    assert out["c"] == (pytest.approx(0.06), False)
    assert out["b"] == (pytest.approx(0.06), False)
    assert stats.holm({"x": 0.6, "y": 0.7}) == {"x": (1.0, False), "y": (1.0, False)}
    with pytest.raises(ValueError):
        stats.holm({"x": 1.5})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=8))
def test_properties(d):
    g = stats.paired_t(d, "greater")
    lo, hi = g.ci
    assert lo <= g.mean + 1e-12 and g.mean <= hi + 1e-12
    assert 0.0 <= g.p <= 1.0
    pg, pl = stats.sign_flip_p(d, "greater"), stats.sign_flip_p(d, "less")
    assert 2 ** -len(d) <= pg <= 1 and 2 ** -len(d) <= pl <= 1
    assert pg + pl >= 1.0  # the observed assignment is counted on both sides
    # Negating the differences swaps the one-sided p-values.
    assert stats.sign_flip_p([-x for x in d], "greater") == pytest.approx(pl)
