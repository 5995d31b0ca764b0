"""One short GPU check of the FP8 rollout path: decode throughput and FP8 GEMMs in the compiled HLO.

On an NVIDIA H200 (jax[cuda]), for a ~1B-parameter Llama with random weights:

1. `ais_jax.rollout.sampler.sample` decode throughput with BF16 params and with the
   FP8 rollout copy (`fp8.to_rollout_params`), compile time reported apart,
   and the FP8 / BF16 tokens-per-second ratio;
2. the compiled HLO of both sampler programs searched for FP8 GEMMs
   (cuBLASLt ``__cublas$lt$matmul$f8`` custom calls, any custom call whose
   target names f8 / fp8, and GEMM fusions with float8 operands);
3. a micro-check of `fp8.qdot` alone on a 4096 x 4096 x 4096 matmul: its HLO
   and its time against a BF16 dot.

Everything runs in one process, well under 4 minutes on the H200 (compiles
included).  Results go to stdout and, when ``$OUT`` is set, to
``$OUT/gpu_check.json`` (plus the FP8 sampler's HLO text).

    python benchmarks/gpu_sampler_check.py            # the H200 check
    python benchmarks/gpu_sampler_check.py --tiny     # CPU smoke test of this script
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

from ais_jax.models import decode, fp8
from ais_jax.models.model import ModelConfig, init_params
from ais_jax.rollout import sampler

F8_TYPES = ("f8e4m3fn", "f8e5m2", "f8e4m3", "f8e5m2fnuz", "f8e4m3fnuz")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small config for a CPU smoke test")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per variant (median)")
    ap.add_argument("--segments", type=int, default=1,
                    help="sample(decode_segments=...); 1 keeps the GPU compile short")
    ap.add_argument("--matmul", type=int, default=4096, help="qdot micro-check size")
    return ap.parse_args(argv)


def model_config(tiny: bool) -> ModelConfig:
    if tiny:
        return ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=1024)
    return ModelConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_layers=16,
                       num_heads=32, num_kv_heads=8, head_dim=64, max_position_embeddings=4096)


def _computations(hlo: str) -> dict[str, str]:
    """HLO module text split into ``{computation name: body text}``."""
    out: dict[str, str] = {}
    name, lines = None, []
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY )?(%[\w.\-]+) ", line)
        if m and line.rstrip().endswith("{"):
            name, lines = m.group(1), []
        elif line.startswith("}") and name is not None:
            out[name] = "\n".join(lines)
            name = None
        elif name is not None:
            lines.append(line)
    return out


def inspect_hlo(hlo: str) -> dict:
    """Counts of GEMMs and of FP8 GEMMs in compiled HLO text."""
    targets = re.findall(r'custom_call_target="([^"]+)"', hlo)
    gemm_targets = [t for t in targets if "matmul" in t or "gemm" in t.lower()]
    f8_targets = [t for t in targets if re.search(r"f8|fp8", t, re.I)]
    comps = _computations(hlo)
    # Fusions that hold a dot (Triton / cuDNN GEMM fusions, CPU dot fusions) with f8 operands.
    f8_gemm_fusions, gemm_fusions = [], []
    for line in hlo.splitlines():
        m = re.search(r"\bfusion\(.*calls=(%[\w.\-]+)", line)
        if not m or m.group(1) not in comps:
            continue
        body = comps[m.group(1)]
        if " dot(" not in body and "custom-call(" not in body:
            continue
        gemm_fusions.append(m.group(1))
        params = [p for p in body.splitlines() if " parameter(" in p]
        if any(t + "[" in p for p in params for t in F8_TYPES):
            kind = re.search(r'"kind":"([^"]+)"', line)
            f8_gemm_fusions.append(kind.group(1) if kind else "fusion")
    # Plain dots (not fused) reading f8 values directly.
    f8_dots = [ln for ln in hlo.splitlines()
               if " dot(" in ln and any(t + "[" in ln for t in F8_TYPES)]
    return {
        "custom_call_gemms": len(gemm_targets),
        "custom_call_targets": sorted(set(gemm_targets)),
        "f8_custom_calls": len(f8_targets),
        "f8_custom_call_targets": sorted(set(f8_targets)),
        "gemm_fusions": len(gemm_fusions),
        "f8_gemm_fusions": len(f8_gemm_fusions),
        "f8_gemm_fusion_kinds": sorted(set(f8_gemm_fusions)),
        "f8_dots": len(f8_dots),
    }


def _timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - t)
    return out


def decode_check(a: argparse.Namespace, cfg: ModelConfig, out_dir: str | None) -> dict:
    key = jax.random.key(0)
    t = time.perf_counter()
    params = jax.jit(init_params, static_argnums=(1, 2))(key, cfg, jnp.bfloat16)
    rollout = jax.jit(fp8.to_rollout_params)(params)
    jax.block_until_ready((params, rollout))
    setup_s = time.perf_counter() - t
    B, P, N = a.batch, a.prompt, a.new
    prompt = jax.random.randint(jax.random.key(1), (B, P), 0, cfg.vocab_size, jnp.int32)
    pmask = jnp.ones((B, P), jnp.bool_)
    scan = decode.scan_layers_default(cfg)
    static = dict(cfg=cfg, max_new_tokens=N, temperature=1.0, top_k=0, top_p=1.0, eos_ids=(),
                  pad_id=0, num_samples=1, kv_fp8=False, segments=a.segments,
                  transpose=jax.default_backend() == "cpu" and not scan, scan_layers=scan)
    res: dict = {"setup_s": setup_s, "param_bytes": {
        "bf16": fp8.tree_nbytes(params), "fp8": fp8.tree_nbytes(rollout)}}
    for name, p in (("bf16", params), ("fp8", rollout)):
        t = time.perf_counter()
        compiled = sampler._sample_jit.lower(p, prompt, pmask, key, **static).compile()
        compile_s = time.perf_counter() - t
        hlo = compiled.as_text()
        if out_dir and name == "fp8":
            with open(os.path.join(out_dir, "fp8_sampler_hlo.txt"), "w") as f:
                f.write(hlo)
        jax.block_until_ready(compiled(p, prompt, pmask, key))  # warm-up
        times = _timed(lambda p=p, c=compiled: c(p, prompt, pmask, jax.random.key(2)), a.runs)
        med = statistics.median(times)
        res[name] = {"compile_s": compile_s, "median_s": med, "times_s": times,
                     "tokens_per_s": B * N / med, "hlo": inspect_hlo(hlo)}
        print(f"[decode] {name}: compile {compile_s:.1f} s, median {med:.3f} s, "
              f"{B * N / med:,.0f} tokens/s; HLO {res[name]['hlo']}", flush=True)
    res["fp8_over_bf16_tokens_per_s"] = res["fp8"]["tokens_per_s"] / res["bf16"]["tokens_per_s"]
    return res


def qdot_check(n: int, runs: int) -> dict:
    kx, kw = jax.random.split(jax.random.key(3))
    x = jax.random.normal(kx, (n, n), jnp.bfloat16)
    w = jax.random.normal(kw, (n, n), jnp.bfloat16) * 0.02
    wq = fp8.quantize_weight(w)
    f_fp8 = jax.jit(lambda x, w: fp8.qdot(x, w, out_dtype=jnp.bfloat16))
    f_bf16 = jax.jit(lambda x, w: jax.lax.dot_general(
        x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    # Alternative spellings of the same FP8 product, to see which one XLA fuses
    # into an FP8 GEMM: the operands converted to bf16 (not f32) before the
    # scalar scale, and a dot of the float8 arrays themselves.
    f_fp8_bf16 = jax.jit(lambda x, w: fp8.qdot(x, w, compute_dtype=jnp.bfloat16,
                                               out_dtype=jnp.bfloat16))

    def direct(x, w):
        xq = fp8.quantize(x, dtype=w.value.dtype)
        y = jax.lax.dot_general(xq.value, w.value, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        return (y * (xq.scale.reshape(()) * w.scale.reshape(()))).astype(jnp.bfloat16)

    f_direct = jax.jit(direct)
    res = {}
    for name, f, args in (("fp8_qdot", f_fp8, (x, wq)), ("bf16_dot", f_bf16, (x, w)),
                          ("fp8_qdot_bf16_convert", f_fp8_bf16, (x, wq)),
                          ("fp8_direct_f8_dot", f_direct, (x, wq))):
        t = time.perf_counter()
        c = f.lower(*args).compile()
        compile_s = time.perf_counter() - t
        jax.block_until_ready(c(*args))
        times = _timed(lambda c=c, args=args: c(*args), max(runs, 10))
        med = statistics.median(times)
        res[name] = {"compile_s": compile_s, "median_s": med, "tflops": 2 * n**3 / med / 1e12,
                     "hlo": inspect_hlo(c.as_text())}
        print(f"[qdot {n}] {name}: {med * 1e3:.3f} ms, {res[name]['tflops']:.1f} TFLOP/s; "
              f"HLO {res[name]['hlo']}", flush=True)
    err = jnp.abs(f_fp8(x, wq).astype(jnp.float32) - f_bf16(x, w).astype(jnp.float32))
    res["max_abs_diff_vs_bf16"] = float(jnp.max(err))
    res["fp8_speedup"] = res["bf16_dot"]["median_s"] / res["fp8_qdot"]["median_s"]
    return res


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    if a.tiny:
        a.batch, a.prompt, a.new, a.matmul = 4, 8, 8, 256
    t0 = time.perf_counter()
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    cfg = model_config(a.tiny)
    dev = jax.devices()[0]
    print(f"jax {jax.__version__}, device {dev.device_kind} ({jax.default_backend()}); "
          f"model {cfg.num_params / 1e9:.2f}B params; batch {a.batch}, prompt {a.prompt}, "
          f"new {a.new}", flush=True)
    result = {"jax": jax.__version__, "device": dev.device_kind, "backend": jax.default_backend(),
              "args": vars(a), "num_params": cfg.num_params}
    # Each part runs on its own: a failure in one still leaves the other's numbers.
    for part, fn in (("qdot", lambda: qdot_check(a.matmul, a.runs)),
                     ("decode", lambda: decode_check(a, cfg, out_dir))):
        try:
            result[part] = fn()
        except Exception as e:  # report and go on: this is a one-shot remote check
            result[part] = {"error": f"{type(e).__name__}: {e}"}
            print(f"[{part}] FAILED: {type(e).__name__}: {e}", flush=True)
    result["total_s"] = time.perf_counter() - t0
    d, q = result["decode"], result["qdot"]
    if "error" not in d and "error" not in q:
        print(f"FP8/BF16 decode tokens/s ratio: {d['fp8_over_bf16_tokens_per_s']:.2f} "
              f"(bf16 {d['bf16']['tokens_per_s']:,.0f}, fp8 {d['fp8']['tokens_per_s']:,.0f}); "
              f"FP8 GEMM custom calls in the FP8 sampler: {d['fp8']['hlo']['f8_custom_calls']}, "
              f"f8 GEMM fusions: {d['fp8']['hlo']['f8_gemm_fusions']}; "
              f"qdot speedup vs bf16 dot: {q['fp8_speedup']:.2f}", flush=True)
    print(f"total {result['total_s']:.0f} s", flush=True)
    if out_dir:
        with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
