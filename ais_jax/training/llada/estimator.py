"""diffu-GRPO (d1) per-token log-prob estimate of a completion under a masked-diffusion model.

One forward on the sequence ``[prompt', mask * N]`` where every completion
token is replaced by the mask token and each (real) prompt token is masked
independently with probability ``p_mask``; the estimate of ``log pi(o_j | q)``
is the log-softmax at completion position ``j`` of the completion token.  The
random prompt mask is a deterministic function of the key passed in, so two
policies (the FP8 rollout copy and the BF16 trainer) evaluated with one key see
the same input and their ratio measures precision only; a fresh key per inner
iteration gives a fresh mask (the regularization d1 relies on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.models.fp8 import QuantArray
from ais_jax.models.llada.model import LLaDAConfig, forward, hidden_states
from ais_jax.training.logprobs import REMAT_POLICIES, head_map

Constrain = Callable[[jax.Array], jax.Array]

DEFAULT_P_MASK = 0.15


def mask_prompt(key: jax.Array, prompt: jax.Array, cfg: LLaDAConfig,
                p_mask: float = DEFAULT_P_MASK,
                prompt_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Mask each real prompt token independently with probability ``p_mask``.

    Args:
      key: PRNG key (the same key gives the same mask).
      prompt: ``[B, P]`` int prompt ids.
      cfg: model config (for ``mask_token_id``).
      p_mask: masking probability in ``[0, 1]``.
      prompt_mask: optional ``[B, P]`` validity; padding is never masked.

    Returns:
      ``(masked_prompt [B, P] int32, masked [B, P] bool)``.
    """
    masked = jax.random.bernoulli(key, p_mask, prompt.shape)
    if prompt_mask is not None:
        masked = masked & prompt_mask.astype(jnp.bool_)
    return jnp.where(masked, cfg.mask_token_id, prompt).astype(jnp.int32), masked


