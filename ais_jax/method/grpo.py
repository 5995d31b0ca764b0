"""GRPO: group advantages and the clipped objective with k3 KL, on log-probs (no model).

docs/spec.md section 5.  `grpo_loss` takes the trainer's log-probs and the
AIS-weighted advantage ``A_tilde`` (from `ais_jax.method.ais.ais_coefficient`);
the model side (scoring completions, `policy_loss`) is `ais_jax.training.policy`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ais_jax.method.corrections import k3

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "constant")


def group_advantages(rewards: jax.Array, eps: float = 1e-6, *, scale: bool = True) -> jax.Array:
    """Group-relative advantages ``(r - mean_g(r)) / (std_g(r) + eps)``.

    Args:
      rewards: ``[P, G]`` rewards, G samples for each of P prompts.
      eps: added to the group std.
      scale: divide by the group std (GRPO); ``False`` gives the mean-centred
        advantage of Dr. GRPO.

    Returns:
      ``[P, G]`` float32.  The std is the sample std (ddof=1, as ``torch.std``
      in common GRPO code; 0 for G = 1).  A group whose rewards are all equal
      gets exactly zero advantage.
    """
    r = jnp.asarray(rewards, jnp.float32)
    if r.ndim != 2:
        raise ValueError(f"group_advantages expects rewards [P, G], got shape {r.shape}")
    G = r.shape[1]
    mean = jnp.mean(r, axis=1, keepdims=True)
    centred = r - mean
    if scale:
        std = jnp.sqrt(jnp.sum(centred**2, axis=1, keepdims=True) / max(G - 1, 1))
        centred = centred / (std + eps)
    same = jnp.max(r, axis=1, keepdims=True) == jnp.min(r, axis=1, keepdims=True)
    return jnp.where(same, 0.0, centred)


class LossConfig(NamedTuple):
    """Static settings of the GRPO objective.

    Attributes:
      clip_eps: PPO clip range (lower side and, by default, upper side).
      clip_eps_high: upper clip range (DAPO "clip-higher"); ``None`` = clip_eps.
      beta_kl: weight of the k3 KL penalty to the reference policy.
      aggregation: ``"token_mean"`` (all valid tokens of the batch),
        ``"seq_mean_token_mean"`` (mean over sequences of per-sequence token
        means) or ``"constant"`` (sum / (num_sequences * normalizer), Dr. GRPO).
      normalizer: the constant of ``"constant"``; ``None`` = the padded length N.
    """

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    beta_kl: float = 0.0
    aggregation: str = "token_mean"
    normalizer: float | None = None


DEFAULT_LOSS = LossConfig()


class LossTotals(NamedTuple):
    """Normalizers of a whole (mini)batch, for a loss summed over micro-batches.

    Attributes:
      tokens: float32 scalar, valid tokens of the whole batch (>= 1).
      sequences: float32 scalar, sequences of the whole batch with a valid
        token (>= 1; ``seq_mean_token_mean``).
      rows: float32 scalar, all sequences of the whole batch (``constant``).
    """

    tokens: jax.Array
    sequences: jax.Array
    rows: jax.Array


def loss_totals(mask: jax.Array) -> LossTotals:
    """`LossTotals` of a ``[B, N]`` validity mask."""
    vf = (mask != 0).astype(jnp.float32)
    has = jnp.sum(vf, axis=-1) > 0
    return LossTotals(jnp.maximum(jnp.sum(vf), 1.0), jnp.maximum(jnp.sum(has), 1).astype(
        jnp.float32), jnp.asarray(max(1, mask.size // mask.shape[-1]), jnp.float32))


def grpo_loss(
    logp_new: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    logp_ref: jax.Array | None = None,
    loss_cfg: LossConfig = DEFAULT_LOSS,
    totals: LossTotals | None = None,
    logp_new_full: jax.Array | None = None,
    logp_old_full: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped GRPO objective on (AIS-weighted) advantages with the k3 KL penalty.

    ``ratio = exp(logp_new - logp_old)``;
    per token ``-min(ratio * A, clip(ratio, 1 - e_lo, 1 + e_hi) * A) + beta_kl * KL_k3``
    with ``KL_k3 = exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1``
    (`ais_jax.method.corrections.k3`: a series near 0, so a tiny KL keeps its
    relative accuracy in float32), aggregated as ``loss_cfg.aggregation`` says.

    Args:
      logp_new: ``[B, N]`` log-probs under the policy being updated (differentiated).
      logp_old: ``[B, N]`` log-probs under the pre-update policy (detached).
      advantages: ``[B, N]`` per-token advantages (``A_tilde`` from AIS).
      mask: ``[B, N]`` 1 for valid generated tokens; masked slots may hold garbage.
      logp_ref: ``[B, N]`` reference-policy log-probs, or None (no KL term).
      loss_cfg: `LossConfig`.
      totals: normalizers of the whole batch when this call sees one
        micro-batch of it (the losses and metrics of the micro-batches then
        sum to those of the whole batch); None: this batch's own.
      logp_new_full, logp_old_full: ``[B, N]`` log-probs under the full
        (untruncated) tempered distribution when ``logp_new`` / ``logp_old``
        are truncated ones (top-k / top-p).  A token outside the trainer's
        truncated set (``logp_old = -inf``: its importance ratio is 0, see
        `ais_jax.method.corrections`) takes its PPO ratio from these, so every mode
        trains on the tokens it sampled; the KL term always compares full
        distributions (finite).  None: nothing truncates.

    Returns:
      ``(loss scalar float32, metrics)`` with ``clip_frac``, ``kl``, ``ratio_mean``.
    """
    if loss_cfg.aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {loss_cfg.aggregation!r}; "
                         f"use one of {AGGREGATIONS}")
    valid = mask.astype(jnp.bool_) if mask.dtype == jnp.bool_ else mask != 0
    ln_kl = logp_new
    if logp_new_full is not None and logp_old_full is not None:
        in_set = ~jnp.isneginf(jax.lax.stop_gradient(logp_old))  # NaN stays NaN
        logp_new = jnp.where(in_set, logp_new, logp_new_full)
        logp_old = jnp.where(in_set, logp_old, logp_old_full)
        ln_kl = logp_new_full
    ln = jnp.where(valid, logp_new.astype(jnp.float32), 0.0)
    lo = jnp.where(valid, jax.lax.stop_gradient(logp_old).astype(jnp.float32), 0.0)
    adv = jnp.where(valid, jax.lax.stop_gradient(advantages).astype(jnp.float32), 0.0)
    e_lo = loss_cfg.clip_eps
    e_hi = loss_cfg.clip_eps if loss_cfg.clip_eps_high is None else loss_cfg.clip_eps_high
    ratio = jnp.exp(ln - lo)
    clipped = jnp.clip(ratio, 1.0 - e_lo, 1.0 + e_hi)
    per_tok = -jnp.minimum(ratio * adv, clipped * adv)  # [B, N]
    kl = jnp.zeros_like(per_tok)
    if logp_ref is not None:
        lref = jnp.where(valid, jax.lax.stop_gradient(logp_ref).astype(jnp.float32), 0.0)
        d = lref - jnp.where(valid, ln_kl.astype(jnp.float32), 0.0)
        kl = k3(d)  # exp(d) - d - 1 without float32 cancellation at small d
        per_tok = per_tok + loss_cfg.beta_kl * kl
    per_tok = jnp.where(valid, per_tok, 0.0)
    vf = valid.astype(jnp.float32)
    n_tok = jnp.maximum(jnp.sum(vf), 1.0) if totals is None else totals.tokens
    if loss_cfg.aggregation == "token_mean":
        loss = jnp.sum(per_tok) / n_tok
    elif loss_cfg.aggregation == "seq_mean_token_mean":
        n_seq_tok = jnp.sum(vf, axis=-1)  # [B]
        seq_loss = jnp.sum(per_tok, axis=-1) / jnp.maximum(n_seq_tok, 1.0)
        has = n_seq_tok > 0
        n_has = jnp.maximum(jnp.sum(has), 1) if totals is None else totals.sequences
        loss = jnp.sum(jnp.where(has, seq_loss, 0.0)) / n_has
    else:
        norm = per_tok.shape[-1] if loss_cfg.normalizer is None else loss_cfg.normalizer
        n_seq = max(1, per_tok.size // per_tok.shape[-1]) if totals is None else totals.rows
        loss = jnp.sum(per_tok) / (n_seq * norm)
    is_clipped = (ratio < 1.0 - e_lo) | (ratio > 1.0 + e_hi)
    metrics = {
        "clip_frac": jnp.sum(jnp.where(valid, is_clipped, False)) / n_tok,
        "kl": jnp.sum(jnp.where(valid, kl, 0.0)) / n_tok,
        "ratio_mean": jnp.sum(jnp.where(valid, ratio, 0.0)) / n_tok,
    }
    return loss.astype(jnp.float32), jax.lax.stop_gradient(metrics)


class GRPOBatch(NamedTuple):
    """One (mini)batch of the GRPO update (``B`` sequences, prompt ``P``, ``N`` new tokens).

    Attributes:
      prompt_tokens: ``[B, P]`` left-padded prompts.
      prompt_mask: ``[B, P]``.
      tokens: ``[B, N]`` generated tokens.
      mask: ``[B, N]`` float32, 1 for valid generated tokens.
      logp_old: ``[B, N]`` pre-update trainer log-probs (detached).
      advantages: ``[B, N]`` AIS-weighted advantages ``A_tilde``.
      logp_ref: ``[B, N]`` reference log-probs under the full (untruncated)
        distribution, or None (no KL term).
      logp_old_full: ``[B, N]`` pre-update log-probs under the full tempered
        distribution when the sampler truncates (top-k / top-p), else None.
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    mask: jax.Array
    logp_old: jax.Array
    advantages: jax.Array
    logp_ref: jax.Array | None = None
    logp_old_full: jax.Array | None = None
