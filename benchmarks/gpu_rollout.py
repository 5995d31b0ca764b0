"""Rollout throughput on one accelerator: model x batch x precision arm, with kernel counts.

``python benchmarks/gpu_rollout.py [--models Qwen3-8B,Qwen3-0.6B] [--batches 256,64]
[--arms bf16,fp8,fp8_kv,fp8_token] [--reps 3] [--new 512] [--prompt-len 128]
[--time-budget-s 420] [--xla-flags="--xla_..."] [--save-docs] [--tiny]``

Each config runs the rollout program users run: ``steps.build_step_fns`` of
``configs/qwen3_0p6b_gsm8k.yaml`` / ``configs/qwen3_8b_gsm8k.yaml`` on one
device (``mesh.fsdp=1``) with the arm's overrides and ``batch / 8`` prompts x
``G = 8`` samples.  Arms: ``bf16`` (``rollout.precision=bf16``), ``fp8`` (W8A8,
E4M3, per-tensor weight and activation scales), ``fp8_kv`` (``fp8`` +
``rollout.kv_cache_fp8=true``), ``fp8_token`` (``fp8`` +
``rollout.act_scaling=token``), ``fp8_prefill`` / ``fp8_prefill_kv`` (``fp8`` / ``fp8_kv``
with ``rollout.act_scaling=prefill``: scales fixed by the prefill, no amax in a decode
step).  No EOS id: every row decodes the full budget.

The params are random, made on the device by one jitted init directly in
bfloat16 (an f32 master copy of the 8B model would take minutes to build and
33 GB; ``TrainState`` with Adam moments would not fit beside the cache).  The
program takes them as its params argument, so its first step, the cast of the
trainer's f32 masters to bf16, is a no-op here; the FP8 arms still quantize
inside the program (the weight sync), as in training.  ``build_step_fns``
only reads the train state's shapes (an abstract one is passed).

Per config: lower and compile times (``lower()``, ``compile()``; the
compiled program is what runs; the table's "compile" is their sum), a
warm-up, ``--reps`` timed runs (all reported, and their median), tokens/s
(``rows x new / median``), ms per decode step (``median / new``, the prefill
included), model FLOP/s and MFU (`ais_jax.training.flops`), the
compiled memory analysis, the device allocator's bytes in use and peak (a
process-wide high-water mark), the KV cache's bytes (from the shapes), and
from the compiled HLO (`_hlo_stats.decode_loop_stats`) the kernels per decode
step (fusions + custom calls of the decode loop's body) and the FP8 GEMMs
(per step and in the whole program); from the lowered StableHLO the dots fed
by converted float8 values (>0 only where the program holds `QuantArray`
weights).  Ratios: each arm's tokens/s over ``bf16``'s per (model, batch).

The acceptance-critical configs run first (8B at 256 rows bf16 then fp8, 0.6B
at 64 rows bf16 then fp8), then the other arms of those, then the rest.  A
config whose estimated time (`_estimate`: the closest measured lower +
compile time plus ``reps + 1`` runs at the model's measured speed, on the low
side) exceeds what is left of ``--time-budget-s`` is skipped and listed as
such; a rep that would overrun the budget is not started (at least one runs).
A failing config (e.g. out of memory) is recorded and the sweep goes on.  The JSON goes to
``$OUT/gpu_rollout.json`` after every config (and with ``--save-docs`` to
``docs/measurements/gpu_rollout_<device>.json``); a table is printed.
``--tiny`` runs a 2-layer model on CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _bench_common as bc
import _hlo_stats
import jax
import jax.numpy as jnp

from ais_jax.training import flops, optim, steps
from ais_jax.training import sharding as shd

_FP8 = ["rollout.precision=fp8", "rollout.fp8_format=e4m3", "rollout.weight_scaling=tensor",
        "rollout.lm_head_fp8=false"]
# per-token int8 activations: per-tensor or prefill-fixed int8 scales measured d_bar 1.1 / 2.1 on
# SmolLM2 (docs/accelerators.md)
_INT8 = ["rollout.precision=int8", "rollout.act_scaling=token", "rollout.lm_head_fp8=false",
         "rollout.kv_cache_fp8=false"]
ARMS: dict[str, list[str]] = {
    "bf16": ["rollout.precision=bf16"],
    "fp8": [*_FP8, "rollout.act_scaling=tensor", "rollout.kv_cache_fp8=false"],
    "fp8_kv": [*_FP8, "rollout.act_scaling=tensor", "rollout.kv_cache_fp8=true"],
    "fp8_token": [*_FP8, "rollout.act_scaling=token", "rollout.kv_cache_fp8=false"],
    "fp8_prefill": [*_FP8, "rollout.act_scaling=prefill", "rollout.kv_cache_fp8=false"],
    "fp8_prefill_kv": [*_FP8, "rollout.act_scaling=prefill", "rollout.kv_cache_fp8=true"],
    # INT8 W8A8 (per-channel int8 weights, int32 accumulation; bf16 lm head), models/int8.py
    "int8": [*_INT8, "rollout.kv_cache_int8=false"],
    "int8_kv": [*_INT8, "rollout.kv_cache_int8=true"],
    "int8_prefill_kv": [*_INT8[:1], "rollout.act_scaling=prefill", *_INT8[2:],
                        "rollout.kv_cache_int8=true"],
}
CRITICAL = (("Qwen3-8B", 256), ("Qwen3-0.6B", 64))  # (model, rows) pairs measured first ...
CRITICAL_ARMS = ("bf16", "fp8")  # ... in these arms
G = 8


def sweep_order(models: list[str], batches: list[int], arms: list[str]
                ) -> list[tuple[str, int, str]]:
    """``(model, rows, arm)`` in run order: the critical arms of the critical pairs, the
    other arms of those pairs, then every other pair (models, then batches, as given)."""
    pairs = [(m, b) for m in models for b in batches]
    crit = [p for p in CRITICAL if p in pairs]
    first = [(m, b, a) for m, b in crit for a in arms if a in CRITICAL_ARMS]
    later = [(m, b, a) for m, b in crit + [p for p in pairs if p not in crit] for a in arms]
    return first + [c for c in later if c not in first]


def _estimate(report: dict, model: str, layers: int, rows: int, arm: str, reps: int) -> float:
    """Seconds a config should take, on the low side (a config that overruns is cut by the
    command's timeout, the JSON so far kept): the lower + compile time of the same model and
    arm at another batch, else the same model's fastest, else the arm's fastest on another
    model scaled by the layer counts (the decode unrolls the layers), else 30 s; plus
    ``reps + 1`` runs at the speed (per row) of the model's runs so far."""
    done = [c for c in report["configs"] if c["status"] == "ok"]

    def build(c: dict) -> float:
        return (c["lower_s"] + c["compile_s"]) * (layers / c["layers"] if c["model"] != model
                                                  else 1.0)

    times = [build(c) for c in done if (c["model"], c["arm"]) == (model, arm)]
    times = times or [build(c) for c in done if c["model"] == model]
    times = times or [build(c) for c in done if c["arm"] == arm]
    per_row = max((c["median_s"] / c["rows"] for c in done if c["model"] == model), default=0.0)
    return min(times, default=30.0) + (reps + 1) * per_row * rows


def run_config(name: str, mc: Any, params: Any, rows: int, arm: str, args: argparse.Namespace,
               budget: bc.Budget) -> dict[str, Any]:
    """Compile and time one (model, rows, arm) rollout; the report entry."""
    cfg = bc.config(name, [f"rollout.prompts_per_step={rows // G}", f"rollout.group_size={G}",
                           f"rollout.max_new_tokens={args.new}", "train.minibatches=1",
                           *ARMS[arm]])
    opt = optim.make_optimizer(1e-6)  # unused by the rollout; build_step_fns wants one
    state = jax.eval_shape(lambda p: optim.init_train_state(p, opt), params)
    fns = steps.build_step_fns(state, shd.make_mesh(), opt, None, mc, cfg, steps.TokenIds((), None))
    key = jax.random.key(1)
    prompts = jax.random.randint(jax.random.key(2), (rows // G, args.prompt_len), 0,
                                 mc.vocab_size)
    pmask = jnp.ones(prompts.shape, bool)
    t0 = time.perf_counter()
    lowered = fns.rollout.lower(params, prompts, pmask, key)
    e: dict[str, Any] = {"lower_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    compiled = lowered.compile()
    e["compile_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    e["hlo"] = _guarded(lambda: _hlo_stats.decode_loop_stats(compiled.as_text()))
    if args.lowered_stats:
        e["lowered"] = _guarded(lambda: {k: v for k, v in _hlo_stats.stablehlo_f8_dots(
            lowered.as_text()).items() if k in ("dots", "f8_dots", "dequantized_dots")})
    e["hlo_parse_s"] = time.perf_counter() - t0
    e["memory"] = {"compiled": bc.compiled_memory(compiled), "before": bc.device_memory()}
    out, e["warmup_s"] = bc.timed(compiled, params, prompts, pmask, key)
    e["generated_tokens"] = int(jnp.sum(out.mask))  # rows x new: no EOS ends a row early
    bc.delete_tree(out)
    reps: list[float] = []
    for i in range(args.reps):
        if i and budget.left() < 1.2 * reps[-1]:
            e["note"] = f"time budget: {i} of {args.reps} reps"
            break
        out, dt = bc.timed(compiled, params, prompts, pmask, key)
        bc.delete_tree(out)
        reps.append(dt)
    med = bc.median(reps)
    P, N = args.prompt_len, args.new
    model_flops = (flops.forward_flops(mc, rows // G, P)  # each prompt is prefilled once
                   + flops.rollout_flops(mc, rows, P, N) - flops.forward_flops(mc, rows, P))
    e["memory"]["after"] = bc.device_memory()
    e.update(reps_s=reps, median_s=med, tokens_per_s=rows * N / med, ms_per_step=1e3 * med / N,
             model_tflops_per_s=model_flops / med / 1e12,
             mfu=flops.mfu(model_flops, med, jax.devices()[0]),
             kv_cache_bytes=bc.kv_cache_bytes(mc, rows, P + max(N - 1, 0),
                                              fp8=cfg.rollout.kv_cache_fp8))
    return e


def _guarded(fn: Any) -> dict[str, Any]:
    """``fn()``, or ``{"error": ...}``: a surprise in the HLO text must not cost the timings."""
    try:
        return fn()
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"[:500]}


def _ratios(report: dict) -> dict[str, dict[str, float]]:
    ok = {(c["model"], c["rows"], c["arm"]): c["tokens_per_s"] for c in report["configs"]
          if c["status"] == "ok"}
    out: dict[str, dict[str, float]] = {}
    for (m, b, a), tps in ok.items():
        base = ok.get((m, b, "bf16"))
        if base and a != "bf16":
            out.setdefault(f"{m}@{b}", {})[a] = tps / base
    return out


def _row(c: dict) -> str:
    if c["status"] != "ok":
        return f"{c['model']:11s} {c['rows']:5d} {c['arm']:9s} {c['status']}: {c.get('reason', '')}"
    gb = ((c["memory"]["after"] or {}).get("peak_bytes_in_use", 0)) / 2**30
    h = c["hlo"]
    build = c["lower_s"] + c["compile_s"]
    return (f"{c['model']:11s} {c['rows']:5d} {c['arm']:9s} {build:8.1f} "
            f"{c['median_s']:8.3f} {c['tokens_per_s']:10.0f} {c['ms_per_step']:8.2f} "
            f"{h.get('kernels_per_step', -1):7d} {h.get('fp8_gemms_per_step', -1):6d} "
            f"{gb:7.1f} {c.get('ratio_vs_bf16') or float('nan'):6.2f}")


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="2-layer model, few tokens (CPU)")
    ap.add_argument("--models", default=None, help="comma-separated HF_PRESETS names")
    ap.add_argument("--batches", default=None, help="comma-separated rows (multiples of 8)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new", type=int, default=None, help="new tokens per row (512)")
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (128)")
    ap.add_argument("--time-budget-s", type=float, default=420.0)
    ap.add_argument("--xla-flags", default="",
                    help='appended to XLA_FLAGS before JAX starts: --xla-flags="--xla_..."')
    ap.add_argument("--lowered-stats", action=argparse.BooleanOptionalAction, default=True,
                    help="count float8-fed dots in the lowered StableHLO")
    ap.add_argument("--save-docs", action="store_true")
    ap.add_argument("--docs-dir", default=os.path.join(bc.ROOT, "docs", "measurements"))
    a = ap.parse_args(argv)
    a.models = (a.models or ("tiny" if a.tiny else "Qwen3-8B,Qwen3-0.6B")).split(",")
    a.batches = [int(b) for b in (a.batches or ("16" if a.tiny else "256,64")).split(",")]
    a.arms = a.arms.split(",")
    a.new = a.new or (8 if a.tiny else 512)
    a.prompt_len = a.prompt_len or (16 if a.tiny else 128)
    bad = [x for x in a.arms if x not in ARMS] + [b for b in a.batches if b % G or b <= 0]
    if bad or a.reps < 1:
        ap.error(f"unknown arms / batches not a positive multiple of {G} / reps < 1: {bad}")
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the sweep; returns the report (also written as JSON, see the module doc)."""
    args = _args(argv)
    env = bc.setup_env(args.xla_flags)
    budget = bc.Budget(args.time_budget_s)
    order = sweep_order(args.models, args.batches, args.arms)
    data: dict[str, Any] = {
        "script": "benchmarks/gpu_rollout.py", "argv": list(argv or sys.argv[1:]),
        **bc.device_info(), "env": env,
        "settings": {"prompt_len": args.prompt_len, "new_tokens": args.new, "group_size": G,
                     "reps": args.reps, "time_budget_s": args.time_budget_s, "eos": None,
                     "params": "random bf16, made on device", "order": order},
        "notes": [bc.PEAK_NOTE, "ms_per_step = median wall time / new tokens (prefill included)",
                  "kernels_per_step = fusions + custom calls in the decode loop body "
                  "(largest segment); the loop condition adds condition_kernels",
                  "MFU = model FLOPs (flops.rollout_flops, each prompt prefilled once) / "
                  "time / dense BF16 peak"],
        "configs": [], "ratios": {}}
    report = bc.Report("gpu_rollout", data)
    params: dict[str, Any] = {}
    print(f"{'model':11s} {'rows':>5s} {'arm':9s} {'compile':>8s} {'median':>8s} "
          f"{'tok/s':>10s} {'ms/step':>8s} {'kern':>7s} {'fp8mm':>6s} {'peakGB':>7s} {'ratio':>6s}")
    for i, (name, rows, arm) in enumerate(order):
        entry: dict[str, Any] = {"model": name, "rows": rows, "arm": arm}
        layers = bc.model_config(name).num_layers
        need = 0.0 if args.tiny else _estimate(data, name, layers, rows, arm, args.reps)
        if budget.left() <= need:
            entry.update(status="skipped", reason=f"time budget: ~{need:.0f} s needed, "
                         f"{max(budget.left(), 0):.0f} s of {args.time_budget_s:.0f} s left")
        else:
            try:
                mc = bc.model_config(name)
                if name not in params:
                    t0 = time.perf_counter()
                    params[name] = jax.block_until_ready(bc.device_params(mc, jnp.bfloat16))
                    entry["param_init_s"] = time.perf_counter() - t0
                entry.update(params=mc.num_params, layers=mc.num_layers)
                entry.update(run_config(name, mc, params[name], rows, arm, args, budget),
                             status="ok")
            except Exception as err:  # record and go on: one lease, many configs
                entry.update(status="error", reason=f"{type(err).__name__}: {err}"[:2000],
                             traceback=traceback.format_exc()[-4000:])
        if name in params and all(m != name for m, _, _ in order[i + 1:]):
            bc.delete_tree(params.pop(name))  # free this model before the next one
        data["configs"].append(entry)
        data["ratios"] = _ratios(data)
        if entry["status"] == "ok" and arm != "bf16":
            entry["ratio_vs_bf16"] = data["ratios"].get(f"{name}@{rows}", {}).get(arm)
        data["elapsed_s"] = budget.elapsed()
        report.write()
        print(_row(entry), flush=True)
    for p in params.values():
        bc.delete_tree(p)
    data["skipped"] = [f"{c['model']}@{c['rows']} {c['arm']}" for c in data["configs"]
                       if c["status"] == "skipped"]
    if data["skipped"]:
        print(f"skipped for the time budget: {', '.join(data['skipped'])}")
    report.write()
    if args.save_docs:
        print("saved", report.save_docs(args.docs_dir))
    return data


if __name__ == "__main__":
    main()
