"""Tests for the decode's whole-cache mode: a cache allocated once at its final length, each
decode segment attending to a static prefix of it (`ais_jax.models.decode.whole_cache_default`,
`ais_jax.models.kv_cache.prefix`, ``extend(window=...)``): the same slots, the same numbers
as the cache grown per segment."""

from __future__ import annotations

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from _models import TINY
from _models import left_padded as _left_padded
from _models import random_params as _random_params

from ais_jax.models import decode, fp8, kv_cache
from ais_jax.models.fp8 import QuantArray
from ais_jax.rollout import sampler


def test_whole_cache_on_tpu_only():
    class Mesh:
        def __init__(self, size):
            self.size = size

    assert decode.whole_cache_default("tpu") and decode.whole_cache_default("tpu", Mesh(1))
    assert decode.whole_cache_default("tpu", Mesh(4))  # 8B on v5p-8: smaller with the barrier
    assert not decode.whole_cache_default("cpu") and not decode.whole_cache_default("gpu")


def _fed_by(eqns: list, sources: set) -> set:
    """The variables of ``eqns`` (in order) computed from any of ``sources``, with them."""
    seen = set(sources)
    for e in eqns:
        if any(not isinstance(v, jax.extend.core.Literal) and v in seen for v in e.invars):
            seen.update(e.outvars)
    return seen


def test_whole_cache_waits_for_the_decode_params():
    """With the whole cache the unstacked decode params and the prefill's cache pass one
    optimization barrier, and the full-length cache is built from its outputs: the compiler
    cannot allocate the cache before the params' copy (the 8B rollout on v5p-8 did: the whole
    cache was live while the FP8 weights were unstacked, partly in two copies;
    docs/measurements/plan_targets.md)."""
    params = _random_params(TINY)
    tokens, mask = _left_padded(TINY, 3, 4, [1, 2, 3])
    run = functools.partial(
        sampler._sample_impl,
        cfg=TINY,
        max_new_tokens=10,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_ids=(),
        pad_id=0,
        num_samples=2,
        kv_fp8=False,
        segments=3,
        transpose=False,
        scan_layers=False,
        whole_cache=True,
    )
    eqns = jax.make_jaxpr(run)(params, tokens, mask, jax.random.key(1)).jaxpr.eqns
    bar = [e for e in eqns if e.primitive.name == "optimization_barrier"]
    assert len(bar) == 1
    shapes = [v.aval.shape for v in bar[0].invars]
    L, K, H = TINY.num_layers, TINY.num_kv_heads, TINY.head_dim
    assert shapes.count((K * H, TINY.hidden_size)) == 2 * L  # wk, wv of each layer, unstacked
    assert (L, 3, K, 4, H) in shapes  # the prefill's keys: 3 prompts, 4 slots
    after = _fed_by(eqns[eqns.index(bar[0]) + 1 :], set(bar[0].outvars))
    whole = [e for e in eqns if any(v.aval.shape == (6, K, 4 + 9, H) for v in e.outvars)]
    assert whole and all(set(e.outvars) <= after for e in whole)


def test_prefix_known_slices():
    """Keys ``[B, K, S, H]`` and values ``[B, K, H, S]`` cut on their slot axis; per-token
    scales with them; a per-layer fixed scale and a full window left alone."""
    k = jnp.arange(2 * 3 * 5 * 4).reshape(2, 3, 5, 4)
    np.testing.assert_array_equal(kv_cache.prefix(k, kv_cache.K_LAYOUT, 2), k[:, :, :2])
    v = jnp.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(kv_cache.prefix(v, kv_cache.V_LAYOUT, 3), v[..., :3])
    assert kv_cache.prefix(k, kv_cache.K_LAYOUT, None) is k
    assert kv_cache.prefix(k, kv_cache.K_LAYOUT, 5) is k
    q = QuantArray(value=k.astype(jnp.int8), scale=jnp.arange(10.0).reshape(2, 1, 5, 1))
    cut = kv_cache.prefix(q, kv_cache.K_LAYOUT, 2)
    np.testing.assert_array_equal(cut.value, q.value[:, :, :2])
    np.testing.assert_array_equal(cut.scale, [[[[0.0], [1.0]]], [[[5.0], [6.0]]]])
    fixed = QuantArray(
        value=k.astype(jnp.int8), act_scaling="prefill", scale=jnp.full((1, 1, 1, 1), 0.5)
    )
    cut = kv_cache.prefix(fixed, kv_cache.K_LAYOUT, 2)
    assert cut.value.shape == (2, 3, 2, 4) and cut.scale.shape == (1, 1, 1, 1)


@pytest.mark.slow  # ~8 s on 2 busy cores (load 6-8), eager
@pytest.mark.parametrize("scan_layers", [True])  # unrolled: the sampler test below
def test_extend_window_equals_the_cache_cut_to_it(scan_layers):
    """A decode step over a 12-slot cache attending to its first 8 slots gives the logits of
    the same step over the cache cut to 8 slots, and writes the same slots."""
    params = _random_params(TINY)
    tokens, mask = _left_padded(TINY, 2, 4, [1, 2])
    logits0, cache = decode.prefill(params, tokens, mask, TINY, 4)
    step = jnp.argmax(logits0[:, -1:], -1).astype(jnp.int32)
    ones = jnp.ones((2, 1), bool)
    ref, short = decode.extend(
        params, step, ones, kv_cache.resize_cache(cache, 1, 8), TINY, scan_layers=scan_layers
    )
    got, long = decode.extend(
        params,
        step,
        ones,
        kv_cache.resize_cache(cache, 1, 12),
        TINY,
        scan_layers=scan_layers,
        window=8,
    )
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(long.k[..., :8, :], short.k)
    np.testing.assert_array_equal(long.v[..., :8], short.v)
    assert not long.valid[:, 8:].any() and int(long.index) == 5


@pytest.mark.slow  # 8-17 s each on 2 busy cores (load 6-8; 2 sampler compiles each)
@pytest.mark.parametrize(("scan_layers", "kv_fp8"), [(False, False), (True, "int8")])
def test_whole_cache_samples_the_tokens_of_the_grown_cache(monkeypatch, scan_layers, kv_fp8):
    """The sampler with the whole cache (TPU's default, forced here on CPU) draws the same
    tokens and records the same log-probs, bit for bit, as with the cache grown per
    segment; it resizes the cache once instead of once per segment."""
    params = _random_params(TINY)
    if kv_fp8:
        params = fp8.to_rollout_params(params)
    tokens, mask = _left_padded(TINY, 3, 4, [1, 2, 3])
    calls, real = [], kv_cache.resize_cache

    def spy(cache, repeat, length):
        calls.append(length)
        return real(cache, repeat, length)

    monkeypatch.setattr(kv_cache, "resize_cache", spy)
    out = {}
    for whole in (False, True):
        monkeypatch.setattr(decode, "whole_cache_default", lambda mesh=None, w=whole: w)
        calls.clear()
        out[whole] = sampler.sample(
            params,
            tokens,
            mask,
            jax.random.key(1),
            TINY,
            max_new_tokens=10,
            num_samples=2,
            decode_segments=3,
            kv_fp8=kv_fp8,
            scan_layers=scan_layers,
        )
        assert calls == ([4 + 9] if whole else [4, 4 + 3, 4 + 6, 4 + 9])
    np.testing.assert_array_equal(out[True].tokens, out[False].tokens)
    np.testing.assert_array_equal(out[True].logp, out[False].logp)
    np.testing.assert_array_equal(out[True].mask, out[False].mask)
