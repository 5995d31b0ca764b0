"""Chunked online-softmax attention in pure XLA, with a flash-style backward.

The keys are cut into ``chunk``-wide blocks (the last one padded with masked
keys); a ``lax.scan`` over the blocks keeps, per query and head, the running
maximum ``m`` and sum ``l`` of the exponentials (float32) and the unnormalized
output ``acc``: for each block ``s = q k^T * scale``, ``m' = max(m, max s)``,
``p = exp(s - m')`` (0 at masked keys), ``l' = l exp(m - m') + sum p``,
``acc' = acc exp(m - m') + p v``; the output is ``acc / l``.  The backward
(``jax.custom_vjp``) keeps only ``o`` and ``lse = m + log l`` and recomputes
each block's probabilities ``p = exp(s - lse)``:
``dv = p^T do``, ``ds = p (do v^T - rowsum(do o))``, ``dq = ds k scale``,
``dk = ds^T q scale``.  No buffer of either pass is ``T x S``: the largest is
one block's scores ``[B, K, G*T, chunk]``.

Grouped-query heads share their key / value head without copying it: the queries
are laid out ``[B, K, G*T, H]`` (the group folded into the query axis, so no
array has a tiny minor dimension the TPU would pad to its 128-wide tiles) against
key blocks ``[B, K, chunk, H]``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["chunked"]

_MASKED = -1e30  # a masked score (finite: exp(_MASKED - m) is 0, never nan)


def _blocks(x: jax.Array, n: int, chunk: int, fill: object = 0) -> jax.Array:
    """``x`` ``[B, S, ...]`` padded to ``n * chunk`` keys, as ``[n, B, chunk, ...]``."""
    B, S = x.shape[:2]
    pad = [(0, 0), (0, n * chunk - S)] + [(0, 0)] * (x.ndim - 2)
    x = jnp.pad(x, pad, constant_values=fill)
    return jnp.moveaxis(x.reshape(B, n, chunk, *x.shape[2:]), 1, 0)


def _visible(valid: jax.Array, slot: jax.Array, q_slot: jax.Array, causal: bool) -> jax.Array:
    """``[B, 1, GT, c]`` bool: block keys (``valid [B, c]``, slots ``[c]``) each query
    (slots ``q_slot [GT]``) sees."""
    vis = valid[:, None, :]  # [B, 1, c]
    if causal:
        before = slot[None, :] <= q_slot[:, None]  # [GT, c]
        vis = (vis & before[None]) | (slot[None, :] == q_slot[:, None])[None]
    return vis[:, None]


def _scores(qg, kb, vis, scale):
    s = jnp.einsum("bkqh,bkch->bkqc", qg, kb, preferred_element_type=jnp.float32) * scale
    return jnp.where(vis, s, _MASKED)  # [B, K, GT, c]


def _prepare(q, k, v, kv_valid, q_slot, chunk):
    """Queries ``[B, K, G*T, H]`` (the group folded into the query axis: no tiny minor
    dimension for the TPU's tiles), their slots ``[G*T]``, and the key blocks
    ``[n, B, K, chunk, H]``."""
    B, T, Qn, H = q.shape
    S, Kn = k.shape[1], k.shape[2]
    n = -(-S // chunk)
    G = Qn // Kn
    qg = jnp.moveaxis(q.reshape(B, T, Kn, G, H), 1, 3).reshape(B, Kn, G * T, H)
    kv = tuple(jnp.moveaxis(_blocks(a, n, chunk), 3, 2) for a in (k, v))  # [n, B, K, c, H]
    blocks = (
        *kv,
        _blocks(kv_valid, n, chunk, False),
        jnp.arange(n * chunk, dtype=jnp.int32).reshape(n, chunk),
    )
    return qg, jnp.tile(q_slot, G), blocks


def _forward(q, k, v, kv_valid, q_slot, scale, causal, chunk):
    """``(o [B, K, G*T, H] float32, lse [B, K, G*T] float32)``."""
    qg, q_slot, blocks = _prepare(q, k, v, kv_valid, q_slot, chunk)
    B, Kn, GT, H = qg.shape

    def step(carry, blk):
        m, l, acc = carry
        kb, vb, valid, slot = blk
        vis = _visible(valid, slot, q_slot, causal)
        s = _scores(qg, kb, vis, scale)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.where(vis, jnp.exp(s - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        pv = jnp.einsum(
            "bkqc,bkch->bkqh", p.astype(vb.dtype), vb, preferred_element_type=jnp.float32
        )
        return (m_new, l * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + pv), None

    init = (
        jnp.full((B, Kn, GT), _MASKED, jnp.float32),
        jnp.zeros((B, Kn, GT), jnp.float32),
        jnp.zeros((B, Kn, GT, H), jnp.float32),
    )
    (m, l, acc), _ = jax.lax.scan(step, init, blocks)
    return acc / l[..., None], m + jnp.log(l)


def _out(o, q):
    B, T, Qn, H = q.shape
    Kn = o.shape[1]
    o = o.reshape(B, Kn, Qn // Kn, T, H)
    return jnp.moveaxis(o, 3, 1).reshape(B, T, Qn, H)  # [B, K, G, T, H] -> [B, T, Q, H]


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def chunked(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    kv_valid: jax.Array,
    q_slot: jax.Array,
    scale: jax.Array,
    causal: bool,
    chunk: int,
) -> jax.Array:
    """Attention over ``chunk``-key blocks, never materializing the ``T x S`` scores.

    Args:
      q: ``[B, T, Q, H]`` queries.
      k: ``[B, S, K, H]`` keys (``Q`` a multiple of ``K``: grouped-query).
      v: ``[B, S, K, H]`` values.
      kv_valid: ``[B, S]`` bool, the keys that may be attended to.
      q_slot: ``[T]`` int32 key slot of each query (used when ``causal``).
      scale: float32 scalar multiplying the scores (``1 / sqrt(H)``).
      causal: a query sees the valid keys at slots ``<= q_slot`` and its own slot;
        otherwise every valid key.
      chunk: keys per block (``S`` need not be a multiple: the last block is
        padded with masked keys).

    Returns:
      ``[B, T, Q, H]`` float32.
    """
    return _out(_forward(q, k, v, kv_valid, q_slot, scale, causal, chunk)[0], q)


def _fwd(q, k, v, kv_valid, q_slot, scale, causal, chunk):
    o, lse = _forward(q, k, v, kv_valid, q_slot, scale, causal, chunk)
    return _out(o, q), (q, k, v, kv_valid, q_slot, scale, o, lse)


def _bwd(causal, chunk, res, do):
    q, k, v, kv_valid, q_slot, scale, o, lse = res
    qg, q_slot, blocks = _prepare(q, k, v, kv_valid, q_slot, chunk)
    B, Kn, GT, H = qg.shape
    T = q.shape[1]
    dog = jnp.moveaxis(do.reshape(B, T, Kn, GT // T, H), 1, 3).reshape(B, Kn, GT, H)
    dog = dog.astype(jnp.float32)
    delta = jnp.sum(dog * o, axis=-1)  # [B, K, GT]

    def step(dq, blk):
        kb, vb, valid, slot = blk
        vis = _visible(valid, slot, q_slot, causal)
        p = jnp.where(vis, jnp.exp(_scores(qg, kb, vis, scale) - lse[..., None]), 0.0)
        dv = jnp.einsum(
            "bkqc,bkqh->bkch",
            p.astype(vb.dtype),
            dog.astype(vb.dtype),
            preferred_element_type=jnp.float32,
        )
        dp = jnp.einsum(
            "bkqh,bkch->bkqc", dog.astype(vb.dtype), vb, preferred_element_type=jnp.float32
        )
        ds = p * (dp - delta[..., None]) * scale  # [B, K, GT, c]
        dq = dq + jnp.einsum(
            "bkqc,bkch->bkqh", ds.astype(kb.dtype), kb, preferred_element_type=jnp.float32
        )
        dk = jnp.einsum(
            "bkqc,bkqh->bkch", ds.astype(qg.dtype), qg, preferred_element_type=jnp.float32
        )
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(step, jnp.zeros((B, Kn, GT, H), jnp.float32), blocks)
    S = k.shape[1]

    def unblock(x, like):  # [n, B, K, c, H] -> [B, S, K, H]
        return (
            jnp.moveaxis(x, 0, 2).reshape(B, Kn, -1, H)[:, :, :S].swapaxes(1, 2).astype(like.dtype)
        )

    return (
        _out(dq, q).astype(q.dtype),
        unblock(dk, k),
        unblock(dv, v),
        None,
        None,
        jnp.zeros_like(scale),
    )


chunked.defvjp(_fwd, _bwd)
