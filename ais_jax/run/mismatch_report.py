"""The mismatch report's pieces shared by the AR and LLaDA paths of `python -m ais_jax.mismatch`.

`encode_prompts` (the prompts of a diagnosis), `diagnostics` (one arm's
statistics: d_bar, ESS ratio, |delta log p| quantiles, sequence log-ratio
spread, AIS alpha and its parts) and `format_table`.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from ais_jax.core.errors import UsageError


def encode_prompts(args: argparse.Namespace, tok: Any) -> list[list[int]]:
    """Token ids of ``args.num_prompts`` prompts (cycled when the file has fewer)."""
    from ais_jax.rollout.codec import PromptCodec
    from ais_jax.tasks import CharTokenizer, get_task

    char = isinstance(tok, CharTokenizer)
    codec = PromptCodec(tok, "compact" if char else "chat", None, 0, ())
    if args.prompts is not None:
        try:
            with open(args.prompts, encoding="utf-8") as f:
                texts = [line.rstrip("\n") for line in f if line.strip()]
        except OSError as e:
            raise UsageError(f"cannot read prompts file {args.prompts}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise UsageError(f"prompts file {args.prompts} is not UTF-8 text (byte "
                             f"{e.object[e.start]:#04x} at offset {e.start}); pass a UTF-8 text "
                             "file, one prompt per line") from None
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
    from ais_jax.method.ais import ais_coefficient

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
