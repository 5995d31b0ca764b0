"""Tests for ais_jax.models.decode: the KV cache, prefill / extend against the full forward,
scanned against unrolled layers, and the decode program's size against depth."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _models import FULL, TINY
from _models import left_padded as _left_padded
from _models import random_params as _random_params

from ais_jax.models import decode, fp8, kv_cache, model
from ais_jax.rollout.sampler import sample

forward = jax.jit(model.forward, static_argnums=2)
extend = jax.jit(decode.extend, static_argnums=4, static_argnames="scan_layers")


def _chunked(params, cfg, tokens, mask, cache, chunks, scan):
    outs, start = [], 0
    for n in chunks:  # padding inside the first chunk (the prompt) only
        logits, cache = extend(params, tokens[:, start:start + n], mask[:, start:start + n],
                               cache, cfg, scan_layers=scan)
        outs.append(logits)
        start += n
    return jnp.concatenate(outs, 1), cache


# ----------------------------------------------------------------------------- cache


@pytest.mark.parametrize("fp8_cache", [False, True])
def test_init_cache_layout(fp8_cache):
    cfg = dataclasses.replace(TINY, num_layers=3)
    c = kv_cache.init_cache(cfg, 2, 7, jnp.float32, fp8=fp8_cache)
    k, v = (c.k.value, c.v.value) if fp8_cache else (c.k, c.v)
    assert k.shape == (3, 2, 2, 7, 8) and v.shape == (3, 2, 2, 8, 7)  # [L,B,K,S,H], [L,B,K,H,S]
    if fp8_cache:
        assert k.dtype == jnp.float8_e4m3fn
        assert c.k.scale.shape == (3, 2, 1, 7, 1) and c.v.scale.shape == (3, 2, 1, 1, 7)
    assert c.valid.shape == (2, 7) and not c.valid.any() and int(c.index) == 0
    per_layer = kv_cache.unstack_cache(c)
    assert len(per_layer.k) == 3 and kv_cache.unstack_cache(per_layer) is per_layer
    leaf = per_layer.k[0].value if fp8_cache else per_layer.k[0]
    assert leaf.shape == (2, 2, 7, 8)


@pytest.mark.slow  # ~23 s in the full suite on 2 busy cores
@pytest.mark.parametrize("stacked", [True, False])
def test_resize_cache_repeats_rows_and_adds_empty_slots(stacked):
    cfg = TINY
    params = _random_params(cfg)
    tokens, mask = _left_padded(cfg, 2, 5, [0, 2])
    _, c = decode.prefill(params, tokens, mask, cfg, 5, dtype=jnp.float32, fp8=True)
    c = c if stacked else kv_cache.unstack_cache(c)
    r = kv_cache.resize_cache(c, 3, 9)
    assert r.valid.shape == (6, 9) and not r.valid[:, 5:].any()
    np.testing.assert_array_equal(r.valid[:, :5], np.repeat(np.asarray(mask), 3, 0))
    np.testing.assert_array_equal(r.pos, np.repeat(np.asarray(c.pos), 3))
    k0 = r.k.value if stacked else r.k[0].value[None]
    assert k0.shape[1:] == (6, 1 if cfg.num_kv_heads == 1 else 2, 9, 8)
    scale = r.k.scale if stacked else r.k[0].scale[None]
    assert bool(jnp.all(scale[..., 5:, :] == 1.0))  # empty slots: scale 1, value 0


# ----------------------------------------------------------------------------- extend


@pytest.mark.slow  # ~9 s in the full suite on 2 busy cores
@pytest.mark.parametrize("scan,stacked", [(True, True), (False, True), (False, False),
                                          (True, False)])
def test_extend_matches_forward_at_every_position(scan, stacked):
    cfg, chunks = FULL, (3, 3, 1, 1, 1)  # a chunked prefill, then decode steps
    params = _random_params(cfg)
    T = sum(chunks)
    tokens, mask = _left_padded(cfg, 3, T, [0, 2, 3], seed=1)
    ref = forward(params, tokens, cfg, mask)  # [B, T, V]
    cache = kv_cache.init_cache(cfg, 3, T + 2, jnp.float32)  # spare slots stay unused
    cache = cache if stacked else kv_cache.unstack_cache(cache)
    got, cache = _chunked(params, cfg, tokens, mask, cache, chunks, scan)
    assert isinstance(cache.k, tuple) != stacked  # returned in the form it was given
    valid = np.asarray(mask)
    diff = np.abs(np.asarray(got) - np.asarray(ref))[valid]
    assert diff.max() <= 1e-5, diff.max()
    assert int(cache.index) == T
    np.testing.assert_array_equal(cache.pos, valid.sum(-1))
    np.testing.assert_array_equal(cache.valid[:, :T], valid)


@pytest.mark.slow  # ~21 s in the full suite on 2 busy cores
def test_prefill_equals_extend_on_an_empty_cache():
    cfg = FULL
    params = _random_params(cfg)
    tokens, mask = _left_padded(cfg, 3, 6, [0, 1, 4])
    logits, c = decode.prefill(params, tokens, mask, cfg, 9, dtype=jnp.float32)
    ref_logits, ref = extend(params, tokens, mask, kv_cache.init_cache(cfg, 3, 9, jnp.float32), cfg)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-5)
    np.testing.assert_allclose(c.k, ref.k, atol=1e-5)
    np.testing.assert_allclose(c.v, ref.v, atol=1e-5)
    for a, b in [(c.valid, ref.valid), (c.pos, ref.pos), (c.index, ref.index)]:
        np.testing.assert_array_equal(a, b)


def test_prefill_last_only_is_the_last_position_of_the_full_logits():
    cfg = FULL
    params = _random_params(cfg)
    tokens, mask = _left_padded(cfg, 3, 6, [0, 1, 4])
    full, c_full = decode.prefill(params, tokens, mask, cfg, 9, dtype=jnp.float32)
    last, c_last = decode.prefill(params, tokens, mask, cfg, 9, dtype=jnp.float32,
                                  last_only=True)
    assert last.shape == (3, 1, cfg.vocab_size)
    np.testing.assert_allclose(last[:, 0], full[:, -1], atol=1e-5)
    np.testing.assert_array_equal(c_last.k, c_full.k)  # the cache does not depend on it


def test_sampler_prefill_does_not_materialize_prompt_logits():
    """Ahead-of-time plan: with a 32k vocabulary and 256-token prompts the compiled sampler's
    scratch memory stays far below the [B, P, V] float32 logits of every prompt position."""
    from ais_jax.models import model as model_lib
    from ais_jax.rollout import sampler

    cfg = dataclasses.replace(TINY, vocab_size=32768)
    params = jax.eval_shape(lambda k: model_lib.init_params(k, cfg), jax.random.key(0))
    B0, P = 8, 256
    compiled = sampler._sample_jit.lower(
        params, jax.ShapeDtypeStruct((B0, P), jnp.int32), jax.ShapeDtypeStruct((B0, P), bool),
        jax.eval_shape(lambda: jax.random.key(0)), cfg=cfg, max_new_tokens=4,
        temperature=1.0, top_k=0, top_p=1.0, eos_ids=(1,), pad_id=0, num_samples=1,
        kv_fp8=False, segments=1, transpose=True, scan_layers=False).compile()
    full_logits = B0 * P * cfg.vocab_size * 4
    assert compiled.memory_analysis().temp_size_in_bytes < full_logits / 8


@pytest.mark.slow  # ~10 s in the full suite on 2 busy cores
@pytest.mark.parametrize("scan", [True, False])
def test_fp8_cache_stays_close_to_the_full_precision_one(scan):
    cfg = dataclasses.replace(TINY, num_layers=3)
    params = _random_params(cfg)
    tokens, mask = _left_padded(cfg, 2, 8, [0, 3])
    chunks = (5, 1, 1, 1)
    ref, c32 = _chunked(params, cfg, tokens, mask, kv_cache.init_cache(cfg, 2, 8, jnp.float32),
                        chunks, scan)
    got, c8 = _chunked(params, cfg, tokens, mask,
                       kv_cache.init_cache(cfg, 2, 8, jnp.float32, fp8=True), chunks, scan)
    assert isinstance(c8.k, fp8.QuantArray) and c8.k.value.dtype == jnp.float8_e4m3fn
    keys = fp8.dequantize(c8.k)  # one scale per (layer, row, token): within E4M3's 2^-4
    valid = np.asarray(mask)[None, :, None, :, None]
    err = np.abs(np.asarray(keys - c32.k)) * valid
    assert err.max() <= 0.07 * float(jnp.abs(c32.k).max()), err.max()
    delta = np.abs(np.asarray(jax.nn.log_softmax(got) - jax.nn.log_softmax(ref)))
    assert 0 < delta[np.asarray(mask)].mean() < 0.1


@pytest.mark.slow  # ~12 s in the full suite on 2 busy cores
def test_scanned_and_unrolled_steps_agree():
    cfg = dataclasses.replace(FULL, num_layers=5)
    params = _random_params(cfg)
    tokens, mask = _left_padded(cfg, 2, 7, [0, 2])
    out = {}
    for scan in (True, False):
        out[scan] = _chunked(params, cfg, tokens, mask, kv_cache.init_cache(cfg, 2, 7, jnp.float32),
                             (4, 1, 1, 1), scan)
    np.testing.assert_allclose(out[True][0], out[False][0], atol=1e-5)
    np.testing.assert_allclose(out[True][1].k, out[False][1].k, atol=1e-5)
    assert decode.scan_layers_default(cfg, "cpu") and not decode.scan_layers_default(TINY, "cpu")
    assert not decode.scan_layers_default(cfg, "gpu")  # accelerators unroll (faster decode)


# ----------------------------------------------------------------------------- compile size


def _decode_dots(cfg: model.ModelConfig, scan: bool | None) -> int:
    """dot_general ops in the lowered sampler program (prefill scan + decode loops)."""
    params = jax.eval_shape(lambda: model.init_params(jax.random.key(0), cfg))
    f = jax.jit(lambda p, t, m, k: sample(p, t, m, k, cfg, max_new_tokens=8, decode_segments=2,
                                          scan_layers=scan))
    text = f.lower(params, jax.ShapeDtypeStruct((2, 4), jnp.int32),
                   jax.ShapeDtypeStruct((2, 4), jnp.bool_), jax.random.key(0)).as_text()
    return len(re.findall(r"stablehlo\.dot_general", text))


def test_scanned_decode_program_does_not_grow_with_depth():
    shallow = dataclasses.replace(TINY, num_layers=2)
    deep = dataclasses.replace(TINY, num_layers=24)
    assert _decode_dots(deep, None) == _decode_dots(shallow, True)  # CPU scans depth 24
    assert _decode_dots(dataclasses.replace(TINY, num_layers=4), None) > _decode_dots(shallow,
                                                                                      True)


@pytest.mark.slow  # compiles a 24-layer sampler of 4 decode segments (~5 s)
def test_sample_for_a_deep_model_compiles_to_a_depth_independent_program():
    """The compiled 4-segment sampler of a 24-layer model (what made compiles slow when the
    layers were unrolled) is about as big as a 2-layer one: the scan keeps compile time flat.
    A structural check (instruction counts), never a timing."""

    def compiled_lines(layers: int, scan: bool | None) -> int:
        cfg = dataclasses.replace(TINY, num_layers=layers, max_position_embeddings=256)
        params = jax.eval_shape(lambda: model.init_params(jax.random.key(0), cfg))
        f = jax.jit(lambda p, t, m, k: sample(p, t, m, k, cfg, max_new_tokens=200,
                                              scan_layers=scan))  # 4 segments
        args = (params, jax.ShapeDtypeStruct((4, 16), jnp.int32),
                jax.ShapeDtypeStruct((4, 16), jnp.bool_), jax.random.key(0))
        return len(f.lower(*args).compile().as_text().splitlines())

    deep, shallow = compiled_lines(24, None), compiled_lines(2, True)  # the default scans 24
    assert deep < 1.2 * shallow, (deep, shallow)


# ----------------------------------------------------------------------------- fixed FP8 scales


@pytest.mark.slow  # ~10 s on 2 busy cores
def test_prefill_fixes_the_decode_scales_of_act_scaling_prefill():
    """act_scaling="prefill": the prefill's masked amaxes (x 2 / 448) become the decode's fixed
    activation scales ([L, 4]) and, with an FP8 cache, one key / value scale per layer; the
    decode steps then quantize with them, scanned and unrolled alike."""
    cfg = dataclasses.replace(FULL, num_layers=3)
    params = _random_params(cfg)
    rp = fp8.to_rollout_params(params, act_scaling="prefill")
    assert decode.prefill_scaled_format(rp) == jnp.float8_e4m3fn
    assert decode.prefill_scaled_format(fp8.to_rollout_params(params)) is None
    tokens, mask = _left_padded(cfg, 2, 6, [0, 3])
    _, c = decode.prefill(rp, tokens, mask, cfg, 9, dtype=jnp.float32, fp8=True)
    assert c.act_scales.shape == (3, 4)
    # layer 0's q/k/v input: the attention norm of the prompt's embeddings, padding excluded
    h = model.rms_norm(params["embed"][tokens], params["layers"]["attn_norm"][0],
                       cfg.rms_norm_eps)
    amax = jnp.max(jnp.where(mask[..., None], jnp.abs(h), 0.0))
    np.testing.assert_allclose(c.act_scales[0, 0], 2 * amax / 448, rtol=1e-6)
    # the cache: one fixed scale per layer from the prompt's keys (the same as a full one's)
    _, c32 = decode.prefill(rp, tokens, mask, cfg, 9, dtype=jnp.float32)
    assert kv_cache.is_fixed_scale(c.k) and c.k.scale.shape == (3, 1, 1, 1, 1)
    valid = np.asarray(c32.valid)[None, :, None, :, None]  # keys [L, B, K, S, H]
    k_amax = np.max(np.abs(np.asarray(c32.k)) * valid, axis=(1, 2, 3, 4))
    np.testing.assert_allclose(c.k.scale.reshape(3), 2 * k_amax / 448, rtol=1e-6)
    err = np.abs(np.asarray(fp8.dequantize(c.k) - c32.k)) * valid
    assert err.max() <= 0.07 * k_amax.max()
    r = kv_cache.resize_cache(c, 2, 11)  # the fixed scales ride along unchanged
    assert r.k.scale.shape == (3, 1, 1, 1, 1) and r.act_scales is c.act_scales
    step = jnp.ones((4, 1), bool)
    nxt = jax.random.randint(jax.random.key(5), (4, 1), 0, cfg.vocab_size)
    out = {s: extend(rp, nxt, step, r, cfg, scan_layers=s) for s in (True, False)}
    np.testing.assert_allclose(out[True][0], out[False][0], atol=1e-5)
    assert out[True][1].act_scales is not None and kv_cache.is_fixed_scale(out[True][1].k)
    # the sampler's per-layer form: the scales as scalars (nothing sliced in the loop), same step
    u = kv_cache.unstack_cache(r)
    assert len(u.act_scales) == 3 and all(len(s) == 4 for s in u.act_scales)
    assert float(u.act_scales[1][2]) == float(r.act_scales[1, 2])
    np.testing.assert_array_equal(extend(rp, nxt, step, u, cfg)[0], out[False][0])
    # the scales are used: tenfold smaller ones saturate the step's activations
    tiny = r._replace(act_scales=r.act_scales / 10)
    assert float(jnp.max(jnp.abs(extend(rp, nxt, step, tiny, cfg)[0] - out[False][0]))) > 1e-2
    # the fixed-scale cache reads as a ScaledView (no dequantized copy), same attention numbers
    view = kv_cache.cache_read(r.k, kv_cache.K_LAYOUT, 0, jnp.float32)
    assert isinstance(view, kv_cache.ScaledView) and view.x.dtype == jnp.float32
    np.testing.assert_array_equal(view.x * view.scale, jnp.transpose(
        fp8.dequantize(r.k)[0], (0, 2, 1, 3)))
