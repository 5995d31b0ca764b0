"""The metrics of a LLaDA update, with the diagnostics of its trajectory ratio.

`ais_jax.training.llada.steps.update` logs each inner iteration's correction
(`iteration_metrics`) and the step's batch (`step_metrics`).  With ``diffusion.ratio:
trajectory`` it adds its diagnostics: ``traj/*`` and ``est/*`` compare the
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


def iteration_metrics(res: Any, valid: jax.Array, logp_roll: jax.Array) -> dict[str, jax.Array]:
    """One inner iteration's token counts, mean rollout log-prob and the correction ``res``'s
    statistics (`ais_jax.method.corrections.CorrectionResult`); ``valid``, ``logp_roll``
    ``[B, N]``."""
    keep = res.keep
    return {
        "loss_tokens": jnp.sum(keep).astype(jnp.float32),
        "dropped_tokens": jnp.sum(valid & ~keep).astype(jnp.float32),
        "logp_rollout_mean": jnp.sum(jnp.where(valid, logp_roll, 0.0))
        / jnp.maximum(jnp.sum(valid), 1),
        **res.stats(),
    }


def step_metrics(mets: dict[str, jax.Array], rewards: jax.Array, adv_seq: jax.Array,
                 valid: jax.Array, batch: Any, traj_old: jax.Array | None,
                 sel_old: jax.Array | None) -> dict[str, jax.Array]:
    """`ais_jax.training.llada.steps.update`'s metrics: the inner iterations' ``mets``
    (``[M]`` each) averaged (``skipped`` summed), with the batch's rewards ``[Pn, G]``,
    advantages ``adv_seq`` ``[B]``, lengths and, with ``diffusion.ratio: trajectory``
    (``traj_old`` / ``sel_old`` ``[B, N]``), the selection metrics (`select_metrics`)."""
    skipped = jnp.sum(mets.pop("skipped"))
    mets = {k: jnp.mean(v) for k, v in mets.items()}
    mets.pop("ratio_mean", None)
    return {
        **mets, "skipped": skipped,
        "reward_mean": jnp.mean(rewards), "reward_std": jnp.std(rewards),
        "adv_abs_mean": jnp.mean(jnp.abs(adv_seq)),
        "response_len": jnp.mean(jnp.sum(valid, axis=1).astype(jnp.float32)),
        "zero_prob_tokens": jnp.zeros((), jnp.float32),
        **({} if traj_old is None else select_metrics(traj_old, sel_old, batch.traj_logp,
                                                    batch.traj_select, valid)),
    }
