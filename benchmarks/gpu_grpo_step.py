"""One GRPO step of a random-init Qwen3-0.6B at config shapes on a GPU: memory, time, FP8 GEMMs.

``python benchmarks/gpu_grpo_step.py [--tiny] [--new N] [--prompts P]`` builds
the programs of ``configs/qwen3_0p6b_gsm8k.yaml`` (f32 master, BF16 compute,
remat full, chunked log-probs) on one device with random weights, runs the BF16
and FP8 rollouts and one update, and writes ``$OUT/gpu_grpo_step.json`` (or
prints it): per program the compiled memory analysis, the device's peak bytes
in use, wall times (after compile), rollout tokens/s for BF16 vs FP8, and
whether the compiled FP8 rollout holds FP8 GEMMs (custom calls on f8 operands).
``--tiny`` runs a small model on CPU as a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time

import jax
import jax.numpy as jnp

from ais_jax.config.load import load_config
from ais_jax.config.schema import SKIP_PATH_CHECK_ENV
from ais_jax.models.hf_config import HF_PRESETS, model_config_from_hf
from ais_jax.models.model import ModelConfig, init_params
from ais_jax.training import optim, steps


def _mem(compiled) -> dict:
    m = compiled.memory_analysis()
    return {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp")}


def _peak() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    args = ap.parse_args()
    os.environ[SKIP_PATH_CHECK_ENV] = "1"
    G = 8
    if args.tiny:
        mc = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True)
    else:
        mc = model_config_from_hf(HF_PRESETS["Qwen3-0.6B"])
    opt = optim.make_optimizer(1e-6)
    out: dict = {"backend": jax.default_backend(), "device": str(jax.devices()[0]),
                 "params": mc.num_params, "rows": args.prompts * G, "prompt_len": args.prompt_len,
                 "new_tokens": args.new}
    from ais_jax.training import sharding as shd
    mesh = shd.make_mesh()
    state = optim.init_train_state(init_params(jax.random.key(0), mc, jnp.float32), opt)
    k = jax.random.key(1)
    pt = jax.random.randint(k, (args.prompts, args.prompt_len), 0, mc.vocab_size)
    pm = jnp.ones(pt.shape, bool)
    ids = steps.TokenIds((), None)  # no EOS: every row decodes the full budget
    for precision in ("bf16", "fp8"):
        c = load_config("configs/qwen3_0p6b_gsm8k.yaml", [
            f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={G}",
            f"rollout.max_new_tokens={args.new}", "train.minibatches=1",
            f"rollout.precision={precision}", "rollout.act_scaling=tensor",
            "rollout.weight_scaling=tensor"])
        fns = steps.build_step_fns(state, mesh, opt, None, mc, c, ids)
        t0 = time.perf_counter()
        comp = fns.rollout.lower(state.params, pt, pm, k).compile()
        entry = {"compile_s": time.perf_counter() - t0, "memory": _mem(comp)}
        if precision == "fp8":
            hlo = comp.as_text()
            calls = re.findall(r"custom_call_target=\"([^\"]+)\"", hlo)
            entry["fp8_gemm_calls"] = sum("f8" in line and "custom-call" in line
                                          for line in hlo.splitlines())
            entry["custom_call_targets"] = sorted(set(calls))
        batch = jax.block_until_ready(fns.rollout(state.params, pt, pm, k))
        t0 = time.perf_counter()
        batch = jax.block_until_ready(fns.rollout(state.params, pt, pm, k))
        dt = time.perf_counter() - t0
        entry.update(seconds=dt, tokens_per_s=args.prompts * G * args.new / dt, peak=_peak())
        out[f"rollout_{precision}"] = entry
    rewards = jax.random.uniform(k, (args.prompts, G))
    t0 = time.perf_counter()
    comp = fns.update.lower(state, batch, rewards, k, None, None).compile()
    out["update"] = {"compile_s": time.perf_counter() - t0, "memory": _mem(comp)}
    state, met = fns.update(state, batch, rewards, k, None, None)
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    state, met = fns.update(state, batch, rewards, k, None, None)
    jax.block_until_ready(state)
    out["update"].update(seconds=time.perf_counter() - t0, peak=_peak(),
                         loss=float(met["loss"]), d_bar=float(met["d_bar"]),
                         ess_ratio=float(met["ess_ratio"]))
    text = json.dumps(out, indent=1)
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_grpo_step.json"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
