"""Attention implementations (ais_jax.models.attention): chunked vs today's reference vs a
NumPy attention written here; gradients under remat; the selection rule; no T x T buffer."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ais_jax.models import attention as att
from ais_jax.models.kv_cache import ScaledView

B, Q, K, H = 2, 4, 2, 8  # grouped-query: 2 query heads per key / value head


def _qkv(T, S, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kq, (B, T, Q, H), dtype), jax.random.normal(kk, (B, S, K, H), dtype),
            jax.random.normal(kv, (B, S, K, H), dtype))


def _numpy_attention(q, k, v, visible):
    """Softmax attention per row and head in float64; ``visible`` ``[B, T, S]`` bool."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    Bn, T, Qn, Hn = q.shape
    out = np.zeros((Bn, T, Qn, Hn))
    for b in range(Bn):
        for t in range(T):
            for h in range(Qn):
                kh = h // (Qn // k.shape[2])
                s = k[b, :, kh] @ q[b, t, h] / np.sqrt(Hn)
                s = np.where(visible[b, t], s, -np.inf)
                p = np.exp(s - s.max())
                out[b, t, h] = (p / p.sum()) @ v[b, :, kh]
    return out.reshape(Bn, T, Qn * Hn)


def _causal_visible(valid, start, T):
    valid = np.asarray(valid)
    S = valid.shape[1]
    vis = np.zeros((valid.shape[0], T, S), bool)
    for t in range(T):
        vis[:, t, : start + t + 1] = valid[:, : start + t + 1]
        vis[:, t, start + t] = True  # a query always sees itself
    return vis


# left padding (3 slots) in row 0; S = 13 is not a multiple of the chunk 5
VALID = jnp.array([[0, 0, 0] + [1] * 10, [1] * 13], bool)


def _masks():
    causal = (att.causal_mask(VALID), _causal_visible(VALID, 0, 13), 13)
    # a cache: 4 queries at slots 6..9 of 13, keys 10.. not yet written
    cache_valid = VALID.at[:, 10:].set(False)
    extend = (att.causal_mask(cache_valid, 6, 4), _causal_visible(cache_valid, 6, 4), 4)
    bidir_valid = VALID.at[0, 5].set(False)
    bidir = (att.bidirectional_mask(bidir_valid),
             np.broadcast_to(np.asarray(bidir_valid)[:, None], (B, 13, 13)), 13)
    return {"causal": causal, "extend": extend, "bidirectional": bidir}


@pytest.mark.parametrize("kind", ["causal", "extend", "bidirectional"])
@pytest.mark.parametrize("chunk", [1, 5, 13, 64])
def test_chunked_matches_numpy_and_reference_f32(kind, chunk):
    mask, visible, T = _masks()[kind]
    q, k, v = _qkv(T, 13)
    want = _numpy_attention(q, k, v, visible)
    ref = att.attend(q, k, v, mask, "reference")
    got = jax.jit(att.attend, static_argnums=(4, 5))(q, k, v, mask, "chunked", chunk)
    np.testing.assert_allclose(ref, want, atol=2e-6)
    np.testing.assert_allclose(got, want, atol=2e-6)
    np.testing.assert_allclose(got, ref, atol=1e-6)


@pytest.mark.parametrize("kind", ["causal", "bidirectional"])
def test_chunked_bf16_within_rounding(kind):
    mask, visible, T = _masks()[kind]
    q, k, v = _qkv(T, 13, jnp.bfloat16)
    want = _numpy_attention(q, k, v, visible)  # exact attention of the bf16 inputs
    ref = np.asarray(att.attend(q, k, v, mask, "reference"), np.float64)
    got = np.asarray(att.attend(q, k, v, mask, "chunked", 5), np.float64)
    assert got.dtype == ref.dtype
    err_ref, err_got = np.abs(ref - want).max(), np.abs(got - want).max()
    assert err_got <= 2 * err_ref + 2**-8, (err_got, err_ref)
    np.testing.assert_allclose(got, ref, atol=3 * 2**-7)


@pytest.mark.parametrize("kind", ["causal", "extend", "bidirectional"])
def test_chunked_gradients_match_reference_under_remat(kind):
    mask, _, T = _masks()[kind]
    q, k, v = _qkv(T, 13)
    w = jax.random.normal(jax.random.key(7), (B, T, Q * H))

    def loss(impl):
        f = jax.checkpoint(lambda q, k, v: jnp.sum(att.attend(q, k, v, mask, impl, 5) * w))
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)

    for g_ref, g_got in zip(loss("reference"), loss("chunked"), strict=True):
        assert float(jnp.abs(g_ref).max()) > 1e-3  # a gradient that can be wrong
        np.testing.assert_allclose(g_got, g_ref, atol=3e-6)


