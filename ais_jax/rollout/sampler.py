"""Rollout sampler: prefill + `lax.while_loop` decode with exact log-prob recording.

`sample` draws ``max_new_tokens`` tokens per row from full-precision params or
the FP8 rollout copy (`ais_jax.models.fp8.to_rollout_params`) and records, for every
sampled token, its log-probability under the very distribution it was drawn
from.  One `jax.jit` per static configuration (shapes, model config, sampling
settings): repeated calls with the same shapes never retrace.

The sampling distribution (temperature, top-k, top-p, greedy at 0) and its
log-probs live in `ais_jax.method.distributions`; the trainer re-scores the sampled
tokens with `ais_jax.method.distributions.token_logprobs` and the same settings
(docs/spec.md section 4, "pitfalls").  With truncation, the trainer's own
top-k / top-p set is recomputed from its logits, so a sampled token can fall
outside it: its log-prob is then ``-inf`` and the caller must mask such tokens.

Details:

* Prompts are left-padded ``[B, P]`` with a validity mask; rotary positions
  count real tokens only (`ais_jax.models.model.positions_from_mask`).  Every prompt
  length ``P`` (and every ``max_new_tokens``) is one compilation: round ``P``
  up with `bucket_length` / `pad_prompts` to bound the number of shapes.
* ``num_samples=G``: each prompt is prefilled once and its cache is repeated to
  ``G`` rows; output rows ``p*G .. p*G+G-1`` belong to prompt ``p``.
* EOS (one id or several) ends a row: the EOS token itself has mask 1; every
  later position holds ``pad_id`` (default: the first EOS id), mask 0 and logp
  0.  The loop exits as soon as every row is done.  Rows that never emit EOS
  keep mask 1 up to the budget.
* Tokens are drawn by an exact inverse-CDF draw (one uniform per row, block
  sums, then a cumulative sum inside the chosen block), much cheaper on CPU
  than `jax.random.categorical` (Gumbel logs over the whole vocabulary) and
  equal in distribution (on TPU, blocks of 128 entries summed straight from the
  logits: `ais_jax.method.distributions.lane_blocks`).  All uniforms,
  ``uniform(key, (N, B))``, are drawn before the loop: the same key and inputs
  give the same rollout.
* The KV cache lives inside one jitted program (a `while_loop` carry, updated
  in place; nothing to donate; `ais_jax.models.decode`).  A decode step either scans
  over the stacked layers (one decoder block compiled: a 36-layer model's
  program compiles in ~1.5 s instead of ~16 s on 2 CPU cores) or unrolls them
  (faster steps: 13-70% on CPU for a 4-layer model, ~2x on an H200, where XLA
  copies the scanned per-layer slices of the weights); ``scan_layers`` /
  `ais_jax.models.decode.scan_layers_default` choose (scan on CPU beyond 4 layers).
* Decoding runs in segments, each a `while_loop` attending to a statically
  sized prefix of the cache.  By default (`default_segments`) up to 64 new
  tokens take one segment and longer budgets up to 16 equal segments, so a
  step attends to about the filled prefix (within 1/16 on average), not the
  whole cache from the first step; each segment compiles once.  The cache grows
  per segment, or on TPU is allocated once (`decode.whole_cache_default`), after
  the decode's params are prepared (an optimization barrier orders the two).
* On CPU with unrolled layers the full-precision linear weights are
  transposed once per call to ``[in, out]`` (small-batch matmuls measured
  ~10% faster per decode step; costs one extra copy of those weights while
  sampling).  Scanned layers, FP8 weights and other backends keep
  ``[out, in]`` (scanned, the transposed copies made the steps slower).
* ``kv_fp8=True`` stores the KV cache as float8 E4M3 with one scale per
  (layer, row, token), or, for FP8 params with ``act_scaling="prefill"``, one
  fixed scale per layer and buffer set by the prefill (`ais_jax.models.decode.prefill`;
  those params also fix their activation scales there).  The paper keeps the
  cache in BF16: this is an extra memory option, off by default, and adds its
  own mismatch.  On CPU float8 conversions are software-emulated, so it is
  much slower there.
* Called under an outer `jax.jit` (traced prompts) the value checks on the
  prompts are skipped; shape and setting checks always run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ais_jax.method.distributions import sample_logits_u
from ais_jax.models import decode as decode_lib
from ais_jax.models import kv_cache
from ais_jax.models import model as model_lib
from ais_jax.rollout.decode_params import prepare_params, view_params
from ais_jax.rollout.sampler_args import check_int, validate_sample_args


class Rollout(NamedTuple):
    """Sampled completions, row ``p*G + g`` is sample ``g`` of prompt ``p``.

    Attributes:
      tokens: ``[B, N]`` int32 sampled ids (``pad_id`` after EOS).
      mask: ``[B, N]`` float32, 1 for generated tokens up to and including EOS.
      logp: ``[B, N]`` float32 log-prob of each token under the distribution it
        was sampled from (0 where ``mask`` is 0).
    """

    tokens: jax.Array
    mask: jax.Array
    logp: jax.Array


class _DecodeState(NamedTuple):
    step: jax.Array  # int32 scalar, next column of the output to fill
    tokens: jax.Array  # [B, N] int32
    logp: jax.Array  # [B, N] float32
    mask: jax.Array  # [B, N] float32
    done: jax.Array  # [B] bool, row has emitted EOS
    last: jax.Array  # [B] int32, token to feed next
    cache: kv_cache.KVCache


# ----------------------------------------------------------------------------- shapes


def bucket_length(n: int, *, multiple: int = 16, pow2_max: int = 512) -> int:
    """Round a prompt length up to a bucket: powers of two up to ``pow2_max``, then multiples.

    ``bucket_length(5) == 16``, ``bucket_length(40) == 64``, ``bucket_length(600) == 608``.
    Each distinct bucket is one compilation of `sample`.
    """
    if n < 0:
        raise ValueError(f"length must be >= 0, got {n}")
    if n <= pow2_max:
        return max(multiple, 1 << max(0, math.ceil(math.log2(max(n, 1)))))
    return -(-n // multiple) * multiple


def pad_prompts(
    prompts: Sequence[Sequence[int]],
    *,
    pad_id: int = 0,
    length: int | None = None,
    bucket: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists into ``([B, P] int32 tokens, [B, P] bool mask)``.

    ``P`` is ``length`` if given, else the longest prompt, rounded up with
    `bucket_length` when ``bucket``.
    """
    if not prompts:
        raise ValueError("no prompts given (empty batch)")
    longest = max(len(p) for p in prompts)
    if min(len(p) for p in prompts) == 0:
        raise ValueError("every prompt needs at least one token")
    P = length if length is not None else (bucket_length(longest) if bucket else longest)
    if longest > P:
        raise ValueError(f"length {P} is shorter than the longest prompt ({longest} tokens)")
    tokens = np.full((len(prompts), P), pad_id, np.int32)
    mask = np.zeros((len(prompts), P), bool)
    for i, p in enumerate(prompts):
        tokens[i, P - len(p):] = p
        mask[i, P - len(p):] = True
    return tokens, mask


