"""Llama / Qwen2 / Qwen3 decoder as pure functions of a params pytree.

One layer function serves the full-sequence forward (log-probs, training) and
the KV-cached prefill / decode steps of `ais_jax.models.decode` (sampling), for
full-precision params and for the FP8 rollout copy from
`ais_jax.models.fp8.to_rollout_params` alike.

Params layout: layers stacked on a leading ``L`` axis, weights ``[out, in]``
as in Hugging Face checkpoints; the parameter table `ais_jax.models.layout` declares
every leaf (shape, sharding axes, checkpoint names, init, FP8 role).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.models import layout
from ais_jax.models.attention import AttnMask, attend, causal_mask, resolve
from ais_jax.models.fp8 import QuantArray, act_amax, linear, qdot
from ais_jax.models.fused import split_sizes
from ais_jax.models.kv_cache import cache_update
from ais_jax.models.layout import ARCHITECTURES, ModelConfig  # ModelConfig lives with its table

__all__ = ["ARCHITECTURES", "ModelConfig", "forward", "init_params"]

def init_params(key: jax.Array, cfg: ModelConfig, dtype: Any = jnp.float32) -> dict:
    """Random params for training from scratch, as `ais_jax.models.layout` declares them.

    Weights are normal(0, 0.02) (the residual projections ``wo`` / ``w_down``
    0.02 / sqrt(2 L)), norms ones, biases zeros.  The random params draw keys
    from ``jax.random.split(key, 16)`` in table order: the per-layer linears
    first (wq wk wv wo w_gate w_up w_down), then ``embed``, then ``lm_head``.

    Args:
      key: PRNG key.
      cfg: model config.
      dtype: parameter dtype (float32 master weights, or bfloat16).

    Returns:
      Params pytree with the leaves of `ais_jax.models.layout.param_table(cfg)`
      (``embed`` ``[V, D]``, ``layers/wq`` ``[L, Q*H, D]``, ...).
    """
    keys = iter(jax.random.split(key, 16))

    def init(info: layout.ArrayInfo) -> jax.Array:
        shape = info.shape(cfg)
        if info.init == "ones":
            return jnp.ones(shape, dtype)
        if info.init == "zeros":
            return jnp.zeros(shape, dtype)
        # the barrier keeps XLA from folding ``std`` into the sampler's constants under jit, so
        # the sharded start-up (`ais_jax.training.startup.init_on_mesh`) draws the eager bits
        z = jax.lax.optimization_barrier(jax.random.normal(next(keys), shape, jnp.float32))
        return (info.std(cfg) * z).astype(dtype)

    table = layout.param_table(cfg)
    layers = {name: init(info) for name, info in table.pop("layers").items()}  # draw first
    top = {name: init(info) for name, info in table.items()}
    return {"embed": top.pop("embed"), "layers": layers, **top}


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """RMSNorm in float32, result in ``x.dtype`` (as Hugging Face Llama does)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (w.astype(jnp.float32) * xf.astype(x.dtype).astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
    """Rotary inverse frequencies ``[H/2]`` float32, with Llama-3 scaling if configured."""
    H = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, H, 2, dtype=jnp.float32) / H))
    if cfg.rope_scaling is not None:
        factor, low, high, orig = cfg.rope_scaling
        low_wavelen, high_wavelen = orig / low, orig / high
        wavelen = 2 * math.pi / inv
        smooth = (orig / wavelen - low) / (high - low)
        scaled = jnp.where(wavelen > low_wavelen, inv / factor, inv)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = jnp.where(is_mid, mid, scaled)
    return inv / cfg.rope_linear_factor


