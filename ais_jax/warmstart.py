"""Supervised warm start of scratch models: teacher forcing on the task's worked answers.

A model trained from scratch knows nothing of the task, so GRPO would see only
zero rewards.  `warm_start` trains it for ``sft.steps`` steps on generated
problems (answer + EOS after the compact prompt; a share ``sft.mistake_rate``
of them show the task's typical mistake instead) with a warmup + cosine
schedule, before the first RL step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ais_jax.build import Run
from ais_jax.codec import PromptCodec
from ais_jax.errors import UsageError
from ais_jax.placement import place


def sft_batch(problems: Sequence[Any], flawed: Sequence[bool], codec: PromptCodec, length: int,
              max_answer: int) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forcing batch of the supervised warm start.

    Args:
      problems: ``B`` problems.
      flawed: ``[B]``; True shows the task's typical mistake (``task.mistake``)
        instead of the correct answer (``sft.mistake_rate``).
      codec: prompt / answer encoding.
      length: sequence length ``T`` (prompt bucket + new tokens).
      max_answer: answer + EOS tokens kept (``rollout.max_new_tokens``).

    Returns:
      ``(tokens [B, T] int32, loss_mask [B, T] float32)``: prompt then answer
      + EOS, right-padded; the mask is 1 on the answer and EOS tokens.
    """
    toks = np.full((len(problems), length), codec.pad_id, np.int32)
    lm = np.zeros((len(problems), length), np.float32)
    for j, (p, bad) in enumerate(zip(problems, flawed, strict=True)):
        pr = codec.encode_prompt(p)
        ans = codec.encode_answer(p, codec.task.mistake(p) if bad else None)[:max_answer]
        if len(pr) + len(ans) > length:
            raise UsageError(f"a warm-start sequence has {len(pr) + len(ans)} tokens, more than "
                             f"{length}")
        toks[j, :len(pr) + len(ans)] = pr + ans
        lm[j, len(pr):len(pr) + len(ans)] = 1.0
    return toks, lm


def warm_start(run: Run, params: Any, progress: Any = None) -> Any:
    """``sft.steps`` teacher-forcing steps from ``params``; returns the trained params, placed.

    Args:
      run: the built run (its ``fns.sft`` program and optimizer).
      params: initial params.
      progress: optional ``tqdm``-like wrapper ``progress(iterable) -> iterable``
        (its ``set_postfix`` shows the loss every 20 steps).
    """
    cfg = run.cfg
    sft_params, sft_state = params, run.sft_optimizer.init(params)
    length = run.prompt_bucket + cfg.rollout.max_new_tokens
    steps = range(cfg.sft.steps)
    bar = progress(steps) if progress is not None else steps
    coins = np.random.default_rng([cfg.seed, 4242])  # flawed-demonstration coins
    for i in bar:
        probs = run.train_problems(1, i, cfg.sft.batch_size)
        flawed = coins.random(len(probs)) < cfg.sft.mistake_rate
        toks, lm = sft_batch(probs, flawed, run.codec, length, cfg.rollout.max_new_tokens)
        sft_params, sft_state, sm = run.fns.sft(sft_params, sft_state, jnp.asarray(toks),
                                                jnp.asarray(lm))
        if hasattr(bar, "set_postfix") and i % 20 == 0:
            bar.set_postfix(loss=f"{float(sm['loss']):.3f}")
    return place(sft_params, run.fns.state_shardings.params)
