"""The vocabulary head and its token log-prob in one `jax.custom_vjp`: fewer passes over the logits.

``log_softmax(x @ W^T)[token]`` by autodiff passes over a chunk's ``[B, c, V]`` float32
logits seven times per update on a TPU (issue 54; docs/measurements/deviceless_cost.md): the
head's matmul with the row max, the exp-sum, the target pick (a masked sum over ``V``),
and in the backward pass the rematerialized matmul, max and exp-sum again before the two
gradient matmuls read ``softmax - onehot``.  `token_logprobs_from_hidden` computes the
same numbers with:

* forward: the matmul feeding one variadic reduction over ``V`` (`_max_sumexp_pick`: the
  row max, the online exp-sum and the target's logit), which the TPU compiler fuses into
  the matmul: the logits are never written; residuals are the input rows, the weight and
  two ``[B, c]`` float32 vectors (the max ``m`` and ``l = log sum exp((z - m) / T)``);
* backward: the matmul again, fused with ``dz = g * (onehot - exp((z - m) / T - l)) / T``
  written once in the input's dtype, read by the two gradient matmuls.

``z`` are the raw logits; at temperature ``T`` (``0``: scored at 1, as
`ais_jax.method.distributions.token_logprobs` does) the log-prob is
``(z_t - m) / T - l``.  Truncation (top-k / top-p) is not covered: `use_fused_head`
decides, in one place, where this form replaces the reference
(``log_softmax(truncate(logits / T))[token]`` on materialized logits).  It is taken on a
TPU only (`jax.default_backend()` at trace time, as `ais_jax.models.attention.resolve`
reads it): the math is the same but the float32 reductions run in another order and the
gradient of the logits is rounded to the compute dtype before its matmuls (at default
precision a TPU may compute a float32 matmul in bfloat16 anyway: JAX's "Matmul precision"
docs), so CPU runs keep the reference form and its bits (tests/test_golden.py).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.method.distributions import check_temperature, truncates
from ais_jax.models.qarray import QuantArray


def use_fused_head(
    temperature: float,
    top_k: int,
    top_p: float,
    head: Any,
    backend: str | None = None,
    vocab_parallel: bool = False,
) -> bool:
    """Whether the update's head log-probs take `token_logprobs_from_hidden`.

    Args:
      temperature, top_k, top_p: the sampling distribution (no truncation required).
      head: the head's weight (``lm_head`` or the tied ``embed``); a quantized one keeps
        the reference form.
      backend: JAX backend name (default: ``jax.default_backend()``); only ``"tpu"``.
      vocab_parallel: a vocabulary-sharded head (`ais_jax.training.logprobs.head_map`'s
        ``head_constrain``) keeps the reference form.

    Returns:
      True where the fused form is used.
    """
    backend = jax.default_backend() if backend is None else backend
    return (
        backend == "tpu"
        and not truncates(temperature, top_k, top_p)
        and not isinstance(head, QuantArray)
        and not vocab_parallel
    )


def _dot_v(x: jax.Array, w: jax.Array) -> jax.Array:
    """``[..., D] x [V, D] -> [..., V]`` float32."""
    return jax.lax.dot_general(
        x, w, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32
    )


def _scaled(z: jax.Array, m: jax.Array, temperature: float) -> jax.Array:
    s = z - m  # m: [..., 1]
    return s / temperature if temperature not in (0, 1) else s


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused(x: jax.Array, w: jax.Array, tokens: jax.Array, temperature: float) -> jax.Array:
    return _fused_fwd(x, w, tokens, temperature)[0]


def _fused_fwd(
    x: jax.Array, w: jax.Array, tokens: jax.Array, temperature: float
) -> tuple[jax.Array, tuple]:
    z = _dot_v(x, w)  # [..., V] float32, consumed by one reduction (never written)
    m, se, z_t = _max_sumexp_pick(z, tokens, temperature)  # [..., 1] each
    l = jnp.log(se)
    return (_scaled(z_t, m, temperature) - l)[..., 0], (x, w, tokens, m, l)


def _max_sumexp_pick(
    z: jax.Array, tokens: jax.Array, temperature: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One pass over ``z`` ``[..., V]``: the row max ``m``, ``sum exp((z - m) / T)`` (online:
    partial sums rescaled when the max grows) and ``z[token]`` (a masked sum: exact), each
    ``[..., 1]`` float32.  One variadic reduce, which the TPU compiler fuses into the head's
    matmul: the logits are never written."""
    inv = 1.0 / temperature if temperature not in (0, 1) else 1.0
    hit = jnp.arange(z.shape[-1], dtype=jnp.int32) == tokens.astype(jnp.int32)[..., None]

    def combine(a: tuple, b: tuple) -> tuple:
        (m1, s1, p1), (m2, s2, p2) = a, b
        m = jnp.maximum(m1, m2)
        d1 = jnp.where(m1 == m, 0.0, (m1 - m) * inv)  # 0, not nan, when both are -inf
        d2 = jnp.where(m2 == m, 0.0, (m2 - m) * inv)
        return m, s1 * jnp.exp(d1) + s2 * jnp.exp(d2), p1 + p2

    ops = (z, jnp.ones_like(z), jnp.where(hit, z, 0.0))
    init = (jnp.float32(-jnp.inf), jnp.float32(0.0), jnp.float32(0.0))
    m, se, z_t = jax.lax.reduce(ops, init, combine, (z.ndim - 1,))
    return m[..., None], se[..., None], z_t[..., None]


def _fused_bwd(temperature: float, res: tuple, g: jax.Array) -> tuple:
    x, w, tokens, m, l = res
    z = _dot_v(x, w)  # recomputed: [..., V] float32
    p = jnp.exp(_scaled(z, m, temperature) - l)
    hit = jnp.arange(z.shape[-1], dtype=jnp.int32) == tokens.astype(jnp.int32)[..., None]
    dz = (jnp.where(hit, 1.0, 0.0) - p) * g[..., None]
    if temperature not in (0, 1):
        dz = dz / temperature
    dz = dz.astype(x.dtype)  # written once; read by both gradient matmuls
    dx = jax.lax.dot_general(
        dz, w, (((dz.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )  # [..., D]
    lead = tuple(range(dz.ndim - 1))
    dw = jax.lax.dot_general(
        dz, x, ((lead, lead), ((), ())), preferred_element_type=jnp.float32
    )  # [V, D]
    return dx.astype(x.dtype), dw.astype(w.dtype), None


_fused.defvjp(_fused_fwd, _fused_bwd)


def token_logprobs_from_hidden(
    x: jax.Array, w: jax.Array, tokens: jax.Array, temperature: float = 1.0
) -> jax.Array:
    """``log_softmax(x @ w^T / T)[token]`` without keeping (or re-reading) the logits.

    Args:
      x: ``[..., D]`` normed hidden states (the head's input, compute dtype).
      w: ``[V, D]`` head weight in ``x``'s dtype.
      tokens: ``[...]`` int ids in ``[0, V)``.
      temperature: ``0`` (scored at 1) or ``>= MIN_TEMPERATURE``; no truncation.

    Returns:
      ``[...]`` float32 log-probs; differentiable in ``x`` and ``w`` (custom VJP, see the
      module doc).

    Raises:
      ValueError: for a temperature rejected by `check_temperature`.
    """
    check_temperature(temperature)
    return _fused(x, w, tokens, float(temperature))
