"""Compile time of the rollout sampler (`ais_jax.rollout.sampler.sample`) for deep models (CPU).

Lowers and compiles ``sample`` ahead of time on abstract shapes
(``jax.jit(...).lower(ShapeDtypeStructs).compile()``), so no weights are
allocated and a model of any size can be planned; prints the lowering and
compile wall times.  Compile time is what grows with depth: an unrolled decode
step compiles ``L`` copies of the decoder block per decode segment, a scan over
the stacked layers one.

    python benchmarks/decode_compile.py                         # 36 layers, width 64
    python benchmarks/decode_compile.py --preset qwen3-8b --new 4096
    python benchmarks/decode_compile.py --layers 24 --segments 1 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax
import jax.numpy as jnp

PRESETS = {  # (vocab, hidden, ffn, layers, heads, kv heads, head dim)
    "small": (256, 64, 128, 36, 4, 2, 16),
    "qwen3-0.6b": (151936, 1024, 3072, 28, 16, 8, 128),
    "qwen3-8b": (151936, 4096, 12288, 36, 32, 8, 128),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--layers", type=int, default=None, help="override the preset's depth")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=64, help="max_new_tokens")
    ap.add_argument("--segments", type=int, default=None,
                    help="sample(decode_segments=...); default: the sampler's own default")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--json", default=None, help="write the results here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Lower and compile `sample` once; return and print the timings."""
    a = parse_args(argv)
    from ais_jax.models.model import ModelConfig, init_params
    from ais_jax.rollout.sampler import sample

    vocab, hidden, ffn, layers, heads, kv, hd = PRESETS[a.preset]
    cfg = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                      num_layers=a.layers or layers, num_heads=heads, num_kv_heads=kv,
                      head_dim=hd, max_position_embeddings=max(4096, a.prompt + a.new))
    dtype = jnp.dtype(a.dtype)
    shapes = jax.eval_shape(lambda k: init_params(k, cfg, dtype), jax.random.key(0))
    kw = {"max_new_tokens": a.new, "temperature": 1.0}
    if a.segments is not None:
        kw["decode_segments"] = a.segments

    def rollout(params, tokens, mask, key):
        return sample(params, tokens, mask, key, cfg, **kw)

    args = (shapes, jax.ShapeDtypeStruct((a.batch, a.prompt), jnp.int32),
            jax.ShapeDtypeStruct((a.batch, a.prompt), jnp.bool_),
            jax.eval_shape(lambda: jax.random.key(0)))
    t0 = time.perf_counter()
    lowered = jax.jit(rollout).lower(*args)
    t1 = time.perf_counter()
    lowered.compile()
    t2 = time.perf_counter()
    has_scan = "scan_layers" in inspect.signature(sample).parameters
    res = {"config": dataclasses.asdict(cfg), "batch": a.batch, "prompt": a.prompt,
           "new": a.new, "segments": a.segments, "dtype": a.dtype,
           "lower_s": t1 - t0, "compile_s": t2 - t1, "sampler_has_scan_layers": has_scan}
    print(f"{a.preset}: {cfg.num_layers} layers, width {cfg.hidden_size}, batch {a.batch}, "
          f"prompt {a.prompt}, new {a.new}, decode_segments {a.segments or 'default'}, "
          f"{a.dtype}; jax {jax.__version__} {jax.default_backend()}")
    print(f"lower {res['lower_s']:.1f} s, compile {res['compile_s']:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
