"""One short GPU check of the decode loop: scanned against unrolled layers, and long responses.

On an NVIDIA H200 (jax[cuda]), for a ~1B-parameter Llama with random weights:

1. `ais_jax.rollout.sampler.sample` with ``scan_layers=True`` and ``False``, BF16
   params and the FP8 rollout copy: compile time and decode tokens/s, and in
   the compiled scanned program the per-layer slices of the stacked weights
   inside the decode loops (copies, unless XLA fuses them into the GEMMs);
2. long responses: tokens/s at ``--long`` against ``--short`` new tokens
   (the default segment plan and layer rule), and their ratio;
3. the ahead-of-time compile of a Qwen3-8B-shaped rollout program (abstract
   shapes, nothing allocated), with the default layer rule.

Everything runs in one process in a few minutes; results go to stdout and,
when ``$OUT`` is set, to ``$OUT/gpu_decode.json`` (plus the scanned BF16
program's HLO).

    python benchmarks/gpu_decode_check.py            # the H200 check
    python benchmarks/gpu_decode_check.py --tiny     # CPU smoke test of this script
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax
import jax.numpy as jnp

from ais_jax.models import fp8
from ais_jax.models.model import ModelConfig, init_params
from ais_jax.rollout.sampler import sample


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small config for a CPU smoke test")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--short", type=int, default=128)
    ap.add_argument("--long", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per variant (median)")
    ap.add_argument("--skip-8b", action="store_true")
    ap.add_argument("--skip-decode", action="store_true", help="skip check 1")
    return ap.parse_args(argv)


def model_config(tiny: bool) -> ModelConfig:
    if tiny:
        return ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=6,
                           num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=4096)
    return ModelConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_layers=16,
                       num_heads=32, num_kv_heads=8, head_dim=64, max_position_embeddings=4096)


def weight_slices_in_loops(hlo: str, cfg: ModelConfig) -> int:
    """Dynamic slices of an ``[F, D]`` / ``[D, F]`` weight (a per-layer copy) in the program."""
    F, D = cfg.intermediate_size, cfg.hidden_size
    shape = re.compile(rf"= \w+\[(?:1,)?(?:{F},{D}|{D},{F})\]")
    return sum(1 for line in hlo.splitlines()
               if shape.search(line) and re.search(r"dynamic[-_]slice", line))


def run_variant(params, cfg, prompt, pmask, n_new, scan, runs, hlo_path=None) -> dict:
    f = jax.jit(lambda p, t, m, k: sample(p, t, m, k, cfg, max_new_tokens=n_new,
                                          temperature=1.0, scan_layers=scan))
    t = time.perf_counter()
    compiled = f.lower(params, prompt, pmask, jax.random.key(0)).compile()
    compile_s = time.perf_counter() - t
    hlo = compiled.as_text()
    if hlo_path:
        with open(hlo_path, "w") as fh:
            fh.write(hlo)
    jax.block_until_ready(compiled(params, prompt, pmask, jax.random.key(0)))
    times = []
    for r in range(runs):
        t = time.perf_counter()
        jax.block_until_ready(compiled(params, prompt, pmask, jax.random.key(r + 1)))
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    return {"compile_s": compile_s, "median_s": med, "times_s": times,
            "tokens_per_s": prompt.shape[0] * n_new / med,
            "weight_slices_in_loops": weight_slices_in_loops(hlo, cfg)}


def main(argv: list[str] | None = None) -> dict:
    """Run the three checks; print and (with ``$OUT``) save the results."""
    a = parse_args(argv)
    out_dir = os.environ.get("OUT")
    cfg = model_config(a.tiny)
    if a.tiny:
        a.batch, a.prompt, a.new, a.short, a.long, a.skip_8b = 4, 8, 16, 16, 64, True
    print(f"jax {jax.__version__}, devices {jax.devices()}", flush=True)
    res: dict = {"config": vars(a), "decode": {}, "long": {}}

    def save() -> None:
        if out_dir:
            with open(os.path.join(out_dir, "gpu_decode.json"), "w") as fh:
                json.dump(res, fh, indent=2)

    params = jax.jit(init_params, static_argnums=(1, 2))(jax.random.key(0), cfg, jnp.bfloat16)
    variants = {"bf16": params, "fp8": jax.jit(fp8.to_rollout_params)(params)}
    prompt = jax.random.randint(jax.random.key(1), (a.batch, a.prompt), 0, cfg.vocab_size)
    pmask = jnp.ones((a.batch, a.prompt), jnp.bool_)
    for name, p in ({} if a.skip_decode else variants).items():
        for scan in (True, False):
            hlo_path = (os.path.join(out_dir, "bf16_scan_hlo.txt")
                        if out_dir and scan and name == "bf16" else None)
            r = run_variant(p, cfg, prompt, pmask, a.new, scan, a.runs, hlo_path)
            res["decode"][f"{name}_{'scan' if scan else 'unroll'}"] = r
            print(f"[decode] {name} scan={scan}: compile {r['compile_s']:.1f} s, "
                  f"{r['tokens_per_s']:,.0f} tokens/s, weight slices in loops "
                  f"{r['weight_slices_in_loops']}", flush=True)
            save()
    for label, n in (("short", a.short), ("long", a.long)):
        r = run_variant(params, cfg, prompt, pmask, n, None, a.runs)  # the default rule
        res["long"][label] = {"new": n, **r}
        print(f"[long] {label} {n} new (scan_layers default): compile {r['compile_s']:.1f} s, "
              f"{r['tokens_per_s']:,.0f} tokens/s", flush=True)
        save()
    res["long"]["ratio"] = res["long"]["long"]["tokens_per_s"] / res["long"]["short"][
        "tokens_per_s"]
    print(f"[long] long / short tokens/s = {res['long']['ratio']:.2f}", flush=True)
    save()
    if not a.skip_8b:
        big = ModelConfig(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                          num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
                          max_position_embeddings=40960)
        shapes = jax.eval_shape(lambda k: init_params(k, big, jnp.bfloat16), jax.random.key(0))
        f = jax.jit(lambda p, t, m, k: sample(p, t, m, k, big, max_new_tokens=4096))  # default
        t = time.perf_counter()
        f.lower(shapes, jax.ShapeDtypeStruct((64, 256), jnp.int32),
                jax.ShapeDtypeStruct((64, 256), jnp.bool_), jax.random.key(0)).compile()
        res["compile_8b_s"] = time.perf_counter() - t
        print(f"[8b] Qwen3-8B-shaped rollout (batch 64, prompt 256, 4096 new, scan_layers "
              f"default): "
              f"compile {res['compile_8b_s']:.1f} s", flush=True)
        save()
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
