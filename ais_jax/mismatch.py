"""Measure the FP8-rollout / BF16-trainer mismatch of a model: ``python -m ais_jax.mismatch``.

Samples completions with the FP8 rollout copy (`ais_jax.fp8.to_rollout_params`
of the BF16 params), re-scores the same tokens with the BF16 params
(`ais_jax.model.forward`, same temperature) and prints the paper's diagnostics
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
        --diffusion-steps 16            # a LLaDA checkpoint (ais_jax.llada.mismatch)

``--model random:tiny`` builds a small random model (character tokenizer) so
that the CLI runs without files.  Prompts come from ``--prompts FILE`` (one
prompt per line) or a built-in task's generator (``--task``); with an HF
tokenizer that has a chat template they are wrapped as one user message.
Bad input prints one line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

import numpy as np

from ais_jax.errors import UsageError

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

    from ais_jax.build import scratch_model_config
    from ais_jax.model import init_params
    from ais_jax.tasks import CharTokenizer

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
    from ais_jax import pretrained

    try:
        params, cfg = pretrained.load_pretrained(path, dtype)
        if os.path.isfile(os.path.join(path, "char_tokenizer.json")):
            from ais_jax.tasks import CharTokenizer

            tok = CharTokenizer.load(path)  # a policy exported by a scratch run of the CLI
        else:
            tok = pretrained.load_tokenizer(path)
    except (pretrained.CheckpointError, OSError, ValueError) as e:
        raise UsageError(str(e).splitlines()[0] if str(e) else repr(e)) from None
    return params, cfg, tok


def encode_prompts(args: argparse.Namespace, tok: Any) -> list[list[int]]:
    """Token ids of ``args.num_prompts`` prompts (cycled when the file has fewer)."""
    from ais_jax.codec import PromptCodec
    from ais_jax.tasks import CharTokenizer, get_task

    char = isinstance(tok, CharTokenizer)
    codec = PromptCodec(tok, "compact" if char else "chat", None, 0, ())
    if args.prompts is not None:
        try:
            with open(args.prompts, encoding="utf-8") as f:
                texts = [line.rstrip("\n") for line in f if line.strip()]
        except OSError as e:
            raise UsageError(f"cannot read prompts file {args.prompts}: {e.strerror}") from None
        if not texts:
            raise UsageError(f"prompts file {args.prompts} has no non-empty line")
        texts = [texts[i % len(texts)] for i in range(args.num_prompts)]
        messages = [[{"role": "user", "content": t}] for t in texts]
    else:
        try:
            task = get_task(args.task or "arithmetic")
        except ValueError as e:
            raise UsageError(str(e)) from None
        problems = task.generate(args.seed, args.num_prompts, "eval")
        texts = [task.compact_prompt(p) if char else p.prompt for p in problems]
        messages = [task.chat_messages(p) for p in problems]
    try:
        if char:
            return [codec.encode_text(t) for t in texts]
        return [codec.encode_text(codec.messages_text(m)) for m in messages]
    except ValueError as e:
        raise UsageError(str(e)) from None


# ----------------------------------------------------------------------------- diagnostics


def diagnostics(logp_train: np.ndarray, logp_rollout: np.ndarray, mask: np.ndarray,
                advantages: np.ndarray) -> dict:
    """The mismatch statistics of one arm (all numpy; ``[B, N]`` inputs, ``[B]`` advantages)."""
    from ais_jax.ais import ais_coefficient

    valid = mask > 0
    delta = np.where(valid, logp_train - logp_rollout, 0.0)  # [B, N]
    absd = np.abs(delta[valid])
    seq = delta.sum(-1)  # [B] per-sequence log ratio
    import jax

    res = jax.jit(ais_coefficient)(logp_train, logp_rollout, np.broadcast_to(
        advantages[:, None], mask.shape).astype(np.float32), valid)
    q = np.quantile(absd, [0.5, 0.9, 0.99]) if absd.size else [float("nan")] * 3
    return {
        "num_tokens": int(valid.sum()),
        "num_sequences": int(mask.shape[0]),
        "mean_length": float(valid.sum(-1).mean()),
        "d_bar": float(res.d_bar),
        "ess_ratio": float(res.ess_ratio),
        "abs_delta_p50": float(q[0]), "abs_delta_p90": float(q[1]),
        "abs_delta_p99": float(q[2]),
        "abs_delta_max": float(absd.max()) if absd.size else float("nan"),
        "mean_delta": float(delta[valid].mean()) if absd.size else float("nan"),
        "seq_log_ratio_mean": float(seq.mean()), "seq_log_ratio_std": float(seq.std()),
        "seq_log_ratio_min": float(seq.min()), "seq_log_ratio_max": float(seq.max()),
        "alpha": float(res.alpha), "alpha_ess": float(res.alpha_ess),
        "alpha_mis": float(res.alpha_mis), "alpha_var": float(res.alpha_var),
        "var_amp": float(res.var_amp),
    }


_ROWS = [
    ("tokens scored", "num_tokens", "{:.0f}"), ("mean length", "mean_length", "{:.1f}"),
    ("d_bar = mean |dlogp|", "d_bar", "{:.4f}"), ("ESS ratio", "ess_ratio", "{:.4f}"),
    ("|dlogp| p50", "abs_delta_p50", "{:.4f}"), ("|dlogp| p90", "abs_delta_p90", "{:.4f}"),
    ("|dlogp| p99", "abs_delta_p99", "{:.4f}"), ("|dlogp| max", "abs_delta_max", "{:.4f}"),
    ("mean dlogp (train-roll)", "mean_delta", "{:+.4f}"),
    ("seq log-ratio mean", "seq_log_ratio_mean", "{:+.3f}"),
    ("seq log-ratio std", "seq_log_ratio_std", "{:.3f}"),
    ("seq log-ratio min", "seq_log_ratio_min", "{:+.3f}"),
    ("seq log-ratio max", "seq_log_ratio_max", "{:+.3f}"),
    ("alpha_ess", "alpha_ess", "{:.4f}"), ("alpha_mis", "alpha_mis", "{:.4f}"),
    ("alpha_var", "alpha_var", "{:.4f}"), ("alpha", "alpha", "{:.4f}"),
]


def format_table(arms: dict[str, dict]) -> str:
    names = list(arms)
    lines = [f"{'':26s}" + "".join(f"{n:>14s}" for n in names)]
    for label, key, fmt in _ROWS:
        lines.append(f"{label:26s}" + "".join(f"{fmt.format(arms[n][key]):>14s}" for n in names))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp

    from ais_jax import fp8
    from ais_jax.grpo import sequence_logprobs
    from ais_jax.llada.checkpoint import is_llada_dir
    from ais_jax.sampler import pad_prompts, sample

    if is_llada_dir(args.model):
        from ais_jax.llada.mismatch import run as run_llada

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
    except UsageError as e:
        print(f"mismatch: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # sampler / model input checks: one sentence each
        print(f"mismatch: error: {str(e).splitlines()[0]}", file=sys.stderr)
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