# ----------------------------------------------------------------------------- decoding


SEGMENT_STEPS = 64  # default plan: decode segments of at least this many steps ...
MAX_SEGMENTS = 16  # ... and at most this many segments


def default_segments(max_new_tokens: int) -> int:
    """The default number of decode segments: ``min(16, ceil((N - 1) / 64))``, at least 1.

    Each segment is its own `lax.while_loop` over a statically sized cache
    prefix (compiled once per segment), so a step attends to at most one
    segment's length of empty slots: up to 64 new tokens decode in one segment,
    longer budgets in up to 16 equal segments of ``>= 64`` steps, whose
    attention work is within about ``1 / 16`` of the filled prefix's.
    """
    steps = max(0, max_new_tokens - 1)
    return max(1, min(MAX_SEGMENTS, -(-steps // SEGMENT_STEPS)))


def _segment_ends(n_new: int, segments: int) -> list[int]:
    """Decode steps ``1 .. n_new-1`` split into ``segments`` ranges; their exclusive ends."""
    steps = n_new - 1
    segments = max(1, min(segments, steps))
    return sorted({1 + round(j * steps / segments) for j in range(1, segments + 1)})


def _sample_impl(
    params: dict,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
    *,
    cfg: model_lib.ModelConfig,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    eos_ids: tuple[int, ...],
    pad_id: int,
    num_samples: int,
    kv_fp8: bool | str,
    segments: int,
    transpose: bool,
    scan_layers: bool,
    mesh: Any = None,
    whole_cache: bool = False,
) -> Rollout:
    B0, P = prompt_tokens.shape
    G, N = num_samples, max_new_tokens
    B = B0 * G
    dtype = params["embed"].dtype  # activation / cache dtype
    prepared = prepare_params(params, cfg, transpose, scan_layers)
    eos = jnp.asarray(eos_ids if eos_ids else (-1,), jnp.int32)

    uniforms = jax.random.uniform(key, (N, B), jnp.float32)  # one per token, drawn up front

    def draw(step: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
        u = jax.lax.dynamic_index_in_dim(uniforms, step, keepdims=False)  # [B]
        return sample_logits_u(u, logits, temperature, top_k, top_p)

    # Prefill each prompt once, then share its cache across the G samples.
    logits, cache = decode_lib.prefill(params, prompt_tokens, prompt_mask, cfg, P, dtype=dtype,
                                       fp8=kv_fp8, last_only=True, mesh=mesh)  # [B0, 1, V]
    last_logits = jnp.repeat(logits[:, -1], G, axis=0)  # [B, V]
    ends = _segment_ends(N, segments) if N > 1 else []
    whole = whole_cache and bool(ends)  # the cache at its final length once (decode_lib)
    if whole:  # the decode's params (unstacked: a copy) first, then the cache at full length
        prepared, cache = jax.lax.optimization_barrier((prepared, cache))
    tok, lp = draw(jnp.int32(0), last_logits)
    state = _DecodeState(
        step=jnp.int32(1),
        tokens=jnp.full((B, N), pad_id, jnp.int32).at[:, 0].set(tok),
        logp=jnp.zeros((B, N), jnp.float32).at[:, 0].set(lp),
        mask=jnp.zeros((B, N), jnp.float32).at[:, 0].set(1.0),
        done=jnp.isin(tok, eos),
        last=tok,
        cache=kv_cache.resize_cache(
            cache if scan_layers else kv_cache.unstack_cache(cache), G,
            P + ends[-1] - 1 if whole else P),
    )

    def body(st: _DecodeState, window: int | None = None) -> _DecodeState:
        p = view_params(prepared, transpose)
        # Finished rows enter as padding: never attended to, and never part of an
        # FP8 activation scale (a live row's numbers do not depend on them).
        logits, cache = decode_lib.extend(
            p, st.last[:, None], ~st.done[:, None], st.cache, cfg,
            scan_layers=scan_layers, window=window,
        )  # [B, 1, V]
        tok, lp = draw(st.step, logits[:, 0])
        tok = jnp.where(st.done, pad_id, tok)
        lp = jnp.where(st.done, 0.0, lp)
        col = st.step
        return _DecodeState(
            step=st.step + 1,
            tokens=jax.lax.dynamic_update_slice(st.tokens, tok[:, None], (0, col)),
            logp=jax.lax.dynamic_update_slice(st.logp, lp[:, None], (0, col)),
            mask=jax.lax.dynamic_update_slice(
                st.mask, (~st.done).astype(jnp.float32)[:, None], (0, col)),
            done=st.done | jnp.isin(tok, eos),
            last=tok,
            cache=cache,
        )

    state = _run_segments(state, body, ends, P, whole)
    return Rollout(tokens=state.tokens, mask=state.mask, logp=state.logp)


def _run_segments(
    state: _DecodeState, body: Callable, ends: list[int], P: int, whole: bool
) -> _DecodeState:
    """The decode loop, one `lax.while_loop` per segment ending at each of ``ends``: steps
    ``[.., end)`` write cache slots up to ``P + end - 2``.  A grown cache is resized to
    ``P + end - 1`` slots before its segment; a whole one (``whole``) is read through that
    prefix (``body``'s ``window``)."""
    for end in ends:
        if not whole:
            state = state._replace(cache=kv_cache.resize_cache(state.cache, 1, P + end - 1))
        state = jax.lax.while_loop(lambda st, end=end: (st.step < end) & ~jnp.all(st.done),
                                   functools.partial(body, window=P + end - 1 if whole else None),
                                   state)
    return state


_sample_jit = jax.jit(
    _sample_impl,
    static_argnames=("cfg", "max_new_tokens", "temperature", "top_k", "top_p", "eos_ids",
                     "pad_id", "num_samples", "kv_fp8", "segments", "transpose", "scan_layers",
                     "mesh", "whole_cache"),
)


# ----------------------------------------------------------------------------- public API


def sample(
    params: dict,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
    cfg: model_lib.ModelConfig,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int | Sequence[int] | None = None,
    num_samples: int = 1,
    pad_id: int | None = None,
    kv_fp8: bool | str = False,
    decode_segments: int | None = None,
    scan_layers: bool | None = None,
    mesh: Any = None,
) -> Rollout:
    """Sample ``max_new_tokens`` tokens for each prompt (``num_samples`` times each).

    Args:
      params: full-precision params or the FP8 rollout copy.
      prompt_tokens: ``[B0, P]`` int left-padded prompts.
      prompt_mask: ``[B0, P]`` validity (1 real token, 0 left padding).
      key: PRNG key (same key, same inputs -> same rollout).
      cfg: model config (static).
      max_new_tokens: ``N``, the decode budget.
      temperature: ``> 0`` samples softmax(logits / T); ``0`` is greedy.  Any
        ``T >= ais_jax.method.distributions.MIN_TEMPERATURE`` (float32's smallest
        normal number, ~1.18e-38) is exact: tokens stay in the vocabulary and
        their log-probs finite (the logits are shifted by their max before
        dividing); smaller positive values are rejected.
      top_k: keep the k most likely tokens (0 = off).
      top_p: nucleus mass in (0, 1] (1 = off).
      eos_id: an id or a sequence of ids that end a row; None: never stop early.
      num_samples: ``G`` samples per prompt (prompt prefilled once).
      pad_id: token written after EOS (default: the first EOS id, else 0).
      kv_fp8: FP8 E4M3 KV cache, one scale per (layer, row, token), or per layer fixed
        by the prefill for ``act_scaling="prefill"`` params (off by default); ``"int8"``:
        the same cache in int8 (`ais_jax.models.int8`).
      decode_segments: the decode loop is split into this many segments, each
        attending to a statically sized prefix of the cache (more segments: less
        attention work, longer compile). None: `default_segments`
        (``min(16, ceil((N - 1) / 64))``).
      scan_layers: a decode step scans over the stacked layers (compiles one
        decoder block) or unrolls them (``L`` blocks; faster per step on CPU).
        None: `ais_jax.models.decode.scan_layers_default` (scan on CPU beyond 4
        layers; unroll on accelerators, where it decodes up to 2x faster).
      mesh: the program's device mesh (static), for the TPU attention kernel of the
        prefill on several devices (`ais_jax.models.decode.prefill`); None: one device.

    Returns:
      `Rollout` of ``[B0 * G, N]`` arrays; rows ``p*G .. p*G+G-1`` are prompt ``p``.

    Raises:
      ValueError: for an empty batch, a prompt too long for the model's
        positions, a negative temperature or a positive one below
        ``MIN_TEMPERATURE``, ``top_p`` outside (0, 1], a negative
        ``top_k`` and similar bad settings (one sentence each).
    """
    prompt_tokens = jnp.asarray(prompt_tokens) if isinstance(prompt_tokens, np.ndarray | list) \
        else prompt_tokens
    prompt_mask = jnp.asarray(prompt_mask) if isinstance(prompt_mask, np.ndarray | list) \
        else prompt_mask
    eos_ids, pad_id = validate_sample_args(prompt_tokens, prompt_mask, cfg, max_new_tokens,
                                           temperature, top_k, top_p, eos_id, num_samples, pad_id)
    segments = (default_segments(int(max_new_tokens)) if decode_segments is None
                else check_int("decode_segments", decode_segments, 1))
    scan = decode_lib.scan_layers_default(cfg) if scan_layers is None else bool(scan_layers)
    return _sample_jit(
        params, prompt_tokens.astype(jnp.int32), prompt_mask.astype(jnp.bool_), key,
        cfg=cfg, max_new_tokens=int(max_new_tokens), temperature=float(temperature),
        top_k=int(top_k), top_p=float(top_p), eos_ids=eos_ids, pad_id=pad_id,
        num_samples=int(num_samples), kv_fp8=kv_fp8 if kv_fp8 == "int8" else bool(kv_fp8),
        segments=segments,
        transpose=jax.default_backend() == "cpu" and not scan, scan_layers=scan, mesh=mesh,
        whole_cache=decode_lib.whole_cache_default(mesh=mesh),
    )