def apply_rope(
    x: jax.Array, pos: jax.Array, inv_freq: jax.Array, heads_axis: int = 2, matmul: bool = False
) -> jax.Array:
    """Rotate ``x`` ``[B, T, N, H]`` at integer positions ``pos`` ``[B, T]`` (half-split layout);
    ``heads_axis=1``: ``x`` is head-major ``[B, N, T, H]``.  ``matmul``: the half swap
    ``[-x2, x1]`` as a product with a signed ``[H, H]`` permutation (`rotate_half_matrix`;
    exact, float32 accumulation), which the TPU compiler fuses where it would materialize the
    two halves of a lane-split ``concatenate``."""
    ang = pos.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
    cos = jnp.expand_dims(jnp.concatenate([jnp.cos(ang)] * 2, -1), heads_axis)  # [B, T, 1, H]
    sin = jnp.expand_dims(jnp.concatenate([jnp.sin(ang)] * 2, -1), heads_axis)
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    if matmul:
        r = rotate_half_matrix(x.shape[-1], x.dtype)
        rot = jnp.einsum(
            "...i,ij->...j", x, r, preferred_element_type=jnp.float32,
            precision=jax.lax.Precision.HIGHEST,
        ).astype(x.dtype)
    else:
        x1, x2 = jnp.split(x, 2, axis=-1)
        rot = jnp.concatenate([-x2, x1], axis=-1)
    return x * cos + rot * sin


def rotate_half_matrix(H: int, dtype: Any = jnp.float32) -> jax.Array:
    """``R`` ``[H, H]`` with ``x @ R == concatenate([-x[H/2:], x[:H/2]])`` (entries 0 / +-1)."""
    half = H // 2
    i, j = jnp.arange(H)[:, None], jnp.arange(H)[None, :]
    r = jnp.where(i == j + half, -1.0, 0.0) + jnp.where(i + half == j, 1.0, 0.0)
    return r.astype(dtype)


ACT_INPUTS = ("qkv", "o", "gate_up", "down")  # the 4 linear inputs of a block, in order


