"""Attention, one place that picks its implementation: today's reference, chunked, cuDNN.

Every program that attends over a sequence calls `attend`: the update's
forward / backward (`ais_jax.training.logprobs`), the rollout prefill and each
decode step (`ais_jax.models.decode`), `ais_jax.models.model.forward` and
LLaDA's bidirectional forward (`ais_jax.models.llada.model`).  The mask is
described, not materialized (`AttnMask`): the keys that may be attended to
(``kv_valid [B, S]``) and, for causal attention, each query's own key slot
(``q_slot [T]``).  A causal query sees the valid keys at or before its slot and
always itself (so a padding query's unused output stays finite); a
bidirectional query sees every valid key.

Implementations (``model.attention``; `resolve` maps ``auto``):

- ``reference``: today's attention, the full ``[B, K, G, T, S]`` float32 score
  tensor and a softmax (`reference`).  ``auto`` on CPU and for decode steps
  (``T = 1``, where the scores are ``[B, Q, 1, S]``), so the CPU numbers stay
  bit-for-bit those of earlier releases.
- ``chunked``: an online softmax over ``chunk``-key blocks in pure XLA
  (`ais_jax.models.attention_chunked`): a running max and sum in float32, a
  ``lax.scan`` over the blocks, and a flash-style backward (``jax.custom_vjp``)
  that recomputes each block from the saved log-sum-exp; neither pass holds a
  ``T x S`` buffer.  Never picked by ``auto``: the TPU compiler's own cost model
  prices it slower than ``reference`` (the 0.6B update on v6e-1: model-MFU bound
  9.8% against 15.7%, docs/measurements/attention_tpu.md), so it is the option for
  a sequence whose scores do not fit, not a speed-up.
- ``cudnn``: `jax.nn.dot_product_attention` with ``implementation="cudnn"``
  (flash attention).  ``auto`` on GPU when the query dtype is bfloat16 / float16
  and the head dim a multiple of 8 up to 128; otherwise ``reference``.
- ``pallas``: JAX's TPU flash-attention kernel (`ais_jax.models.attention_pallas`),
  scores kept on chip, segment ids for the padding mask, kv heads repeated for GQA.
  ``auto`` on TPU for a full pass (one query per key slot, ``T == S``: the update,
  LLaDA's forward) over plain keys; anything else (a decode step, a prefill into a
  longer cache, an FP8 / int8 cache) falls back to ``reference``, as an explicit
  ``pallas`` does too.  On CPU it runs in Pallas's
  interpret mode (tests only: slow; an explicit ``pallas`` says so at start), and
  an explicit ``pallas`` on GPU is refused (`ais_jax.training.steps.interpret_note`).

The backend is ``jax.default_backend()`` at trace time, which
``python -m ais_jax.plan --target`` sets to the target's platform
(`ais_jax.run.plan_target.backend_as`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ais_jax.models.attention_chunked import chunked
from ais_jax.models.kv_cache import ScaledView
from ais_jax.models.layout import ATTENTION_IMPLEMENTATIONS as IMPLEMENTATIONS

__all__ = [
    "DEFAULT_CHUNK",
    "IMPLEMENTATIONS",
    "AttnMask",
    "attend",
    "bidirectional_mask",
    "causal_mask",
    "dequantize_view",
    "kernel_len",
    "reference",
    "resolve",
]

DEFAULT_CHUNK = 256  # keys per block of the chunked implementation


class AttnMask(NamedTuple):
    """Which keys each query sees, without a ``[B, T, S]`` array.

    Attributes:
      kv_valid: ``[B, S]`` bool, the keys that may be attended to.
      q_slot: ``[T]`` int32 key slot of each query (causal: it sees the valid
        slots ``<= q_slot`` and always its own); None: bidirectional.
    """

    kv_valid: jax.Array
    q_slot: jax.Array | None = None

    def dense(self, T: int) -> jax.Array:
        """The mask as ``[B, T, S]`` bool (the reference implementation's)."""
        kv = self.kv_valid
        if self.q_slot is None:
            return jnp.broadcast_to(kv[:, None, :], (kv.shape[0], T, kv.shape[1]))
        slot = jnp.arange(kv.shape[1])
        vis = (slot[None, :] <= self.q_slot[:, None])[None] & kv[:, None, :]
        return vis | (slot[None, :] == self.q_slot[:, None])[None]


def causal_mask(valid: jax.Array, start: Any = 0, T: int | None = None) -> AttnMask:
    """Causal attention over the keys ``valid`` ``[B, S]`` for ``T`` queries at slots ``start..``.

    Args:
      valid: ``[B, S]`` validity of the keys (left padding 0).
      start: slot of the first query (a cache's write index; 0 for a full pass).
      T: number of queries (default ``S``).

    Returns:
      The `AttnMask`.
    """
    T = valid.shape[1] if T is None else T
    return AttnMask(valid.astype(jnp.bool_), start + jnp.arange(T, dtype=jnp.int32))


def bidirectional_mask(valid: jax.Array) -> AttnMask:
    """Every query sees every valid key of ``valid`` ``[B, S]``."""
    return AttnMask(valid.astype(jnp.bool_))


def resolve(
    impl: str, backend: str | None = None, dtype: Any = None, head_dim: int = 0, T: int = 0
) -> str:
    """The implementation ``impl`` names: ``auto`` by backend (see the module doc).

    Args:
      impl: one of `IMPLEMENTATIONS`.
      backend: JAX backend name (default: ``jax.default_backend()``).
      dtype: the query dtype (cuDNN needs bfloat16 / float16).
      head_dim: ``H`` (cuDNN needs a multiple of 8, at most 128).
      T: queries (``1``: a decode step, reference everywhere).

    Returns:
      ``"reference"``, ``"chunked"``, ``"cudnn"`` or ``"pallas"``.
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"attention must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl != "auto":
        return impl
    backend = jax.default_backend() if backend is None else backend
    if backend in ("gpu", "cuda") and T != 1 and cudnn_fits(dtype, head_dim):
        return "cudnn"
    if backend == "tpu" and T != 1:
        return "pallas"
    return "reference"


def kernel_len(cfg: Any, T: int) -> int:
    """The sequence length a full pass of ``T`` tokens should run at: ``T`` rounded up to the
    TPU kernel's block (`ais_jax.models.attention_pallas.padded_len`) where ``cfg.attention``
    resolves to ``pallas``, else ``T``.  Padding the trunk once (trailing padding tokens,
    masked) spares a pad and a slice of q / k / v / o in every layer."""
    if T == 1 or resolve(cfg.attention, head_dim=cfg.head_dim, T=T) != "pallas":
        return T
    from ais_jax.models.attention_pallas import padded_len

    return padded_len(T)


def cudnn_fits(dtype: Any, head_dim: int) -> bool:
    """Whether cuDNN's flash attention takes queries of ``dtype`` and head dim ``head_dim``."""
    return (
        dtype is not None
        and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
        and head_dim % 8 == 0
        and 0 < head_dim <= 128
    )


def reference(q: jax.Array, k: Any, v: Any, mask: jax.Array) -> jax.Array:
    """Today's grouped-query attention: full float32 scores, softmax in float32.

    q ``[B, T, Q, H]``, k / v ``[B, S, K, H]``, mask ``[B, T, S]`` bool -> ``[B, T, Q*H]``.
    k / v may be `ais_jax.models.kv_cache.ScaledView`s: a scalar scale (a
    fixed-scale FP8 cache) multiplies the float32 scores / outputs; ``[B, S]``
    scales (an int8 cache, one per row and token) multiply the float32 scores
    (keys: ``(q . k_int8) * s_k[t]``) and the probabilities before the value
    matmul (values: ``sum_t (e[t] * s_v[t] / sum(e)) v_int8[t]``), so the cache is
    never dequantized into a copy.  Over scaled values no divide runs per cached
    token (`_scaled_values`: a fixed scale's softmax is normalized after the value
    matmul); plain keys / values keep today's softmax-then-matmul, bit for bit.
    """
    sk = k.scale if isinstance(k, ScaledView) else None
    sv = v.scale if isinstance(v, ScaledView) else None
    k, v = (a.x if isinstance(a, ScaledView) else a for a in (k, v))
    B, T, Qn, H = q.shape
    Kn = k.shape[2]
    q = q.reshape(B, T, Kn, Qn // Kn, H)  # [B, T, K, G, H]
    s = jnp.einsum("btkgh,bskh->bkgts", q, k, preferred_element_type=jnp.float32)
    if sk is None:
        s = s / math.sqrt(H)
    elif sk.ndim:  # per (row, token): an epilogue of the score matmul
        s = s * sk[:, None, None, None, :] / math.sqrt(H)
    else:
        s = s * (sk / math.sqrt(H))
    s = jnp.where(mask[:, None, None], s, -1e30)
    if sv is not None:  # a quantized cache: no divide per cached token
        o = jnp.transpose(_scaled_values(s, v, sv), (0, 3, 1, 2, 4))  # [B, T, K, G, H]
        return o.reshape(B, T, Qn * H).astype(q.dtype)
    p = jax.nn.softmax(s, axis=-1)  # [B, K, G, T, S] float32
    o = jnp.einsum("bkgts,bskh->btkgh", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o.reshape(B, T, Qn * H).astype(q.dtype)


def _scaled_values(s: jax.Array, v: jax.Array, sv: jax.Array) -> jax.Array:
    """``softmax(s) . (v * sv)`` over a quantized cache, without a divide per cached token.

    s ``[B, K, G, T, S]`` float32 masked scores, v ``[B, S, K, H]`` (a quantized cache's values
    in the compute dtype), sv the value scale: a float32 scalar (fixed per layer) or ``[B, S]``
    (per row and token) -> ``[B, K, G, T, H]`` float32.  A scalar ``sv``: the unnormalized
    ``e = exp(s - max)`` goes into the value matmul and its float32 output is multiplied by
    ``sv`` and divided by ``sum(e)`` (an ``[.., H]`` epilogue; ``o * (sv / sum)`` made tpu7x
    compute the quotient in a kernel of its own).  Per token: ``e * sv[t] * (1 / sum(e))`` goes
    into the matmul (a reciprocal per row and head, not a divide per token; dividing the output
    instead made v5e materialize the broadcast reciprocal).  Both are ``softmax`` then the matmul
    up to float32 rounding, and the compute dtype's rounding of the matmul operand.
    """
    e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    total = jnp.sum(e, axis=-1)[..., None]  # [B, K, G, T, 1]
    if sv.ndim:  # per (row, token): the scale and the normalization multiply the exponentials
        p = e * sv[:, None, None, None, :] * (1 / total)
        return jnp.einsum(
            "bkgts,bskh->bkgth", p.astype(v.dtype), v, preferred_element_type=jnp.float32
        )
    o = jnp.einsum("bkgts,bskh->bkgth", e.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o * sv / total


def dequantize_view(a: Any, dtype: Any) -> Any:
    """A per-(row, token) scaled `ScaledView` ``[B, S, K, H]`` as a plain array in ``dtype``
    (what the chunked and cuDNN paths take); anything else unchanged."""
    if isinstance(a, ScaledView) and a.scale.ndim:
        return (a.x.astype(jnp.float32) * a.scale[:, :, None, None]).astype(dtype)
    return a


def reference_bidirectional(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """LLaDA's attention as it was (bidirectional, padding keys masked).

    q ``[B,T,Q,H]``, k/v ``[B,T,K,H]``, mask ``[B,T]`` -> ``[B,T,Q*H]``.
    """
    B, T, Qn, H = q.shape
    Kn = k.shape[2]
    q = q.reshape(B, T, Kn, Qn // Kn, H)
    s = jnp.einsum("btkgh,bskh->bkgts", q, k, preferred_element_type=jnp.float32)
    s = jnp.where(mask[:, None, None, None, :], s / math.sqrt(H), -1e30)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bkgts,bskh->btkgh", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o.reshape(B, T, Qn * H).astype(q.dtype)


def _cudnn(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttnMask) -> jax.Array:
    """`jax.nn.dot_product_attention` (cuDNN) with the dense mask; ``[B, T, Q*H]``."""
    B, T, Qn, H = q.shape
    dense = mask.dense(T)[:, None]  # [B, 1, T, S]
    o = jax.nn.dot_product_attention(
        q, k.astype(q.dtype), v.astype(q.dtype), mask=dense, implementation="cudnn"
    )
    return o.reshape(B, T, Qn * H).astype(q.dtype)


def attend(
    q: jax.Array,
    k: Any,
    v: Any,
    mask: AttnMask,
    impl: str = "auto",
    chunk: int = DEFAULT_CHUNK,
    mesh: Any = None,
) -> jax.Array:
    """Grouped-query attention by the implementation ``impl`` resolves to (`resolve`).

    Args:
      q: ``[B, T, Q, H]`` queries.
      k: ``[B, S, K, H]`` keys (or a `ais_jax.models.kv_cache.ScaledView`).
      v: ``[B, S, K, H]`` values (or a ``ScaledView``).
      mask: the `AttnMask` (`causal_mask`, `bidirectional_mask`).
      impl: one of `IMPLEMENTATIONS`.
      chunk: keys per block of ``chunked``.
      mesh: the program's device mesh, for ``pallas`` on several devices
        (`ais_jax.models.attention_pallas.flash_heads`); None: one device.

    Returns:
      ``[B, T, Q*H]`` in ``q.dtype``.
    """
    B, T, Qn, H = q.shape
    which = resolve(impl, dtype=q.dtype, head_dim=H, T=T)
    if which != "reference":  # per-token scales fold into the reference attention only
        k, v = dequantize_view(k, q.dtype), dequantize_view(v, q.dtype)
    scaled = isinstance(k, ScaledView) or isinstance(v, ScaledView)
    if which == "cudnn" and scaled:
        which = "chunked"  # an FP8 cache's scales: not cuDNN's
    if which == "pallas" and (scaled or k.shape[1] != T):
        which = "reference"  # the kernel: full passes over plain keys only
    if which == "pallas":
        from ais_jax.models.attention_pallas import flash

        return flash(q, k, v, mask.kv_valid, causal=mask.q_slot is not None, mesh=mesh)
    if which == "reference":
        if mask.q_slot is None:
            return reference_bidirectional(q, k, v, mask.kv_valid)
        return reference(q, k, v, mask.dense(T))
    if which == "cudnn":
        return _cudnn(q, k, v, mask)
    sk = k.scale if isinstance(k, ScaledView) else None
    sv = v.scale if isinstance(v, ScaledView) else None
    k, v = (a.x if isinstance(a, ScaledView) else a for a in (k, v))
    scale = jnp.float32(1 / math.sqrt(H)) if sk is None else sk / math.sqrt(H)
    q_slot = jnp.zeros((T,), jnp.int32) if mask.q_slot is None else mask.q_slot
    o = chunked(
        q,
        k,
        v,
        mask.kv_valid,
        q_slot,
        scale.astype(jnp.float32),
        causal=mask.q_slot is not None,
        chunk=chunk,
    )  # [B, T, Q, H] float32
    o = o if sv is None else o * sv
    return o.reshape(B, T, Qn * H).astype(q.dtype)
