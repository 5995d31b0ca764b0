"""Masked-diffusion supervised warm start of LLaDA policies (LLaDA's SFT objective).

Each demonstration is the left-padded prompt followed by the answer, its EOS
and EOS filling the rest of the ``N`` response positions (LLaDA pads short
answers with EOS and trains on those too, which is how it learns to end a
response).  Per sequence, ``t ~ U(eps, 1]``; every response token is masked
with probability ``t``; the loss is the cross-entropy of the clean tokens at
the masked positions weighted ``1 / t``, summed per sequence, divided by the
response length ``N`` and averaged over sequences (an upper bound on the
negative log-likelihood of the response, LLaDA eq. 5).  The prompt stays
clean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ais_jax.core.errors import UsageError
from ais_jax.models.llada.model import LLaDAConfig, forward
from ais_jax.training.policy import cast_params

#: Lower end of the masking rate ``t`` (LLaDA's ``eps``: no division by ~0).
T_MIN = 1e-3


def sft_loss(params: Any, tokens: jax.Array, loss_mask: jax.Array, key: jax.Array,
             lcfg: LLaDAConfig, pad_id: int | None, compute_dtype: Any = jnp.bfloat16,
             mesh: Any = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """LLaDA's masked-diffusion SFT loss of one batch.

    Args:
      params: master params.
      tokens: ``[B, T]`` prompt (left-padded with ``pad_id``) then response.
      loss_mask: ``[B, T]`` 1 on the response positions (maskable targets).
      key: PRNG key of the masking rates and masks.
      lcfg: model config.
      pad_id: prompt padding id (None: no padding).
      compute_dtype: forward dtype.
      mesh: the program's device mesh, for the TPU attention kernel on several devices
        (`ais_jax.models.llada.model.forward`); None: one device.

    Returns:
      ``(loss, {"accuracy": argmax accuracy on the masked tokens,
      "masked_frac": share of response tokens masked})``.
    """
    B, T = tokens.shape
    kt, km = jax.random.split(key)
    t = (1.0 - T_MIN) * jax.random.uniform(kt, (B, 1)) + T_MIN  # [B, 1]
    target = loss_mask > 0
    masked = (jax.random.uniform(km, (B, T)) < t) & target
    x = jnp.where(masked, lcfg.mask_token_id, tokens).astype(jnp.int32)
    valid = jnp.ones((B, T), jnp.bool_) if pad_id is None else target | (tokens != pad_id)
    logits = forward(cast_params(params, compute_dtype), x, lcfg, valid, mesh=mesh)  # [B,T,V]
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(lp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    m = masked.astype(jnp.float32)
    length = jnp.maximum(jnp.sum(target, axis=1), 1).astype(jnp.float32)  # [B]
    loss = jnp.mean(jnp.sum(nll * m / t, axis=1) / length)
    hit = (jnp.argmax(logits, -1) == tokens).astype(jnp.float32)
    n = jnp.maximum(jnp.sum(m), 1.0)
    return loss, {"accuracy": jnp.sum(hit * m) / n, "masked_frac": jnp.sum(m) / jnp.sum(length)}


def sft_batch(problems: Sequence[Any], flawed: Sequence[bool], codec: Any, prompt_len: int,
              gen_length: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Demonstrations ``[prompt (left-padded to prompt_len), answer, EOS ... EOS]``.

    Args:
      problems: ``B`` task problems.
      flawed: ``[B]``; True shows the task's typical mistake instead of the answer.
      codec: the run's `ais_jax.rollout.codec.PromptCodec` (its answer ids end with EOS).
      prompt_len: prompt bucket ``P``.
      gen_length: response length ``N``.
      eos_id: the id filling the response after the answer.

    Returns:
      ``(tokens [B, P + N] int32, loss_mask [B, P + N] float32)``, the mask 1 on
      the ``N`` response positions.

    Raises:
      UsageError: an answer (with its EOS) is longer than ``N``.
    """
    B = len(problems)
    prompts = [codec.encode_prompt(p) for p in problems]
    pt, _ = codec.pad(prompts, prompt_len)
    resp = np.full((B, gen_length), eos_id, np.int32)
    for j, (p, bad) in enumerate(zip(problems, flawed, strict=True)):
        ans = codec.encode_answer(p, codec.task.mistake(p) if bad else None)
        if len(ans) > gen_length:
            raise UsageError(f"a warm-start answer has {len(ans)} tokens with its EOS, more than "
                             f"rollout.max_new_tokens={gen_length}; raise rollout.max_new_tokens")
        resp[j, :len(ans)] = ans
    tokens = np.concatenate([pt.astype(np.int32), resp], axis=1)
    lm = np.concatenate([np.zeros((B, prompt_len), np.float32),
                         np.ones((B, gen_length), np.float32)], axis=1)
    return tokens, lm
