"""Long-response decode throughput: `ais_jax.rollout.sampler.sample` at 1024 vs 64 new tokens (CPU).

A decode step should cost about the same whether the response is short or
long: the sampler decodes in segments that attend to a statically sized
prefix of the KV cache (`ais_jax.rollout.sampler.default_segments`), not to the whole
cache from the first step.  This benchmark samples a random small Llama with
no EOS (every row runs to its budget), alternating the short and the long run
round after round, and prints the median tokens/s of each and their ratio
(target: long / short >= 0.6).  Compile time (first call) is reported apart.

    python benchmarks/long_decode.py
    python benchmarks/long_decode.py --long 2048 --rounds 5 --scan-layers scan
    python benchmarks/long_decode.py --segments 1     # one segment: the whole cache per step
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax
import jax.numpy as jnp
import numpy as np


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=704)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--short", type=int, default=64, help="new tokens of the short run")
    ap.add_argument("--long", type=int, default=1024, help="new tokens of the long run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--segments", type=int, default=None,
                    help="sample(decode_segments=...); default: the sampler's plan")
    ap.add_argument("--scan-layers", choices=("auto", "scan", "unroll"), default="auto")
    ap.add_argument("--json", default=None, help="write the results here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Time the short and the long decode; print tokens/s and the long / short ratio."""
    a = parse_args(argv)
    from ais_jax.models.model import ModelConfig, init_params
    from ais_jax.rollout import sampler
    from ais_jax.rollout.sampler import sample

    def default_segments(n: int) -> int:
        return sampler.default_segments(n) if hasattr(sampler, "default_segments") else 4

    cfg = ModelConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_layers=a.layers, num_heads=a.heads, num_kv_heads=a.kv_heads,
                      head_dim=a.hidden // a.heads,
                      max_position_embeddings=max(4096, a.prompt + a.long))
    params = init_params(jax.random.key(0), cfg, jnp.dtype(a.dtype))
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, a.vocab, (a.batch, a.prompt)), jnp.int32)
    pmask = jnp.ones((a.batch, a.prompt), jnp.bool_)
    scan = {"auto": None, "scan": True, "unroll": False}[a.scan_layers]

    kw = {} if scan is None else {"scan_layers": scan}  # (older samplers lack scan_layers)
    if a.segments is not None:
        kw["decode_segments"] = a.segments

    def run(n: int, r: int) -> None:
        out = sample(params, prompt, pmask, jax.random.key(r), cfg, max_new_tokens=n,
                     temperature=1.0, eos_id=None, **kw)
        jax.block_until_ready(out)

    budgets = {"short": a.short, "long": a.long}
    first: dict[str, float] = {}
    for name, n in budgets.items():
        t = time.perf_counter()
        run(n, 0)
        first[name] = time.perf_counter() - t
    times: dict[str, list[float]] = {k: [] for k in budgets}
    load0 = os.getloadavg()[0]
    for r in range(1, a.rounds + 1):
        for name, n in budgets.items():
            t = time.perf_counter()
            run(n, r)
            times[name].append(time.perf_counter() - t)
    load1 = os.getloadavg()[0]

    print(f"config: hidden {a.hidden}, layers {a.layers}, heads {a.heads}/{a.kv_heads}, "
          f"ffn {a.intermediate}, vocab {a.vocab}, {a.dtype}; batch {a.batch}, prompt "
          f"{a.prompt}; scan_layers {a.scan_layers}; jax {jax.__version__} "
          f"{jax.default_backend()}; {a.rounds} rounds; loadavg {load0:.1f} -> {load1:.1f}")
    result: dict = {"args": vars(a), "loadavg": [load0, load1], "runs": {}}
    print(f"{'run':6s} {'new':>6s} {'segments':>8s} {'first call s':>12s} {'median s':>9s} "
          f"{'tokens/s':>9s}")
    for name, n in budgets.items():
        med = statistics.median(times[name])
        segs = a.segments or default_segments(n)
        row = {"new_tokens": n, "segments": segs, "first_call_s": first[name], "median_s": med,
               "tokens_per_s": a.batch * n / med, "times_s": times[name]}
        result["runs"][name] = row
        print(f"{name:6s} {n:6d} {segs:8d} {first[name]:12.2f} {med:9.3f} "
              f"{row['tokens_per_s']:9.0f}")
    ratio = result["runs"]["long"]["tokens_per_s"] / result["runs"]["short"]["tokens_per_s"]
    result["long_over_short"] = ratio
    print(f"long / short tokens/s = {ratio:.2f} (target >= 0.6); first call = compile + one run")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
