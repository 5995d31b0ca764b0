"""The k3 KL of the GRPO loss and of the correction diagnostics: float32 accuracy at small gaps.

``exp(d) - d - 1`` in float32 cancels: 0.0 at ``d = 1e-4`` (exact 5e-9) and
4.77e-7 at ``1e-3`` (exact 5.0e-7); `ais_jax.method.corrections.k3` keeps the
relative accuracy and `ais_jax.method.grpo.grpo_loss` uses it.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ais_jax.method import grpo
from ais_jax.method.corrections import k3


@pytest.mark.slow  # ~10 s in the full suite on 2 busy cores
@pytest.mark.parametrize("d", [1e-4, 1e-3, -1e-3, 5e-3])
def test_k3_kl_keeps_relative_accuracy_at_small_gaps(d):
    # exp(d) - d - 1 in float32 gave 0.0 at d = 1e-4 and 4.77e-7 at 1e-3.
    ln = jnp.zeros((2, 3), jnp.float32)
    lref = jnp.full((2, 3), d, jnp.float32)  # d = logp_ref - logp_new
    mask = jnp.ones((2, 3), jnp.float32)
    cfg = grpo.LossConfig(beta_kl=1.0)
    zeros = jnp.zeros((2, 3), jnp.float32)
    loss, m = grpo.grpo_loss(ln, zeros, zeros, mask, lref, cfg)
    d32 = float(np.float32(d))
    exact = 0.5 * d32**2 + d32**3 / 6 + d32**4 / 24
    np.testing.assert_allclose(float(m["kl"]), exact, rtol=1e-3)
    np.testing.assert_allclose(float(loss), exact, rtol=1e-3)  # A = 0: the loss is the KL
    g = jax.grad(lambda x: grpo.grpo_loss(x, zeros, zeros, mask, lref, cfg)[0])(ln)
    assert np.isfinite(np.asarray(g)).all()
    # d KL / d logp_new = 1 - exp(d), over 6 tokens
    np.testing.assert_allclose(np.asarray(g), -math.expm1(d32) / 6, rtol=1e-3)


def test_k3_kl_unchanged_at_large_gaps():
    d = np.array([[0.5, -2.0, 3.0, 20.0]], np.float32)
    zeros = jnp.zeros((1, 4), jnp.float32)
    _, m = grpo.grpo_loss(zeros, zeros, zeros, jnp.ones((1, 4)), jnp.asarray(d),
                          grpo.LossConfig(beta_kl=0.1))
    old = np.mean(np.exp(d) - d - 1.0)  # the float32 formula, exact enough here
    np.testing.assert_allclose(float(m["kl"]), old, rtol=1e-6)
    np.testing.assert_allclose(float(m["kl"]), np.mean(np.expm1(d.astype(np.float64)) - d),
                               rtol=1e-6)


def _k3_float64(c: np.ndarray) -> np.ndarray:
    """exp(c) - 1 - c in float64; expm1(c) - c cancels in float64 too below ~1e-5, so the
    series (to c^5, exact to float64 there) below 1e-3."""
    c = np.asarray(c, np.float64)
    series = c * c * (0.5 + c / 6 + c * c / 24 + c**3 / 120)
    return np.where(np.abs(c) < 1e-3, series, np.expm1(c) - c)


@settings(max_examples=200, deadline=None)
@given(st.floats(-60.0, 60.0, width=32))
def test_property_k3_matches_float64(c):
    # k3 >= 0 and within 1e-6 relative of the float64 exp(c) - 1 - c (of the float32 input).
    got = float(k3(jnp.float32(c)))
    assert got >= 0.0
    if c == 0.0:
        assert got == 0.0
    else:
        np.testing.assert_allclose(got, _k3_float64(c), rtol=1e-6, atol=1e-37)  # c^2 underflows


def test_k3_relative_error_on_a_dense_float32_grid():
    """Every float32 on dense grids over [-60, 60], with both sides of the series / expm1
    switch at |c| = 0.5 and the old switch at 1e-2 (where expm1(c) - c lost 6e-5 relative):
    within 1e-6 of float64, and the gradient within 1e-6 of expm1(c)."""
    grids = [np.linspace(lo, hi, 20001, dtype=np.float32) for lo, hi in
             ((1e-6, 1e-2), (1e-2, 0.6), (0.45, 0.55), (0.5, 60.0))]
    c = np.concatenate([*grids, *(-g for g in grids)])
    got = np.asarray(jax.jit(k3)(jnp.asarray(c)), np.float64)
    want = _k3_float64(c)
    assert (got > 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    grad = np.asarray(jax.jit(jax.vmap(jax.grad(k3)))(jnp.asarray(c)), np.float64)
    np.testing.assert_allclose(grad, np.expm1(c.astype(np.float64)), rtol=1e-6)
    # the old switch point: expm1(c) - c in float32 is 6e-5 off there, k3 is not
    c01 = np.float32(0.01003515)
    old = float(np.expm1(c01) - c01)
    assert abs(old / float(_k3_float64(c01)) - 1) > 1e-5
    assert abs(float(k3(jnp.float32(c01))) / float(_k3_float64(c01)) - 1) < 1e-6
