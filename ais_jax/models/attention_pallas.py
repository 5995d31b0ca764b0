"""Attention by JAX's TPU splash-attention kernel (``model.attention=pallas``).

The kernel is ``jax.experimental.pallas.ops.tpu.splash_attention`` (Pallas / Mosaic kernels,
used as a library): it walks the keys in blocks with an online softmax in float32 and keeps
each block's scores in the core's on-chip memory, so no ``T x S`` score tensor reaches HBM,
forward or backward (its ``custom_vjp`` recomputes the blocks from the saved log-sum-exp);
it skips the key blocks a causal mask hides.  This wrapper adapts our attention to it:

- **layout**: the kernel's own, head-major ``[B, N, T, H]`` (`flash_heads`); the trunk
  projects straight into it when the attention resolves to this kernel
  (`ais_jax.models.model`), so no transpose is left around the kernel.  `flash` takes the
  token-major ``[B, T, N, H]`` of `ais_jax.models.attention.attend` and transposes.
- **GQA, natively**: query head ``n`` reads key / value head ``n // G`` inside the kernel
  (the Hugging Face order), and the key / value gradient sums over the group inside the
  backward kernel: no key / value copy per query head, no gradient reduction outside.
- **mask**: segment ids; a valid key is segment 1, a padding key (left padding, a hole)
  segment 0, the block padding below segment 2, and each query takes its own slot's segment.
  With ``causal`` (the kernel's static causal mask) a valid query then sees exactly the
  valid keys at or before it (the reference's mask); a padding query sees the padding keys
  at or before it, itself included, so its output stays finite (the reference gives it
  other finite values; nothing reads them, and no valid query depends on them).  Needs one
  query per key slot (``T == S``: the update, LLaDA's forward, a prefill without a cache
  offset).
- **blocks**: the kernel needs sequence blocks of 128; a sequence that is not a multiple of
  128 is padded inside (segment 2, seen by no real query) and its outputs sliced off; the
  update's trunk pads once instead (`ais_jax.training.logprobs.hidden_states`).
- **scale**: the kernel takes none; the queries are multiplied by ``1 / sqrt(H)`` first (in
  their dtype, fused into their producer).
- **batch**: the kernel attends one row; rows are ``jax.vmap``-ed on TPU (the grid gains a
  dimension) and looped on CPU.  On a mesh of several devices the call runs under
  ``jax.shard_map`` (rows over the batch axes): the SPMD partitioner cannot split a Mosaic
  kernel ("Mosaic kernels cannot be automatically partitioned"), so the trunk passes its
  mesh down (`ais_jax.training.logprobs.hidden_states`).
- **all-padding rows** (LLaDA's bidirectional forward of an empty row): the reference
  averages every key uniformly (all scores masked alike), the kernel softmaxes the row's
  padding keys by their scores; both finite, neither read.
- **CPU**: the kernels run in Pallas's TPU interpret mode (``force_tpu_interpret_mode``), for
  the parity tests; slow, not a CPU implementation.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

__all__ = ["BLOCK", "flash", "flash_heads", "padded_len"]

BLOCK = 128  # sequence block of the kernel (its blocks must be multiples of 128)


def padded_len(T: int) -> int:
    """``T`` rounded up to a multiple of `BLOCK` (the kernel's sequence length)."""
    return -(-T // BLOCK) * BLOCK


def _block(T: int) -> int:
    """The largest of 512 / 256 / 128 dividing ``T`` (a multiple of `BLOCK`)."""
    return next(b for b in (512, 256, BLOCK) if T % b == 0)


def _kernel(T: int, Qn: int, causal: bool) -> sk.SplashAttentionKernel:
    """The splash kernel for ``Qn`` query heads over ``T`` slots (its block tables are arrays
    of the trace that builds it: built per call, not cached)."""
    one = sm.CausalMask((T, T)) if causal else sm.FullMask((T, T))
    b = _block(T)
    sizes = sk.BlockSizes(b, b, b, b, b, b, b, b)
    return sk.make_splash_mha(
        sm.MultiHeadMask([one] * Qn), block_sizes=sizes, head_shards=1, q_seq_shards=1
    )


def _call(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array, causal: bool) -> jax.Array:
    """q ``[B, Q, T, H]`` (scaled), k / v ``[B, K, T, H]``, seg ``[B, T]`` -> ``[B, Q, T, H]``."""
    kern = _kernel(q.shape[2], q.shape[1], causal)

    def row(q, k, v, s):
        return kern(q, k, v, segment_ids=sk.SegmentIds(q=s, kv=s))

    if jax.default_backend() == "cpu":  # interpret mode cannot vmap a kernel's grid
        return jnp.stack([row(q[b], k[b], v[b], seg[b]) for b in range(q.shape[0])])
    return jax.vmap(row)(q, k, v, seg)


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


def _sharded(run: Any, mesh: Any, Qn: int, Kn: int) -> Any:
    """``run`` under ``jax.shard_map`` over ``mesh``: rows over the batch axes, heads over
    ``tensor`` where it divides both head counts (a Mosaic kernel is one custom call that
    the SPMD partitioner cannot split)."""
    from jax.sharding import PartitionSpec as P

    from ais_jax.models.layout import BATCH_AXES

    tp = dict(mesh.shape).get("tensor", 1)
    heads = "tensor" if tp > 1 and Qn % tp == 0 and Kn % tp == 0 else None
    x, seg = P(BATCH_AXES, heads), P(BATCH_AXES)
    return jax.shard_map(run, mesh=mesh, in_specs=(x, x, x, seg), out_specs=x, check_vma=False)


def flash_heads(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    kv_valid: jax.Array,
    causal: bool,
    mesh: Any = None,
) -> jax.Array:
    """Grouped-query attention by the splash kernel, head-major, one query per key slot.

    Args:
      q: ``[B, Q, T, H]`` queries (head ``n`` reads key / value head ``n // (Q / K)``).
      k: ``[B, K, T, H]`` keys (``Q`` a multiple of ``K``); cast to ``q.dtype``.
      v: ``[B, K, T, H]`` values; cast to ``q.dtype``.
      kv_valid: ``[B, T]`` bool, the valid key slots (padding: False).
      causal: query ``t`` sees the valid keys ``<= t``; else every valid key.
      mesh: the program's device mesh (`ais_jax.training.sharding.make_mesh`); with more
        than one device the kernel runs under ``jax.shard_map``, rows over the batch axes
        (``B`` divisible by them, as the trunk's batch sharding needs anyway).

    Returns:
      ``[B, Q, T, H]`` in ``q.dtype`` (softmax in float32 inside the kernel).
    """
    T, H = q.shape[2], q.shape[3]
    if k.shape[2] != T:
        raise ValueError(
            f"pallas attention needs one query per key slot, got T={T}, S={k.shape[2]}"
        )
    pad = padded_len(T) - T
    seg = jnp.pad(kv_valid.astype(jnp.int32), ((0, 0), (0, pad)), constant_values=2)
    widths = ((0, 0), (0, 0), (0, pad), (0, 0))
    qs = jnp.pad((q * (1.0 / math.sqrt(H))).astype(q.dtype), widths)
    ks, vs = (jnp.pad(a.astype(q.dtype), widths) for a in (k, v))
    kern = _interpreted if jax.default_backend() == "cpu" else _call

    def run(q, k, v, seg):
        return kern(q, k, v, seg, causal)

    if mesh is not None and mesh.size > 1:
        run = _sharded(run, mesh, q.shape[1], k.shape[1])
    o = run(qs, ks, vs, seg)
    return o[:, :, :T].astype(q.dtype)


def flash(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    kv_valid: jax.Array,
    causal: bool,
    mesh: Any = None,
) -> jax.Array:
    """`flash_heads` for token-major inputs (`ais_jax.models.attention.attend`'s layout).

    Args:
      q: ``[B, T, Q, H]`` queries.
      k: ``[B, T, K, H]`` keys (``Q`` a multiple of ``K``).
      v: ``[B, T, K, H]`` values.
      kv_valid: ``[B, T]`` bool, the valid key slots.
      causal: as `flash_heads`.
      mesh: as `flash_heads`.

    Returns:
      ``[B, T, Q*H]`` in ``q.dtype``.
    """
    B, T, Qn, H = q.shape
    if k.shape[1] != T:
        raise ValueError(
            f"pallas attention needs one query per key slot, got T={T}, S={k.shape[1]}"
        )
    qh, kh, vh = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
    o = flash_heads(qh, kh, vh, kv_valid, causal, mesh)  # [B, Q, T, H]
    return o.transpose(0, 2, 1, 3).reshape(B, T, Qn * H)
