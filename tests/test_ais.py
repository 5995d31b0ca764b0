"""Known-answer and property tests of ais_jax.method.ais (docs/spec.md section 4)."""

import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ais_jax import ais_coefficient
from ais_jax.method.ais import LOG_RATIO_BOUND

W_BAR = np.array([0.8, 1.0, 1.2, 2.0])
ADV = np.array([1.2, 0.4, -0.2, -0.8])


def _golden():
    return ais_coefficient(jnp.log(W_BAR), jnp.zeros(4), ADV, jnp.ones(4))


def test_worked_example():
    r = _golden()
    assert float(r.alpha_mis) == 1.0  # d_bar = mean |log w_bar| = 0.275 >= delta
    np.testing.assert_allclose(float(r.cv), 0.421, atol=5e-4)
    np.testing.assert_allclose(float(r.alpha_ess), 0.922, atol=5e-4)
    np.testing.assert_allclose(float(r.var_amp), 1.290, atol=5e-4)
    np.testing.assert_allclose(float(r.alpha_var), 0.075, atol=5e-4)
    np.testing.assert_allclose(float(r.alpha), 0.847, atol=5e-4)
    np.testing.assert_allclose(np.asarray(r.weights), [0.831, 1.000, 1.169, 1.847], atol=5e-4)
    np.testing.assert_allclose(np.asarray(r.advantages), [0.997, 0.400, -0.234, -1.478],
                               atol=5e-4)
    np.testing.assert_allclose(float(r.ess_ratio), float(r.alpha_ess) ** 2, rtol=1e-6)


def test_term_ablation_switches():
    # Worked example: alpha_ess 0.922, alpha_var 0.075, alpha_mis 1.
    r = _golden()
    no_var = ais_coefficient(jnp.log(W_BAR), jnp.zeros(4), ADV, jnp.ones(4), use_var=False)
    np.testing.assert_allclose(float(no_var.alpha), float(r.alpha_ess), rtol=1e-6)
    no_ess = ais_coefficient(jnp.log(W_BAR), jnp.zeros(4), ADV, jnp.ones(4), use_ess=False)
    np.testing.assert_allclose(float(no_ess.alpha), 1.0 - float(r.alpha_var), rtol=1e-6)
    # alpha_mis only matters below delta: d_bar = 0.005 gives alpha_mis = 0.25.
    lt = jnp.log(W_BAR) * 0.005 / float(r.d_bar)
    small = ais_coefficient(lt, jnp.zeros(4), ADV, jnp.ones(4))
    no_mis = ais_coefficient(lt, jnp.zeros(4), ADV, jnp.ones(4), use_mis=False)
    np.testing.assert_allclose(float(small.alpha_mis), 0.25, rtol=1e-4)
    np.testing.assert_allclose(float(no_mis.alpha), float(small.alpha) / 0.25, rtol=1e-4)
    assert float(no_mis.alpha_mis) == float(small.alpha_mis)  # still reported as measured
    both = ais_coefficient(jnp.log(W_BAR), jnp.zeros(4), ADV, jnp.ones(4), use_ess=False,
                           use_mis=False, use_var=False)
    assert float(both.alpha) == 1.0  # nothing left: truncated IS


def _numpy_reference(lt, lr, adv, mask, C=5.0, delta=0.02, gamma=1.2, beta_var=1.0, eps=1e-6):
    v = mask.astype(bool)
    d = (lt - lr)[v]
    w = np.minimum(np.exp(d), C)
    a = adv[v]
    cv = np.std(w, ddof=1) / np.mean(w) if len(w) > 1 else 0.0
    alpha_ess = (1 + cv**2) ** -0.5
    alpha_mis = min(1.0, np.mean(np.abs(d)) / delta)
    sa = np.std(a, ddof=1) if len(a) > 1 else 0.0
    saw = np.std(a * w, ddof=1) if len(a) > 1 else 0.0
    D = saw / (sa + eps)
    alpha_var = max(0.0, (D - gamma) / gamma)
    return np.clip(alpha_ess - beta_var * alpha_var, 0, 1) * alpha_mis


