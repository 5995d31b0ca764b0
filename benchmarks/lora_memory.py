"""Compiled memory of the GRPO update with LoRA vs full fine-tuning, on the same model.

Compiles the update program (`ais_jax.training.steps.build_step_fns`) of a scratch decoder
twice, with ``lora.rank=0`` and with ``lora.rank=R``, and prints XLA's
``memory_analysis()``: argument bytes (params or adapters + optimizer state, the frozen base,
the batch), temp bytes (activations, gradients, optimizer temporaries) and their ratio.
CPU numbers are XLA's buffer assignment, not a device measurement.

    python benchmarks/lora_memory.py [--rank 8] [--hidden 512] [--layers 4]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ais_jax.config.load import load_config
from ais_jax.training.build import build_run
from ais_jax.training.trainer import RolloutBatch


def update_memory(overrides: list[str]) -> dict[str, int]:
    """``{"argument", "output", "temp", "alias"}`` bytes of the compiled update program."""
    r = build_run(load_config(None, overrides))
    c = r.cfg.rollout
    B, P, N = c.prompts_per_step * c.group_size, r.prompt_bucket, c.max_new_tokens
    batch = RolloutBatch(jnp.zeros((B, P), jnp.int32), jnp.ones((B, P), jnp.int32),
                         jnp.zeros((B, N), jnp.int32), jnp.ones((B, N), jnp.float32),
                         jnp.zeros((B, N), jnp.float32))
    rewards = jnp.zeros((c.prompts_per_step, c.group_size), jnp.float32)
    logp_old = None if not r.fns.score_for_update else jnp.zeros((B, N), jnp.float32)
    m = r.fns.update.lower(r.state, batch, rewards, jax.random.key(0), None,
                           logp_old).compile().memory_analysis()
    return {"argument": m.argument_size_in_bytes, "output": m.output_size_in_bytes,
            "temp": m.temp_size_in_bytes, "alias": m.alias_size_in_bytes}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    a = ap.parse_args(argv)
    base = [f"model.hidden_size={a.hidden}", f"model.num_layers={a.layers}",
            "model.num_heads=8", "model.num_kv_heads=4", f"model.head_dim={a.hidden // 8}",
            f"model.intermediate_size={4 * a.hidden}", "sft.steps=0", "task.eval_size=8",
            "rollout.prompts_per_step=8", "rollout.group_size=4",
            f"rollout.max_new_tokens={a.new_tokens}", "out_dir=/tmp/ais_jax_lora_memory"]
    full = update_memory(base)
    lo = update_memory([*base, f"lora.rank={a.rank}"])
    print(f"update program, scratch model D={a.hidden} L={a.layers}, LoRA rank {a.rank} "
          f"(all targets), bf16 compute, f32 master / adapters")
    print(f"{'bytes':>10} {'full FT':>14} {'LoRA':>14} {'LoRA/full':>10}")
    for k in ("argument", "temp", "output"):
        print(f"{k:>10} {full[k]:>14,} {lo[k]:>14,} {lo[k] / max(full[k], 1):>10.3f}")
    tf, tl = full["argument"] + full["temp"], lo["argument"] + lo["temp"]
    print(f"{'arg+temp':>10} {tf:>14,} {tl:>14,} {tl / tf:>10.3f}")


if __name__ == "__main__":
    main()
