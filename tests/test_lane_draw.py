"""The TPU form of the token draw (`distributions.lane_blocks`): 128-entry blocks summed
straight from the logits.  On CPU it is called directly or forced with a monkeypatch; the
reference is a float64 inverse CDF written here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ais_jax.method import distributions as dist


def _logits(seed: int, B: int, V: int, drop: float = 0.3) -> np.ndarray:
    """Random float32 logits with a share ``drop`` of ``-inf`` (a truncated set); entry 0 of
    each row kept."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 2, (B, V)).astype(np.float32)
    z[rng.random((B, V)) < drop] = -np.inf
    z[:, 0] = 1.0
    return z


def _draw(u: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    zj = jnp.asarray(z)
    m = jnp.max(zj, axis=-1, keepdims=True)
    tok, total = jax.jit(dist._draw_lanes)(jnp.asarray(u, jnp.float32), zj, m)
    return np.asarray(tok), np.asarray(total)


def test_lane_blocks_only_on_tpu_with_a_lane_multiple():
    assert dist.lane_blocks(151936, "tpu")
    assert dist.lane_blocks(256, "tpu")
    assert not dist.lane_blocks(151937, "tpu")  # not a multiple of 128: the generic form
    assert not dist.lane_blocks(151936, "cpu")
    assert not dist.lane_blocks(151936, "gpu")


def test_draw_lanes_midpoints_of_the_float64_cdf():
    """Known answers: a uniform at the middle of token k's CDF interval draws token k, for
    every token of weight > 1e-4 (three blocks, truncated entries among them)."""
    z = _logits(0, 1, 384)
    p = np.exp(z[0].astype(np.float64) - z[0].max())
    c = np.cumsum(p) / p.sum()
    ks = np.flatnonzero(p / p.sum() > 1e-4)
    u = c[ks] - p[ks] / p.sum() / 2  # interval midpoints
    tok, total = _draw(u, np.repeat(z, len(ks), axis=0))
    np.testing.assert_array_equal(tok, ks)
    np.testing.assert_allclose(total, p.sum(), rtol=1e-6)
    # the generic form draws the same tokens at these uniforms
    e = jnp.exp(jnp.asarray(np.repeat(z, len(ks), 0)) - z[0].max())
    np.testing.assert_array_equal(np.asarray(dist._inverse_cdf(jnp.asarray(u, jnp.float32), e)), ks)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), u=st.sampled_from([0.0, 1e-7, 0.5, 1 - 2**-24]))
def test_draw_lanes_never_returns_a_zero_weight_token(seed: int, u: float):
    z = _logits(seed, 4, 256, drop=0.9)
    tok, total = _draw(np.full(4, u), z)
    assert np.all(np.isfinite(z[np.arange(4), tok]))
    np.testing.assert_allclose(total, np.exp(z - z.max(-1, keepdims=True)).sum(-1), rtol=1e-5)


def test_sample_logits_u_lane_form_log_probs_and_distribution(monkeypatch):
    """Forced on CPU: the recorded log-prob is `token_logprobs`' and 20k draws from a top-k
    truncated row follow its distribution (chi-square)."""
    from scipy import stats

    monkeypatch.setattr(dist, "lane_blocks", lambda V, backend=None: V % dist.LANES == 0)
    V, n = 256, 20000
    row = jnp.asarray(_logits(1, 1, V, drop=0.0)[0] * 0.5)
    u = jax.random.uniform(jax.random.key(0), (n,), jnp.float32)
    tok, logp = jax.jit(dist.sample_logits_u, static_argnums=(2, 3, 4))(
        u, jnp.broadcast_to(row, (n, V)), 1.0, 40, 1.0
    )
    tok = np.asarray(tok)
    ref = dist.token_logprobs(jnp.broadcast_to(row, (64, V)), jnp.asarray(tok[:64]), 1.0, 40)
    np.testing.assert_allclose(logp[:64], ref, atol=1e-5)
    probs = np.exp(
        np.asarray(dist.token_logprobs(row[None].repeat(V, 0), jnp.arange(V), 1.0, 40), np.float64)
    )
    kept = probs > 0
    assert kept.sum() == 40 and set(np.unique(tok)) <= set(np.flatnonzero(kept))
    res = stats.chisquare(np.bincount(tok, minlength=V)[kept], n * probs[kept] / probs[kept].sum())
    assert res.pvalue > 1e-3, res


@pytest.mark.parametrize("V", [128, 384])
def test_sample_logits_u_cpu_keeps_the_generic_form(V):
    """Unforced on CPU the generic form runs (the golden run's bits): same tokens as
    `_inverse_cdf` of ``exp(z - max z)``."""
    z = jnp.asarray(_logits(2, 8, V))
    u = jax.random.uniform(jax.random.key(1), (8,), jnp.float32)
    tok, _ = dist.sample_logits_u(u, z, 1.0, 0, 1.0)
    ref = dist._inverse_cdf(u, jnp.exp(z - jnp.max(z, -1, keepdims=True)))
    np.testing.assert_array_equal(np.asarray(tok), np.asarray(ref))