def test_chunked_scaled_fp8_cache_view():
    mask, _, T = _masks()["extend"]
    q, k, v = _qkv(T, 13)
    ks, vs = ScaledView(k * 0.5, jnp.float32(2.0)), ScaledView(v * 0.25, jnp.float32(4.0))
    ref = att.attend(q, ks, vs, mask, "reference")
    np.testing.assert_allclose(att.attend(q, ks, vs, mask, "chunked", 4), ref, atol=2e-6)
    np.testing.assert_allclose(ref, att.attend(q, k, v, mask, "reference"), atol=2e-6)


def _e4m3(x, scale):
    """Values rounded to float8 E4M3 at ``scale`` (as an FP8 cache stores them), as float32."""
    return jnp.clip(x / scale, -448, 448).astype(jnp.float8_e4m3fn).astype(jnp.float32)


@pytest.mark.parametrize("kind", ["causal", "extend"])
def test_fixed_scale_fp8_values_normalized_after_the_matmul(kind):
    # a fixed-scale FP8 cache (`ScaledView` with a scalar scale): the softmax is normalized
    # after the value matmul; float32: the float64 attention of the dequantized cache
    mask, visible, T = _masks()[kind]
    q, k, v = _qkv(T, 13, seed=3)
    sk, sv = jnp.float32(0.01), jnp.float32(0.02)
    k8, v8 = _e4m3(k, sk), _e4m3(v, sv)
    want = _numpy_attention(q, k8 * sk, v8 * sv, visible)
    got = att.attend(q, ScaledView(k8, sk), ScaledView(v8, sv), mask, "reference")
    np.testing.assert_allclose(got, want, atol=2e-6)
    # bfloat16 compute (the decode step's): within the rounding of plain bf16 attention
    qb, kb, vb = q.astype(jnp.bfloat16), k8.astype(jnp.bfloat16), v8.astype(jnp.bfloat16)
    want = _numpy_attention(qb, k8 * sk, v8 * sv, visible)
    got = att.attend(qb, ScaledView(kb, sk), ScaledView(vb, sv), mask, "reference")
    plain = att.attend(
        qb, (kb * sk).astype(jnp.bfloat16), (vb * sv).astype(jnp.bfloat16), mask, "reference"
    )
    err, err_plain = (np.abs(np.asarray(a, np.float64) - want).max() for a in (got, plain))
    assert err <= 2 * err_plain + 2**-9, (err, err_plain)


def test_fixed_scale_values_known_answer():
    # H = 4 (1 / sqrt(H) = 0.5), power-of-two scales, every step exact: scores
    # (2 * 1, 2 * 1, masked) * s_k / 2 = (0.5, 0.5) -> e = (1, 1, 0), sum 2;
    # output (e . v) * s_v / 2 = (12, -8, 2, 2) * 0.25 / 2
    q = jnp.asarray([2.0, 2.0, 0.0, 0.0]).reshape(1, 1, 1, 4)
    k = jnp.asarray([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [9.0, 9, 9, 9]]).reshape(1, 3, 1, 4)
    v = jnp.asarray([[4.0, -8, 0, 1], [8.0, 0, 2, 1], [64.0, 64, 64, 64]]).reshape(1, 3, 1, 4)
    mask = att.causal_mask(jnp.asarray([[True, True, False]]), 1, 1)
    views = ScaledView(k, jnp.float32(0.5)), ScaledView(v, jnp.float32(0.25))
    assert att.attend(q, *views, mask).reshape(-1).tolist() == [1.5, -1.0, 0.25, 0.25]


def test_resolve_by_backend():
    bf16 = jnp.bfloat16
    assert att.resolve("auto", "cpu", bf16, 64, 100) == "reference"  # CPU: today's numbers
    assert att.resolve("auto", "tpu", bf16, 64, 100) == "pallas"  # TPU: the flash kernel
    assert att.resolve("auto", "tpu", bf16, 64, 1) == "reference"  # a decode step
    assert att.resolve("auto", "gpu", bf16, 64, 100) == "cudnn"
    assert att.resolve("auto", "gpu", jnp.float32, 64, 100) == "reference"
    assert att.resolve("auto", "gpu", bf16, 72, 100) == "cudnn"
    assert att.resolve("auto", "gpu", bf16, 256, 100) == "reference"
    assert att.resolve("chunked", "cpu") == "chunked"
    with pytest.raises(ValueError, match="attention must be one of"):
        att.resolve("flash")


def _tiny_model(attention, chunk=16):
    from ais_jax.models.model import ModelConfig, init_params

    cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True,
                      attention=attention, attention_chunk=chunk)
    return cfg, init_params(jax.random.key(0), cfg)


