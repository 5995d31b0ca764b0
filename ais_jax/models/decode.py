"""KV-cached prefill and decode steps of the `ais_jax.models.model` decoder.

A decode step (`extend`) either scans over the stacked layers, compiling one
decoder block instead of ``L`` (the stacked cache buffers ride in the scan
carry and each layer writes its new keys / values into them in place), or
unrolls the layers over per-layer buffers (`unstack_cache`), which runs faster
but compiles ``L`` blocks; `scan_layers_default` chooses.  The same
`ais_jax.models.model._layer` serves the full-sequence forward, the prefill and the
decode step, for full-precision params and the FP8 rollout copy alike.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.models import fp8 as fp8_lib
from ais_jax.models.attention import causal_mask
from ais_jax.models.kv_cache import (
    ALL_LAYERS,
    K_LAYOUT,
    V_LAYOUT,
    KVCache,
    cache_update,
    cache_write,
    init_cache,
    kv_dtype,
    stack_buffers,
    unstack_buffer,
    unstack_cache,
)
from ais_jax.models.model import (
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


def whole_cache_default(backend: str | None = None, mesh: Any = None) -> bool:
    """Whether the sampler allocates the decode's whole KV cache once (True) or grows it per
    decode segment (`ais_jax.rollout.sampler`).

    Each segment attends to a statically sized prefix of the cache.  Grown, every segment
    pads each layer's buffers into larger new ones, and the TPU compiler's heap keeps the old
    buffers' holes beside the new ones (the Qwen3-0.6B rollout on v6e-1: 2.27 GB of holes at
    the peak).  Whole, the cache is allocated once at its final length and each segment reads
    its prefix by a static slice, which the TPU compiler fuses into the attention matmuls (no
    copy); the sampler builds it only after the decode's unstacked params (an optimization
    barrier), else the compiler may allocate it while the FP8 weights exist twice (stacked and
    unstacked: Qwen3-8B on v5p-8, ``mesh.fsdp=4``, 29.61 GB).  Measured by the plan
    (docs/measurements/plan_targets.md), rollout, cache grown -> whole: Qwen3-0.6B on one v6e
    chip 31.15 -> 27.64 GB, Qwen3-8B on v5p-8 26.96 -> 25.75 GB.  XLA CPU / GPU may copy such
    a slice in every step: they grow the cache.  The same slots are read either way (the same
    numbers).

    Args:
      backend: JAX backend name; default `jax.default_backend()`.
      mesh: the program's device mesh (None: one device); any size.

    Returns:
      True on TPU.
    """
    del mesh  # every TPU mesh since the barrier (the 8B on v5p-8 is smaller with it)
    backend = jax.default_backend() if backend is None else backend
    return backend == "tpu"


def prefill(
    params: dict,
    tokens: jax.Array,
    mask: jax.Array,
    cfg: ModelConfig,
    length: int,
    *,
    dtype: Any = None,
    fp8: bool | str = False,
    last_only: bool = False,
    mesh: Any = None,
) -> tuple[jax.Array, KVCache]:
    """Full causal pass over left-padded prompts that keeps their keys / values.

    With ``act_scaling="prefill"`` FP8 params (`prefill_scaled_format`) the
    pass also fixes the decode steps' scales: per layer, the masked amax of
    each FP8 linear's input (``cache.act_scales`` ``[L, 4]``) and, with an FP8
    cache, of the prompt's keys and values (one fixed scale per layer and
    buffer), each times `ais_jax.models.fp8.PREFILL_HEADROOM`.

    The same computation as `ais_jax.models.model.forward` (a `lax.scan` over the
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
      fp8: FP8 cache, or ``"int8"``: an int8 one (see `init_cache`).
      last_only: apply the output projection to the last position only (what a
        sampler needs: ``[B, 1, V]`` instead of ``[B, T, V]``, which at a 150k
        vocabulary is the largest buffer of a long prompt's prefill).  An FP8
        lm_head then scales its activations over those rows only, as an
        inference engine that projects only the last position does.
      mesh: the program's device mesh, for the TPU attention kernel on several devices
        (`ais_jax.models.attention.attend`); None: one device.

    Returns:
      ``(logits [B, T, V] float32, cache)``; ``[B, 1, V]`` with ``last_only``.
    """
    B, T = tokens.shape
    mask = mask.astype(jnp.bool_)
    pos = positions_from_mask(mask)
    attn_mask = causal_mask(mask)
    inv_freq = rope_inv_freq(cfg)
    x = _embed(params, tokens)

    act_fmt = prefill_scaled_format(params)

    def body(x, lp):
        return _layer(x, lp, pos, attn_mask, inv_freq, cfg, rows=mask,
                      calibrate=act_fmt is not None, mesh=mesh)

    x, ys = jax.lax.scan(body, x, params["layers"])
    act_scales = kv_scales = None
    if act_fmt is None:
        ks, vs = ys  # [L, B, T, K, H]
    else:  # act_scaling="prefill": fix the decode's scales from this pass's amaxes
        (ks, vs), amax = ys  # amax [L, 4]
        act_scales = fp8_lib.prefill_scale(amax, act_fmt)
        if fp8:
            rows = mask[None, :, :, None, None]
            kv_scales = tuple(fp8_lib.prefill_scale(jnp.max(jnp.where(rows, jnp.abs(
                a.astype(jnp.float32)), 0.0), axis=(1, 2, 3, 4)), kv_dtype(fp8))
                for a in (ks, vs))
    dtype = params["embed"].dtype if dtype is None else dtype
    cache = init_cache(cfg, B, length, dtype, fp8=fp8, kv_scales=kv_scales)
    valid = jnp.zeros((B, length), jnp.bool_).at[:, :T].set(mask)
    zero = jnp.zeros((), jnp.int32)
    cache = KVCache(k=cache_write(cache.k, ks, K_LAYOUT, ALL_LAYERS, zero),
                    v=cache_write(cache.v, vs, V_LAYOUT, ALL_LAYERS, zero), valid=valid,
                    pos=jnp.sum(mask, -1, dtype=jnp.int32), index=jnp.full((), T, jnp.int32),
                    act_scales=act_scales)
    if last_only:
        x, mask = x[:, -1:], mask[:, -1:]
    return _logits(params, x, cfg, mask), cache


def prefill_scaled_format(params: dict) -> Any:
    """The float8 dtype of ``act_scaling="prefill"`` block linears in ``params``, else None."""
    layers = params["layers"]
    for lp in layers if isinstance(layers, tuple | list) else (layers,):
        for w in lp.values():
            w = getattr(w, "base", w)  # a LoRA weight's base
            if isinstance(w, fp8_lib.QuantArray) and w.act_scaling == "prefill":
                return w.value.dtype
    return None


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


def _scan_layers(x, layers, ck, cv, run, index, dtype, window=None):
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
            return cache_update((ck, cv), k, v, index, dtype, l, window)

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
    window: int | None = None,
) -> tuple[jax.Array, KVCache]:
    """Run ``T`` new tokens through the model, writing them into the cache.

    Prefill is ``extend`` with the (left-padded) prompt on an empty cache; a
    decode step is ``extend`` with ``T = 1``.  The layers run as a `lax.scan`
    over the stacked params and cache (or unrolled, see ``scan_layers``), with
    the same `ais_jax.models.model._layer` as `ais_jax.models.model.forward`.

    Args:
      params: full-precision or FP8 rollout params, stacked (as from
        `ais_jax.models.model.init_params`); unrolled steps also take unstacked
        params (`unstack_layers`).
      tokens: ``[B, T]`` new token ids.
      mask: ``[B, T]`` validity of the new tokens (padding is never attended to).
      cache: current cache, stacked or per layer (`unstack_cache`; cheaper for
        unrolled steps inside a loop); ``cache.index + T`` must not exceed
        its length.
      cfg: model config.
      scan_layers: scan over the layers (True) or unroll them (False);
        None: `scan_layers_default`.
      window: attend to the first ``window`` slots of the cache only (static; the new
        tokens' slots must lie there): a decode loop that allocates its whole cache once
        (`whole_cache_default`) reads the prefix its segment has filled.  None: every slot.

    Returns:
      ``(logits [B, T, V] float32, updated cache)`` (in the form of ``cache``).
    """
    T = tokens.shape[1]
    mask = mask.astype(jnp.bool_)
    pos = cache.pos[:, None] + positions_from_mask(mask)  # [B, T]
    valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, cache.index))  # [B, S]
    seen = valid if window is None or window >= valid.shape[1] else valid[:, :window]
    attn_mask = causal_mask(seen, cache.index, T)  # slots <= each query's, and its own
    inv_freq = rope_inv_freq(cfg)
    x = _embed(params, tokens)
    dtype = x.dtype

    def run(x, lp, kv):
        return _layer(x, lp, pos, attn_mask, inv_freq, cfg, kv_update=kv, rows=mask)

    if scan_layers is None:
        scan_layers = scan_layers_default(cfg)
    stacked = not isinstance(cache.k, tuple)
    index = cache.index
    scales = cache.act_scales  # [L, 4] fixed FP8 activation scales, or None
    if scan_layers:
        ck, cv = (cache.k, cache.v) if stacked else (stack_buffers(cache.k), stack_buffers(cache.v))
        layers = params["layers"]
        layers = stack_buffers(layers) if isinstance(layers, tuple | list) else layers
        if scales is not None:
            layers = {**layers, "act_scales": jnp.asarray(scales, jnp.float32)}
        x, ck, cv = _scan_layers(x, layers, ck, cv, run, index, dtype, window)
        ck, cv = (ck, cv) if stacked else (unstack_buffer(ck), unstack_buffer(cv))
    else:
        layers = unstack_layers(params, cfg)["layers"]
        if scales is not None:
            layers = tuple({**lp, "act_scales": scales[l]} for l, lp in enumerate(layers))
        c = unstack_cache(cache) if stacked else cache
        ks, vs = [], []
        for lp, lk, lv in zip(layers, c.k, c.v, strict=True):
            x, (lk, lv) = run(x, lp, lambda k, v, c=(lk, lv): cache_update(
                c, k, v, index, dtype, window=window))
            ks.append(lk)
            vs.append(lv)
        ck, cv = (stack_buffers(ks), stack_buffers(vs)) if stacked else (tuple(ks), tuple(vs))
    logits = _logits(params, x, cfg, mask)
    new_pos = cache.pos + jnp.sum(mask.astype(jnp.int32), -1)
    return logits, KVCache(k=ck, v=cv, valid=valid, pos=new_pos, index=cache.index + T,
                           act_scales=scales)
