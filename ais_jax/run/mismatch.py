"""Measure the FP8-rollout / BF16-trainer mismatch of a model: ``python -m ais_jax.mismatch``.

Samples completions with the FP8 rollout copy (`ais_jax.models.fp8.to_rollout_params`
of the BF16 params), re-scores the same tokens with the BF16 params
(`ais_jax.models.model.forward`, same temperature) and prints the paper's diagnostics
(docs/spec.md sections 2-4): mean |delta logp| (``d_bar``), the ESS ratio, quantiles
of |delta logp|, per-sequence log-ratio statistics, and the AIS coefficient
``alpha`` with its three parts.

``alpha`` needs advantages.  A constant advantage has zero spread, which makes
the variance-amplification term (``std(A * w) / (std(A) + eps)``) blow up and
``alpha`` collapse to 0, so the CLI uses a seeded random +-1 advantage per
sequence (half "correct", half "wrong", as in a GRPO group), broadcast to its
tokens.  ``d_bar``, the ESS ratio and ``alpha_ess`` / ``alpha_mis`` do not
depend on the advantages.

    python -m ais_jax.mismatch --model PATH_TO_HF_DIR_OR.gguf --task arithmetic
    python -m ais_jax.mismatch --model random:tiny --num-prompts 4 --json out.json
    python -m ais_jax.mismatch --model LLADA_DIR --max-new-tokens 32 --block-length 8 \
        --diffusion-steps 16            # a LLaDA checkpoint (ais_jax.run.llada_mismatch)

``--model random:tiny`` builds a small random model (character tokenizer) so
that the CLI runs without files.  Prompts come from ``--prompts FILE`` (one
prompt per line) or a built-in task's generator (``--task``); with an HF
tokenizer that has a chat template they are wrapped as one user message.
Bad input prints one line on stderr and exits with status 2; so do weights
holding NaN / inf (refused on load) and diagnostics that come out non-finite
(`check_finite_results`), instead of a table of ``nan``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import numpy as np

from ais_jax.core.errors import UsageError, xla_link_error
from ais_jax.run.mismatch_report import diagnostics, encode_prompts, format_table

RANDOM_TINY = "random:tiny"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise UsageError(message)


def _int_at_least(lo: int):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    return parse


def _temperature(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {s}")
    return v


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m ais_jax.mismatch",
                 description="FP8 rollout vs BF16 trainer log-prob mismatch of a model.")
    ap.add_argument("--model", required=True,
                    help=f"HF checkpoint directory, .gguf file, or {RANDOM_TINY!r}")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--prompts", help="text file, one prompt per line")
    src.add_argument("--task", default=None, help="built-in task name (default: arithmetic)")
    ap.add_argument("--num-prompts", type=_int_at_least(1), default=8)
    ap.add_argument("--samples", type=_int_at_least(1), default=4, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=_int_at_least(1), default=64)
    ap.add_argument("--temperature", type=_temperature, default=1.0)
    ap.add_argument("--seed", type=_int_at_least(0), default=0)
    ap.add_argument("--lm-head-fp8", action="store_true", help="also quantize the lm_head")
    ap.add_argument("--fp8-format", choices=("e4m3", "e5m2", "nvfp4", "mxfp4"), default="e4m3",
                    help="rollout weight format (rollout.fp8_format): FP8 e4m3 / e5m2, or "
                         "block-scaled FP4 nvfp4 / mxfp4 (weight-only, BF16 activations)")
    ap.add_argument("--act-scaling", choices=("tensor", "token"), default="tensor",
                    help="FP8 activation scales: per tensor (paper) or per token")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                    help="trainer precision (the params FP8 is made from)")
    ap.add_argument("--kv-fp8", action="store_true", help="FP8 KV cache in the FP8 sampler")
    ap.add_argument("--decode-segments", type=_int_at_least(1), default=4,
                    help="sampler decode segments (fewer: faster compile)")
    ap.add_argument("--bf16-arm", action="store_true",
                    help="also sample with the trainer-precision params (on-policy reference)")
    ap.add_argument("--json", default=None, help="write the diagnostics to this file")
    llada = ap.add_argument_group("LLaDA checkpoints (a --model directory whose config.json "
                                  "is LLaDA's; --max-new-tokens is gen_length)")
    llada.add_argument("--block-length", type=_int_at_least(1), default=32,
                       help="semi-autoregressive block length (divides --max-new-tokens)")
    llada.add_argument("--diffusion-steps", type=_int_at_least(1), default=64,
                       help="denoising steps (a multiple of the number of blocks, <= gen_length)")
    llada.add_argument("--p-mask", type=float, default=0.15,
                       help="prompt masking probability of the diffu-GRPO estimator")
    return ap


# ----------------------------------------------------------------------------- loading


def _tiny_model(seed: int):
    import jax

    from ais_jax.models.model import init_params
    from ais_jax.tasks import CharTokenizer
    from ais_jax.training.build import scratch_model_config

    tok = CharTokenizer()
    cfg = scratch_model_config(tok, hidden_size=64, intermediate_size=128, num_layers=2,
                               num_heads=4, num_kv_heads=2, head_dim=16, max_positions=1024,
                               tie_embeddings=False)
    params = jax.jit(init_params, static_argnums=1)(jax.random.key(seed), cfg)
    return params, cfg, tok


def load_model(path: str, dtype: Any, seed: int):
    """``(params, cfg, tokenizer)``; raises UsageError for a bad path."""
    if path == RANDOM_TINY:
        import jax

        params, cfg, tok = _tiny_model(seed)
        return jax.jit(lambda p: jax.tree_util.tree_map(lambda x: x.astype(dtype), p))(
            params), cfg, tok
    if path.startswith("random:"):
        raise UsageError(f"unknown random model {path!r}; the only one is {RANDOM_TINY!r}")
    from ais_jax.core import storage
    from ais_jax.models import pretrained, weight_files

    try:
        params, cfg = pretrained.load_pretrained(path, dtype)
        if weight_files.isfile(storage.join(path, "char_tokenizer.json")):  # gs:// too
            from ais_jax.tasks import CharTokenizer

            tok = CharTokenizer.load(path)  # a policy exported by a scratch run of the CLI
        else:
            tok = pretrained.load_tokenizer(path)
    except (pretrained.CheckpointError, OSError, ValueError) as e:
        raise UsageError(str(e).splitlines()[0] if str(e) else repr(e)) from None
    return params, cfg, tok


# ----------------------------------------------------------------------------- main


def check_finite_results(out: dict) -> None:
    """Refuse diagnostics that are not finite instead of printing ``nan``.

    Args:
      out: the result of `run` (or `ais_jax.run.llada_mismatch.run`).

    Raises:
      UsageError: an arm's statistic is NaN or inf (one line naming the arm and
        the statistics): the log-probs were not finite, i.e. weights that overflow
        the trainer / rollout precision (non-finite weights are refused on load).
    """
    for arm, stats in out["arms"].items():
        if stats.get("num_tokens") == 0:
            raise UsageError(f"arm {arm!r} of {out['model']}: no completion tokens were scored; "
                             "raise --max-new-tokens")
        bad = [k for k, v in stats.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            raise UsageError(f"arm {arm!r} of {out['model']}: non-finite results "
                             f"({', '.join(bad[:3])}{more}): the log-probs hold NaN or inf; "
                             "check the weights for values that overflow "
                             f"{out['trainer_dtype']} / the rollout format (or try "
                             "--dtype float32)")


def run(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp

    from ais_jax.models import fp8
    from ais_jax.models.llada.checkpoint import is_llada_dir
    from ais_jax.rollout.sampler import pad_prompts, sample
    from ais_jax.training.policy import sequence_logprobs

    if is_llada_dir(args.model):
        from ais_jax.run.llada_mismatch import run as run_llada

        return run_llada(args)
    fmt = getattr(args, "fp8_format", "e4m3")
    if fmt in fp8.FP4_FORMATS and args.act_scaling != "tensor":
        raise UsageError(f"--act-scaling {args.act_scaling} does not apply to --fp8-format {fmt} "
                         "(FP4 formats keep activations in BF16); drop --act-scaling")
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    t0 = time.perf_counter()
    params, cfg, tok = load_model(args.model, dtype, args.seed)
    prompts = encode_prompts(args, tok)
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    ptoks, pmask = pad_prompts(prompts, pad_id=pad)
    if int(pmask.sum(-1).max()) + args.max_new_tokens > cfg.max_position_embeddings:
        raise UsageError(f"longest prompt ({int(pmask.sum(-1).max())} tokens) + --max-new-tokens "
                         f"({args.max_new_tokens}) exceeds the model's "
                         f"{cfg.max_position_embeddings} positions")
    eos = cfg.eos_token_ids or ((cfg.eos_token_id,) if cfg.eos_token_id is not None else None)
    rollout = jax.jit(lambda p: fp8.to_rollout_params(
        p, dtype=fmt, quantize_lm_head=args.lm_head_fp8, act_scaling=args.act_scaling))(params)
    G = args.samples
    seq_prompt = jnp.repeat(jnp.asarray(ptoks), G, axis=0)
    seq_pmask = jnp.repeat(jnp.asarray(pmask), G, axis=0)
    score = jax.jit(lambda p, toks: sequence_logprobs(p, seq_prompt, seq_pmask, toks, cfg,
                                                      args.temperature))
    rng = np.random.default_rng(args.seed)
    adv = rng.choice(np.array([-1.0, 1.0], np.float32), size=len(prompts) * G)
    key = jax.random.key(args.seed)
    arms = {"fp8": rollout, **({args.dtype: params} if args.bf16_arm else {})}
    out: dict[str, Any] = {"model": args.model, "num_prompts": len(prompts), "samples": G,
                           "max_new_tokens": args.max_new_tokens,
                           "temperature": args.temperature, "lm_head_fp8": args.lm_head_fp8,
                           "act_scaling": args.act_scaling, "trainer_dtype": args.dtype,
                           "kv_fp8": args.kv_fp8, "seed": args.seed, "fp8_format": fmt,
                           "advantages": "random +-1 per sequence (seeded)", "arms": {}}
    for name, p in arms.items():
        r = sample(p, ptoks, pmask, key, cfg, max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, eos_id=eos, num_samples=G,
                   pad_id=pad, kv_fp8=args.kv_fp8 and name == "fp8",
                   decode_segments=args.decode_segments)
        logp_train = np.asarray(score(params, r.tokens), np.float32)
        out["arms"][name] = diagnostics(logp_train, np.asarray(r.logp, np.float32),
                                        np.asarray(r.mask, np.float32), adv)
    out["seconds"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        out = run(args)
        check_finite_results(out)
    except UsageError as e:
        print(f"mismatch: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # sampler / model input checks: one sentence each
        print(f"mismatch: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except Exception as e:  # XLA:CPU without F16C (issue 58); anything else keeps its traceback
        link = xla_link_error(e)
        if link is None:
            raise
        print(f"mismatch: error: {link}", file=sys.stderr)
        return 2
    trainer = out["trainer_dtype"]
    print(f"model {out['model']}: {out['num_prompts']} prompts x {out['samples']} samples, "
          f"<= {out['max_new_tokens']} new tokens, T={out['temperature']}, "
          f"{out['fp8_format'].upper()} "
          f"{'decoder + lm_head' if out['lm_head_fp8'] else 'decoder linears'}, "
          + ("BF16 activations (weight-only FP4)" if out["fp8_format"] in ("nvfp4", "mxfp4")
             else f"activation scales per {out['act_scaling']}")
          + f"; logp_train from {trainer} forward (arm 'fp8': the rollout format)")
    if out.get("family") == "llada":
        print(f"LLaDA: responses of {out['max_new_tokens']} positions denoised by the rollout "
              f"copy in blocks of {out['block_length']}, {out['diffusion_steps']} steps; both "
              f"log-probs from the diffu-GRPO estimator with one shared prompt mask "
              f"(p_mask={out['p_mask']})")
    print(format_table(out["arms"]))
    print(f"advantages for alpha: {out['advantages']}; {out['seconds']:.1f} s")
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(out, f, indent=2)
        except OSError as e:
            print(f"mismatch: error: cannot write {args.json}: {e.strerror}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