def _batch(P=12, N=28):
    prompt = jax.random.randint(jax.random.key(1), (B, P), 0, 50)
    pmask = jnp.ones((B, P), bool).at[0, :5].set(False)
    tokens = jax.random.randint(jax.random.key(2), (B, N), 0, 50)
    return prompt, pmask, tokens


@pytest.mark.slow
def test_model_forward_and_logprob_gradient_chunked_equal_reference():
    from ais_jax.models.model import forward
    from ais_jax.training.logprobs import completion_logprobs

    prompt, pmask, tokens = _batch()
    results = {}
    for impl in ("reference", "chunked"):
        cfg, params = _tiny_model(impl)
        logits = jax.jit(forward, static_argnums=2)(params, prompt, cfg, pmask)

        def loss(p, cfg=cfg):
            lp = completion_logprobs(p, prompt, pmask, tokens, cfg, remat="full")
            return jnp.sum(lp), lp

        grads, lp = jax.jit(jax.grad(loss, has_aux=True))(params)
        results[impl] = (logits, lp, grads)
    (l_ref, lp_ref, g_ref), (l_got, lp_got, g_got) = results["reference"], results["chunked"]
    np.testing.assert_allclose(l_got[pmask], l_ref[pmask], atol=2e-5)
    np.testing.assert_allclose(lp_got, lp_ref, atol=2e-5)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
def test_prefill_and_decode_chunked_equal_reference():
    from ais_jax.models import decode

    prompt, pmask, _ = _batch(P=10)
    out = {}
    for impl in ("reference", "chunked"):
        cfg, params = _tiny_model(impl, chunk=4)
        @jax.jit
        def run(params, cfg=cfg):
            logits, cache = decode.prefill(params, prompt, pmask, cfg, 14)
            ones = jnp.ones((B, 1), bool)
            return logits, decode.extend(params, prompt[:, -1:], ones, cache, cfg)[0]

        out[impl] = run(params)
    np.testing.assert_allclose(out["chunked"][0][pmask], out["reference"][0][pmask], atol=2e-5)
    np.testing.assert_allclose(out["chunked"][1], out["reference"][1], atol=2e-5)


@pytest.mark.slow
def test_llada_forward_chunked_equal_reference():
    from ais_jax.models.llada import model as llada

    base = llada.LLaDAConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2,
                             num_heads=4, num_kv_heads=2, mask_token_id=39)
    params = llada.init_params(jax.random.key(0), base)
    tokens = jax.random.randint(jax.random.key(3), (3, 11), 0, 40)
    mask = jnp.ones((3, 11), bool).at[0, :4].set(False).at[2].set(False)  # row 2: all padding
    fwd = jax.jit(llada.forward, static_argnums=2)
    ref = fwd(params, tokens, dataclasses.replace(base, attention="reference"), mask)
    got = fwd(params, tokens, dataclasses.replace(base, attention="chunked", attention_chunk=3),
              mask)
    np.testing.assert_allclose(got[mask], ref[mask], atol=2e-5)
    np.testing.assert_allclose(got[2], ref[2], atol=2e-5)  # the all-padding row: every key


def _score_buffers(hlo: str, T: int) -> list[str]:
    return re.findall(rf"f32\[[0-9,]*\b{T},{T}\]", hlo)


@pytest.mark.slow
def test_update_hlo_has_no_sequence_square_buffer_with_chunked():
    from ais_jax.training.logprobs import completion_logprobs

    prompt, pmask, tokens = _batch(P=12, N=29)  # T = P + N - 1 = 40 > chunk 16
    T = 40
    found = {}
    for impl in ("reference", "chunked"):
        cfg, params = _tiny_model(impl, chunk=16)

        def loss(p, cfg=cfg):
            return jnp.sum(completion_logprobs(p, prompt, pmask, tokens, cfg, remat="full"))

        hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
        found[impl] = _score_buffers(hlo, T)
    assert found["reference"], "the check must see the reference's [.., T, T] scores"
    assert not found["chunked"], found["chunked"][:3]


def test_config_keys_reach_the_model_config():
    from ais_jax.config.schema import DEFAULT_CONFIG_PATH
    from ais_jax.run.plan import load_plan_config, resolve_model_config

    cfg = load_plan_config(DEFAULT_CONFIG_PATH, ["model.attention=chunked",
                                                 "model.attention_chunk=64"])
    model_cfg = resolve_model_config(cfg)[0]
    assert (model_cfg.attention, model_cfg.attention_chunk) == ("chunked", 64)
    llada_cfg = resolve_model_config(load_plan_config(DEFAULT_CONFIG_PATH, [
        "model.kind=llada", "model.attention=reference", "diffusion.steps=8"]))[0]
    assert type(llada_cfg).__name__ == "LLaDAConfig" and llada_cfg.attention == "reference"
    with pytest.raises(ValueError, match="attention must be one of"):
        dataclasses.replace(model_cfg, attention="flash")
