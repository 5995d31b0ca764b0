"""Argument checks of `ais_jax.rollout.sampler.sample`: one clear ValueError per bad argument.

Split from the sampler so that its module holds the decode program only.
Value checks on prompt ids / masks run only when they are concrete arrays
(under an outer `jax.jit` the traced prompts are trusted).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ais_jax.method.distributions import check_temperature


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def check_int(name: str, v: Any, lo: int) -> int:
    """``int(v)``; ValueError unless ``v`` is an int (not a bool) ``>= lo``."""
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    return int(v)


def validate_sample_args(prompt_tokens: Any, prompt_mask: Any, cfg: Any, max_new_tokens: Any,
                         temperature: Any, top_k: Any, top_p: Any, eos_id: Any,
                         num_samples: Any, pad_id: Any) -> tuple[tuple[int, ...], int]:
    """Check `ais_jax.rollout.sampler.sample`'s arguments; ``(eos_ids, pad_id)`` resolved.

    Args:
      prompt_tokens: ``[B, P]`` prompt ids (values checked when concrete).
      prompt_mask: ``[B, P]`` left-padding mask (values checked when concrete).
      cfg: the model config (``vocab_size``, ``max_position_embeddings``).
      max_new_tokens: ``N >= 1``.
      temperature: 0 (greedy) or a finite temperature >= the documented floor.
      top_k: ``>= 0``.
      top_p: in ``(0, 1]``.
      eos_id: None, an id or a sequence of ids, each in the vocabulary.
      num_samples: ``G >= 1``.
      pad_id: None (the first EOS, else 0) or an id in the vocabulary.

    Returns:
      ``(eos_ids, pad_id)``.

    Raises:
      ValueError: naming the first bad argument and the fix.
    """
    if prompt_tokens.ndim != 2:
        raise ValueError(f"prompt_tokens must be [B, P], got shape {prompt_tokens.shape}")
    if prompt_mask.shape != prompt_tokens.shape:
        raise ValueError(f"prompt_mask shape {prompt_mask.shape} != prompt_tokens shape "
                         f"{prompt_tokens.shape}")
    B0, P = prompt_tokens.shape
    if B0 == 0:
        raise ValueError("empty batch: prompt_tokens has 0 rows")
    if P == 0:
        raise ValueError("empty prompts: prompt_tokens has 0 columns; give at least one token")
    N = check_int("max_new_tokens", max_new_tokens, 1)
    check_int("num_samples", num_samples, 1)
    check_int("top_k", top_k, 0)
    check_temperature(temperature)  # finite, and 0 (greedy) or >= MIN_TEMPERATURE
    if not isinstance(top_p, int | float) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    V = cfg.vocab_size
    if eos_id is None:
        eos_ids: tuple[int, ...] = ()
    elif isinstance(eos_id, int | np.integer):
        eos_ids = (int(eos_id),)
    else:
        eos_ids = tuple(int(e) for e in eos_id)
    for e in eos_ids:
        if not 0 <= e < V:
            raise ValueError(f"eos_id {e} is outside the vocabulary [0, {V})")
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else 0
    if not 0 <= int(pad_id) < V:
        raise ValueError(f"pad_id {pad_id} is outside the vocabulary [0, {V})")
    max_pos = cfg.max_position_embeddings
    longest = P
    if _is_concrete(prompt_mask):
        m = np.asarray(prompt_mask).astype(bool)
        lengths = m.sum(-1)
        if (lengths == 0).any():
            raise ValueError(f"prompt row {int(np.argmin(lengths))} has no tokens (mask all 0)")
        if (np.diff(m.astype(np.int8), axis=-1) < 0).any():
            raise ValueError("prompts must be left-padded: mask must be 0...0 1...1 in each row")
        longest = int(lengths.max())
    if _is_concrete(prompt_tokens):
        t = np.asarray(prompt_tokens)
        if t.size and (t.min() < 0 or t.max() >= V):
            raise ValueError(f"prompt token ids must be in [0, {V}), got range "
                             f"[{t.min()}, {t.max()}]")
    if longest + N > max_pos:
        raise ValueError(
            f"prompt ({longest} tokens) + max_new_tokens ({N}) exceeds the model's "
            f"max_position_embeddings ({max_pos}); shorten the prompt or the budget")
    return eos_ids, int(pad_id)
