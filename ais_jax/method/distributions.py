"""The sampling distribution: temperature, top-k / top-p truncation, token log-probs, draws.

One module for the math that the sampler and the trainer must agree on
(docs/spec.md section 4, "pitfalls"), in the order Hugging Face's logits
warpers use::

    z = logits / temperature                 # float32
    z = top_k(z, k)                          # keep the k largest (ties at the k-th kept)
    z = top_p(z, p)                          # keep the smallest head of mass >= p
                                             # (of the top-k renormalized distribution)
    token ~ softmax(z)      logp = log_softmax(z)[token]

The sampler draws with `sample_logits` and records ``logp``; the trainer
re-scores the same tokens with `token_logprobs` and the same settings.  With
``temperature == 0`` decoding is greedy (argmax of the raw logits, no
truncation) and the recorded log-prob is ``log_softmax(logits)`` (temperature
1, untruncated) of the chosen token.  A token outside the truncated set has
log-prob ``-inf``.

Tiny temperatures.  For ``temperature < 1`` the logits are shifted by their row
max before the division, ``z = (logits - max logits) / T``: the same
distribution (softmax, top-k and top-p are shift invariant), but ``z`` never
overflows float32, so every ``T > 0`` is exact down to the floor below.  As
``T -> 0`` the draw concentrates on the argmax (shared among exact ties), its
log-prob tends to ``0`` (``-log(#ties)``) and is always finite, and every other
token's log-prob is a large negative number or ``-inf``.  Sampler and trainer
use the same formula, so their log-probs stay consistent at any temperature.
Temperatures in ``(0, MIN_TEMPERATURE)`` -- below float32's smallest normal
number, where ``T`` itself is not representable (flushed to 0 on accelerators)
-- are rejected with a ValueError, as are negative and non-finite ones; use
``temperature=0`` for greedy decoding.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import jax
import jax.numpy as jnp

#: Smallest accepted positive temperature: float32's smallest normal number (~1.18e-38).
MIN_TEMPERATURE = float(jnp.finfo(jnp.float32).tiny)

LANES = 128  # a TPU vreg's lane count: `lane_blocks`' block size


def check_temperature(temperature: float) -> None:
    """Raise ValueError unless ``temperature`` is 0 (greedy) or in ``[MIN_TEMPERATURE, inf)``.

    Args:
      temperature: a Python number (static in every jitted caller).

    Raises:
      ValueError: negative, non-finite, or positive below `MIN_TEMPERATURE`.
    """
    t = temperature
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
    if 0 < t < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature {t!r} is below MIN_TEMPERATURE = {MIN_TEMPERATURE:.7g} (float32's "
            f"smallest normal number); use temperature=0 for greedy decoding")


def scale_logits(logits: jax.Array, temperature: float) -> jax.Array:
    """``logits / T`` in float32 without overflow. ``[..., V]`` -> ``[..., V]``.

    For ``T < 1`` the row max is subtracted first (same distribution, every
    value ``<= 0``, the argmax exactly 0); for ``T >= 1`` it is the plain
    quotient (``|logits / T| <= |logits|``).

    Args:
      logits: ``[..., V]`` raw logits (any float dtype).
      temperature: ``>= MIN_TEMPERATURE`` (see `check_temperature`).

    Returns:
      ``[..., V]`` float32 scaled logits.
    """
    z = logits.astype(jnp.float32)
    if temperature < 1.0:
        z = z - jnp.max(z, axis=-1, keepdims=True)
    return z / temperature


def truncate_logits(z: jax.Array, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """Top-k then top-p truncation: ``-inf`` outside the kept set. ``[..., V]`` float32.

    ``z`` are temperature-scaled logits.  Top-k keeps every token whose logit is
    at least the k-th largest (ties included, as Hugging Face does).  Top-p keeps
    the smallest set of most likely tokens (of the top-k renormalized
    distribution) whose probability sums to at least ``top_p``; tokens tied with
    the last kept one are kept too.  ``top_k=0`` / ``top_p=1`` disable each.
    """
    z = z.astype(jnp.float32)
    V = z.shape[-1]
    if 0 < top_k < V:
        kth = jax.lax.top_k(z, top_k)[0][..., -1:]  # [..., 1]
        z = jnp.where(z >= kth, z, -jnp.inf)
    if top_p < 1.0:
        zs = -jnp.sort(-z, axis=-1)  # [..., V] descending
        ps = jax.nn.softmax(zs, axis=-1)
        before = jnp.cumsum(ps, axis=-1) - ps  # mass strictly ahead of each token
        n_keep = jnp.maximum(jnp.sum(before < top_p, axis=-1, keepdims=True), 1)
        thr = jnp.take_along_axis(zs, n_keep - 1, axis=-1)  # [..., 1]
        z = jnp.where(z >= thr, z, -jnp.inf)
    return z


def token_logprobs(
    logits: jax.Array,
    tokens: jax.Array,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> jax.Array:
    """Log-prob of ``tokens`` under the sampling distribution the sampler uses.

    Args:
      logits: ``[..., V]`` raw logits (any float dtype; computed in float32).
      tokens: ``[...]`` int ids.
      temperature: sampling temperature; 0 means greedy, scored at temperature
        1 without truncation (as `sample` records it).  Positive values below
        `MIN_TEMPERATURE` are rejected; tiny ones are exact (see the module
        docstring).
      top_k: keep the k largest (0 = off).
      top_p: nucleus mass (1 = off).

    Returns:
      ``[...]`` float32: ``log_softmax(truncate(logits / T))[token]``
      (``-inf`` for a token outside the truncated set, or one whose
      probability underflows at a tiny temperature).

    Raises:
      ValueError: for a temperature rejected by `check_temperature`.
    """
    check_temperature(temperature)
    z = logits.astype(jnp.float32)
    if temperature > 0:
        z = truncate_logits(scale_logits(z, temperature), top_k, top_p)
    lp = jax.nn.log_softmax(z, axis=-1)
    hit = jnp.arange(lp.shape[-1], dtype=jnp.int32) == tokens[..., None].astype(jnp.int32)
    return jnp.sum(jnp.where(hit, lp, 0.0), axis=-1)


def truncates(temperature: float, top_k: int, top_p: float) -> bool:
    """Whether the sampling distribution is truncated (top-k / top-p at ``temperature > 0``)."""
    return temperature > 0 and (top_k > 0 or top_p < 1.0)


def token_logprob_pair(
    logits: jax.Array,
    tokens: jax.Array,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Log-probs of ``tokens`` under the truncated and the full (tempered) distribution.

    Args:
      logits: ``[..., V]`` raw logits.
      tokens: ``[...]`` int ids.
      temperature, top_k, top_p: as in `token_logprobs`.

    Returns:
      ``(truncated, full)``, each ``[...]`` float32: `token_logprobs` with the
      given truncation (``-inf`` outside the kept set), and without it (finite
      for finite logits).  Equal when nothing truncates.
    """
    trunc = token_logprobs(logits, tokens, temperature, top_k, top_p)
    if not truncates(temperature, top_k, top_p):
        return trunc, trunc
    return trunc, token_logprobs(logits, tokens, temperature)


