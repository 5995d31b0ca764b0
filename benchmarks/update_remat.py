"""GRPO update throughput with and without per-layer rematerialization, side by side.

``python benchmarks/update_remat.py [--rounds 5]`` builds the 16M-parameter
Llama of the sampler benchmark (hidden 512, 4 layers, 8 / 4 heads, ffn 1408,
vocab 8192), one rollout-shaped batch (16 rows, prompt 16, 64 new tokens) and
the jitted `ais_jax.training.steps.update` for ``train.remat`` = none / full / dots.
The variants run in one process in alternating rounds; the script prints the
median update time, completion tokens per second and each variant's ratio to
``none`` (compile time reported apart).  Remat trades recomputation for
memory: the target on this CPU is a cost of at most ~35%.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from ais_jax.config.load import load_config
from ais_jax.models.model import ModelConfig, init_params
from ais_jax.training import optim, steps

MODEL = ModelConfig(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_layers=4,
                    num_heads=8, num_kv_heads=4, head_dim=64)
ROWS, PROMPT, NEW = 16, 16, 64


def build(remat: str):
    """``(update_fn, args)`` for one remat policy (compiled on first call)."""
    cfg = load_config(None, ["rollout.prompts_per_step=4", "rollout.group_size=4",
                             f"rollout.max_new_tokens={NEW}", f"train.remat={remat}",
                             "train.logprob_chunk=64", "model.compute_dtype=float32"])
    opt = optim.make_optimizer(1e-5)
    state = optim.init_train_state(init_params(jax.random.key(0), MODEL), opt)
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    batch = steps.RolloutBatch(
        jax.random.randint(k1, (ROWS, PROMPT), 0, MODEL.vocab_size),
        jnp.ones((ROWS, PROMPT), bool), jax.random.randint(k2, (ROWS, NEW), 0, MODEL.vocab_size),
        jnp.ones((ROWS, NEW), jnp.float32), -5.0 + 0.1 * jax.random.normal(k3, (ROWS, NEW)))
    rewards = jax.random.uniform(k3, (4, 4))

    def fn(st):
        return steps.update(st, batch, rewards, jax.random.key(2), None, opt, MODEL, cfg)

    return jax.jit(fn), state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    variants = {name: build(name) for name in ("none", "full", "dots")}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name, (fn, state) in variants.items():
        t0 = time.perf_counter()
        jax.block_until_ready(fn(state))
        print(f"{name:5s} compile + first call {time.perf_counter() - t0:.1f} s")
    for _ in range(args.rounds):
        for name, (fn, state) in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(state))
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["none"])
    print(f"\nupdate of {ROWS} rows x ({PROMPT} prompt + {NEW} new tokens), "
          f"{MODEL.num_params / 1e6:.1f}M params, float32, median of {args.rounds} rounds")
    print(f"{'remat':6s}{'s/update':>10s}{'tokens/s':>10s}{'x none':>8s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:6s}{med:10.3f}{ROWS * NEW / med:10.0f}{base / med:8.2f}")


if __name__ == "__main__":
    main()
