"""The policy side of GRPO: trainer log-probs of completions and the loss of a params pytree.

`policy_loss` scores a `ais_jax.method.grpo.GRPOBatch` with the model
(`trainer_logprobs`, through `ais_jax.training.logprobs`) and hands the
log-probs to `ais_jax.method.grpo.grpo_loss`; the trainer
(`ais_jax.training.trainer`) differentiates it through
`ais_jax.training.optim.apply_update`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ais_jax.method.grpo import DEFAULT_LOSS, GRPOBatch, LossConfig, LossTotals, grpo_loss
from ais_jax.models import model as model_lib
from ais_jax.models.qarray import QuantArray
from ais_jax.training.logprobs import Constrain, completion_logprobs


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

    Scored under the sampler's distribution (`ais_jax.method.distributions`): the same
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
    return completion_logprobs(params, prompt_tokens, prompt_mask, tokens, cfg, temperature,
                               top_k, top_p)  # [B, N]


class Scoring(NamedTuple):
    """How the trainer scores completions: the sampler's distribution and how to run the model.

    Attributes:
      temperature: the sampler's temperature.
      top_k: the sampler's top-k (0 = off).
      top_p: the sampler's top-p (1 = off).
      compute_dtype: dtype the float params are cast to for the forward pass.
      chunk: completion positions per head application (0: all at once);
        see `ais_jax.training.logprobs.head_logprobs`.
      remat: per-layer rematerialization policy (`ais_jax.training.logprobs.REMAT_POLICIES`).
      constrain: sharding constraint for activations (batch axis), or None.
      head_constrain: rows constraint of a vocab-parallel ``lm_head``
        (`ais_jax.training.sharding.head_constraint`), or None.
      view: ``params -> model params`` applied first (LoRA: the adapters onto the frozen
        base, `ais_jax.training.lora_policy.view`), or None (the params are the model's).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    compute_dtype: Any = jnp.bfloat16
    chunk: int = 0
    remat: str = "none"
    constrain: Constrain | None = None
    head_constrain: Constrain | None = None
    view: Any = None


DEFAULT_SCORING = Scoring()


def cast_params(params: Any, dtype: Any) -> Any:
    """Cast float leaves to ``dtype`` (`ais_jax.models.fp8.QuantArray` leaves untouched)."""
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
    *,
    both: bool = False,
) -> Any:
    """Trainer log-probs ``[B, N]`` of ``tokens``: `sequence_logprobs` in the compute dtype.

    Args:
      params: master params (cast to ``scoring.compute_dtype`` for the forward).
      prompt_tokens: ``[B, P]`` left-padded prompts.
      prompt_mask: ``[B, P]``.
      tokens: ``[B, N]`` generated tokens.
      cfg: model config.
      scoring: the sampler's distribution settings and the compute dtype.
      both: return ``(truncated, full)``: under the sampler's (truncated)
        distribution and under the full tempered one, from one forward.

    Returns:
      ``[B, N]`` float32, or the pair with ``both``.
    """
    s = scoring
    if s.view is not None:
        params = s.view(params)
    return completion_logprobs(cast_params(params, s.compute_dtype), prompt_tokens, prompt_mask,
                               tokens, cfg, s.temperature, s.top_k, s.top_p, chunk=s.chunk,
                               remat=s.remat, constrain=s.constrain,
                               head_constrain=s.head_constrain, both=both)


def policy_loss(
    params: Any,
    batch: GRPOBatch,
    cfg: model_lib.ModelConfig,
    loss_cfg: LossConfig = DEFAULT_LOSS,
    scoring: Scoring = DEFAULT_SCORING,
    totals: LossTotals | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO loss of ``params`` on ``batch`` (the differentiated argument first).

    Args:
      params: master params.
      batch: a `GRPOBatch` of ``B`` sequences.
      cfg: model config.
      loss_cfg: `LossConfig`.
      scoring: how completions are scored (`Scoring`).
      totals: normalizers of the whole batch when ``batch`` is one micro-batch.

    Returns:
      ``(loss, metrics)`` as `grpo_loss`.
    """
    pair = batch.logp_old_full is not None
    logp_new = trainer_logprobs(params, batch.prompt_tokens, batch.prompt_mask, batch.tokens,
                                cfg, scoring, both=pair)
    logp_new, logp_new_full = logp_new if pair else (logp_new, None)
    return grpo_loss(logp_new, batch.logp_old, batch.advantages, batch.mask, batch.logp_ref,
                     loss_cfg, totals, logp_new_full, batch.logp_old_full)
