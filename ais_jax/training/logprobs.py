"""Completion log-probs at scale: a rematerialized trunk, and the head on completion positions only.

The trainer needs ``log pi(token | prefix)`` for the ``N`` generated tokens of
each row, never the ``[B, T, V]`` logits of the whole sequence (for a 150k
vocabulary that array is 15-30 GB).  `completion_logprobs`:

1. runs the decoder trunk over ``prompt + completion[:-1]`` (`hidden_states`),
   optionally rematerializing each layer in the backward pass (``remat``:
   ``"none"``, ``"full"`` or ``"dots"``, see `REMAT_POLICIES`) and pinning the
   residual stream to a batch sharding at every layer (``constrain``), so FSDP
   gathers weights per layer instead of replicating activations;
2. takes the hidden states of the ``N`` positions that predict completion
   tokens (the prompt's other positions never reach the head);
3. applies the final norm and the head in chunks of ``chunk`` positions under
   `jax.checkpoint`: the forward keeps ``[B, chunk, V]`` float32 logits at a
   time and the backward recomputes them, so peak memory no longer grows with
   ``N * V``.  With an untied head sharded on its vocabulary (FSDP,
   `ais_jax.training.sharding.head_constraint`), ``head_constrain`` gathers each chunk's
   rows instead of the head's weight: the logits are computed vocab-parallel.
   On a TPU (untruncated, plain head, not vocab-parallel) each chunk instead runs
   `ais_jax.training.fused_head`'s custom VJP, which never writes the float32 logits.

The numbers equal the plain path (full forward, logits sliced to the
completion, log-softmax) up to float reordering; see ``tests/test_logprobs.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.method.distributions import token_logprob_pair, token_logprobs
from ais_jax.models import model as model_lib
from ais_jax.models.attention import causal_mask, kernel_len
from ais_jax.training.fused_head import token_logprobs_from_hidden, use_fused_head

REMAT_POLICIES: dict[str, Any] = {
    "none": None,  # keep every activation of the backward pass
    "full": jax.checkpoint_policies.nothing_saveable,  # keep only each layer's input
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs
}

Constrain = Callable[[jax.Array], jax.Array]


def hidden_states(
    params: dict,
    tokens: jax.Array,
    cfg: model_lib.ModelConfig,
    mask: jax.Array | None = None,
    *,
    remat: str = "none",
    constrain: Constrain | None = None,
) -> jax.Array:
    """The decoder trunk: residual stream after the last layer, before the final norm.

    Args:
      params: full-precision or FP8 rollout params.
      tokens: ``[B, T]`` ids.
      cfg: model config.
      mask: ``[B, T]`` validity (left padding 0); default all valid.
      remat: per-layer rematerialization policy, a key of `REMAT_POLICIES`.
      constrain: applied to the residual stream ``[B, T, D]`` entering each
        layer and leaving the last (e.g. a batch-sharding constraint); its ``mesh``
        attribute, if any (`ais_jax.training.sharding.batch_constraint`), is the mesh the
        TPU attention kernel runs under ``jax.shard_map`` over.

    On the TPU kernel's path the sequence is padded once to the kernel's block
    (`ais_jax.models.attention.kernel_len`: trailing padding tokens, masked) and the
    result sliced back to ``T``.

    Returns:
      ``[B, T, D]`` in the params' dtype.
    """
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat must be one of {tuple(REMAT_POLICIES)}, got {remat!r}")
    B, T = tokens.shape
    mask = jnp.ones((B, T), jnp.bool_) if mask is None else mask.astype(jnp.bool_)
    Tp = kernel_len(cfg, T)  # the TPU kernel's blocks: pad once here, not in every layer
    if Tp != T:
        tokens = jnp.pad(tokens, ((0, 0), (0, Tp - T)))
        mask = jnp.pad(mask, ((0, 0), (0, Tp - T)))  # padding keys, seen by no real query
    pos = model_lib.positions_from_mask(mask)
    attn_mask = causal_mask(mask)  # padding queries see themselves
    inv_freq = model_lib.rope_inv_freq(cfg)
    pin = constrain if constrain is not None else (lambda x: x)
    mesh = getattr(constrain, "mesh", None)  # for the TPU kernel's shard_map (batch_constraint)

    def body(x: jax.Array, lp: dict) -> tuple[jax.Array, None]:
        x, _ = model_lib._layer(pin(x), lp, pos, attn_mask, inv_freq, cfg, rows=mask, mesh=mesh)
        return x, None

    if remat != "none":
        body = jax.checkpoint(body, policy=REMAT_POLICIES[remat])
    x, _ = jax.lax.scan(body, model_lib._embed(params, tokens), params["layers"])
    return pin(x[:, :T] if Tp != T else x)


def head_logprobs(
    params: dict,
    h: jax.Array,
    tokens: jax.Array,
    cfg: model_lib.ModelConfig,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    *,
    chunk: int = 0,
    constrain: Constrain | None = None,
    head_constrain: Constrain | None = None,
    both: bool = False,
) -> Any:
    """Log-probs of ``tokens`` from the hidden states predicting them, ``chunk`` positions a time.

    Args:
      params: params holding ``final_norm`` and the head (``lm_head`` or tied ``embed``).
      h: ``[B, N, D]`` trunk outputs at the positions predicting ``tokens``.
      tokens: ``[B, N]`` ids.
      cfg: model config.
      temperature, top_k, top_p: the sampling distribution (`ais_jax.method.distributions`).
      chunk: positions per head application (0: all ``N`` at once); each chunk
        is rematerialized in the backward pass.
      constrain: applied to each chunk's hidden states ``[B, c, D]`` and outputs.
      head_constrain: see `head_map`.
      both: return the pair ``(truncated, full)`` of
        `ais_jax.method.distributions.token_logprob_pair` (one head pass).

    On a TPU, untruncated and with a plain head that is not vocabulary-parallel
    (`ais_jax.training.fused_head.use_fused_head`), the chunks run
    `ais_jax.training.fused_head.token_logprobs_from_hidden` (one custom VJP: no logits
    kept, none rematerialized by `jax.checkpoint`); elsewhere ``log_softmax`` of
    materialized logits (`head_map`).

    Returns:
      ``[B, N]`` float32 (a pair of them with ``both``).
    """
    head = params.get("lm_head", params["embed"])
    vocab_parallel = head_constrain is not None and "lm_head" in params
    if use_fused_head(temperature, top_k, top_p, head, vocab_parallel=vocab_parallel):
        return _fused_head_logprobs(
            params, h, tokens, cfg, temperature, chunk=chunk, constrain=constrain, both=both
        )

    def fn(logits: jax.Array, tc: jax.Array) -> Any:
        if both:
            return token_logprob_pair(logits, tc, temperature, top_k, top_p)
        return token_logprobs(logits, tc, temperature, top_k, top_p)

    return head_map(
        params, h, tokens, cfg, fn, chunk=chunk, constrain=constrain, head_constrain=head_constrain
    )


def _fused_head_logprobs(
    params: dict,
    h: jax.Array,
    tokens: jax.Array,
    cfg: model_lib.ModelConfig,
    temperature: float,
    *,
    chunk: int,
    constrain: Constrain | None,
    both: bool,
) -> Any:
    """`head_logprobs` by `ais_jax.training.fused_head` (untruncated, plain head weight):
    chunks without `jax.checkpoint` (the custom VJP keeps no logits)."""
    pin = constrain if constrain is not None else (lambda x: x)
    w = params.get("lm_head", params["embed"]).astype(h.dtype)  # cast once, outside the scan
    eps = cfg.rms_norm_eps

    def one(hc: jax.Array, tc: jax.Array) -> jax.Array:  # [B, c, D], [B, c] -> [B, c]
        x = model_lib.rms_norm(pin(hc), params["final_norm"], eps)
        return pin(token_logprobs_from_hidden(x, w.astype(x.dtype), pin(tc), temperature))

    lp = map_chunks(one, h, tokens, chunk, remat=False)
    return (lp, lp) if both else lp


def head_map(
    params: dict,
    h: jax.Array,
    tokens: jax.Array,
    cfg: model_lib.ModelConfig,
    fn: Callable[[jax.Array, jax.Array], Any],
    *,
    chunk: int = 0,
    constrain: Constrain | None = None,
    head_constrain: Constrain | None = None,
) -> Any:
    """``fn(logits [B, c, V] float32, tokens [B, c])`` over chunks of ``c`` positions.

    ``fn`` returns a pytree of ``[B, c]`` arrays; the result holds them
    concatenated back to ``[B, N]``.  Each chunk is rematerialized in the
    backward pass, so only one chunk's logits are alive at a time.

    Args:
      params: params holding ``final_norm`` and the head.
      h: ``[B, N, D]`` hidden states.
      tokens: ``[B, N]`` ids passed to ``fn`` with the logits.
      cfg: model config.
      fn: ``(logits [B, c, V] float32, tokens [B, c]) -> pytree of [B, c]``;
        reductions over ``V`` only (it may run on vocabulary-sharded logits).
      chunk: positions per head application (0: all at once).
      constrain: applied to each chunk's input and to ``fn``'s outputs (rows).
      head_constrain: applied instead of ``constrain`` to a chunk's input
        ``[B, c, D]`` and tokens when the params hold an untied ``lm_head``
        (`ais_jax.training.sharding.head_constraint`: vocab-parallel head).

    Returns:
      ``fn``'s pytree with leaves ``[B, N]``.
    """
    pin = constrain if constrain is not None else (lambda x: x)
    head_pin = head_constrain if head_constrain is not None and "lm_head" in params else pin

    def one(hc: jax.Array, tc: jax.Array) -> Any:  # [B, c, D], [B, c] -> [B, c] leaves
        out = fn(model_lib._logits(params, head_pin(hc), cfg), head_pin(tc))
        return jax.tree.map(pin, out)

    return map_chunks(one, h, tokens, chunk)


def map_chunks(
    one: Callable[[jax.Array, jax.Array], Any],
    h: jax.Array,
    tokens: jax.Array,
    chunk: int,
    *,
    remat: bool = True,
) -> Any:
    """``one(h [B, c, D], tokens [B, c])`` (a pytree of ``[B, c]``) over chunks of ``c``
    positions under `jax.lax.scan`, each step under `jax.checkpoint` with ``remat``; the
    leaves concatenated back to ``[B, N]`` (``chunk <= 0`` or ``>= N``: one call)."""
    B, N, D = h.shape
    if chunk <= 0 or chunk >= N:
        return one(h, tokens)
    n_chunks = -(-N // chunk)
    pad = n_chunks * chunk - N
    hp = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(B, n_chunks, chunk, D)
    tp = jnp.pad(tokens, ((0, 0), (0, pad))).reshape(B, n_chunks, chunk)
    step = lambda _, xs: (None, one(*xs))  # noqa: E731
    if remat:
        step = jax.checkpoint(step)
    _, out = jax.lax.scan(step, None, (jnp.moveaxis(hp, 1, 0), jnp.moveaxis(tp, 1, 0)))
    return jax.tree.map(
        lambda y: jnp.moveaxis(y, 0, 1).reshape(B, n_chunks * chunk)[:, :N], out
    )  # [B, N]


def completion_logprobs(
    params: dict,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    tokens: jax.Array,
    cfg: model_lib.ModelConfig,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    *,
    chunk: int = 0,
    remat: str = "none",
    constrain: Constrain | None = None,
    head_constrain: Constrain | None = None,
    both: bool = False,
) -> Any:
    """Per-token log-probs ``[B, N]`` of the completions ``tokens`` after left-padded prompts.

    Args:
      params: policy params.
      prompt_tokens: ``[B, P]`` left-padded prompts.
      prompt_mask: ``[B, P]``.
      tokens: ``[B, N]`` completion ids.
      cfg: model config.
      temperature, top_k, top_p: the sampler's distribution.
      chunk: head chunk length (0: one chunk).
      remat: per-layer rematerialization (`REMAT_POLICIES`).
      constrain: batch-sharding constraint for activations (see `hidden_states`).
      head_constrain: rows constraint of a vocab-parallel head (see `head_map`).
      both: return ``(truncated, full)`` log-probs (see `head_logprobs`).

    Returns:
      ``[B, N]`` float32 (positions after EOS computed too; mask them downstream);
      a pair of them with ``both``.
    """
    P = prompt_tokens.shape[1]
    seq = jnp.concatenate([prompt_tokens, tokens], axis=1)  # [B, P+N]
    seq_mask = jnp.concatenate(
        [prompt_mask.astype(jnp.bool_), jnp.ones(tokens.shape, jnp.bool_)], axis=1
    )
    h = hidden_states(
        params, seq[:, :-1], cfg, seq_mask[:, :-1], remat=remat, constrain=constrain
    )  # [B, P+N-1, D]
    return head_logprobs(
        params,
        h[:, P - 1 :],
        tokens,
        cfg,
        temperature,
        top_k,
        top_p,
        chunk=chunk,
        constrain=constrain,
        head_constrain=head_constrain,
        both=both,
    )
