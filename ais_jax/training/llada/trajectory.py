"""Replay of a LLaDA denoising trajectory: each revealed token's log-prob at its reveal step.

The sampler (`ais_jax.rollout.llada_sampler.generate`) reveals the response in
``steps`` global steps and records, for every revealed token, its log-prob under
the distribution it was drawn from (`DiffusionSample.logprobs`) and the step that
revealed it (`DiffusionSample.reveal_step`).  `trajectory_logprobs` rebuilds the
canvas the sampler saw at each step -- the prompt, then the response with every
token revealed at an earlier step in place and the mask id everywhere else --
runs the model on it and reads off the log-prob of each token at the step that
revealed it, with the sampler's candidate rules (mask id and ids past the text
vocabulary excluded; ``log_softmax(logits / T)``, raw ``log_softmax`` at ``T = 0``).

Run with the FP8 copy that sampled, it reproduces the recorded log-probs; run
with the trainer's params, ``exp(trainer - recorded)`` per revealed token is the
ratio of the revealed tokens' probabilities given the reveal order (``diffusion.ratio:
trajectory``, docs/llada.md "Two ratios").  It is not the whole trajectory's importance
ratio: with ``remasking: low_confidence`` the policy also decides which positions are
revealed, and that selection term is not included (with ``remasking: random`` the
selection does not depend on the policy, so nothing is left out).  Unlike d1's one-step estimate
(`ais_jax.training.llada.estimator`), each token is predicted given the tokens
revealed before it.  Cost: ``steps`` forwards of all ``R`` rows (one per step,
each on the ``R`` canvases of that step, as in the sampler, so an FP8 copy's
per-tensor activation scales are the sampler's), batched over the steps with
`jax.vmap`, or over chunks of steps with `jax.lax.map` when ``chunk > 0``.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ais_jax.method.distributions import check_temperature, scale_logits
from ais_jax.models.llada.model import LLaDAConfig, forward


class ReplayBatch(NamedTuple):
    """The GRPO batch of the trajectory surrogate (``diffusion.surrogate: trajectory``):
    `ais_jax.method.grpo.GRPOBatch`'s fields with the unmasked prompt, plus the reveal order.

    Attributes:
      prompt_tokens: ``[B, P]`` left-padded prompts (never masked: the replay's canvases).
      prompt_mask: ``[B, P]`` validity of the prompt tokens.
      tokens: ``[B, N]`` responses.
      mask: ``[B, N]`` float32 tokens kept by the correction.
      logp_old: ``[B, N]`` the trainer's replay before the update (`trajectory_logprobs`).
      advantages: ``[B, N]`` corrected advantages.
      logp_ref: ``[B, N]`` the KL reference's replay, or None.
      reveal_step: ``[B, N]`` int32 step that revealed each token.
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    mask: jax.Array
    logp_old: jax.Array
    advantages: jax.Array
    logp_ref: jax.Array | None
    reveal_step: jax.Array


def step_logprobs(params: dict, cfg: LLaDAConfig, prompt: jax.Array, attn: jax.Array,
                  tokens: jax.Array, reveal_step: jax.Array, i: jax.Array, *,
                  temperature: float) -> jax.Array:
    """Log-probs of the tokens revealed at global step ``i``, on that step's canvas.

    Args:
      params: full-precision or FP8 rollout params.
      cfg: model config.
      prompt: ``[R, P]`` int32 prompt ids (left-padded).
      attn: ``[R, P + N]`` bool attention validity (prompt mask, then ones).
      tokens: ``[R, N]`` int32 response ids.
      reveal_step: ``[R, N]`` int32 step that revealed each token.
      i: scalar int32 global step.
      temperature: the sampler's temperature (0: greedy, raw log-softmax).

    Returns:
      ``[R, N]`` float32: the log-prob where ``reveal_step == i``, 0 elsewhere.
    """
    P = prompt.shape[1]
    mask_id = cfg.mask_token_id
    canvas = jnp.where(reveal_step < i, tokens, mask_id)  # revealed before step i
    logits = forward(params, jnp.concatenate([prompt, canvas], axis=1), cfg, attn)[:, P:]
    vocab = jnp.arange(cfg.vocab_size)
    allowed = (vocab != mask_id) & (vocab < cfg.text_vocab_size)  # the sampler's candidates
    logits = jnp.where(allowed, logits, -jnp.inf)
    if temperature > 0:
        z = jax.nn.log_softmax(scale_logits(logits, temperature), axis=-1)
    else:
        z = jax.nn.log_softmax(logits, axis=-1)
    lp = jnp.take_along_axis(z, tokens[..., None], axis=-1)[..., 0]  # [R, N]
    return jnp.where(reveal_step == i, lp, 0.0)


def trajectory_logprobs(
    params: dict,
    cfg: LLaDAConfig,
    prompt: jax.Array,
    sample_tokens: jax.Array,
    reveal_step: jax.Array,
    *,
    steps: int,
    temperature: float,
    prompt_mask: jax.Array | None = None,
    chunk: int = 0,
    remat: bool = False,
) -> jax.Array:
    """Log-prob of each response token at its reveal step, replaying the sampler's order.

    Jittable (``cfg``, ``steps``, ``temperature`` and ``chunk`` static; it is
    jitted itself).  The number of forwards is ``steps`` (not ``N``); each runs
    on the ``R`` canvases of one step.

    Args:
      params: full-precision or FP8 rollout params (an FP8 copy replays its own
        numbers: the per-tensor activation scale of a step covers that step's ``R``
        rows, as in the sampler, so pass the sampler's whole batch).
      cfg: model config.
      prompt: ``[R, P]`` int prompt ids, one row per sample (the sampler's rows:
        prompts repeated ``G`` times).
      sample_tokens: ``[R, N]`` response ids, or ``[R, P + N]`` prompt + response
        (`DiffusionSample.tokens`).
      reveal_step: ``[R, N]`` int global step (0-based) that revealed each token
        (`DiffusionSample.reveal_step`); -1: never revealed (log-prob 0).
      steps: the sampler's total denoising steps (``diffusion.steps``).
      temperature: the sampler's temperature (``>= 0``; 0 is greedy).
      prompt_mask: optional ``[R, P]`` validity of prompt tokens (0 = padding).
      chunk: steps per `jax.lax.map` chunk, each a `jax.vmap` over its steps
        (less memory: ``chunk`` canvases of logits at a time); 0 = all steps in
        one batched forward.  ``steps`` is padded up to a multiple of ``chunk``
        (the padding steps reveal nothing and add 0).
      remat: recompute each step's forward in the backward pass (`jax.checkpoint`) instead of
        keeping its activations: for a replay under gradient (``diffusion.surrogate:
        trajectory``), with ``chunk=1`` one step's activations are alive at a time.

    Returns:
      ``[R, N]`` float32 log-probs (the sampler's `DiffusionSample.logprobs` for
      the params that sampled).

    Raises:
      ValueError: bad shapes, ``steps < 1``, ``chunk < 0`` or a bad temperature (one line).
    """
    prompt = jnp.asarray(prompt, jnp.int32)
    reveal_step = jnp.asarray(reveal_step, jnp.int32)
    sample_tokens = jnp.asarray(sample_tokens, jnp.int32)
    if prompt.ndim != 2 or reveal_step.ndim != 2 or reveal_step.shape[0] != prompt.shape[0]:
        raise ValueError(f"prompt [R, P] and reveal_step [R, N] must share R, got shapes "
                         f"{prompt.shape} and {reveal_step.shape}")
    R, P = prompt.shape
    N = reveal_step.shape[1]
    if sample_tokens.shape == (R, P + N) and P:
        sample_tokens = sample_tokens[:, P:]
    if sample_tokens.shape != (R, N):
        raise ValueError(f"sample_tokens must be [R, N] = {(R, N)} or [R, P + N], got "
                         f"{sample_tokens.shape}")
    for name, v, lo in (("steps", steps, 1), ("chunk", chunk, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    check_temperature(temperature)
    pm = (jnp.ones((R, P), jnp.bool_) if prompt_mask is None
          else jnp.asarray(prompt_mask, jnp.bool_))
    return _replay(params, prompt, pm, sample_tokens, reveal_step, cfg=cfg, steps=steps,
                   temperature=float(temperature), chunk=chunk, remat=bool(remat))


@partial(jax.jit, static_argnames=("cfg", "steps", "temperature", "chunk", "remat"))
def _replay(params, prompt, prompt_mask, tokens, reveal_step, *, cfg, steps, temperature,
            chunk, remat) -> jax.Array:
    R, N = tokens.shape
    attn = jnp.concatenate([prompt_mask, jnp.ones((R, N), jnp.bool_)], axis=1)  # [R, P + N]

    def at(i: jax.Array) -> jax.Array:  # [R, N]
        return step_logprobs(params, cfg, prompt, attn, tokens, reveal_step, i,
                             temperature=temperature)

    if remat:
        at = jax.checkpoint(at)

    def over(ids: jax.Array) -> jax.Array:  # ids [S] -> [R, N]; one term per token is nonzero
        return jnp.sum(jax.vmap(at)(ids), axis=0)

    if chunk == 1:  # one step at a time: the sampler's own per-step program, no vmap
        return jnp.sum(jax.lax.map(at, jnp.arange(steps, dtype=jnp.int32)), axis=0)
    if chunk <= 0 or chunk >= steps:
        return over(jnp.arange(steps, dtype=jnp.int32))
    n_chunks = -(-steps // chunk)
    ids = jnp.arange(n_chunks * chunk, dtype=jnp.int32).reshape(n_chunks, chunk)
    return jnp.sum(jax.lax.map(over, ids), axis=0)