def _layer(x, lp, pos, mask: AttnMask, inv_freq, cfg: ModelConfig, cache_kv=None, index=None,
           *, kv_update=None, rows=None, calibrate=False, mesh=None):
    """One decoder block. ``x`` [B, T, D]; returns (x', (k, v)).

    ``mask``: which keys each query sees (`ais_jax.models.attention.AttnMask`);
    the attention runs as ``cfg.attention`` resolves (`ais_jax.models.attention.attend`).

    ``rows`` (``[B, T]`` bool, optional): the real tokens; only they set the
    per-tensor activation scales of FP8 linears (`ais_jax.models.fp8.qdot`).
    ``lp["act_scales"]`` (optional float32 ``[4]``, `ACT_INPUTS` order): fixed
    activation scales of the FP8 linears (``act_scaling="prefill"`` decode
    steps; no amax reduction).  ``calibrate``: also return the masked amax of
    each of the 4 linear inputs, ``(x', ((k, v), amax [4]))``.

    Without a cache ``k`` / ``v`` are this block's ``[B, T, K, H]``.  With
    ``kv_update``, a function ``(k, v) -> ((k', v'), (keys, values))`` that
    writes this block's ``k`` / ``v`` into a cache (`ais_jax.models.decode`), the block
    attends to the returned ``[B, S, K, H]`` keys / values and returns
    ``(k', v')``, the updated cache entries.  ``cache_kv`` (one layer's key
    and value buffers in the layout of `ais_jax.models.kv_cache.KVCache`) with
    ``index`` is that update at slot ``index``.  ``mesh``: the program's device mesh, for
    the TPU attention kernel on several devices (`ais_jax.models.attention.attend`).
    """
    B, T, _ = x.shape
    Q, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    scales, amax = lp.get("act_scales"), []

    def lin(h, name, i):  # linear of input i of ACT_INPUTS (fixed FP8 scale if given)
        if calibrate and len(amax) == i:
            amax.append(act_amax(h, rows))
        s = None if scales is None else scales[i]
        return linear(h, lp[name], lp.get("b" + name[1:]), rows, act_scale=s)

    h = rms_norm(x, lp["attn_norm"], cfg.rms_norm_eps)
    if kv_update is None and cache_kv is None and not calibrate and heads_major(lp, cfg, h):
        a, (k, v) = _attention_heads(h, lp, pos, mask, inv_freq, cfg, mesh)
        return _mlp(x + a, lp, cfg, lin), (k, v)
    if "wqkv" in lp:  # the rollout's fused layout (ais_jax.models.fused): one GEMM
        qkv = lin(h, "wqkv", 0)  # [B, T, QH + 2 KH]
        q, k, v = jnp.split(qkv, split_sizes("wqkv", Q * H, K * H, 0), axis=-1)
    else:
        q, k, v = lin(h, "wq", 0), lin(h, "wk", 0), lin(h, "wv", 0)
    q, k, v = q.reshape(B, T, Q, H), k.reshape(B, T, K, H), v.reshape(B, T, K, H)
    if cfg.qk_norm:
        q = rms_norm(q, lp["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, lp["k_norm"], cfg.rms_norm_eps)
    q = apply_rope(q, pos, inv_freq)
    k = apply_rope(k, pos, inv_freq)
    if kv_update is None and cache_kv is not None:

        def kv_update(k, v):
            return cache_update(cache_kv, k, v, index, q.dtype)
    if kv_update is not None:  # write into the cache, attend over all of it
        (k, v), (kx, vx) = kv_update(k, v)
    else:
        kx, vx = k, v
    o = attend(q, kx, vx, mask, cfg.attention, cfg.attention_chunk, mesh)  # [B, T, Q*H]
    x = _mlp(x + lin(o, "wo", 1), lp, cfg, lin)
    if calibrate:
        return x, ((k, v), jnp.stack(amax))
    return x, (k, v)


def _mlp(x: jax.Array, lp: dict, cfg: ModelConfig, lin: Any) -> jax.Array:
    """The block's MLP half: ``x + down(silu(gate(h)) * up(h))``, ``h`` the normed ``x``."""
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_norm_eps)
    if "w_gate_up" in lp:
        gu = lin(h, "w_gate_up", 2)  # [B, T, 2 F]
        g, u = jnp.split(gu, split_sizes("w_gate_up", 0, 0, cfg.intermediate_size), axis=-1)
    else:
        g, u = lin(h, "w_gate", 2), lin(h, "w_up", 2)
    return x + lin(jax.nn.silu(g) * u, "w_down", 3)


_HEADS_WEIGHTS = ("wq", "wk", "wv", "wo")


def heads_major(lp: dict, cfg: ModelConfig, h: jax.Array) -> bool:
    """Whether a full pass of this block attends head-major (`_attention_heads`): the attention
    resolves to the TPU kernel (`ais_jax.models.attention_pallas`) and the attention weights
    are plain arrays (not FP8 / int8, LoRA, or the rollout's fused ``wqkv``)."""
    impl = resolve(cfg.attention, dtype=h.dtype, head_dim=cfg.head_dim, T=h.shape[1])
    return impl == "pallas" and all(isinstance(lp.get(n), jax.Array) for n in _HEADS_WEIGHTS)


def _heads_linear(h: jax.Array, w: jax.Array, b: jax.Array | None, n: int) -> jax.Array:
    """``h [B, T, D] @ w.T + b`` for ``w [n*H, D]``, straight into head-major ``[B, n, T, H]``
    (float32 accumulation, result in ``h.dtype``, as `ais_jax.models.fp8.linear`)."""
    w = w.reshape(n, w.shape[0] // n, w.shape[1]).astype(h.dtype)
    y = jnp.einsum("btd,nhd->bnth", h, w, preferred_element_type=jnp.float32)
    if b is not None:
        y = y + b.reshape(n, 1, -1).astype(jnp.float32)
    return y.astype(h.dtype)


def _attention_heads(h, lp, pos, mask: AttnMask, inv_freq, cfg: ModelConfig, mesh=None) -> Any:
    """The block's attention half (``o_proj(attention)``, ``[B, T, D]``, and the rotated keys
    and values ``[B, T, K, H]`` as `_layer` returns them) in the TPU kernel's
    head-major layout: q / k / v projected to ``[B, N, T, H]``, normed and rotated there, the
    kernel's ``[B, Q, T, H]`` output contracted with ``wo`` over (head, dim): no transpose of
    q / k / v / o in between.  The same numbers as the token-major path, up to float
    reordering."""
    from ais_jax.models.attention_pallas import flash_heads

    Q, K = cfg.num_heads, cfg.num_kv_heads
    q = _heads_linear(h, lp["wq"], lp.get("bq"), Q)
    k = _heads_linear(h, lp["wk"], lp.get("bk"), K)
    v = _heads_linear(h, lp["wv"], lp.get("bv"), K)
    if cfg.qk_norm:
        q = rms_norm(q, lp["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, lp["k_norm"], cfg.rms_norm_eps)
    q = apply_rope(q, pos, inv_freq, heads_axis=1, matmul=True)
    k = apply_rope(k, pos, inv_freq, heads_axis=1, matmul=True)
    o = flash_heads(q, k, v, mask.kv_valid, mask.q_slot is not None, mesh)  # [B, Q, T, H]
    wo = lp["wo"]
    wo = wo.reshape(wo.shape[0], Q, -1).astype(h.dtype)  # [D, Q, H]
    y = jnp.einsum("bnth,dnh->btd", o, wo, preferred_element_type=jnp.float32)
    if lp.get("bo") is not None:
        y = y + lp["bo"].astype(jnp.float32)
    return y.astype(h.dtype), (k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))


def _embed(params: dict, tokens: jax.Array) -> jax.Array:
    embed = params["embed"]
    if isinstance(embed, QuantArray):
        raise ValueError("the embedding must stay full precision; quantize lm_head instead")
    return jnp.take(embed, tokens, axis=0)  # [B, T, D]


def _logits(params: dict, x: jax.Array, cfg: ModelConfig, rows: jax.Array | None = None
            ) -> jax.Array:
    x = rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    head = params.get("lm_head", params["embed"])
    if isinstance(head, QuantArray):
        return qdot(x, head, out_dtype=jnp.float32, valid=rows)  # [B, T, V]
    return jax.lax.dot_general(
        x, head.astype(x.dtype), (((x.ndim - 1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
    )  # [B, T, V]


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """Rotary positions of left-padded rows: ``cumsum(mask) - 1`` clipped at 0, ``[B, T]`` int32."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward(
    params: dict,
    tokens: jax.Array,
    cfg: ModelConfig,
    mask: jax.Array | None = None,
) -> jax.Array:
    """Full-sequence causal forward.

    Args:
      params: full-precision or FP8 rollout params.
      tokens: ``[B, T]`` int token ids.
      cfg: model config.
      mask: optional ``[B, T]`` validity (1 = real token, 0 = padding, e.g. left
        padding of prompts). Padding keys are not attended to and positions
        count only real tokens. Default: all valid.

    Returns:
      Logits ``[B, T, V]`` float32.
    """
    B, T = tokens.shape
    if mask is None:
        mask = jnp.ones((B, T), jnp.bool_)
    mask = mask.astype(jnp.bool_)
    pos = positions_from_mask(mask)
    # causal over the real tokens; a padding query sees itself (its unused output stays finite)
    attn_mask = causal_mask(mask)
    inv_freq = rope_inv_freq(cfg)
    x = _embed(params, tokens)

    def body(x, lp):
        x, _ = _layer(x, lp, pos, attn_mask, inv_freq, cfg, rows=mask)
        return x, None

    x, _ = jax.lax.scan(body, x, params["layers"])
    return _logits(params, x, cfg, mask)