@pytest.mark.parametrize("d_bar,expected", [(0.002, 0.10), (0.010, 0.50), (0.020, 1.0),
                                            (0.05, 1.0)])
def test_alpha_mis_table(d_bar, expected):
    # Equal |diff| on every token: w_bar nearly constant, so only alpha_mis matters here.
    lt = jnp.full((8,), d_bar)
    r = ais_coefficient(lt, jnp.zeros(8), jnp.ones(8), jnp.ones(8))
    np.testing.assert_allclose(float(r.d_bar), d_bar, rtol=1e-5)
    np.testing.assert_allclose(float(r.alpha_mis), expected, rtol=1e-5)


@pytest.mark.parametrize("D,expected", [(1.0, 0.0), (1.2, 0.0), (1.5, 0.25), (2.4, 1.0)])
def test_alpha_var_table(D, expected):
    # A = [1, -1], w_bar = [D, D] -> std(A w) / std(A) = D (up to eps).
    lt = jnp.full((2,), math.log(D))
    r = ais_coefficient(lt, jnp.zeros(2), jnp.array([1.0, -1.0]), jnp.ones(2))
    np.testing.assert_allclose(float(r.var_amp), D, rtol=1e-5)
    np.testing.assert_allclose(float(r.alpha_var), expected, atol=1e-5)


def test_matches_numpy_reference_random():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = 24
        lt, lr = rng.normal(-2, 1, n), rng.normal(-2, 1, n) * 0.3 - 2
        adv = rng.normal(size=n)
        mask = rng.random(n) < 0.7
        mask[:2] = True
        r = ais_coefficient(lt, lr, adv, mask)
        np.testing.assert_allclose(float(r.alpha), _numpy_reference(lt, lr, adv, mask),
                                   rtol=1e-4, atol=1e-6)


def test_modes():
    lt, lr = jnp.log(W_BAR), jnp.zeros(4)
    assert float(ais_coefficient(lt, lr, ADV, jnp.ones(4), mode="tis").alpha) == 1.0
    r = ais_coefficient(lt, lr, ADV, jnp.ones(4), mode="none")
    assert float(r.alpha) == 0.0
    np.testing.assert_array_equal(np.asarray(r.weights), 1.0)
    np.testing.assert_allclose(np.asarray(ais_coefficient(lt, lr, ADV, jnp.ones(4),
                                                          mode="tis").weights), W_BAR, rtol=1e-6)


def test_truncation_cap():
    r = ais_coefficient(jnp.array([10.0, 0.0]), jnp.zeros(2), jnp.ones(2), jnp.ones(2), C=2.0,
                        mode="tis")
    np.testing.assert_allclose(np.asarray(r.w_bar), [2.0, 1.0], rtol=1e-6)


def test_no_valid_token():
    for mode in ("ais", "tis", "none"):
        r = ais_coefficient(jnp.full(5, jnp.nan), jnp.full(5, jnp.inf), jnp.full(5, jnp.nan),
                            jnp.zeros(5), mode=mode)
        assert float(r.alpha) == 0.0
        np.testing.assert_array_equal(np.asarray(r.weights), 1.0)
        np.testing.assert_array_equal(np.asarray(r.advantages), 0.0)
        for v in r.stats().values():
            assert np.isfinite(float(v))


def test_single_valid_token_and_equal_advantages():
    r = ais_coefficient(jnp.array([0.5, 9.0]), jnp.zeros(2), jnp.array([1.0, 7.0]),
                        jnp.array([1, 0]))
    assert float(r.cv) == 0.0 and float(r.alpha_ess) == 1.0
    r = ais_coefficient(jnp.log(W_BAR), jnp.zeros(4), jnp.ones(4), jnp.ones(4))
    assert np.isfinite(float(r.var_amp)) and np.isfinite(float(r.alpha))


