"""The fused head log-prob (`ais_jax.training.fused_head`): known answers, parity with the
reference form (``token_logprobs`` on materialized logits), values and gradients."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ais_jax.method.distributions import token_logprobs
from ais_jax.models import model as model_lib
from ais_jax.models.qarray import QuantArray
from ais_jax.training import fused_head
from ais_jax.training.fused_head import token_logprobs_from_hidden, use_fused_head
from ais_jax.training.logprobs import head_logprobs


def test_known_answer_value_and_gradients():
    # logits z = x @ w^T = [1, 0, -1]; token 0: log p = 1 - log(e + 1 + 1/e)
    x = jnp.array([[1.0, 0.0]])
    w = jnp.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    t = jnp.array([0])
    e = math.e
    lse = math.log(e + 1 + 1 / e)
    got = token_logprobs_from_hidden(x, w, t)
    np.testing.assert_allclose(np.asarray(got), [1 - lse], rtol=1e-6)
    p = np.array([e, 1.0, 1 / e]) / (e + 1 + 1 / e)
    dz = np.array([1.0, 0.0, 0.0]) - p  # d log p_0 / dz
    gx, gw = jax.grad(lambda x, w: token_logprobs_from_hidden(x, w, t)[0], (0, 1))(x, w)
    np.testing.assert_allclose(np.asarray(gx), [dz @ np.asarray(w)], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(gw), np.outer(dz, [1.0, 0.0]), rtol=1e-6, atol=1e-7)
    # temperature 2: z / 2 = [0.5, 0, -0.5]; greedy (0) scores at temperature 1
    half = token_logprobs_from_hidden(x, w, t, 2.0)
    want = 0.5 - math.log(math.exp(0.5) + 1 + math.exp(-0.5))
    np.testing.assert_allclose(np.asarray(half), [want], rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(token_logprobs_from_hidden(x, w, t, 0.0)), [1 - lse], rtol=1e-6
    )


def test_one_pass_max_sumexp_pick_known_answers():
    z = jnp.array([[-1000.0, 0.0, 50.0, 49.0], [-jnp.inf, 3.0, -jnp.inf, -jnp.inf]])
    t = jnp.array([2, 1])
    m, se, zt = fused_head._max_sumexp_pick(z, t, 1.0)
    np.testing.assert_array_equal(np.asarray(m[:, 0]), [50.0, 3.0])
    np.testing.assert_array_equal(np.asarray(zt[:, 0]), [50.0, 3.0])  # exact
    np.testing.assert_allclose(
        np.asarray(se[:, 0]), [1 + math.exp(-1) + math.exp(-50), 1.0], rtol=1e-6
    )
    _, se_half, _ = fused_head._max_sumexp_pick(z, t, 0.5)  # exp((z - m) / T)
    np.testing.assert_allclose(float(se_half[0, 0]), 1 + math.exp(-2), rtol=1e-6)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
    temperature=st.sampled_from([1.0, 0.25, 3.0]),
)
def test_one_pass_reduction_equals_two_pass(seed, scale, temperature):
    z = scale * jax.random.normal(jax.random.key(seed), (3, 257))
    t = jnp.array([0, 100, 256])
    m, se, zt = fused_head._max_sumexp_pick(z, t, temperature)
    want_m = jnp.max(z, axis=-1, keepdims=True)
    np.testing.assert_array_equal(np.asarray(m), np.asarray(want_m))
    np.testing.assert_array_equal(np.asarray(zt[:, 0]), np.asarray(z[jnp.arange(3), t]))
    want = jnp.sum(jnp.exp((z - want_m) / temperature), axis=-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(se), np.asarray(want), rtol=1e-5)


def _ref_and_fused(x, w, t, g, temperature):
    def ref(x, w):
        return jnp.sum(g * token_logprobs(x @ w.T, t, temperature))

    def new(x, w):
        return jnp.sum(g * token_logprobs_from_hidden(x, w, t, temperature))

    return [(f(x, w), *jax.grad(f, (0, 1))(x, w)) for f in (ref, new)]


@pytest.mark.slow  # ~7 s on 2 busy cores (8 examples, each a fresh compile)
@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 1.7]),
    scale=st.sampled_from([0.1, 1.0, 8.0]),
)
def test_value_and_gradients_equal_the_reference_f32(seed, temperature, scale):
    k = jax.random.split(jax.random.key(seed), 4)
    x = scale * jax.random.normal(k[0], (2, 3, 8))
    w = jax.random.normal(k[1], (13, 8))
    t = jax.random.randint(k[2], (2, 3), 0, 13)
    g = jax.random.normal(k[3], (2, 3))
    (a, gxa, gwa), (b, gxb, gwb) = _ref_and_fused(x, w, t, g, temperature)
    tol = dict(rtol=2e-5, atol=2e-5 * (1 + float(jnp.max(jnp.abs(gxa)))))
    np.testing.assert_allclose(float(b), float(a), **tol)
    np.testing.assert_allclose(np.asarray(gxb), np.asarray(gxa), **tol)
    np.testing.assert_allclose(np.asarray(gwb), np.asarray(gwa), **tol)


def test_bf16_inputs_round_only_the_logit_gradient():
    k = jax.random.split(jax.random.key(3), 4)
    x = jax.random.normal(k[0], (4, 16)).astype(jnp.bfloat16)
    w = jax.random.normal(k[1], (37, 16)).astype(jnp.bfloat16)
    t = jax.random.randint(k[2], (4,), 0, 37)
    g = jax.random.normal(k[3], (4,))
    f32 = _ref_and_fused(x.astype(jnp.float32), w.astype(jnp.float32), t, g, 1.0)[0]
    b, gx, gw = _ref_and_fused(x, w, t, g, 1.0)[1]
    assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
    np.testing.assert_allclose(float(b), float(f32[0]), rtol=1e-5)  # float32 logits
    np.testing.assert_allclose(np.asarray(gx, np.float32), np.asarray(f32[1]), rtol=0.02, atol=0.02)
    np.testing.assert_allclose(np.asarray(gw, np.float32), np.asarray(f32[2]), rtol=0.02, atol=0.02)


def test_choice_tpu_untruncated_plain_head_only():
    w = jnp.zeros((5, 4))
    assert use_fused_head(1.0, 0, 1.0, w, backend="tpu")
    assert use_fused_head(0.0, 3, 0.5, w, backend="tpu")  # greedy: never truncated
    assert not use_fused_head(1.0, 0, 1.0, w, backend="cpu")  # CPU keeps the reference bits
    assert not use_fused_head(1.0, 0, 1.0, w, backend="gpu")
    assert not use_fused_head(1.0, 5, 1.0, w, backend="tpu")
    assert not use_fused_head(0.7, 0, 0.9, w, backend="tpu")
    assert not use_fused_head(1.0, 0, 1.0, w, backend="tpu", vocab_parallel=True)
    q = QuantArray(jnp.zeros((5, 4), jnp.int8), jnp.ones((5, 1)))
    assert not use_fused_head(1.0, 0, 1.0, q, backend="tpu")


CFG = model_lib.ModelConfig(
    vocab_size=41,
    hidden_size=16,
    intermediate_size=24,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    max_position_embeddings=32,
)


@pytest.mark.slow  # ~8 s on 2 busy cores (a model's gradient, both forms)
@pytest.mark.parametrize("chunk", [0, 2])
def test_head_logprobs_on_tpu_path_equal_reference(monkeypatch, chunk):
    k = jax.random.split(jax.random.key(5), 4)
    params = model_lib.init_params(k[0], CFG)
    params["embed"] = params["embed"] * 10.0
    h = jax.random.normal(k[1], (3, 5, CFG.hidden_size))
    t = jax.random.randint(k[2], (3, 5), 0, CFG.vocab_size)
    g = jax.random.normal(k[3], (3, 5))

    def loss(p, h):
        return jnp.sum(g * head_logprobs(p, h, t, CFG, 0.8, chunk=chunk))

    ref = (loss(params, h), *jax.grad(loss, (0, 1))(params, h))
    calls = []
    real = fused_head._fused
    monkeypatch.setattr(fused_head, "_fused", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    got = (loss(params, h), *jax.grad(loss, (0, 1))(params, h))
    assert calls  # the fused form ran
    flat_r, flat_g = jax.tree.leaves(ref), jax.tree.leaves(got)
    for a, b in zip(flat_r, flat_g, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-5)
