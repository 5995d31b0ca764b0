"""The KV cache of the `ais_jax.models.model` decoder: its buffers, writes, reads and resizing.

A `KVCache` holds the keys and values of all layers (stacked on a leading ``L``
axis, or one buffer per layer after `unstack_cache`), in the operand layouts of
the attention matmuls, optionally as float8 `ais_jax.models.fp8.QuantArray`
buffers with one scale per (layer, row, token).  The model's layer function
calls `cache_update`; the prefill / decode steps (`ais_jax.models.decode`) build
and grow the cache.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ais_jax.models.fp8 import E4M3, QuantArray, dequantize, quantize, quantize_static
from ais_jax.models.int8 import INT8, is_int8
from ais_jax.models.layout import ModelConfig

# Stored layout of one layer's keys / values: a permutation of the logical
# [B, S, K, H].  Keys [B, K, S, H] and values [B, K, H, S] are the operand
# layouts of the two attention matmuls on XLA CPU, so reading a layer needs no
# transposing copy (with [B, S, K, H] the copies made 1024-token decodes ~1.5x
# slower per step).  The stacked cache adds a leading L axis.
K_LAYOUT = (0, 2, 1, 3)
V_LAYOUT = (0, 2, 3, 1)
ALL_LAYERS = "all"  # `cache_write` layer argument: every layer of a stacked buffer


class KVCache(NamedTuple):
    """Keys and values of all layers for cached decoding (see `init_cache`, `extend`).

    Attributes:
      k: ``[L, B, K, S, H]`` keys (rotary already applied; `K_LAYOUT`), or a
        `QuantArray` (float8 ``value`` of that shape, float32 ``scale``
        ``[L, B, 1, S, 1]``: one scale per (layer, row, token)) for an FP8 cache,
        or, with ``act_scaling="prefill"`` on the `QuantArray`, ``[L, 1, 1, 1, 1]``:
        one scale per layer fixed by the prefill (`is_fixed_scale`).
      v: ``[L, B, K, H, S]`` values (`V_LAYOUT`; FP8 ``scale`` ``[L, B, 1, 1, S]``).
      valid: ``[B, S]`` bool, True where a slot holds a real (non-padding) token.
      pos: ``[B]`` int32, rotary position of the next token of each row.
      index: int32 scalar, the next cache slot to write (same for all rows).
      act_scales: None, or float32 ``[L, 4]`` fixed activation scales of the FP8
        linears (``act_scaling="prefill"``: set by the prefill, read by every
        decode step; `ais_jax.models.model.ACT_INPUTS` order; ``L`` tuples of 4
        scalars after `unstack_cache`).

    `unstack_cache` gives the per-layer form: ``k`` / ``v`` as ``L``-tuples of
    ``[B, K, S, H]`` / ``[B, K, H, S]`` buffers (what unrolled steps update).
    """

    k: Any
    v: Any
    valid: jax.Array
    pos: jax.Array
    index: jax.Array
    act_scales: Any = None


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
    fp8: bool | str = False,
    kv_scales: tuple[jax.Array, jax.Array] | None = None,
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
        ``"int8"``: the same with int8 values (`kv_dtype`), whose scales fold
        into the attention instead (`cache_read`: no dequantized copy).
      kv_scales: with ``fp8``, optional float32 ``[L]`` key and value scales,
        one per layer and fixed (``act_scaling="prefill"``): writes quantize
        elementwise with them (no reduction, no scale buffer to update).

    Returns:
      `KVCache` of zeros (keys ``[L, B, K, S, H]``, values ``[L, B, K, H, S]``),
      no valid slot, positions and index 0.
    """
    L, logical = cfg.num_layers, (batch, length, cfg.num_kv_heads, cfg.head_dim)
    qdtype = kv_dtype(fp8)

    def empty(perm: tuple, fixed: Any) -> Any:
        shape = (L, *(logical[p] for p in perm))
        if fp8 and fixed is not None:
            return QuantArray(
                value=jnp.zeros(shape, qdtype),
                act_scaling="prefill",
                scale=jnp.asarray(fixed, jnp.float32).reshape(L, 1, 1, 1, 1),
            )
        if fp8:
            scale = (L, *((batch, length, 1, 1)[p] for p in perm))
            return QuantArray(value=jnp.zeros(shape, qdtype), scale=jnp.ones(scale, jnp.float32))
        return jnp.zeros(shape, dtype)

    sk, sv = (None, None) if kv_scales is None else kv_scales
    return KVCache(
        k=empty(K_LAYOUT, sk),
        v=empty(V_LAYOUT, sv),
        valid=jnp.zeros((batch, length), jnp.bool_),
        pos=jnp.zeros((batch,), jnp.int32),
        index=jnp.zeros((), jnp.int32),
    )