def test_bad_inputs():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=r"logp_train\(2, 3\).*mask\(2, 4\)"):
        ais_coefficient(x, x, x, jnp.zeros((2, 4)))
    with pytest.raises(ValueError, match="float"):
        ais_coefficient(jnp.zeros((2, 3), jnp.int32), x, x, x)
    for kw, pat in [({"C": 1.0}, "C=1.0"), ({"delta": 0.0}, "delta=0.0"),
                    ({"gamma": -1.0}, "gamma=-1.0"), ({"mode": "full"}, "mode 'full'"),
                    ({"C": float("nan")}, "C=nan")]:
        with pytest.raises(ValueError, match=pat):
            ais_coefficient(x, x, x, x, **kw)


def test_bf16_inputs_give_float32_stats():
    r = ais_coefficient(jnp.log(W_BAR).astype(jnp.bfloat16), jnp.zeros(4, jnp.bfloat16),
                        jnp.asarray(ADV, jnp.bfloat16), jnp.ones(4, jnp.bfloat16))
    for v in r.stats().values():
        assert v.dtype == jnp.float32
    np.testing.assert_allclose(float(r.alpha), 0.847, atol=5e-3)


def test_no_gradient_through_statistics():
    def f(lt):
        return jnp.sum(ais_coefficient(lt, jnp.zeros(4), ADV, jnp.ones(4)).advantages)

    g = jax.grad(f)(jnp.log(jnp.asarray(W_BAR)))
    np.testing.assert_array_equal(np.asarray(g), 0.0)


def test_any_shape():
    lt = jnp.log(jnp.asarray(W_BAR)).reshape(2, 1, 2)
    r = ais_coefficient(lt, jnp.zeros_like(lt), jnp.asarray(ADV).reshape(2, 1, 2),
                        jnp.ones_like(lt))
    assert r.weights.shape == (2, 1, 2)
    np.testing.assert_allclose(float(r.alpha), 0.847, atol=5e-4)
    s = ais_coefficient(jnp.float32(0.1), jnp.float32(0.0), jnp.float32(1.0), jnp.float32(1.0))
    assert s.weights.shape == ()


# ----------------------------------------------------------------- properties

_floats = st.floats(-1e4, 1e4, allow_nan=False, width=32)
_garbage = st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0])
_adv_floats = st.floats(-10, 10, width=32)


@st.composite
def _batch(draw, garbage=True, elements=_floats, adv_elements=_adv_floats):
    # A few fixed shapes (1-3 dims) so the jit cache is reused across examples.
    shape = draw(st.sampled_from(_SHAPES))
    lt = draw(hnp.arrays(np.float32, shape, elements=elements))
    lr = draw(hnp.arrays(np.float32, shape, elements=elements))
    adv = draw(hnp.arrays(np.float32, shape, elements=adv_elements))
    mask = draw(hnp.arrays(np.bool_, shape))
    if garbage:
        g = draw(hnp.arrays(np.float32, shape, elements=_garbage))
        lt, lr, adv = (np.where(mask, x, g) for x in (lt, lr, adv))
    return lt, lr, adv, mask


_SHAPES = [(1,), (6,), (3, 5), (2, 3, 4)]
_jitted = jax.jit(ais_coefficient, static_argnames=("mode",))


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
@settings(max_examples=300, deadline=None)
@given(_batch(), st.sampled_from(["ais", "tis", "none"]))
def test_property_finite_alpha_in_unit_interval(b, mode):
    r = _jitted(*b, mode=mode)
    assert 0.0 <= float(r.alpha) <= 1.0
    for leaf in jax.tree.leaves(r):
        assert np.all(np.isfinite(np.asarray(leaf)))
    if b[3].any():
        assert float(r.alpha) == {"ais": float(r.alpha), "tis": 1.0, "none": 0.0}[mode]


