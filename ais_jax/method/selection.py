"""The selection term of a LLaDA denoising step with ``remasking: low_confidence`` (issue 42).

At each step the sampler (`ais_jax.rollout.llada_sampler.generate`) draws a candidate token at
every masked position of the current block from ``q_T = softmax(logits / T)``, ranks the
candidates by their *raw* log-probability ``log softmax(logits)`` (the confidence; a stable sort,
so of two equal confidences the lower position ranks first) and reveals the top ``k``.  The
probability of what a step did, the revealed set ``S`` with its tokens, is therefore

    P(S, x_S) = prod_{j in S} q_T(x_j) * prod_{u left masked} P(u ranks after every j in S)

because the candidates are drawn independently.  Given the revealed tokens, the lowest revealed
confidence ``c*`` is fixed, and a position ``u`` left masked ranks after every revealed one
exactly when its candidate's confidence is below ``c*``, or equal to it with ``u`` past every
revealed position of confidence ``c*``.  So each such ``u`` contributes the ``q_T`` mass of the
tokens whose raw log-prob is below ``c*`` (plus, past the last tied position, those equal to it).
`selection_logprob` returns the sum over ``u`` of the log of that mass; the first product is the
revealed tokens' log-probs.  With ``remasking: random`` the ranking does not depend on the
policy and the term is 0.  It lives in the method layer so that both the sampler (rollout,
`DiffusionSample.select_logprobs`) and the replay (training,
`ais_jax.training.llada.trajectory.step_logprobs`) compute it, with the same operations
(`block_selection_logprob`), from the logits they already have.  The term is one number per
row and step; `spread_over_revealed` attributes it to the step's revealed tokens in equal
shares, so per-token records ``[R, N]`` sum to the trajectory's log-probability.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_logsumexp(x: jax.Array, keep: jax.Array) -> jax.Array:
    """``log sum_{keep} exp(x)`` over the last axis; ``-inf`` where nothing is kept.

    Stable when the kept mass is tiny (a max-shifted log-sum-exp), and its gradient is finite
    (zero) on rows that keep nothing.

    Args:
      x: ``[..., V]`` float log-weights (``-inf`` allowed).
      keep: ``[..., V]`` bool.

    Returns:
      ``[...]`` float32.
    """
    x = jnp.asarray(x, jnp.float32)
    any_kept = jnp.any(keep & (x > -jnp.inf), axis=-1)
    safe = jnp.where(any_kept[..., None], jnp.where(keep, x, -jnp.inf), 0.0)
    return jnp.where(any_kept, jax.nn.logsumexp(safe, axis=-1), -jnp.inf)


def selection_logprob(raw_lp: jax.Array, z: jax.Array, tokens: jax.Array, revealed: jax.Array,
                      left: jax.Array) -> jax.Array:
    """Log-probability that the positions left masked at one step rank below the revealed ones.

    Args:
      raw_lp: ``[R, N, V]`` raw log-probs ``log softmax(logits)`` of the step's canvas (the
        confidence), ``-inf`` at tokens the sampler never proposes.
      z: ``[R, N, V]`` the sampling log-probs ``log softmax(logits / T)`` (``-inf`` likewise).
      tokens: ``[R, N]`` int response ids (read at the revealed positions only).
      revealed: ``[R, N]`` bool, the positions this step revealed.
      left: ``[R, N]`` bool, the positions this step could reveal and left masked (masked and
        in the current block, not revealed).

    Returns:
      ``[R]`` float32: ``sum_{u in left} log P(conf_u ranks after every revealed position)``;
      0 for a row that revealed nothing (every position then ranks after the empty set) or
      left nothing; ``-inf`` when some ``u`` has no such token under these log-probs.
    """
    N = tokens.shape[-1]
    pos = jnp.arange(N)
    conf = jnp.take_along_axis(raw_lp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    c_star = jnp.min(jnp.where(revealed, conf, jnp.inf), axis=-1)  # [R]
    tied = revealed & (conf == c_star[:, None])
    last_tied = jnp.max(jnp.where(tied, pos, -1), axis=-1)  # [R]; -1 when none is revealed
    below = raw_lp < c_star[:, None, None]
    tie_ok = (raw_lp == c_star[:, None, None]) & (pos[None, :] > last_tied[:, None])[..., None]
    per_pos = masked_logsumexp(z, below | tie_ok)  # [R, N]
    return jnp.sum(jnp.where(left, per_pos, 0.0), axis=-1)


def block_selection_logprob(logits: jax.Array, z: jax.Array, tokens: jax.Array,
                            revealed: jax.Array, left: jax.Array, start: jax.Array,
                            size: int) -> jax.Array:
    """`selection_logprob` of one step, on the step's block of positions only.

    The sampler (`ais_jax.rollout.llada_sampler`) and the replay
    (`ais_jax.training.llada.trajectory`) both call this, so the two compute the term with
    the same operations: the confidence ``log_softmax(logits)`` is taken on the block's
    ``size`` positions only (every revealed and left position lies there), which keeps the
    extra ``[R, size, V]`` temporaries to one block.

    Args:
      logits: ``[R, N, V]`` the step's logits, ``-inf`` at tokens never proposed.
      z: ``[R, N, V]`` the sampling log-probs ``log softmax(logits / T)``.
      tokens: ``[R, N]`` int candidates (read at revealed positions only).
      revealed: ``[R, N]`` bool, the positions the step revealed.
      left: ``[R, N]`` bool, the positions it could reveal and left masked.
      start: scalar int, the block's first position (clamped to ``N - size`` as
        `jax.lax.dynamic_slice_in_dim` does; pass masks that are empty outside the block).
      size: the block length (static).

    Returns:
      ``[R]`` float32, as `selection_logprob`.
    """
    def blk(a: jax.Array) -> jax.Array:
        return jax.lax.dynamic_slice_in_dim(a, start, size, axis=1)

    raw = jax.nn.log_softmax(blk(logits).astype(jnp.float32), axis=-1)
    return selection_logprob(raw, blk(z), blk(tokens), blk(revealed), blk(left))


def spread_over_revealed(term: jax.Array, revealed: jax.Array) -> jax.Array:
    """Split a per-row step term evenly over the tokens the step revealed.

    This is the per-token attribution of the selection term: each revealed token carries
    ``term / (tokens revealed at the step)``, so a row's shares sum to ``term`` (a row that
    revealed nothing carries nothing; the sampler reveals at least one token a step).

    Args:
      term: ``[R]`` float, one number per row (e.g. `selection_logprob`).
      revealed: ``[R, N]`` bool, the positions the step revealed.

    Returns:
      ``[R, N]`` float32: the share at revealed positions, 0 elsewhere.
    """
    n = jnp.sum(revealed, axis=-1, dtype=jnp.int32)
    share = term.astype(jnp.float32) / jnp.maximum(n, 1).astype(jnp.float32)
    return jnp.where(revealed, share[:, None], 0.0)