def kv_dtype(fp8: bool | str) -> Any:
    """The element type of a quantized cache (`init_cache`'s ``fp8``): int8 for ``"int8"``,
    E4M3 for any other true value, None for False."""
    return INT8 if fp8 == "int8" else (E4M3 if fp8 else None)


def is_fixed_scale(c: Any) -> bool:
    """Whether a cache buffer is float8 with fixed per-layer scales (see `init_cache`)."""
    return isinstance(c, QuantArray) and c.act_scaling == "prefill"


def is_per_token_int8(c: Any) -> bool:
    """Whether a cache buffer is int8 with one scale per (row, token) (read as a `ScaledView`)."""
    return isinstance(c, QuantArray) and not is_fixed_scale(c) and is_int8(c.value.dtype)


def cache_write(c: Any, new: jax.Array, perm: tuple, layer: Any, index: jax.Array) -> Any:
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
    if is_fixed_scale(c):  # a fixed scale per layer: elementwise, fuses into the update
        s = c.scale
        if stacked and not isinstance(layer, str):
            s = jax.lax.dynamic_slice_in_dim(s, layer, 1)  # [1, 1, 1, 1, 1]
        q = quantize_static(new, s, dtype=c.value.dtype)
        return c.replace(
            value=jax.lax.dynamic_update_slice(c.value, jnp.transpose(q.value, order), start)
        )
    if isinstance(c, QuantArray):  # one scale per (row, token)
        q = quantize(new, dtype=c.value.dtype, axes=(-2, -1))  # scale [.., B, T, 1, 1]
        return QuantArray(
            value=jax.lax.dynamic_update_slice(c.value, jnp.transpose(q.value, order), start),
            scale=jax.lax.dynamic_update_slice(c.scale, jnp.transpose(q.scale, order), start),
        )
    return jax.lax.dynamic_update_slice(c, jnp.transpose(new.astype(c.dtype), order), start)


class ScaledView(NamedTuple):
    """A quantized cache layer as the attention reads it: ``x * scale``, never materialized.

    ``x``: ``[B, S, K, H]`` float8 / int8 values converted exactly to the compute
    dtype (the convert fuses into the attention matmul); ``scale``: float32, either
    a scalar (a fixed-scale cache, `is_fixed_scale`: applied to the matmul's
    float32 result) or ``[B, S]``, one per (row, token) (an int8 cache: the key
    scale multiplies the scores, the value scale the probabilities;
    `ais_jax.models.attention.reference`).
    """

    x: jax.Array
    scale: jax.Array


def cache_read(
    c: Any, perm: tuple, layer: Any, dtype: Any, window: int | None = None
) -> jax.Array | ScaledView:
    """One layer of a stored buffer, viewed as logical ``[B, S, K, H]`` in ``dtype``.

    ``layer``: a layer index of the stacked buffer ``c``; None: ``c`` is one layer.
    ``window``: view only the first ``window`` slots (`prefix`; None: all ``S``).
    The view's transposition folds into the attention matmuls (no copy).  A
    fixed-scale FP8 buffer (`is_fixed_scale`) gives a `ScaledView` with a scalar
    scale, an int8 buffer with per-(row, token) scales one with ``[B, S]`` scales
    (`is_per_token_int8`): no dequantized copy of the cache.
    """
    if layer is not None:
        c = jax.tree_util.tree_map(
            lambda a: jax.lax.dynamic_index_in_dim(a, layer, keepdims=False), c
        )
    c = prefix(c, perm, window)
    order = tuple(perm.index(i) for i in range(4))
    if is_fixed_scale(c):
        return ScaledView(jnp.transpose(c.value.astype(dtype), order), c.scale.reshape(()))
    if is_per_token_int8(c):  # the scales fold into the scores / probabilities
        B, S = c.value.shape[perm.index(0)], c.value.shape[perm.index(1)]
        return ScaledView(jnp.transpose(c.value.astype(dtype), order), c.scale.reshape(B, S))
    x = dequantize(c, dtype) if isinstance(c, QuantArray) else c.astype(dtype)
    return jnp.transpose(x, order)