@settings(max_examples=200, deadline=None)
@given(_batch())
def test_property_agreeing_logps_give_unit_weights(b):
    lt, _, adv, mask = b
    r = _jitted(lt, lt, adv, mask)
    np.testing.assert_array_equal(np.asarray(r.weights), 1.0)
    assert float(r.d_bar) == 0.0 and float(r.alpha) == 0.0


@pytest.mark.slow  # ~5 s in the full suite on 2 busy cores
@settings(max_examples=200, deadline=None)
@given(_batch(garbage=False), st.sampled_from([1, 4]))
def test_property_padding_invariance(b, pad):
    lt, lr, adv, mask = (x.reshape(-1) for x in b)
    r = _jitted(lt, lr, adv, mask)
    padded = [np.concatenate([x, np.full(pad, v, x.dtype)])
              for x, v in zip((lt, lr, adv), (np.nan, np.inf, -np.inf), strict=True)]
    rp = _jitted(*padded, np.concatenate([mask, np.zeros(pad, bool)]))
    for k, v in r.stats().items():
        np.testing.assert_allclose(float(rp.stats()[k]), float(v), rtol=1e-5, atol=1e-6,
                                   err_msg=k)
    np.testing.assert_allclose(np.asarray(rp.weights)[: lt.size], np.asarray(r.weights),
                               rtol=1e-6)


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
@settings(max_examples=200, deadline=None)
@given(_batch(), st.sampled_from(["ais", "tis", "none"]))
def test_property_jit_equals_eager(b, mode):
    r1 = ais_coefficient(*b, mode=mode)
    r2 = _jitted(*b, mode=mode)
    for a, c in zip(jax.tree.leaves(r1), jax.tree.leaves(r2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-5, atol=1e-6)


# ------------------------------------------------- scale-free statistics (float64 reference)

_F32_MAX = float(np.finfo(np.float32).max)


def _logspace_reference(lt, lr, adv, mask, C=5.0, delta=0.02, gamma=1.2, beta_var=1.0, eps=1e-6):
    """Float64 statistics computed in log space (shifted by the max log weight)."""
    v = np.asarray(mask).astype(bool)
    d = (np.asarray(lt, np.float64) - np.asarray(lr, np.float64))[v]
    log_w = np.minimum(d, math.log(C))
    m = log_w.max()
    ws = np.exp(log_w - m)  # in (0, 1]: no underflow
    a = np.asarray(adv, np.float64)[v]
    s = np.abs(a).max() or 1.0  # D is scale-free in A except eps, which keeps A's units
    n = len(ws)
    cv = np.std(ws, ddof=1) / np.mean(ws) if n > 1 else 0.0
    sa = np.std(a / s, ddof=1) if n > 1 else 0.0
    saw = np.std(a / s * ws, ddof=1) if n > 1 else 0.0
    D = math.exp(m) * saw / (sa + eps / s)
    out = {"cv": cv, "alpha_ess": (1 + cv**2) ** -0.5, "var_amp": D,
           "d_bar": np.mean(np.abs(np.clip(d, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))),
           "alpha_var": max(0.0, (D - gamma) / gamma)}
    out["alpha_mis"] = min(1.0, out["d_bar"] / delta)
    out["alpha"] = np.clip(out["alpha_ess"] - beta_var * out["alpha_var"], 0, 1) * out["alpha_mis"]
    return out


def _assert_matches_reference(lt, lr, adv, mask, rtol=1e-4):
    r = ais_coefficient(np.float32(lt), np.float32(lr), np.float32(adv), mask)
    ref = _logspace_reference(np.float32(lt), np.float32(lr), np.float32(adv), mask)
    for k, v in ref.items():
        np.testing.assert_allclose(float(getattr(r, k)), v, rtol=rtol, atol=1e-7, err_msg=k)
    return r


def test_tiny_ratios_do_not_underflow_the_cv():
    # The batch: log gaps -58 and -53 gave CV = 0, alpha_ess = 1.
    r = _assert_matches_reference(np.array([-58.0, -53.0]), np.zeros(2), np.array([1.0, -1.0]),
                                  np.ones(2))
    np.testing.assert_allclose(float(r.alpha_ess), 0.5825, atol=1e-4)
    rng = np.random.default_rng(5)
    for _ in range(20):  # every ratio below 1e-20
        n = 32
        lt = rng.uniform(-60.0, -46.1, n)
        mask = rng.random(n) < 0.8
        mask[:2] = True
        _assert_matches_reference(lt, np.zeros(n), rng.normal(size=n), mask)


def test_matches_logspace_reference_with_log_gaps_up_to_60():
    rng = np.random.default_rng(6)
    for i in range(30):
        n = 40
        width = [0.05, 2.0, 60.0][i % 3]
        lt, lr = rng.uniform(-width, width, n) - 3.0, np.full(n, -3.0)
        mask = rng.random(n) < 0.8
        mask[:2] = True
        _assert_matches_reference(lt, lr, rng.normal(size=n), mask)


def test_huge_advantages_give_finite_statistics():
    rng = np.random.default_rng(7)
    lt = rng.normal(0, 0.3, 16)
    for scale in (1e30, 1e38, _F32_MAX):
        adv = np.clip(rng.uniform(-1, 1, 16) * scale, -_F32_MAX, _F32_MAX)
        r = _assert_matches_reference(lt, np.zeros(16), adv, np.ones(16))
        for k, v in r.stats().items():
            assert np.isfinite(float(v)), k
        assert not np.isnan(np.asarray(r.advantages)).any()


def test_tis_weights_are_exactly_w_bar_and_zero_trainer_probability():
    lt = jnp.array([math.log(1e-10), -jnp.inf, 0.3, 0.0])
    r = ais_coefficient(lt, jnp.zeros(4), jnp.ones(4), jnp.ones(4), mode="tis")
    np.testing.assert_allclose(np.asarray(r.weights), [1e-10, 0.0, math.exp(0.3), 1.0],
                               rtol=1e-6)
    for mode in ("ais", "tis", "none"):
        r = ais_coefficient(lt, jnp.zeros(4), jnp.ones(4), jnp.ones(4), mode=mode)
        for leaf in jax.tree.leaves(r):
            assert np.all(np.isfinite(np.asarray(leaf))), mode
        assert float(r.w_bar[1]) == 0.0
        # The -inf gap enters d_bar as LOG_RATIO_BOUND.
        np.testing.assert_allclose(float(r.d_bar), (23.02585 + LOG_RATIO_BOUND + 0.3) / 4,
                                   rtol=1e-5)


@settings(max_examples=200, deadline=None)
@given(_batch(elements=st.floats(width=32, allow_nan=False, allow_infinity=False),
              adv_elements=st.floats(width=32, allow_nan=False, allow_infinity=False)),
       st.sampled_from(["ais", "tis", "none"]))
def test_property_finite_statistics_for_any_finite_inputs(b, mode):
    r = _jitted(*b, mode=mode)
    for k, v in r.stats().items():
        assert np.isfinite(float(v)), k
    assert np.all(np.isfinite(np.asarray(r.weights)))
    assert not np.any(np.isnan(np.asarray(r.advantages)))  # |A| w may exceed float32 max


# ------------------------------------------- issue 55 rows 12 and 13: NaN guard, input checks


def test_nan_trainer_logprob_is_guarded_like_minus_inf():
    lt = jnp.log(jnp.asarray(W_BAR)).at[1].set(jnp.nan)  # a valid position
    r = ais_coefficient(lt, jnp.zeros(4), ADV, jnp.ones(4))
    for leaf in jax.tree.leaves(r):
        assert np.all(np.isfinite(np.asarray(leaf)))
    assert float(r.w_bar[1]) == 0.0
    # The NaN gap enters d_bar as LOG_RATIO_BOUND, as a -inf one does.
    np.testing.assert_allclose(float(r.d_bar), (abs(math.log(0.8)) + LOG_RATIO_BOUND
                                                + math.log(1.2) + math.log(2.0)) / 4, rtol=1e-6)
    ref = ais_coefficient(lt.at[1].set(-jnp.inf), jnp.zeros(4), ADV, jnp.ones(4))
    for a, b in zip(jax.tree.leaves(r), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # ~8 s on 2 busy cores
@settings(max_examples=100, deadline=None)
@given(_batch(garbage=False), st.integers(0, 10**6), st.sampled_from(["ais", "tis", "none"]))
def test_property_nan_trainer_logprob_equals_minus_inf(b, where, mode):
    lt, lr, adv, mask = b
    flat = np.flatnonzero(mask)
    if flat.size == 0:
        return
    i = np.unravel_index(flat[where % flat.size], lt.shape)
    nan, ninf = lt.copy(), lt.copy()
    nan[i], ninf[i] = np.nan, -np.inf
    r, ref = _jitted(nan, lr, adv, mask, mode=mode), _jitted(ninf, lr, adv, mask, mode=mode)
    for a, c in zip(jax.tree.leaves(r), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
    assert not np.isnan(float(r.alpha))


def test_nan_rollout_logprob_still_propagates():
    lr = jnp.zeros(4).at[1].set(jnp.nan)  # outside the contract: an upstream error
    r = ais_coefficient(jnp.log(jnp.asarray(W_BAR)), lr, ADV, jnp.ones(4))
    assert np.isnan(float(r.alpha)) and np.isnan(float(r.d_bar))


def test_scalars_are_a_one_token_batch():
    r = ais_coefficient(0.0, 0.0, 0.0, 1.0)
    assert r.weights.shape == () and float(r.num_valid) == 1.0
    assert float(r.weights) == 1.0 and float(r.alpha) == 0.0  # d_bar = 0: alpha_mis = 0
    t = ais_coefficient(-0.5, -0.2, 2.0, 1.0, mode="tis")
    np.testing.assert_allclose(float(t.weights), math.exp(-0.3), rtol=1e-6)
    np.testing.assert_allclose(float(t.advantages), 2.0 * math.exp(-0.3), rtol=1e-6)
    assert float(ais_coefficient(-0.5, -0.2, 2.0, 0.0).num_valid) == 0.0


@pytest.mark.parametrize("bad", [-1.0, 0.5, 2.0, np.nan])
def test_mask_values_other_than_0_and_1_are_refused(bad):
    mask = np.array([1.0, bad, 0.0, 1.0])
    x = jnp.zeros(4)
    with pytest.raises(ValueError, match=r"ais_coefficient: mask must hold only 0 and 1"):
        ais_coefficient(x, x, ADV, mask)
    if bad in (-1.0, 2.0):  # an integer mask too
        with pytest.raises(ValueError, match=r"got 1 other value\(s\), e\.g\. -?[12]"):
            ais_coefficient(x, x, ADV, mask.astype(np.int32))
    # Under jit the mask is traced: its values are taken as given (nonzero is valid).
    r = jax.jit(ais_coefficient)(x, x, ADV, mask)
    assert float(r.num_valid) == 3.0


def test_jit_keeps_the_static_checks():
    f = jax.jit(ais_coefficient)
    np.testing.assert_allclose(float(f(jnp.log(W_BAR), jnp.zeros(4), ADV, jnp.ones(4)).alpha),
                               0.847, atol=5e-4)
    with pytest.raises(ValueError, match="inputs must have one shape"):
        f(jnp.zeros(4), jnp.zeros(4), jnp.zeros(4), jnp.ones(3))
    with pytest.raises(ValueError, match="float"):
        f(jnp.zeros(4, jnp.int32), jnp.zeros(4), jnp.zeros(4), jnp.ones(4))
