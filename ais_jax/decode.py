"""KV-cached prefill and decode steps of the `ais_jax.model` decoder.

A decode step (`extend`) either scans over the stacked layers, compiling one
decoder block instead of ``L`` (the stacked cache buffers ride in the scan
carry and each layer writes its new keys / values into them in place), or
unrolls the layers over per-layer buffers (`unstack_cache`), which runs faster
but compiles ``L`` blocks; `scan_layers_default` chooses.  The same
`ais_jax.model._layer` serves the full-sequence forward, the prefill and the
decode step, for full-precision params and the FP8 rollout copy alike.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ais_jax.fp8 import E4M3, QuantArray, dequantize, quantize
from ais_jax.model import (
    ModelConfig,
    _embed,
    _layer,
    _logits,
    positions_from_mask,
    rope_inv_freq,
)

# On CPU the decode step scans over the layers of deeper models than this
# (see `scan_layers_default`).
UNROLL_MAX_LAYERS = 4

# Stored layout of one layer's keys / values: a permutation of the logical
# [B, S, K, H].  Keys [B, K, S, H] and values [B, K, H, S] are the operand
# layouts of the two attention matmuls on XLA CPU, so reading a layer needs no
# transposing copy (with [B, S, K, H] the copies made 1024-token decodes ~1.5x
# slower per step).  The stacked cache adds a leading L axis.
K_LAYOUT = (0, 2, 1, 3)
V_LAYOUT = (0, 2, 3, 1)
_ALL = "all"  # `_cache_write` layer argument: every layer of a stacked buffer


class KVCache(NamedTuple):
    """Keys and values of all layers for cached decoding (see `init_cache`, `extend`).

    Attributes:
      k: ``[L, B, K, S, H]`` keys (rotary already applied; `K_LAYOUT`), or a
        `QuantArray` (float8 ``value`` of that shape, float32 ``scale``
        ``[L, B, 1, S, 1]``: one scale per (layer, row, token)) for an FP8 cache.
      v: ``[L, B, K, H, S]`` values (`V_LAYOUT`; FP8 ``scale`` ``[L, B, 1, 1, S]``).
      valid: ``[B, S]`` bool, True where a slot holds a real (non-padding) token.
      pos: ``[B]`` int32, rotary position of the next token of each row.
      index: int32 scalar, the next cache slot to write (same for all rows).

    `unstack_cache` gives the per-layer form: ``k`` / ``v`` as ``L``-tuples of
    ``[B, K, S, H]`` / ``[B, K, H, S]`` buffers (what unrolled steps update).
    """

    k: Any
    v: Any
    valid: jax.Array
    pos: jax.Array
    index: jax.Array


def scan_layers_default(cfg: ModelConfig, backend: str | None = None) -> bool:
    """Whether a decode step scans over the layers (True) or unrolls them.

    Scanning compiles one decoder block instead of ``L``, but every step then
    slices each layer's weights and cache out of the stacked arrays, and XLA
    copies those slices (CPU and GPU alike; it does not fuse them into the
    matmuls).  Measured: on 2 CPU cores a 36-layer model's rollout program
    compiles in ~1.5 s scanned against ~16 s unrolled, while the 4-layer
    benchmark model decodes 13-17% slower scanned (FP8 weights: 70%); on an
    H200 a 16-layer 1B model decodes 2.1x (BF16) / 1.6x (FP8) faster
    unrolled and compiles about as fast (8.8 s against 7.5 s; a Qwen3-8B
    shape with 16 decode segments: 122 s against 24 s).  Rule: scan on CPU
    when ``cfg.num_layers > UNROLL_MAX_LAYERS`` (4); unroll otherwise and on
    every other backend (GPU; TPU not measured).

    Args:
      cfg: model config.
      backend: JAX backend name; default `jax.default_backend()`.

    Returns:
      True to scan over the layers.
    """
    backend = jax.default_backend() if backend is None else backend
    return backend == "cpu" and cfg.num_layers > UNROLL_MAX_LAYERS


def _order(perm: tuple, stacked: bool) -> tuple:
    """Transposition from logical ``[(L,) B, S, K, H]`` to the stored layout ``perm``."""
    return (0, *(p + 1 for p in perm)) if stacked else perm


def _slot_axis(perm: tuple, stacked: bool) -> int:
    return perm.index(1) + int(stacked)


def init_cache(
    cfg: ModelConfig,
    batch: int,
    length: int,
    dtype: Any = jnp.bfloat16,
    *,
    fp8: bool = False,
) -> KVCache:
    """An empty cache of ``length`` slots for ``batch`` rows.

    Args:
      cfg: model config.
      batch: rows ``B``.
      length: slots ``S`` (prompt plus generated tokens).
      dtype: element type of a full-precision cache (ignored when ``fp8``).
      fp8: store keys / values as float8 E4M3 with one float32 scale per
        (layer, row, token), dequantized when attended to. Not part of the
        paper's recipe (it keeps the KV cache in BF16); off by default.

    Returns:
      `KVCache` of zeros (keys ``[L, B, K, S, H]``, values ``[L, B, K, H, S]``),
      no valid slot, positions and index 0.
    """
    L, logical = cfg.num_layers, (batch, length, cfg.num_kv_heads, cfg.head_dim)

    def empty(perm: tuple) -> Any:
        shape = (L, *(logical[p] for p in perm))
        if fp8:
            scale = (L, *((batch, length, 1, 1)[p] for p in perm))
            return QuantArray(value=jnp.zeros(shape, E4M3), scale=jnp.ones(scale, jnp.float32))
        return jnp.zeros(shape, dtype)

    return KVCache(k=empty(K_LAYOUT), v=empty(V_LAYOUT),
                   valid=jnp.zeros((batch, length), jnp.bool_),
                   pos=jnp.zeros((batch,), jnp.int32), index=jnp.zeros((), jnp.int32))


def _cache_write(c: Any, new: jax.Array, perm: tuple, layer: Any, index: jax.Array) -> Any:
    """Write logical ``new`` into a stored buffer ``c`` at slot ``index``.

    ``layer``: a layer index of the stacked buffer ``c`` (``new`` ``[B, T, K, H]``);
    ``"all"``: every layer (``new`` ``[L, B, T, K, H]``); None: ``c`` is one
    layer's buffer (``new`` ``[B, T, K, H]``).
    """
    stacked = layer is not None
    if stacked and not isinstance(layer, str):
        new = new[None]
    start = [0] * new.ndim
    start[_slot_axis(perm, stacked)] = index
    if stacked and not isinstance(layer, str):
        start[0] = layer
    order = _order(perm, stacked)
    if isinstance(c, QuantArray):  # one scale per (row, token)
        q = quantize(new, dtype=c.value.dtype, axes=(-2, -1))  # scale [.., B, T, 1, 1]
        return QuantArray(
            value=jax.lax.dynamic_update_slice(c.value, jnp.transpose(q.value, order), start),
            scale=jax.lax.dynamic_update_slice(c.scale, jnp.transpose(q.scale, order), start))
    return jax.lax.dynamic_update_slice(c, jnp.transpose(new.astype(c.dtype), order), start)


def _cache_read(c: Any, perm: tuple, layer: Any, dtype: Any) -> jax.Array:
    """One layer of a stored buffer, viewed as logical ``[B, S, K, H]`` in ``dtype``.

    ``layer``: a layer index of the stacked buffer ``c``; None: ``c`` is one layer.
    The view's transposition folds into the attention matmuls (no copy).
    """
    if layer is not None:
        c = jax.tree_util.tree_map(
            lambda a: jax.lax.dynamic_index_in_dim(a, layer, keepdims=False), c)
    x = dequantize(c, dtype) if isinstance(c, QuantArray) else c.astype(dtype)
    return jnp.transpose(x, tuple(perm.index(i) for i in range(4)))


def _cache_update(cache_kv: tuple, k: jax.Array, v: jax.Array, index: jax.Array, dtype: Any,
                  layer: Any = None) -> tuple:
    """Write this step's ``k`` / ``v`` ``[B, T, K, H]``; return (new buffers, read views).

    ``cache_kv``: the stacked ``(k, v)`` of a `KVCache` with ``layer`` a layer
    index, or one layer's ``(k, v)`` buffers with ``layer=None``.
    """
    ck, cv = cache_kv
    ck = _cache_write(ck, k, K_LAYOUT, layer, index)
    cv = _cache_write(cv, v, V_LAYOUT, layer, index)
    return (ck, cv), (_cache_read(ck, K_LAYOUT, layer, dtype),
                      _cache_read(cv, V_LAYOUT, layer, dtype))


def resize_cache(cache: KVCache, repeat: int, length: int) -> KVCache:
    """Repeat each row ``repeat`` times (group sampling) and grow the slots to ``length``.

    Args:
      cache: a cache of ``B`` rows and ``S <= length`` slots.
      repeat: copies of each row (row ``b`` becomes rows ``b*repeat .. b*repeat+repeat-1``).
      length: slots of the result (new slots empty: invalid, FP8 scale 1).

    Returns:
      `KVCache` of ``B * repeat`` rows and ``length`` slots.
    """
    S = cache.valid.shape[1]

    def fix(x: jax.Array, row_axis: int, slot_axis: int, fill: Any = 0) -> jax.Array:
        if repeat > 1:
            x = jnp.repeat(x, repeat, axis=row_axis)
        pad = [(0, 0)] * x.ndim
        pad[slot_axis] = (0, length - S)
        return jnp.pad(x, pad, constant_values=fill)

    def buf(c: Any, perm: tuple, stacked: bool = True) -> Any:
        if isinstance(c, tuple):  # per-layer buffers (`unstack_cache`)
            return tuple(buf(b, perm, False) for b in c)
        row, slot = int(stacked), _slot_axis(perm, stacked)
        if isinstance(c, QuantArray):
            return QuantArray(value=fix(c.value, row, slot), scale=fix(c.scale, row, slot, 1.0))
        return fix(c, row, slot)

    pos = jnp.repeat(cache.pos, repeat, axis=0) if repeat > 1 else cache.pos
    return KVCache(k=buf(cache.k, K_LAYOUT), v=buf(cache.v, V_LAYOUT),
                   valid=fix(cache.valid, 0, 1, False), pos=pos, index=cache.index)


def prefill(
    params: dict,
    tokens: jax.Array,
    mask: jax.Array,
    cfg: ModelConfig,
    length: int,
    *,
    dtype: Any = None,
    fp8: bool = False,
    last_only: bool = False,
) -> tuple[jax.Array, KVCache]:
    """Full causal pass over left-padded prompts that keeps their keys / values.

    The same computation as `ais_jax.model.forward` (a `lax.scan` over the
    stacked layers), returning a cache of ``length >= T`` slots with the prompt
    in slots ``0 .. T-1``; equal to `extend` on an empty cache (for an FP8
    cache the prompt attends to its unquantized keys).

    Args:
      params: stacked full-precision or FP8 rollout params.
      tokens: ``[B, T]`` prompt ids.
      mask: ``[B, T]`` validity (left padding 0).
      cfg: model config.
      length: cache slots ``S``.
      dtype: cache element type (default: the embedding's dtype).
      fp8: FP8 cache (see `init_cache`).
      last_only: apply the output projection to the last position only (what a
        sampler needs: ``[B, 1, V]`` instead of ``[B, T, V]``, which at a 150k
        vocabulary is the largest buffer of a long prompt's prefill).  An FP8
        lm_head then scales its activations over those rows only, as an
        inference engine that projects only the last position does.

    Returns:
      ``(logits [B, T, V] float32, cache)``; ``[B, 1, V]`` with ``last_only``.
    """
    B, T = tokens.shape
    mask = mask.astype(jnp.bool_)
    pos = positions_from_mask(mask)
    attn_mask = jnp.tril(jnp.ones((T, T), jnp.bool_))[None] & mask[:, None, :]  # [B, T, T]
    attn_mask = attn_mask | jnp.eye(T, dtype=jnp.bool_)[None]
    inv_freq = rope_inv_freq(cfg)
    x = _embed(params, tokens)

    def body(x, lp):
        return _layer(x, lp, pos, attn_mask, inv_freq, cfg, rows=mask)

    x, (ks, vs) = jax.lax.scan(body, x, params["layers"])  # ks, vs [L, B, T, K, H]
    dtype = params["embed"].dtype if dtype is None else dtype
    cache = init_cache(cfg, B, length, dtype, fp8=fp8)
    valid = jnp.zeros((B, length), jnp.bool_).at[:, :T].set(mask)
    zero = jnp.zeros((), jnp.int32)
    cache = KVCache(k=_cache_write(cache.k, ks, K_LAYOUT, _ALL, zero),
                    v=_cache_write(cache.v, vs, V_LAYOUT, _ALL, zero), valid=valid,
                    pos=jnp.sum(mask, -1, dtype=jnp.int32), index=jnp.full((), T, jnp.int32))
    if last_only:
        x, mask = x[:, -1:], mask[:, -1:]
    return _logits(params, x, cfg, mask), cache


def unstack_layers(params: dict, cfg: ModelConfig) -> dict:
    """``params`` with ``layers`` as an ``L``-tuple of per-layer dicts (for unrolled steps).

    Slicing the stacked weights once, outside a decode loop, keeps the per-layer
    copies out of every step. Accepts already-unstacked params unchanged.
    """
    layers = params["layers"]
    if isinstance(layers, tuple | list):
        return params
    per_layer = tuple(
        jax.tree_util.tree_map(lambda w, l=l: w[l], layers) for l in range(cfg.num_layers)
    )
    return {**params, "layers": per_layer}


def _stack(bufs: Any) -> Any:
    return jax.tree_util.tree_map(lambda *b: jnp.stack(b), *bufs)


def _unstack(buf: Any) -> tuple:
    n = jax.tree_util.tree_leaves(buf)[0].shape[0]
    return tuple(jax.tree_util.tree_map(lambda b, l=l: b[l], buf) for l in range(n))


def unstack_cache(cache: KVCache) -> KVCache:
    """``cache`` with ``k`` / ``v`` as ``L``-tuples of per-layer buffers (for unrolled steps).

    An unrolled decode step writes and reads each layer's own buffer, without
    slicing a stacked one (on CPU a slice is a copy of that layer's keys and
    values at every step).  `extend` returns a cache in the form it is given.
    Accepts an already-unstacked cache unchanged.
    """
    if isinstance(cache.k, tuple):
        return cache
    return cache._replace(k=_unstack(cache.k), v=_unstack(cache.v))


def _scan_layers(x, layers, ck, cv, run, index, dtype):
    """Run the stacked ``layers`` over ``x`` in a `lax.scan`; returns ``(x, ck, cv)``.

    The stacked cache buffers ride in the scan carry and each layer writes its
    new token into them with a `lax.dynamic_update_slice` at its layer index,
    in place.  (Scanning the buffers as ``xs`` with the updated layers as
    ``ys`` instead rebuilt the whole cache at every step: twice as slow at 512
    slots on CPU.)
    """
    def body(carry, lp):
        x, ck, cv, l = carry

        def kv(k, v):
            return _cache_update((ck, cv), k, v, index, dtype, l)

        x, (ck, cv) = run(x, lp, kv)
        return (x, ck, cv, l + 1), None

    (x, ck, cv, _), _ = jax.lax.scan(body, (x, ck, cv, jnp.zeros((), jnp.int32)), layers)
    return x, ck, cv


def extend(
    params: dict,
    tokens: jax.Array,
    mask: jax.Array,
    cache: KVCache,
    cfg: ModelConfig,
    *,
    scan_layers: bool | None = None,
) -> tuple[jax.Array, KVCache]:
    """Run ``T`` new tokens through the model, writing them into the cache.

    Prefill is ``extend`` with the (left-padded) prompt on an empty cache; a
    decode step is ``extend`` with ``T = 1``.  The layers run as a `lax.scan`
    over the stacked params and cache (or unrolled, see ``scan_layers``), with
    the same `ais_jax.model._layer` as `ais_jax.model.forward`.

    Args:
      params: full-precision or FP8 rollout params, stacked (as from
        `ais_jax.model.init_params`); unrolled steps also take unstacked
        params (`unstack_layers`).
      tokens: ``[B, T]`` new token ids.
      mask: ``[B, T]`` validity of the new tokens (padding is never attended to).
      cache: current cache, stacked or per layer (`unstack_cache`; cheaper for
        unrolled steps inside a loop); ``cache.index + T`` must not exceed
        its length.
      cfg: model config.
      scan_layers: scan over the layers (True) or unroll them (False);
        None: `scan_layers_default`.

    Returns:
      ``(logits [B, T, V] float32, updated cache)`` (in the form of ``cache``).
    """
    T = tokens.shape[1]
    S = cache.valid.shape[1]
    mask = mask.astype(jnp.bool_)
    pos = cache.pos[:, None] + positions_from_mask(mask)  # [B, T]
    valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, cache.index))  # [B, S]
    slot = jnp.arange(S)
    qslot = cache.index + jnp.arange(T)
    attn_mask = (slot[None, :] <= qslot[:, None])[None] & valid[:, None, :]  # [B, T, S]
    attn_mask = attn_mask | (slot[None, :] == qslot[:, None])[None]
    inv_freq = rope_inv_freq(cfg)
    x = _embed(params, tokens)
    dtype = x.dtype

    def run(x, lp, kv):
        return _layer(x, lp, pos, attn_mask, inv_freq, cfg, kv_update=kv, rows=mask)

    if scan_layers is None:
        scan_layers = scan_layers_default(cfg)
    stacked = not isinstance(cache.k, tuple)
    index = cache.index
    if scan_layers:
        ck, cv = (cache.k, cache.v) if stacked else (_stack(cache.k), _stack(cache.v))
        layers = params["layers"]
        layers = _stack(layers) if isinstance(layers, tuple | list) else layers
        x, ck, cv = _scan_layers(x, layers, ck, cv, run, index, dtype)
        ck, cv = (ck, cv) if stacked else (_unstack(ck), _unstack(cv))
    else:
        layers = unstack_layers(params, cfg)["layers"]
        c = unstack_cache(cache) if stacked else cache
        ks, vs = [], []
        for lp, lk, lv in zip(layers, c.k, c.v, strict=True):
            x, (lk, lv) = run(x, lp, lambda k, v, c=(lk, lv): _cache_update(c, k, v, index, dtype))
            ks.append(lk)
            vs.append(lv)
        ck, cv = (_stack(ks), _stack(vs)) if stacked else (tuple(ks), tuple(vs))
    logits = _logits(params, x, cfg, mask)
    new_pos = cache.pos + jnp.sum(mask.astype(jnp.int32), -1)
    return logits, KVCache(k=ck, v=cv, valid=valid, pos=new_pos, index=cache.index + T)
