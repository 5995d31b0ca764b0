"""The FP8-rollout / BF16-trainer mismatch of a LLaDA checkpoint (``python -m ais_jax.mismatch``).

`ais_jax.run.mismatch` hands a ``--model`` directory holding a LLaDA ``config.json``
here.  Responses are denoised by the FP8 rollout copy (`ais_jax.rollout.llada_sampler.generate`,
``--max-new-tokens`` = gen_length, ``--block-length``, ``--diffusion-steps``);
then the diffu-GRPO estimator scores them under the FP8 copy and under the
trainer-precision params with one shared random prompt mask (``--p-mask``), so
the diagnostics measure precision, not mask noise (docs/llada.md).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from ais_jax.core.errors import CheckpointError, UsageError


def load(path: str, dtype: Any) -> tuple[dict, Any, Any]:
    """``(params, LLaDAConfig, tokenizer)`` of a LLaDA checkpoint directory.

    The tokenizer is the character tokenizer of a policy exported by a scratch
    run (``char_tokenizer.json``), else the directory's HF tokenizer.

    Raises:
      UsageError: a bad config or a missing tokenizer; `CheckpointError` (a
        UsageError): unreadable, truncated or mis-indexed files, a missing or
        mis-shaped tensor, or one holding NaN / inf (one line each).
    """
    from ais_jax.models.llada.checkpoint import load as load_ckpt

    try:
        params, cfg = load_ckpt(path, dtype)
    except CheckpointError:
        raise  # already one line naming the file or tensor
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: {str(e).splitlines()[0]}") from None
    if os.path.isfile(os.path.join(path, "char_tokenizer.json")):
        from ais_jax.tasks import CharTokenizer

        return params, cfg, CharTokenizer.load(path)
    from ais_jax.models.pretrained import load_tokenizer

    try:
        return params, cfg, load_tokenizer(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: no usable tokenizer ({str(e).splitlines()[0]})") from None


def run(args: argparse.Namespace) -> dict:
    """The diagnostics of `ais_jax.run.mismatch.run` for a LLaDA model (one arm, ``fp8``)."""
    import jax
    import jax.numpy as jnp

    from ais_jax.models import fp8
    from ais_jax.rollout.llada_sampler import check_args, completion_mask, generate
    from ais_jax.rollout.sampler import pad_prompts
    from ais_jax.run.mismatch_report import diagnostics, encode_prompts
    from ais_jax.training.llada.estimator import completion_logprobs

    fmt = getattr(args, "fp8_format", "e4m3")
    check_args(args.max_new_tokens, args.block_length, args.diffusion_steps, args.temperature,
               "low_confidence", args.samples)
    if not 0.0 <= args.p_mask <= 1.0:
        raise UsageError(f"--p-mask must be in [0, 1], got {args.p_mask}")
    if args.kv_fp8 or args.bf16_arm:
        raise UsageError("--kv-fp8 and --bf16-arm do not apply to a LLaDA model (no KV cache; "
                         "the estimator compares the two precisions on the same tokens); "
                         "drop them")
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    t0 = time.perf_counter()
    params, cfg, tok = load(args.model, dtype)
    prompts = encode_prompts(args, tok)
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    ptoks, pmask = pad_prompts(prompts, pad_id=pad)
    if ptoks.shape[1] + args.max_new_tokens > cfg.max_sequence_length:
        raise UsageError(f"longest prompt ({ptoks.shape[1]} tokens) + --max-new-tokens "
                         f"({args.max_new_tokens}) exceeds the model's {cfg.max_sequence_length} "
                         "positions")
    kwargs: dict[str, Any] = {"dtype": fmt, "quantize_lm_head": args.lm_head_fp8}
    if fmt in ("e4m3", "e5m2"):
        kwargs["act_scaling"] = args.act_scaling
    rollout = jax.jit(lambda p: fp8.to_rollout_params(p, **kwargs))(params)
    G = args.samples
    gkey, mkey = jax.random.split(jax.random.key(args.seed))
    out = generate(rollout, cfg, jnp.asarray(ptoks), gkey, gen_length=args.max_new_tokens,
                   block_length=args.block_length, steps=args.diffusion_steps,
                   temperature=args.temperature, num_samples=G, prompt_mask=jnp.asarray(pmask))
    resp = out.tokens[:, ptoks.shape[1]:]
    eos = (cfg.eos_token_id,) if cfg.eos_token_id is not None else ()
    mask = np.asarray(completion_mask(resp, eos), np.float32)
    pt, pm = jnp.repeat(jnp.asarray(ptoks), G, 0), jnp.repeat(jnp.asarray(pmask), G, 0)
    est = jax.jit(lambda p: completion_logprobs(p, cfg, pt, resp, mkey, args.p_mask, pm))
    logp_roll = np.asarray(est(rollout), np.float32)
    logp_train = np.asarray(est(params), np.float32)
    adv = np.random.default_rng(args.seed).choice(np.array([-1.0, 1.0], np.float32),
                                                  size=len(prompts) * G)
    return {"model": args.model, "family": "llada", "num_prompts": len(prompts), "samples": G,
            "max_new_tokens": args.max_new_tokens, "block_length": args.block_length,
            "diffusion_steps": args.diffusion_steps, "p_mask": args.p_mask,
            "temperature": args.temperature, "lm_head_fp8": args.lm_head_fp8,
            "act_scaling": args.act_scaling, "trainer_dtype": args.dtype, "kv_fp8": False,
            "seed": args.seed, "fp8_format": fmt,
            "advantages": "random +-1 per sequence (seeded)",
            "arms": {"fp8": diagnostics(logp_train, logp_roll, mask, adv)},
            "seconds": time.perf_counter() - t0}
