# ---
# jupyter:
#   jupytext:
#     comment_magics: false
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
# # 04 · Colab / TPU: devices, mesh, sharded params, a short run
#
# This notebook runs unchanged on a CPU (one device), a GPU, or a Colab TPU runtime
# (JAX sees the TPU cores as devices).
#
# **Install.** On Colab, install the package first, e.g. from a clone of the
# repository or a wheel you built (`pip install git+...` needs network access to the
# repository host):
#
# ```
# # !git clone <your fork of ais_jax> && pip install -e ./ais_jax
# # !pip install ais_jax              # if you publish a wheel / have one locally
# # !pip install -U "jax[tpu]"        # Colab TPU runtimes usually ship a TPU-enabled jax already
# ```
#
# The cell below is left commented so that the notebook runs offline.

# %%
# %pip install -e .          # from the repository root
# %pip install ais_jax

# %%
import os
import tempfile

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh

from ais_jax import ModelConfig, init_params, load_pretrained, save_pretrained
from ais_jax.config.load import load_config
from ais_jax.models.fp8 import to_rollout_params
from ais_jax.run import cli as train
from ais_jax.training import sharding as shd

devices = jax.devices()
print(f"backend: {jax.default_backend()}, {len(devices)} device(s): {devices}")
print(f"process {jax.process_index()} of {jax.process_count()}")

# %% [markdown]
# ## A mesh over the available devices
#
# `make_mesh(data, fsdp, tensor)` builds a `("data", "fsdp", "tensor")` mesh. Here
# all devices go on the `fsdp` axis (params and optimizer state sharded over the
# model width, batch sharded over `data x fsdp`). On one CPU device this is the
# trivial 1 x 1 x 1 mesh.

# %%
n = len(devices)
mesh = shd.make_mesh(data=1, fsdp=n, tensor=1)
print(mesh)


# %% [markdown]
# ## A checkpoint to train: a local HF directory, or a tiny random Llama
#
# If `AIS_JAX_MODEL_DIR` points at an HF checkpoint directory (`config.json`,
# `*.safetensors`, tokenizer files with a chat template; Llama / Qwen2 / Qwen3),
# that model is used. Otherwise we write a tiny random Llama with `save_pretrained`
# and a byte-level Hugging Face tokenizer (built with `tokenizers`, with a minimal
# chat template) into a temporary directory and load it back with `load_pretrained`,
# exactly as a real checkpoint would be loaded.

# %%
def write_tiny_llama(path):
    # A random 2-layer Llama plus a byte-level HF tokenizer with a chat template.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(specials)
    template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|bos|>",
                                  eos_token="<|eos|>", pad_token="<|pad|>",
                                  chat_template=template)
    tok.save_pretrained(path)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, arch="llama",
                      bos_token_id=1, eos_token_id=2, eos_token_ids=(2,), pad_token_id=0,
                      max_position_embeddings=1024)
    save_pretrained(init_params(jax.random.key(0), cfg), cfg, path)


MODEL_DIR = os.environ.get("AIS_JAX_MODEL_DIR")
if MODEL_DIR:
    print(f"using the checkpoint in AIS_JAX_MODEL_DIR={MODEL_DIR}")
else:
    MODEL_DIR = tempfile.mkdtemp(prefix="tiny_llama_")
    write_tiny_llama(MODEL_DIR)
    print(f"wrote a tiny random Llama to {MODEL_DIR}: {sorted(os.listdir(MODEL_DIR))}")

params, model_cfg = load_pretrained(MODEL_DIR, dtype=jnp.float32)
print(model_cfg)

# %% [markdown]
# ## Sharded params
#
# `param_shardings(params, mesh)` applies the one rules table of `ais_jax/training/sharding.py`:
# the model width (`embed`) goes over `fsdp`, heads / MLP / vocab over `tensor`, the
# stacked layer axis is never sharded, and a dimension the mesh axis does not divide
# stays replicated. `jax.device_put` lays the params out accordingly.

# %%
shardings = shd.param_shardings(params, mesh)
sharded = jax.device_put(params, shardings)
for name in ("embed", "wq", "w_down"):
    leaf = sharded[name] if name in sharded else sharded["layers"][name]
    shard = leaf.addressable_shards[0].data.shape
    print(f"{name:7s} {leaf.shape!s:18s} spec={leaf.sharding.spec} "
          f"shard on device 0: {shard}")

