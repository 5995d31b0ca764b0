"""LLaDA's reverse (unmasking) process under `jax.jit`, one `lax.fori_loop` over steps.

The response starts as ``gen_length`` mask tokens after the prompt and is
revealed in semi-autoregressive blocks of ``block_length`` tokens, left to
right; ``steps`` denoising steps are split evenly over the blocks.  At each
step one bidirectional forward gives a candidate for every position (Gumbel-max
at ``temperature``, argmax at 0); of the still-masked positions of the current
block, the ``k`` with the highest confidence are revealed (``low_confidence``:
the model probability of the candidate; ``random``: uniform scores), where
``k`` follows LLaDA's linear schedule (``block_length // steps_per_block`` per
step, the remainder one each to the first steps).  Revealed tokens never
change.  For each revealed token the log-prob of the candidate under the step's
sampling distribution is recorded (for importance weights between two
policies, e.g. the FP8 rollout and the trainer), and with ``low_confidence`` at
``T > 0`` its share of the step's selection term (`ais_jax.method.selection`: the
log-probability that the positions left masked ranked below the revealed ones), so
that the two records sum to the log-probability of the whole trajectory.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ais_jax.method.distributions import check_temperature, scale_logits
from ais_jax.method.selection import block_selection_logprob, spread_over_revealed
from ais_jax.models.llada.model import LLaDAConfig, forward

REMASKING = ("low_confidence", "random")


class DiffusionSample(NamedTuple):
    """Output of `generate` (``R = B * num_samples`` rows, prompt ``b`` at rows ``b*G..``).

    Attributes:
      tokens: ``[R, P + N]`` int32 prompt followed by the response.
      logprobs: ``[R, N]`` float32 log-prob of each response token under the
        distribution it was sampled from at its reveal step (log-softmax of
        ``logits / temperature``; of the raw logits at temperature 0).
      reveal_step: ``[R, N]`` int32 global step (0-based) that revealed each token.
      select_logprobs: ``[R, N]`` float32 each token's share of the selection term of
        its reveal step: with ``remasking="low_confidence"`` and ``temperature > 0``,
        `ais_jax.method.selection.selection_logprob` of the step (the log-probability
        that every position of the block left masked ranked below the revealed ones)
        split evenly over the tokens the step revealed; 0 with ``random`` remasking (the
        choice does not depend on the policy) or at temperature 0 (no sampling
        distribution).  ``logprobs + select_logprobs`` summed over a row is the
        log-probability of the row's whole trajectory, tokens and reveal order (with
        ``random``: its policy-dependent part, the order's probability being a constant).
    """

    tokens: jax.Array
    logprobs: jax.Array
    reveal_step: jax.Array
    select_logprobs: jax.Array


def transfer_schedule(block_length: int, steps_per_block: int) -> np.ndarray:
    """Tokens revealed at each step of a block (LLaDA's linear schedule).

    Args:
      block_length: masked tokens in the block.
      steps_per_block: denoising steps of the block.

    Returns:
      ``[steps_per_block]`` int32 summing to ``block_length``; the remainder of
      ``block_length / steps_per_block`` goes one each to the first steps.
    """
    base, rem = divmod(block_length, steps_per_block)
    return (base + (np.arange(steps_per_block) < rem)).astype(np.int32)


def check_args(gen_length: int, block_length: int, steps: int, temperature: float,
               remasking: str, num_samples: int) -> None:
    """Raise a one-line ValueError for an invalid sampler setting (see `generate`)."""
    for name, v in (("gen_length", gen_length), ("block_length", block_length),
                    ("steps", steps), ("num_samples", num_samples)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if gen_length % block_length:
        raise ValueError(f"block_length ({block_length}) must divide gen_length ({gen_length})")
    num_blocks = gen_length // block_length
    if steps % num_blocks:
        raise ValueError(f"steps ({steps}) must be divisible by the number of blocks "
                         f"({num_blocks} = gen_length / block_length)")
    if steps > gen_length:
        raise ValueError(f"steps ({steps}) must be <= gen_length ({gen_length})")
    if remasking not in REMASKING:
        raise ValueError(f"remasking must be one of {REMASKING}, got {remasking!r}")
    check_temperature(temperature)


def generate(
    params: dict,
    cfg: LLaDAConfig,
    prompt: jax.Array,
    key: jax.Array,
    *,
    gen_length: int,
    block_length: int,
    steps: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    num_samples: int = 1,
    prompt_mask: jax.Array | None = None,
    mesh: Any = None,
) -> DiffusionSample:
    """Sample ``num_samples`` responses per prompt with LLaDA's reverse process.

    Args:
      params: full-precision or FP8 rollout params.
      cfg: model config.
      prompt: ``[B, P]`` int prompt ids (left-padded when ``prompt_mask`` is given).
      key: PRNG key (Gumbel noise, random remasking).
      gen_length: response length N (a multiple of ``block_length``).
      block_length: tokens per semi-autoregressive block.
      steps: total denoising steps (divisible by N / block_length, ``<= N``).
      temperature: Gumbel-max temperature; 0 is greedy.
      remasking: ``"low_confidence"`` or ``"random"``.
      num_samples: G responses per prompt.
      prompt_mask: optional ``[B, P]`` validity of prompt tokens (0 = padding).
      mesh: the program's device mesh, for the TPU attention kernel on several devices
        (`ais_jax.models.llada.model.forward`); None: one device.

    Returns:
      `DiffusionSample` with ``B * G`` rows.

    Raises:
      ValueError: invalid lengths / steps / remasking / temperature (one line).
    """
    check_args(gen_length, block_length, steps, temperature, remasking, num_samples)
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.ndim != 2:
        raise ValueError(f"prompt must be [B, P], got shape {prompt.shape}")
    if prompt_mask is None:
        prompt_mask = jnp.ones(prompt.shape, jnp.bool_)
    return _generate(params, prompt, jnp.asarray(prompt_mask, jnp.bool_), key, cfg=cfg,
                     gen_length=gen_length, block_length=block_length, steps=steps,
                     temperature=float(temperature), remasking=remasking,
                     num_samples=num_samples, mesh=mesh)


@partial(jax.jit, static_argnames=("cfg", "gen_length", "block_length", "steps",
                                   "temperature", "remasking", "num_samples", "mesh"))
def _generate(params, prompt, prompt_mask, key, *, cfg, gen_length, block_length, steps,
              temperature, remasking, num_samples, mesh=None) -> DiffusionSample:
    G, N = num_samples, gen_length
    prompt = jnp.repeat(prompt, G, axis=0)  # [R, P]
    R, P = prompt.shape
    attn = jnp.concatenate([jnp.repeat(prompt_mask, G, axis=0),
                            jnp.ones((R, N), jnp.bool_)], axis=1)  # [R, P + N]
    spb = steps // (N // block_length)
    sched = jnp.asarray(transfer_schedule(block_length, spb))
    pos = jnp.arange(N)
    mask_id = cfg.mask_token_id
    vocab = jnp.arange(cfg.vocab_size)
    allowed = (vocab != mask_id) & (vocab < cfg.text_vocab_size)  # never propose a mask / pad id
    selects = remasking == "low_confidence" and temperature > 0  # else the term is 0

    def step(i, carry):
        gen, logprobs, reveal_step, select = carry
        logits = forward(params, jnp.concatenate([prompt, gen], axis=1), cfg, attn, mesh=mesh)
        logits = logits[:, P:]
        logits = jnp.where(allowed, logits, -jnp.inf)
        raw_lp = jax.nn.log_softmax(logits, axis=-1)  # [R, N, V]
        k_noise, k_rand = jax.random.split(jax.random.fold_in(key, i))
        if temperature > 0:
            z = jax.nn.log_softmax(scale_logits(logits, temperature), axis=-1)
            cand = jnp.argmax(z + jax.random.gumbel(k_noise, z.shape), axis=-1)
        else:
            z = raw_lp
            cand = jnp.argmax(logits, axis=-1)
        take = lambda a: jnp.take_along_axis(a, cand[..., None], axis=-1)[..., 0]  # noqa: E731
        lp = take(z)  # [R, N] log-prob under the sampling distribution
        # low_confidence: log p(candidate) ranks like LLaDA's softmax probability.
        conf = (take(raw_lp) if remasking == "low_confidence"
                else jax.random.uniform(k_rand, (R, N)))
        b = i // spb
        in_block = (pos >= b * block_length) & (pos < (b + 1) * block_length)
        eligible = (gen == mask_id) & in_block[None]
        conf = jnp.where(eligible, conf, -jnp.inf)
        order = jnp.argsort(-conf, axis=-1, stable=True)
        ranks = jnp.argsort(order, axis=-1)
        reveal = eligible & (ranks < sched[i % spb])
        if selects:
            term = block_selection_logprob(logits, z, cand, reveal, eligible & ~reveal,
                                           b * block_length, block_length)
            select = jnp.where(reveal, spread_over_revealed(term, reveal), select)
        return (jnp.where(reveal, cand.astype(jnp.int32), gen),
                jnp.where(reveal, lp, logprobs),
                jnp.where(reveal, i, reveal_step), select)

    init = (jnp.full((R, N), mask_id, jnp.int32), jnp.zeros((R, N), jnp.float32),
            jnp.full((R, N), -1, jnp.int32), jnp.zeros((R, N), jnp.float32))
    gen, logprobs, reveal_step, select = jax.lax.fori_loop(0, steps, step, init)
    return DiffusionSample(jnp.concatenate([prompt, gen], axis=1), logprobs, reveal_step,
                           select)


def completion_mask(tokens: jax.Array, eos_ids: tuple[int, ...] | None) -> jax.Array:
    """Valid positions of denoised responses: up to and including the first EOS.

    LLaDA learns to fill the rest of its ``gen_length`` with EOS (its SFT pads
    answers with EOS), so a variable-length answer is the prefix through the
    first EOS; what follows is padding for the verifier and the loss.

    Args:
      tokens: ``[R, N]`` int responses.
      eos_ids: ids ending a response; empty or None: every position is valid.

    Returns:
      ``[R, N]`` bool.
    """
    if not eos_ids:
        return jnp.ones(tokens.shape, jnp.bool_)
    is_eos = jnp.isin(tokens, jnp.asarray(eos_ids, tokens.dtype))
    before = jnp.cumsum(is_eos, axis=1) - is_eos  # EOS strictly before each position
    return before == 0
