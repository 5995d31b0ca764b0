"""Attention by JAX's own TPU flash-attention kernel (``model.attention=pallas``).

The kernel is ``jax.experimental.pallas.ops.tpu.flash_attention`` (a Pallas / Mosaic
kernel, used as a library): it walks the keys in blocks with an online softmax in float32
and keeps each block's scores in the core's on-chip memory, so no ``T x S`` score tensor
reaches HBM, forward or backward (its ``custom_vjp`` recomputes the blocks from the saved
log-sum-exp).  This wrapper adapts our attention to it:

- **mask**: the kernel takes segment ids; a valid key is segment 1, a padding key (left
  padding, trailing padding, the block padding below) segment 0, and each query takes its
  own slot's segment.  With ``causal`` a valid query then sees exactly the valid keys at or
  before it (the reference's mask); a padding query sees the padding keys at or before it,
  itself included, so its output stays finite (the reference gives it other finite values;
  nothing reads them, and no valid query depends on them).  Needs one query per key slot
  (``T == S``, a full pass: the update, LLaDA's forward, a prefill without a cache offset).
- **GQA**: the kernel wants as many key / value heads as query heads; the query heads are
  reordered group-major (``[G, K]``, from the reference's ``[K, G]``) inside the transpose
  the kernel's ``[B, N, T, H]`` layout needs anyway, and the key / value heads broadcast over
  that major group axis (the gradient sums over it).  Against a ``jnp.repeat`` beside each
  head, the TPU compiler priced the 0.6B update's roofline 3.69 s instead of 4.03 s
  (docs/measurements/deviceless_cost.md).
- **blocks**: the kernel needs sequence blocks of 128 (its key blocks must be a multiple of
  128); the sequence is padded to a multiple of 128 inside (767 -> 768), the padding slots
  are segment 2 (seen by no real query), and their outputs are sliced off.
- **all-padding rows** (LLaDA's bidirectional forward of an empty row): the reference
  averages every key uniformly (all scores masked alike), the kernel softmaxes the row's
  padding keys by their scores; both finite, neither read.
- **CPU**: the kernel runs in Pallas's TPU interpret mode (``force_tpu_interpret_mode``),
  for the parity tests; slow, not a CPU implementation.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as fa

__all__ = ["BLOCK", "flash", "padded_len"]

BLOCK = 128  # sequence block of the kernel (its key blocks must be a multiple of 128)


def padded_len(T: int) -> int:
    """``T`` rounded up to a multiple of `BLOCK` (the kernel's sequence length)."""
    return -(-T // BLOCK) * BLOCK


def _blocks() -> fa.BlockSizes:
    """`BLOCK`-sized tiles for the forward and both backward kernels."""
    b = BLOCK
    return fa.BlockSizes(
        block_q=b,
        block_k_major=b,
        block_k=b,
        block_b=1,
        block_q_major_dkv=b,
        block_k_major_dkv=b,
        block_k_dkv=b,
        block_q_dkv=b,
        block_k_major_dq=b,
        block_k_dq=b,
        block_q_dq=b,
    )


def _q_heads(q: jax.Array, Kn: int, pad: int) -> jax.Array:
    """Queries ``[B, T, K*G, H]`` (head ``k * G + g``) -> ``[B, G*K, T + pad, H]`` in group-major
    order (head ``g * K + k``), zeros after the sequence."""
    B, T, Qn, H = q.shape
    q = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(B, T + pad, Kn, Qn // Kn, H)
    return q.transpose(0, 3, 2, 1, 4).reshape(B, Qn, T + pad, H)


def _kv_heads(x: jax.Array, G: int, pad: int) -> jax.Array:
    """Keys / values ``[B, T, K, H]`` -> ``[B, G*K, T + pad, H]``, broadcast over a major group
    axis (its gradient: a sum over that major axis)."""
    B, T, Kn, H = x.shape
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
    return jnp.broadcast_to(x[:, None], (B, G, Kn, T + pad, H)).reshape(B, G * Kn, T + pad, H)


def _call(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array, causal: bool) -> jax.Array:
    ids = fa.SegmentIds(q=seg, kv=seg)
    scale = 1.0 / math.sqrt(q.shape[-1])
    return fa.flash_attention(
        q, k, v, segment_ids=ids, causal=causal, sm_scale=scale, block_sizes=_blocks()
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _interpreted(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array, causal: bool):
    """`_call` in Pallas's TPU interpret mode (CPU), its backward kernels too: the mode holds
    for what is traced inside the context, so the backward is traced there by `_interp_bwd`."""
    with pltpu.force_tpu_interpret_mode():
        return _call(q, k, v, seg, causal)


def _interp_fwd(q, k, v, seg, causal):
    with pltpu.force_tpu_interpret_mode():
        o, pullback = jax.vjp(lambda q, k, v: _call(q, k, v, seg, causal), q, k, v)
    return o, (pullback, seg)


def _interp_bwd(causal, res, g):
    pullback, seg = res
    with pltpu.force_tpu_interpret_mode():
        dq, dk, dv = pullback(g)
    return dq, dk, dv, np.zeros(seg.shape, jax.dtypes.float0)


_interpreted.defvjp(_interp_fwd, _interp_bwd)


def flash(q: jax.Array, k: jax.Array, v: jax.Array, kv_valid: jax.Array, causal: bool) -> jax.Array:
    """Grouped-query attention by the TPU flash-attention kernel, one query per key slot.

    Args:
      q: ``[B, T, Q, H]`` queries.
      k: ``[B, T, K, H]`` keys (``Q`` a multiple of ``K``); cast to ``q.dtype``.
      v: ``[B, T, K, H]`` values; cast to ``q.dtype``.
      kv_valid: ``[B, T]`` bool, the valid key slots (padding: False).
      causal: query ``t`` sees the valid keys ``<= t``; else every valid key.

    Returns:
      ``[B, T, Q*H]`` in ``q.dtype`` (softmax in float32 inside the kernel).
    """
    B, T, Qn, H = q.shape
    Kn = k.shape[2]
    if k.shape[1] != T:
        raise ValueError(
            f"pallas attention needs one query per key slot, got T={T}, S={k.shape[1]}"
        )
    pad = padded_len(T) - T
    seg = jnp.pad(kv_valid.astype(jnp.int32), ((0, 0), (0, pad)), constant_values=2)
    G = Qn // Kn
    kh, vh = (_kv_heads(a.astype(q.dtype), G, pad) for a in (k, v))
    qh = _q_heads(q, Kn, pad)
    run = _interpreted if jax.default_backend() == "cpu" else _call
    o = run(qh, kh, vh, seg, causal)
    o = o[:, :, :T].reshape(B, G, Kn, T, H).transpose(0, 3, 2, 1, 4)  # [B, T, K, G, H]
    return o.reshape(B, T, Qn * H).astype(q.dtype)
