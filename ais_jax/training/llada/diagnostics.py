"""Diagnostics of the trajectory ratio of a LLaDA update (``diffusion.ratio: trajectory``).

`ais_jax.training.llada.steps.update` logs them: ``traj/*`` and ``est/*`` compare the
correction's trajectory ratio with d1's estimate pair (`ratio_metrics`), and
``traj/seq_logratio_abs`` / ``traj/select_*`` measure how much of the trajectory's mismatch
is the low_confidence selection term (`select_metrics`; docs/llada.md "Two ratios").
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.method.ais import LOG_RATIO_BOUND


def ratio_metrics(res: Any, est: Any | None) -> dict[str, jax.Array]:
    """``traj/*`` (the correction's trajectory ratio) and ``est/*`` (d1's estimate pair).

    Args:
      res: the correction's result on the trajectory pair (its ``stats()`` has ``d_bar``
        and ``ess_ratio``).
      est: `ais_jax.method.ais.ais_coefficient`'s result on d1's pair, or None.

    Returns:
      Float32 scalars ``traj/d_bar``, ``traj/token_ess``, ``est/d_bar``, ``est/token_ess``
      when ``est`` is given; else an empty dict.
    """
    if est is None:
        return {}
    t = res.stats()
    return {"traj/d_bar": t["d_bar"], "traj/token_ess": t["ess_ratio"],
            "est/d_bar": est.d_bar, "est/token_ess": est.ess_ratio}


def select_metrics(traj_old: jax.Array, sel_old: jax.Array, traj_roll: jax.Array,
                   sel_roll: jax.Array, valid: jax.Array) -> dict[str, jax.Array]:
    """The selection part's share of the trajectory mismatch, per sequence.

    A row's log-ratio is the sum over its valid tokens of ``trainer - sampler`` (each token
    clipped at ``±LOG_RATIO_BOUND``: a trainer selection probability of 0 is ``-inf``).

    Args:
      traj_old: ``[B, N]`` the trainer's complete replay (token + selection parts).
      sel_old: ``[B, N]`` its selection part.
      traj_roll: ``[B, N]`` the sampler's complete record (``DiffusionBatch.traj_logp``).
      sel_roll: ``[B, N]`` its selection part (``DiffusionBatch.traj_select``).
      valid: ``[B, N]`` bool, the completion mask.

    Returns:
      Float32 scalars: ``traj/seq_logratio_abs``, the mean over rows of ``|row log-ratio|``
      of the complete log-probs; ``traj/select_seq_logratio_abs``, the same of the
      selection parts alone (0 with ``remasking: random`` or at temperature 0);
      ``traj/select_share``, the second over the first (0 when the first is 0; above 1 when
      a row's token and selection log-ratios have opposite signs).
    """
    def seq_abs(new: jax.Array, old: jax.Array) -> jax.Array:  # [B]
        d = jnp.clip(new - old, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        return jnp.abs(jnp.sum(jnp.where(valid, d, 0.0), axis=1))

    full = jnp.mean(seq_abs(traj_old, traj_roll))
    sel = jnp.mean(seq_abs(sel_old, sel_roll))
    share = jnp.where(full > 0, sel / jnp.where(full > 0, full, 1.0), 0.0)
    return {"traj/seq_logratio_abs": full, "traj/select_seq_logratio_abs": sel,
            "traj/select_share": share}
