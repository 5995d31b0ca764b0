"""GRPO: group advantages, completion log-probs, the clipped objective with k3 KL, the update.

docs/spec.md section 5.  The one GRPO path of the library: the trainer
(`ais_jax.steps`) differentiates `policy_loss` through `apply_update`.  The
loss takes the AIS-weighted advantage ``A_tilde`` (from
`ais_jax.ais.ais_coefficient`); the update works with any optax
`GradientTransformation` and skips (and counts) a step whose loss or gradient
is not finite, leaving params and optimizer state bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ais_jax import model as model_lib
from ais_jax.distributions import token_logprobs

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


def sequence_logprobs(
    params: dict,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    tokens: jax.Array,
    cfg: model_lib.ModelConfig,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> jax.Array:
    """Per-token log-probs of generated ``tokens`` given their left-padded prompts.

    Scored under the sampler's distribution (`ais_jax.distributions`): the same
    temperature and, when top-k / top-p truncation is on, the same truncated,
    renormalized distribution (a token outside the truncated set gets ``-inf``).

    Args:
      params: policy params (full precision, or an FP8 rollout copy).
      prompt_tokens: ``[B, P]`` left-padded prompts.
      prompt_mask: ``[B, P]`` 1 for real prompt tokens.
      tokens: ``[B, N]`` generated tokens.
      cfg: model config.
      temperature: the sampler's temperature (0: greedy, scored at 1).
      top_k: the sampler's top-k (0 = off).
      top_p: the sampler's top-p (1 = off).

    Returns:
      ``[B, N]`` float32 ``log pi(tokens[:, n] | prompt, tokens[:, :n])``.
      Positions after EOS are computed too (mask them downstream).
    """
    logits = completion_logits(params, prompt_tokens, prompt_mask, tokens, cfg)  # [B, N, V]
    return token_logprobs(logits, tokens, temperature, top_k, top_p)  # [B, N]


def completion_logits(
    params: dict,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    tokens: jax.Array,
    cfg: model_lib.ModelConfig,
) -> jax.Array:
    """Logits ``[B, N, V]`` (float32) that predict each generated token from its prefix.

    Args:
      params: policy params.
      prompt_tokens: ``[B, P]`` left-padded prompts.
      prompt_mask: ``[B, P]``.
      tokens: ``[B, N]`` generated tokens.
      cfg: model config.
    """
    P = prompt_tokens.shape[1]
    seq = jnp.concatenate([prompt_tokens, tokens], axis=1)  # [B, P+N]
    seq_mask = jnp.concatenate([prompt_mask.astype(jnp.bool_),
                                jnp.ones(tokens.shape, jnp.bool_)], axis=1)
    logits = model_lib.forward(params, seq[:, :-1], cfg, seq_mask[:, :-1])  # [B, P+N-1, V]
    return logits[:, P - 1:]  # [B, N, V]


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


def grpo_loss(
    logp_new: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    logp_ref: jax.Array | None = None,
    loss_cfg: LossConfig = DEFAULT_LOSS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped GRPO objective on (AIS-weighted) advantages with the k3 KL penalty.

    ``ratio = exp(logp_new - logp_old)``;
    per token ``-min(ratio * A, clip(ratio, 1 - e_lo, 1 + e_hi) * A) + beta_kl * KL_k3``
    with ``KL_k3 = exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1``,
    aggregated as ``loss_cfg.aggregation`` says.

    Args:
      logp_new: ``[B, N]`` log-probs under the policy being updated (differentiated).
      logp_old: ``[B, N]`` log-probs under the pre-update policy (detached).
      advantages: ``[B, N]`` per-token advantages (``A_tilde`` from AIS).
      mask: ``[B, N]`` 1 for valid generated tokens; masked slots may hold garbage.
      logp_ref: ``[B, N]`` reference-policy log-probs, or None (no KL term).
      loss_cfg: `LossConfig`.

    Returns:
      ``(loss scalar float32, metrics)`` with ``clip_frac``, ``kl``, ``ratio_mean``.
    """
    if loss_cfg.aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {loss_cfg.aggregation!r}; "
                         f"use one of {AGGREGATIONS}")
    valid = mask.astype(jnp.bool_) if mask.dtype == jnp.bool_ else mask != 0
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
        d = lref - ln
        kl = jnp.exp(d) - d - 1.0
        per_tok = per_tok + loss_cfg.beta_kl * kl
    per_tok = jnp.where(valid, per_tok, 0.0)
    vf = valid.astype(jnp.float32)
    n_tok = jnp.maximum(jnp.sum(vf), 1.0)
    if loss_cfg.aggregation == "token_mean":
        loss = jnp.sum(per_tok) / n_tok
    elif loss_cfg.aggregation == "seq_mean_token_mean":
        n_seq_tok = jnp.sum(vf, axis=-1)  # [B]
        seq_loss = jnp.sum(per_tok, axis=-1) / jnp.maximum(n_seq_tok, 1.0)
        has = n_seq_tok > 0
        loss = jnp.sum(jnp.where(has, seq_loss, 0.0)) / jnp.maximum(jnp.sum(has), 1)
    else:
        norm = per_tok.shape[-1] if loss_cfg.normalizer is None else loss_cfg.normalizer
        n_seq = max(1, per_tok.size // per_tok.shape[-1])
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
      logp_ref: ``[B, N]`` reference log-probs, or None (no KL term).
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    mask: jax.Array
    logp_old: jax.Array
    advantages: jax.Array
    logp_ref: jax.Array | None = None


class Scoring(NamedTuple):
    """How the trainer scores completions: the sampler's distribution and the compute dtype.

    Attributes:
      temperature: the sampler's temperature.
      top_k: the sampler's top-k (0 = off).
      top_p: the sampler's top-p (1 = off).
      compute_dtype: dtype the float params are cast to for the forward pass.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    compute_dtype: Any = jnp.bfloat16


DEFAULT_SCORING = Scoring()


def cast_params(params: Any, dtype: Any) -> Any:
    """Cast float leaves to ``dtype`` (`ais_jax.fp8.QuantArray` leaves untouched)."""
    from ais_jax.fp8 import QuantArray

    def cast(x: Any) -> Any:
        if isinstance(x, QuantArray) or not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x.astype(dtype)

    return jax.tree.map(cast, params, is_leaf=lambda x: isinstance(x, QuantArray))


def trainer_logprobs(
    params: Any,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    tokens: jax.Array,
    cfg: model_lib.ModelConfig,
    scoring: Scoring = DEFAULT_SCORING,
) -> jax.Array:
    """Trainer log-probs ``[B, N]`` of ``tokens``: `sequence_logprobs` in the compute dtype.

    Args:
      params: master params (cast to ``scoring.compute_dtype`` for the forward).
      prompt_tokens: ``[B, P]`` left-padded prompts.
      prompt_mask: ``[B, P]``.
      tokens: ``[B, N]`` generated tokens.
      cfg: model config.
      scoring: the sampler's distribution settings and the compute dtype.
    """
    p = cast_params(params, scoring.compute_dtype)
    return sequence_logprobs(p, prompt_tokens, prompt_mask, tokens, cfg, scoring.temperature,
                             scoring.top_k, scoring.top_p)


def policy_loss(
    params: Any,
    batch: GRPOBatch,
    cfg: model_lib.ModelConfig,
    loss_cfg: LossConfig = DEFAULT_LOSS,
    scoring: Scoring = DEFAULT_SCORING,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO loss of ``params`` on ``batch`` (the differentiated argument first).

    Args:
      params: master params.
      batch: a `GRPOBatch` of ``B`` sequences.
      cfg: model config.
      loss_cfg: `LossConfig`.
      scoring: how completions are scored (`Scoring`).

    Returns:
      ``(loss, metrics)`` as `grpo_loss`.
    """
    logp_new = trainer_logprobs(params, batch.prompt_tokens, batch.prompt_mask, batch.tokens,
                                cfg, scoring)
    return grpo_loss(logp_new, batch.logp_old, batch.advantages, batch.mask, batch.logp_ref,
                     loss_cfg)


class TrainState(NamedTuple):
    """Everything that changes across updates (checkpointed).

    Attributes:
      params: master params (float32, or bfloat16 when asked for).
      opt_state: optax state.
      step: int32 scalar, optimizer updates done (applied + skipped).
      skipped: int32 scalar, updates skipped for a non-finite loss / gradient.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    skipped: jax.Array


def init_train_state(params: Any, optimizer: optax.GradientTransformation) -> TrainState:
    """Fresh `TrainState` for ``params``."""
    # Two distinct buffers: the state is donated, and a buffer cannot be donated twice.
    return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32),
                      jnp.zeros((), jnp.int32))


def make_optimizer(
    learning_rate: float | optax.Schedule,
    *,
    clip_norm: float | None = 1.0,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
) -> optax.GradientTransformation:
    """AdamW with optional global-norm gradient clipping (``clip_norm=None`` disables it)."""
    parts = []
    if clip_norm is not None:
        parts.append(optax.clip_by_global_norm(clip_norm))
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay))
    return optax.chain(*parts)


def apply_update(
    state: TrainState,
    batch: Any,
    loss_fn: Callable[..., tuple[jax.Array, dict[str, jax.Array]]],
    optimizer: optax.GradientTransformation,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One guarded optimizer step: ``loss_fn(params, batch) -> (loss, metrics)``.

    If the loss or any gradient is not finite, params and optimizer state are
    returned bit-identical and ``skipped`` is incremented.

    Returns:
      ``(new_state, metrics)``; metrics has ``loss``, ``grad_norm``, ``skipped``
      (1.0 if this step was skipped) and whatever ``loss_fn`` returned.
    """
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    # Non-finite gradients would poison the optimizer moments even if discarded
    # afterwards; feed zeros through instead and select the old state below.
    safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
    updates, new_opt = optimizer.update(safe_grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    new_state = TrainState(
        params=keep(new_params, state.params),
        opt_state=keep(new_opt, state.opt_state),
        step=state.step + 1,
        skipped=state.skipped + jnp.where(finite, 0, 1).astype(jnp.int32),
    )
    metrics = dict(aux)
    metrics.update(loss=loss, grad_norm=grad_norm, skipped=1.0 - finite.astype(jnp.float32))
    return new_state, metrics
