"""Cost of `ais_coefficient` (+ weighting) under jit vs a forward+backward of a small model.

Both run in one process, alternating A B A B; medians and the ratio are printed.

    python benchmarks/ais_overhead.py [--batch 16 --seq 128 --rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from ais_jax import ais_coefficient
from ais_jax.method import grpo
from ais_jax.models.model import ModelConfig, init_params
from ais_jax.training import policy


def _time(fn, *args) -> float:
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128, help="generated tokens per row (N)")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()

    cfg = ModelConfig(vocab_size=8192, hidden_size=256, intermediate_size=704, num_layers=4,
                      num_heads=8, num_kv_heads=4, head_dim=32)
    params = init_params(jax.random.key(0), cfg)
    B, P, N = args.batch, args.prompt, args.seq
    k = jax.random.split(jax.random.key(1), 5)
    prompt = jax.random.randint(k[0], (B, P), 0, cfg.vocab_size)
    pmask = jnp.ones((B, P), bool)
    toks = jax.random.randint(k[1], (B, N), 0, cfg.vocab_size)
    mask = jax.random.uniform(k[2], (B, N)) < 0.9
    logp_old = -jax.random.exponential(k[3], (B, N))
    logp_roll = logp_old + 0.05 * jax.random.normal(k[4], (B, N))
    adv = jnp.repeat(jax.random.normal(k[0], (B, 1)), N, axis=1)

    @jax.jit
    def ais_step(lt, lr, a, m):
        return ais_coefficient(lt, lr, a, m).advantages

    batch = grpo.GRPOBatch(prompt, pmask, toks, mask, logp_old, adv)
    fwd_bwd = jax.jit(jax.grad(lambda p, b: policy.policy_loss(p, b, cfg)[0]))

    c0 = time.perf_counter()
    jax.block_until_ready(ais_step(logp_old, logp_roll, adv, mask))
    c1 = time.perf_counter()
    jax.block_until_ready(fwd_bwd(params, batch))
    c2 = time.perf_counter()
    t_ais, t_fb = [], []
    for _ in range(args.rounds):
        t_ais.append(_time(ais_step, logp_old, logp_roll, adv, mask))
        t_fb.append(_time(fwd_bwd, params, batch))
    a, f = statistics.median(t_ais), statistics.median(t_fb)
    print(f"model: {cfg.num_params / 1e6:.1f}M params, batch {B} x (prompt {P} + {N} tokens), "
          f"{jax.devices()[0].platform}")
    print(f"compile: ais {c1 - c0:.2f} s, forward+backward {c2 - c1:.2f} s")
    print(f"ais_coefficient (jit) median {a * 1e3:.3f} ms")
    print(f"forward+backward   median {f * 1e3:.1f} ms")
    print(f"ratio ais / (forward+backward) = {a / f:.5f} ({100 * a / f:.3f}%)")


if __name__ == "__main__":
    main()