# %% [markdown]
# The rules for a bigger mesh, without the devices: `param_specs` only needs the
# axis sizes, so an `AbstractMesh` shows what a `fsdp=4, tensor=2` layout (e.g. a
# TPU v5e-8) would be (the tiny model's vocabulary of 261 is not divisible by
# `tensor=2`, so that axis of `embed` stays replicated). `rollout=True` gives the layout
# intended for the FP8 rollout copy: the `fsdp` rule dropped, so that decoding does not
# gather weights (`train.run` lays the FP8 copy out this way at every weight sync; see
# `docs/architecture.md`).

# %%
big = AbstractMesh((1, 4, 2), ("data", "fsdp", "tensor"))
trainer_specs = shd.param_specs(params, big)
rollout_specs = shd.param_specs(jax.eval_shape(to_rollout_params, params), big, rollout=True)
for name in ("wq", "wo", "w_gate", "w_down"):
    print(f"{name:7s} trainer {trainer_specs['layers'][name]}   "
          f"rollout {rollout_specs['layers'][name].value}")
print(f"embed   trainer {trainer_specs['embed']}   rollout {rollout_specs['embed']}")

# %% [markdown]
# ## Two training steps on this mesh
#
# `mesh.data x mesh.fsdp x mesh.tensor` must not exceed the visible devices, and
# `rollout.prompts_per_step` must be a multiple of `mesh.data x mesh.fsdp` (the
# batch axis is sharded over both). Chat-formatted prompts (`task.prompt_style=chat`)
# use the tokenizer's chat template. A random model earns no reward, so the
# advantages are zero and the update does nothing: this checks the plumbing.

# %%
OUT = tempfile.mkdtemp(prefix="ais_colab_run_")
cfg = load_config(None, [
    f"model.source={MODEL_DIR}", "task.prompt_style=chat", "task.eval_size=4",
    "mesh.data=1", f"mesh.fsdp={n}", "mesh.tensor=1",
    f"rollout.prompts_per_step={max(4, n)}", "rollout.group_size=2",
    "rollout.max_new_tokens=4", "train.steps=2", "checkpoint.every=0",
    "log.tensorboard=false", "log.progress=false", f"out_dir={OUT}",
])
result = train.run(cfg)
for r in result.metrics:
    print(f"step {r['step']}: reward={r['reward_mean']:.3f} d_bar={r['d_bar']:.4f} "
          f"ess_ratio={r['ess_ratio']:.4f} alpha={r['alpha']:.3f} "
          f"time={r['step_time_s']:.1f}s")
print(f"train steps done: {len(result.metrics)}")

# %% [markdown]
# ## Multi-host (TPU pods, GPU clusters)
#
# There is no driver process: **every host runs the same command** and JAX forms
# one global device set.
#
# ```bash
# # on every host, e.g. 4 hosts x 4 chips
# # (gcloud compute tpus tpu-vm ssh NAME --worker=all --command "...")
# python -m ais_jax.train --config configs/qwen3_8b_gsm8k.yaml --distributed \
#     mesh.data=4 mesh.fsdp=4 out_dir=/shared/runs/qwen3_8b
# ```
#
# * `--distributed` calls `jax.distributed.initialize()`, which auto-detects TPU pods
#   and common GPU cluster launchers. Elsewhere set
#   `AIS_JAX_COORDINATOR=host:port AIS_JAX_NUM_PROCESSES=N AIS_JAX_PROCESS_ID=i` on
#   each process instead.
# * The mesh is global: `mesh.data x mesh.fsdp x mesh.tensor` counts the devices of
#   all hosts.
# * Every process builds the same prompts from the seed and the step, so the host-side
#   data is identical everywhere; sampled tokens are all-gathered so that every
#   process computes the same rewards.
# * Process 0 writes `metrics.jsonl`, TensorBoard events, `summary.json` and the
#   final export; all processes take part in the orbax checkpoints, so `out_dir`
#   must be a directory every host can reach (a shared or mounted file system).
# * Rerunning the same command on all hosts resumes from the latest checkpoint.
# * The tested multi-process layout puts the `data` axis across processes and
#   `fsdp` within each. A mesh whose `fsdp` axis spans processes (parameters
#   sharded across hosts) currently fails at the first checkpoint save; see
#   `docs/architecture.md` ("Multi-host model") before a multi-host run.
