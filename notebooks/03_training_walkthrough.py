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
# # 03 · A training run end to end
#
# `ais_jax.run.cli.run(cfg)` is what `python -m ais_jax.train` runs: build the model,
# task and mesh, an optional supervised warm start (SFT, scratch models only), then
# the GRPO loop. Each step samples with the FP8 rollout copy, scores the completions
# on the host, and takes one AIS-weighted GRPO update; it appends one JSON line to
# `out_dir/metrics.jsonl` and checkpoints every `checkpoint.every` steps.
#
# The setting below is tiny so that it runs in well under a minute on 2 CPU cores:
# a 1-layer, width-32 character-level model, 1-digit additions (so that 60 SFT steps
# already give some correct answers and the rewards, hence the advantages, are not
# all zero), 8 prompts x 4 completions x at most 4 new tokens per step, 6 steps.
# It shows the mechanics, not learning.

# %%
import json
import os
import tempfile

import numpy as np
from IPython.display import Image, display

from ais_jax.config.load import load_config
from ais_jax.run import cli as train
from ais_jax.run.plots import plot_run

OUT = tempfile.mkdtemp(prefix="ais_walkthrough_")
TINY = [
    "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=1", "model.head_dim=16", "model.intermediate_size=64",
    "task.difficulty={digits: 1, num_operands: 2, ops: '+'}", "task.eval_size=8",
    "sft.steps=60", "sft.batch_size=32", "sft.learning_rate=0.01",
    "rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=4",
    "train.steps=6", "train.learning_rate=0.003", "checkpoint.every=3",
    "log.tensorboard=false", "log.progress=false", f"out_dir={OUT}",
]
cfg = load_config(None, TINY)  # None: start from the defaults (docs/configuration.md)
print(cfg.rollout)
print(cfg.ais)

# %% [markdown]
# The same run from the command line:
#
# ```bash
# python -m ais_jax.train model.hidden_size=32 model.num_layers=1 ... out_dir=runs/walkthrough
# ```
#
# (`--config PATH` starts from a YAML file instead of the defaults; without it the
# CLI reads `configs/tiny_arithmetic.yaml`.)

# %%
result = train.run(cfg)
print("compilations:", result.compiles)

# %% [markdown]
# ## The metrics
#
# One line per step in `metrics.jsonl`:
#
# | key | meaning |
# |---|---|
# | `reward_mean`, `reward_std` | mean / std of the rewards of this step's `prompts x G` completions |
# | `accuracy` | fraction of completions the verifier accepts |
# | `loss` | clipped GRPO objective on `A_tilde` (token mean) |
# | `grad_norm`, `clip_frac`, `kl` | gradient norm (before clipping), fraction of tokens outside the PPO clip range, k3 KL to the reference (0 unless `train.beta_kl > 0`) |
# | `skipped` | updates skipped because the loss or a gradient was not finite |
# | `d_bar` | mean \|logp_train - logp_rollout\| over valid tokens: how far the FP8 sampler is from the BF16 trainer |
# | `ess_ratio` | `1 / (1 + CV^2)` of the truncated weights: the fraction of the batch that "counts" after reweighting |
# | `cv`, `var_amp` | CV of `w_bar`; `D = std(A w_bar) / (std(A) + eps)` |
# | `alpha_ess`, `alpha_mis`, `alpha_var`, `alpha` | the three AIS parts and the applied coefficient |
# | `response_len`, `num_valid` | mean completion length (tokens up to and including EOS); valid tokens in the batch |
# | `adv_abs_mean`, `logp_rollout_mean` | mean \|advantage\| per sequence; mean sampler log-prob per token |
# | `step_time_s` | wall time of the step (the first includes compilation) |
#
# Held-out accuracy (greedy decoding with the BF16 params) is measured before and
# after GRPO (`result.eval_before`, `result.eval_after`, `summary.json`), and every
# `eval.every` steps as `eval_accuracy`.
#
# <!-- The rows of the table above cannot be wrapped at 100 columns: # ruff: noqa: E501 -->

# %%
with open(os.path.join(OUT, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
cols = ["step", "reward_mean", "accuracy", "loss", "d_bar", "ess_ratio", "alpha_ess",
        "alpha_mis", "alpha_var", "alpha", "response_len", "step_time_s"]
print(" ".join(f"{c:>11s}" for c in cols))
for r in rows:
    print(" ".join(f"{r[c]:11.4f}" if isinstance(r[c], float) else f"{r[c]:11d}"
                   for c in cols))
print("held-out accuracy before / after GRPO:", result.eval_before["accuracy"],
      result.eval_after["accuracy"])

# %% [markdown]
# A tiny model's FP8 copy is close to its BF16 self: `d_bar` is around the gate
# `delta = 0.02` (a real 135M model sits near 0.2, see notebook 02), so `alpha_mis`
# and with it alpha move below 1 from step to step, while the ESS ratio stays near 1
# and `alpha_var` at 0. Every logged alpha satisfies the formula:

# %%
for r in rows:
    expect = float(np.clip(r["alpha_ess"] - cfg.ais.beta_var * r["alpha_var"], 0, 1)
                   * r["alpha_mis"])
    assert abs(r["alpha"] - expect) < 1e-5, (r["step"], r["alpha"], expect)
print("alpha == clip(alpha_ess - beta_var * alpha_var, 0, 1) * alpha_mis on every step")

# %% [markdown]
# ## Plots
#
# `ais_jax.run.plots.plot_run(out_dir)` (or `python -m ais_jax.plots OUT_DIR`) writes one
# PNG per panel to `out_dir/plots/`.

# %%
paths = plot_run(OUT)
print([os.path.basename(p) for p in paths])
for name in ("alpha", "d_bar", "ess_ratio"):
    display(Image(filename=os.path.join(OUT, "plots", f"{name}.png")))

# %% [markdown]
# ## Checkpoints and resume
#
# The run saved checkpoints (orbax) after the warm start (step 0) and at steps 3 and
# 6. Running the same job again with a larger `train.steps` restores the latest
# checkpoint (params, optimizer state, step counters) and continues; the per-step
# PRNG key is `fold_in(seed, step)` and each step's problems are generated from
# the seed and the step, so a resumed run repeats exactly what an uninterrupted run
# would have done. `metrics.jsonl` is cut back to the checkpointed steps and
# continued.

# %%
print("checkpoints:", sorted(os.listdir(os.path.join(OUT, "checkpoints"))))
more = train.run(load_config(None, [*TINY, "train.steps=8"]))
print("resumed_from:", more.resumed_from)
with open(os.path.join(OUT, "metrics.jsonl")) as f:
    print("steps in metrics.jsonl:", [json.loads(line)["step"] for line in f])
print("run directory:", sorted(os.listdir(OUT)))

# %% [markdown]
# `final/` holds the trained policy as an HF directory (`save_pretrained`: a
# `config.json` and `model.safetensors` that `transformers` loads) plus the
# tokenizer (`char_tokenizer.json` for a scratch model).