def prefix(c: Any, perm: tuple, window: int | None) -> Any:
    """The first ``window`` slots of one layer's stored buffer ``c`` (layout ``perm``), its
    per-token scales too; ``c`` itself when ``window`` is None or covers every slot.  A static
    slice: on TPU it fuses into the attention matmul that reads it (no copy)."""
    axis = _slot_axis(perm, False)
    S = (c.value if isinstance(c, QuantArray) else c).shape[axis]
    if window is None or window >= S:
        return c
    return jax.tree_util.tree_map(
        lambda a: jax.lax.slice_in_dim(a, 0, window, axis=axis) if a.shape[axis] == S else a, c
    )


def cache_update(
    cache_kv: tuple,
    k: jax.Array,
    v: jax.Array,
    index: jax.Array,
    dtype: Any,
    layer: Any = None,
    window: int | None = None,
) -> tuple:
    """Write this step's ``k`` / ``v`` ``[B, T, K, H]``; return (new buffers, read views).

    ``cache_kv``: the stacked ``(k, v)`` of a `KVCache` with ``layer`` a layer
    index, or one layer's ``(k, v)`` buffers with ``layer=None``.  ``window``: the
    views cover the first ``window`` slots only (`cache_read`; the writes must land there).
    """
    ck, cv = cache_kv
    ck = cache_write(ck, k, K_LAYOUT, layer, index)
    cv = cache_write(cv, v, V_LAYOUT, layer, index)
    return (ck, cv), (
        cache_read(ck, K_LAYOUT, layer, dtype, window),
        cache_read(cv, V_LAYOUT, layer, dtype, window),
    )


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
        if is_fixed_scale(c):
            return c.replace(value=fix(c.value, row, slot))
        if isinstance(c, QuantArray):
            return QuantArray(value=fix(c.value, row, slot), scale=fix(c.scale, row, slot, 1.0))
        return fix(c, row, slot)

    pos = jnp.repeat(cache.pos, repeat, axis=0) if repeat > 1 else cache.pos
    return KVCache(
        k=buf(cache.k, K_LAYOUT),
        v=buf(cache.v, V_LAYOUT),
        valid=fix(cache.valid, 0, 1, False),
        pos=pos,
        index=cache.index,
        act_scales=cache.act_scales,
    )


def stack_buffers(bufs: Any) -> Any:
    return jax.tree_util.tree_map(lambda *b: jnp.stack(b), *bufs)


def unstack_buffer(buf: Any) -> tuple:
    n = jax.tree_util.tree_leaves(buf)[0].shape[0]
    return tuple(jax.tree_util.tree_map(lambda b, l=l: b[l], buf) for l in range(n))


def unstack_cache(cache: KVCache) -> KVCache:
    """``cache`` with ``k`` / ``v`` as ``L``-tuples of per-layer buffers (for unrolled steps).

    An unrolled decode step writes and reads each layer's own buffer, without
    slicing a stacked one (on CPU a slice is a copy of that layer's keys and
    values at every step).  `extend` returns a cache in the form it is given.
    Fixed activation scales ``[L, 4]`` become ``L`` tuples of 4 float32 scalars,
    so a decode loop's body slices nothing out of them (on TPU each slice was a
    kernel of its own, every step).  Accepts an already-unstacked cache unchanged.
    """
    if isinstance(cache.k, tuple):
        return cache
    s = cache.act_scales
    if s is not None and not isinstance(s, tuple):
        s = tuple(tuple(s[l, i] for i in range(s.shape[1])) for l in range(s.shape[0]))
    return cache._replace(k=unstack_buffer(cache.k), v=unstack_buffer(cache.v), act_scales=s)