def _block_size(V: int) -> int:
    return max(1, 1 << round(math.log2(math.sqrt(V))))


def categorical_inverse_cdf(key: jax.Array, weights: jax.Array) -> jax.Array:
    """Draw one index per row with probability ``weights / sum(weights)``.

    Exact inverse-CDF draw with one uniform per row: the running sum over
    blocks of about sqrt(V) entries picks the block, a cumulative sum inside it
    picks the entry.  Never returns an index of zero weight (rows need a
    positive total).

    Args:
      key: PRNG key.
      weights: ``[B, V]`` non-negative float32 (e.g. ``exp(z - max z)``).

    Returns:
      ``[B]`` int32 indices.
    """
    return _inverse_cdf(jax.random.uniform(key, weights.shape[:1], jnp.float32), weights)


def _inverse_cdf(u: jax.Array, weights: jax.Array) -> jax.Array:
    """`categorical_inverse_cdf` given the uniforms ``u`` ``[B]`` in [0, 1)."""
    B, V = weights.shape
    blk = _block_size(V)
    nb = -(-V // blk)
    w = jnp.pad(weights, ((0, 0), (0, nb * blk - V))).reshape(B, nb, blk)  # [B, nb, blk]
    block = lambda j: jnp.take_along_axis(w, j[:, None, None], axis=1)[:, 0]  # noqa: E731
    return _draw_blocks(u, jnp.sum(w, axis=-1), block, blk)[0]


def _draw_blocks(
    u: jax.Array, bsum: jax.Array, block: Callable[[jax.Array], jax.Array], blk: int
) -> tuple[jax.Array, jax.Array]:
    """The inverse-CDF draw over blocks: ``bsum`` ``[B, nb]`` block sums, ``block(j)`` the
    ``[B, blk]`` weights of block ``j`` ``[B]``; returns ``(index [B] int32, total [B])``.

    The running sum over blocks picks the block, a cumulative sum inside it the entry; both
    are clamped to the last block / entry of positive weight, so a zero-weight index is
    never returned."""
    nb = bsum.shape[-1]
    bcum = jnp.cumsum(bsum, axis=-1)  # [B, nb]
    u = u * bcum[:, -1]  # [B] in [0, total)
    last_block = nb - 1 - jnp.argmax((bsum > 0)[:, ::-1], axis=-1)
    j = jnp.minimum(jnp.sum(bcum <= u[:, None], axis=-1), last_block)  # [B]
    ahead = jnp.take_along_axis(bcum - bsum, j[:, None], axis=-1)[:, 0]
    r = jnp.maximum(u - ahead, 0.0)  # [B] offset inside block j
    wj = block(j)  # [B, blk]
    last_in = blk - 1 - jnp.argmax((wj > 0)[:, ::-1], axis=-1)
    i = jnp.minimum(jnp.sum(jnp.cumsum(wj, axis=-1) <= r[:, None], axis=-1), last_in)
    return (j * blk + i).astype(jnp.int32), bcum[:, -1]


def lane_blocks(V: int, backend: str | None = None) -> bool:
    """Whether `sample_logits_u` draws by `LANES`-entry blocks summed straight from the
    logits: on TPU (``backend``, default ``jax.default_backend()``) when ``V % LANES == 0``.

    The TPU compiler prices the generic form (a padded, materialized ``exp``, its block sums
    in a reduce of their own) at 547k cycles for a ``[64, 151936]`` draw on v6e, this form at
    166k (v5e 799k / 295k, tpu7x 348k / 178k: `benchmarks/deviceless_draw.py`).  The same
    distribution; other backends keep the generic form and its bits."""
    backend = jax.default_backend() if backend is None else backend
    return backend == "tpu" and V % LANES == 0


def _draw_lanes(u: jax.Array, z: jax.Array, m: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`_draw_blocks` over `LANES`-entry blocks of ``exp(z - m)``, never materialized whole:
    ``z`` ``[B, V]`` float32 (``V % LANES == 0``), ``m`` ``[B, 1]`` its row max; returns
    ``(tokens [B] int32, sum of exp(z - m) [B])``."""
    B, V = z.shape
    zb = z.reshape(B, V // LANES, LANES)  # [B, nb, LANES], a bitcast of the lane tiles
    bsum = jnp.sum(jnp.exp(zb - m[:, :, None]), axis=-1)  # [B, nb]

    def block(j: jax.Array) -> jax.Array:
        idx = j[:, None] * LANES + jnp.arange(LANES)  # [B, LANES]: block j of each row
        return jnp.exp(jnp.take_along_axis(z, idx, axis=-1) - m)

    return _draw_blocks(u, bsum, block, LANES)


def sample_logits(
    key: jax.Array,
    logits: jax.Array,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row and its log-prob under the distribution drawn from.

    Args:
      key: PRNG key.
      logits: ``[B, V]`` raw logits.
      temperature, top_k, top_p: as in `sample` (static Python numbers).

    Returns:
      ``(tokens [B] int32, logp [B] float32)``; ``logp`` equals
      ``token_logprobs(logits, tokens, temperature, top_k, top_p)`` and is
      finite (for finite logits) at every accepted temperature.

    Raises:
      ValueError: for a temperature rejected by `check_temperature`.
    """
    u = jax.random.uniform(key, logits.shape[:1], jnp.float32)
    return sample_logits_u(u, logits, temperature, top_k, top_p)


def sample_logits_u(
    u: jax.Array, logits: jax.Array, temperature: float, top_k: int, top_p: float
) -> tuple[jax.Array, jax.Array]:
    """`sample_logits` given the row uniforms ``u`` ``[B]`` in [0, 1)."""
    check_temperature(temperature)
    z = logits.astype(jnp.float32)
    if temperature == 0:
        tok = jnp.argmax(z, axis=-1).astype(jnp.int32)
        return tok, token_logprobs(z, tok, 0.0)
    z = truncate_logits(scale_logits(z, temperature), top_k, top_p)
    m = jnp.max(z, axis=-1, keepdims=True)  # [B, 1], finite: the argmax is always kept
    if lane_blocks(z.shape[-1]):
        tok, total = _draw_lanes(u, z, m)
    else:
        e = jnp.exp(z - m)  # [B, V], 0 outside the kept set
        tok, total = _inverse_cdf(u, e), jnp.sum(e, axis=-1)
    zt = jnp.take_along_axis(z, tok[:, None], axis=-1)[:, 0]
    return tok, zt - m[:, 0] - jnp.log(total)
