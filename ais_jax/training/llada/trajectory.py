"""Replay of a LLaDA denoising trajectory: the log-probability of each step the sampler took.

The sampler (`ais_jax.rollout.llada_sampler.generate`) reveals the response in
``steps`` global steps and records, for every revealed token, its log-prob under
the distribution it was drawn from (`DiffusionSample.logprobs`), its share of the
step's selection term (`DiffusionSample.select_logprobs`) and the step that
revealed it (`DiffusionSample.reveal_step`).  `trajectory_logprobs` rebuilds the
canvas the sampler saw at each step -- the prompt, then the response with every
token revealed at an earlier step in place and the mask id everywhere else --
runs the model on it and reads off both parts with the sampler's rules (mask id
and ids past the text vocabulary excluded; ``log_softmax(logits / T)``, raw
``log_softmax`` at ``T = 0``):

* the token part: the log-prob of each token revealed at the step;
* the selection part: with ``remasking: low_confidence`` the policy also chooses
  *which* masked positions of the block a step reveals (the most confident
  candidates), and the probability of that choice is
  `ais_jax.method.selection.selection_logprob` (the positions of the block left
  masked ranked below the revealed ones).  It is one number per row and step; each
  token revealed at the step carries an equal share of it
  (`ais_jax.method.selection.spread_over_revealed`), so per-token arrays keep their
  ``[R, N]`` shape and a row's sum is the log-probability of the whole trajectory.
  Token-level corrections and losses see each token's share, not a per-step term.
  With ``remasking: random`` the choice does not depend on the policy, and at
  ``T = 0`` there is no sampling distribution: the part is 0.

Run with the FP8 copy that sampled, it reproduces the sampler's records; run with
the trainer's params, a row's summed log-ratio ``trainer - recorded`` is the log of
the whole trajectory's importance ratio (``diffusion.ratio: trajectory``, docs/llada.md
"Two ratios"), and ``exp(trainer - recorded)`` of one token is its share of it.
Unlike d1's one-step estimate (`ais_jax.training.llada.estimator`), each token is
predicted given the tokens revealed before it.  Cost: ``steps`` forwards of all
``R`` rows (one per step, each on the ``R`` canvases of that step, as in the
sampler, so an FP8 copy's per-tensor activation scales are the sampler's), batched
over the steps with `jax.vmap`, or over chunks of steps with `jax.lax.map` when
``chunk > 0``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ais_jax.method.distributions import scale_logits
from ais_jax.method.selection import block_selection_logprob, spread_over_revealed
from ais_jax.models.llada.model import LLaDAConfig, forward
from ais_jax.rollout.llada_sampler import check_args


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
                  temperature: float, block_length: int, steps_per_block: int,
                  remasking: str, mesh: Any = None) -> tuple[jax.Array, jax.Array]:
    """The two parts of global step ``i``'s log-prob, per revealed token, on that step's canvas.

    Args:
      params: full-precision or FP8 rollout params.
      cfg: model config.
      prompt: ``[R, P]`` int32 prompt ids (left-padded).
      attn: ``[R, P + N]`` bool attention validity (prompt mask, then ones).
      tokens: ``[R, N]`` int32 response ids.
      reveal_step: ``[R, N]`` int32 step that revealed each token (-1: never).
      i: scalar int32 global step.
      temperature: the sampler's temperature (0: greedy, raw log-softmax).
      block_length: the sampler's block length.
      steps_per_block: the sampler's steps per block (step ``i`` works on block
        ``i // steps_per_block``).
      remasking: the sampler's ``remasking``; the selection part is computed for
        ``low_confidence`` at ``temperature > 0`` only (0 otherwise).

    Returns:
      ``(token, select)``, each ``[R, N]`` float32, 0 where ``reveal_step != i``: the log-prob
      of each token revealed at step ``i`` under the sampling distribution, and its share of
      the step's selection term (`ais_jax.method.selection.selection_logprob` over the
      positions of the block still masked before step ``i`` and not revealed at it, split
      evenly over the tokens revealed at it: `spread_over_revealed`).
    """
    P = prompt.shape[1]
    mask_id = cfg.mask_token_id
    canvas = jnp.where(reveal_step < i, tokens, mask_id)  # revealed before step i
    logits = forward(params, jnp.concatenate([prompt, canvas], axis=1), cfg, attn, mesh=mesh)
    logits = logits[:, P:]
    vocab = jnp.arange(cfg.vocab_size)
    allowed = (vocab != mask_id) & (vocab < cfg.text_vocab_size)  # the sampler's candidates
    logits = jnp.where(allowed, logits, -jnp.inf)
    if temperature > 0:
        z = jax.nn.log_softmax(scale_logits(logits, temperature), axis=-1)
    else:
        z = jax.nn.log_softmax(logits, axis=-1)
    lp = jnp.take_along_axis(z, tokens[..., None], axis=-1)[..., 0]  # [R, N]
    revealed = reveal_step == i
    token = jnp.where(revealed, lp, 0.0)
    if remasking != "low_confidence" or temperature <= 0:
        return token, jnp.zeros_like(token)
    b = i // steps_per_block
    pos = jnp.arange(tokens.shape[1])
    in_block = (pos >= b * block_length) & (pos < (b + 1) * block_length)
    left = in_block[None] & ((reveal_step > i) | (reveal_step < 0))  # masked, kept masked
    term = block_selection_logprob(logits, z, tokens, revealed, left, b * block_length,
                                   block_length)
    return token, spread_over_revealed(term, revealed)


def trajectory_logprobs(
    params: dict,
    cfg: LLaDAConfig,
    prompt: jax.Array,
    sample_tokens: jax.Array,
    reveal_step: jax.Array,
    *,
    steps: int,
    temperature: float,
    block_length: int,
    remasking: str,
    prompt_mask: jax.Array | None = None,
    chunk: int = 0,
    remat: bool = False,
    parts: bool = False,
    mesh: Any = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Log-prob of each response token's reveal, replaying the sampler's order.

    Each token carries its own log-prob at its reveal step plus its share of that step's
    selection term (module docstring), so a row's sum is the log-probability of the whole
    trajectory.  Differentiable in ``params`` through both parts (the revealed and the
    left-masked sets come from ``reveal_step``, fixed).  Jittable (``cfg``, ``steps``,
    ``temperature``, ``block_length``, ``remasking``, ``chunk``, ``remat`` and ``parts``
    static; it is jitted itself).  The number of forwards is ``steps`` (not ``N``); each
    runs on the ``R`` canvases of one step.

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
        (`DiffusionSample.reveal_step`); -1: never revealed (log-prob 0; such a position
        counts as masked at every step of its block).
      steps: the sampler's total denoising steps (``diffusion.steps``).
      temperature: the sampler's temperature (``>= 0``; 0 is greedy).
      block_length: the sampler's block length (``diffusion.block_length``): which
        positions a step could have revealed.
      remasking: the sampler's ``remasking`` (``low_confidence`` or ``random``; the
        selection part is 0 with ``random`` and at temperature 0).
      prompt_mask: optional ``[R, P]`` validity of prompt tokens (0 = padding).
      chunk: steps per `jax.lax.map` chunk, each a `jax.vmap` over its steps
        (less memory: ``chunk`` canvases of logits at a time); 0 = all steps in
        one batched forward.  ``steps`` is padded up to a multiple of ``chunk``
        (the padding steps reveal nothing and add 0).
      remat: recompute each step's forward in the backward pass (`jax.checkpoint`) instead of
        keeping its activations: for a replay under gradient (``diffusion.surrogate:
        trajectory``), with ``chunk=1`` one step's activations are alive at a time.
      parts: return the two parts separately.
      mesh: the program's device mesh, for the TPU attention kernel on several devices
        (`ais_jax.models.llada.model.forward`); None: one device.

    Returns:
      ``[R, N]`` float32 complete per-token log-probs (for the params that sampled, the
      sampler's ``DiffusionSample.logprobs + DiffusionSample.select_logprobs``); with
      ``parts``, the pair ``(token, select)`` of ``[R, N]`` arrays summing to it (the
      sampler's ``logprobs`` and ``select_logprobs``).

    Raises:
      ValueError: bad shapes, ``steps < 1``, ``chunk < 0``, a block length or step count
        the sampler would refuse, a bad remasking or temperature (one line).
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
    check_args(N, block_length, steps, temperature, remasking, 1)
    pm = (jnp.ones((R, P), jnp.bool_) if prompt_mask is None
          else jnp.asarray(prompt_mask, jnp.bool_))
    token, select = _replay(params, prompt, pm, sample_tokens, reveal_step, cfg=cfg,
                            steps=steps, temperature=float(temperature),
                            block_length=block_length, remasking=remasking, chunk=chunk,
                            remat=bool(remat), mesh=mesh)
    return (token, select) if parts else token + select


@partial(jax.jit, static_argnames=("cfg", "steps", "temperature", "block_length", "remasking",
                                   "chunk", "remat", "mesh"))
def _replay(params, prompt, prompt_mask, tokens, reveal_step, *, cfg, steps, temperature,
            block_length, remasking, chunk, remat, mesh=None) -> tuple[jax.Array, jax.Array]:
    R, N = tokens.shape
    attn = jnp.concatenate([prompt_mask, jnp.ones((R, N), jnp.bool_)], axis=1)  # [R, P + N]
    spb = steps // (N // block_length)

    def at(i: jax.Array) -> tuple[jax.Array, jax.Array]:  # ([R, N], [R, N])
        return step_logprobs(params, cfg, prompt, attn, tokens, reveal_step, i,
                             temperature=temperature, block_length=block_length,
                             steps_per_block=spb, remasking=remasking, mesh=mesh)

    if remat:
        at = jax.checkpoint(at)

    def total(per_step: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        return jax.tree.map(lambda a: jnp.sum(a, axis=0), per_step)

    def over(ids: jax.Array) -> tuple[jax.Array, jax.Array]:  # ids [S]; one step per token
        return total(jax.vmap(at)(ids))

    if chunk == 1:  # one step at a time: the sampler's own per-step program, no vmap
        return total(jax.lax.map(at, jnp.arange(steps, dtype=jnp.int32)))
    if chunk <= 0 or chunk >= steps:
        return over(jnp.arange(steps, dtype=jnp.int32))
    n_chunks = -(-steps // chunk)
    ids = jnp.arange(n_chunks * chunk, dtype=jnp.int32).reshape(n_chunks, chunk)
    return total(jax.lax.map(over, ids))