def _token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """``[B, c]`` float32 log-softmax of ``logits [B, c, V]`` at ``tokens [B, c]``."""
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(lp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def logprobs_given_input(params: dict, cfg: LLaDAConfig, masked_prompt: jax.Array,
                         completion: jax.Array,
                         prompt_mask: jax.Array | None = None, *, chunk: int = 0,
                         remat: str = "none", constrain: Constrain | None = None,
                         head_constrain: Constrain | None = None,
                         mesh: Any = None) -> jax.Array:
    """Log-probs of ``completion`` from one forward on ``[masked_prompt, mask * N]``.

    With full-precision (or FP8 block-only) params the head sees only the ``N``
    completion positions' hidden states, ``chunk`` positions at a time
    (`ais_jax.training.logprobs.head_map`: float32 log-softmax, each chunk
    rematerialized), so the ``[B, P + N, V]`` logits are never built.  A
    quantized ``lm_head`` keeps the whole-sequence forward (its activation scale
    is taken over every valid position, as the sampler's).

    Args:
      params: full-precision or FP8 rollout params.
      cfg: model config.
      masked_prompt: ``[B, P]`` int prompt ids (some possibly masked).
      completion: ``[B, N]`` int completion ids (the targets).
      prompt_mask: optional ``[B, P]`` validity of prompt tokens.
      chunk: completion positions per head application (0: all ``N`` at once).
      remat: per-block rematerialization, a key of
        `ais_jax.training.logprobs.REMAT_POLICIES` (``none``, ``full``, ``dots``).
      constrain: batch-sharding constraint of the activations ``[B, T, D]``
        (`ais_jax.training.sharding.batch_constraint`), or None.
      head_constrain: rows constraint of a vocab-parallel untied head
        (`ais_jax.training.sharding.head_constraint`), or None.
      mesh: the program's device mesh, for the TPU attention kernel on several devices,
        when ``constrain`` carries none (`ais_jax.models.llada.model.hidden_states`).

    Returns:
      ``[B, N]`` float32 log-softmax of the completion tokens.
    """
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat must be one of {tuple(REMAT_POLICIES)}, got {remat!r}")
    B, P = masked_prompt.shape
    N = completion.shape[1]
    seq = jnp.concatenate([masked_prompt.astype(jnp.int32),
                           jnp.full((B, N), cfg.mask_token_id, jnp.int32)], axis=1)
    valid = None
    if prompt_mask is not None:
        valid = jnp.concatenate([prompt_mask.astype(jnp.bool_), jnp.ones((B, N), jnp.bool_)], 1)
    if isinstance(params.get("lm_head"), QuantArray):
        mesh = mesh if mesh is not None else getattr(constrain, "mesh", None)
        logits = forward(params, seq, cfg, valid, mesh=mesh)[:, P:]  # [B, N, V] float32
        return _token_logprobs(logits, completion)
    h = hidden_states(params, seq, cfg, valid, remat=remat != "none",
                      remat_policy=REMAT_POLICIES[remat], constrain=constrain,
                      mesh=mesh)  # [B, P+N, D]
    return head_map(params, h[:, P:], completion, cfg, _token_logprobs,  # type: ignore[arg-type]
                    chunk=chunk, constrain=constrain, head_constrain=head_constrain)


def completion_logprobs(params: dict, cfg: LLaDAConfig, prompt: jax.Array,
                        completion: jax.Array, key: jax.Array,
                        p_mask: float = DEFAULT_P_MASK,
                        prompt_mask: jax.Array | None = None, **scale: Any) -> jax.Array:
    """The d1 / diffu-GRPO one-step estimate of per-token log-probs.

    It is a biased (mean-field, one-step) surrogate of the true sequence
    likelihood: every completion token is predicted from the prompt alone, and
    the prompt is randomly corrupted.

    Args:
      params: full-precision or FP8 rollout params.
      cfg: model config.
      prompt: ``[B, P]`` int prompt ids.
      completion: ``[B, N]`` int completion ids.
      key: PRNG key of the prompt mask (share it between the two policies of a
        ratio; use a fresh one per inner iteration).
      p_mask: prompt masking probability (d1: 0.15).
      prompt_mask: optional ``[B, P]`` validity of prompt tokens.
      **scale: `logprobs_given_input`'s ``chunk``, ``remat``, ``constrain``,
        ``head_constrain``, ``mesh``.

    Returns:
      ``[B, N]`` float32 log-probs.
    """
    if not 0.0 <= p_mask <= 1.0:
        raise ValueError(f"p_mask must be in [0, 1], got {p_mask!r}")
    masked_prompt, _ = mask_prompt(key, prompt, cfg, p_mask, prompt_mask)
    return logprobs_given_input(params, cfg, masked_prompt, completion, prompt_mask, **scale)


def mismatch_stats(logp_rollout: jax.Array, logp_trainer: jax.Array,
                   valid: jax.Array | None = None) -> tuple[float, float]:
    """Per-token precision mismatch of two estimates of the same tokens (same masks).

    Args:
      logp_rollout: ``[B, N]`` log-probs under the rollout (e.g. FP8) params.
      logp_trainer: ``[B, N]`` log-probs under the trainer (e.g. BF16) params.
      valid: optional ``[B, N]`` tokens to count (default: all).

    Returns:
      ``(d_bar, ess_ratio)``: mean ``|logp_rollout - logp_trainer|`` and
      ``1 / (1 + CV^2)`` of the ratios ``exp(logp_trainer - logp_rollout)``.
    """
    import numpy as np

    diff = np.asarray(logp_trainer, np.float64) - np.asarray(logp_rollout, np.float64)
    if valid is not None:
        diff = diff[np.asarray(valid, bool)]
    ratio = np.exp(diff.ravel())
    cv2 = ratio.var() / ratio.mean() ** 2
    return float(np.abs(diff).mean()), float(1.0 / (1.0 + cv2))
