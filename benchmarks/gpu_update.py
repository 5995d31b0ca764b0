"""The GRPO update program on one accelerator: time, tokens/s, MFU and memory.

``python benchmarks/gpu_update.py [--models Qwen3-0.6B,Qwen3-8B] [--layers Qwen3-8B=24]
[--prompts 8] [--prompt-len 128] [--new 512] [--reps 3] [--time-budget-s 270] [--trace]
[--xla-flags="--xla_..."] [--save-docs] [--tiny]``

For each model it builds the programs of ``configs/qwen3_0p6b_gsm8k.yaml`` /
``configs/qwen3_8b_gsm8k.yaml`` on one device (``mesh.fsdp=1``; f32 master
weights, BF16 compute, ``train.remat`` auto = full, chunked log-probs, the
config's 4 minibatches and its optimizer from ``build.build_optimizers``),
with random f32 params and Adam state made on the device by one jitted init.
The 8B model does not fit one H200 whole (f32 master + two Adam moments + an
f32 gradient are 16 bytes per parameter, 131 GB for 8.2B, before
activations), so its decoder is cut to ``--layers`` blocks (default 24: 5.9B
parameters; compiled for an H200 without a device, the update needs 70.5 GB
of arguments, donated, plus 35.7 GB of temporaries at 128 rows x 640 tokens:
``docs/measurements/deviceless_gpu_compile.md``); the cut is stated in the
output.  The batch is a `RolloutBatch` of random tokens (``--prompts x 8``
rows of ``--prompt-len`` prompt + ``--new`` completion tokens, all valid,
sampler log-probs near the trainer's), no sampling.  The default 8 prompts
(the configs use 32) keep both models inside the time budget.

One training step's device work is ``score`` (the no-grad ``logp_old``
forward, its own program when the update has several minibatches) then
``update`` (advantages, AIS, the minibatch GRPO steps).  Per model: compile
times and memory analyses of both, a warm-up step, ``--reps`` timed steps
(each rep's score and update times; medians), tokens/s (all ``P + N`` tokens
of every row per step), and MFU = ``flops.update_flops(rows, P + N,
extra_forwards=1 for the score pass) / step time / dense BF16 peak`` (model
FLOPs) and the hardware view with the forward that ``remat=full``
recomputes; the exact formula is written into the output.  The device's peak
bytes in use are a process-wide high-water mark: the models run one after
the other, each freed before the next.  A model is skipped when the budget is
spent (less than 60 s left), and reps stop early when the next would overrun
it.  ``--trace`` writes a JAX profiler trace of one more step per model to
``$OUT/trace/<model>/`` (``./gpu_update_trace/<model>`` without ``OUT``).
JSON to ``$OUT/gpu_update.json`` after every model (``--save-docs``:
``docs/measurements/gpu_update_<device>.json``).  ``--tiny``: a small model
on CPU, cut from 2 layers to 1.
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
import jax
import jax.numpy as jnp

from ais_jax.models.model import init_params
from ais_jax.training import build, flops, optim, steps
from ais_jax.training import sharding as shd

MFU_FORMULA = ("model FLOPs = (3 + s) x forward_flops(rows, P + N), s = 1 when logp_old is a "
               "separate score forward; forward_flops = tokens x (2 x matmul_params + "
               "4 L ((P + N + 1) / 2) Q H) (ais_jax.training.flops, the head counted on every "
               "position although log-probs need only the N completion positions); hardware "
               "view: + 1 forward when train.remat=full; MFU = FLOPs / step seconds / dense "
               "BF16 peak; update_program_only: 3 forwards (hardware: 4 with remat=full) over "
               "the update program's median seconds")


def make_batch(mc: Any, rows: int, prompts: int, P: int, N: int) -> tuple[Any, jax.Array]:
    """A random `RolloutBatch` of ``rows`` full-length completions and ``[prompts, G]``
    rewards, on the device."""
    k = jax.random.split(jax.random.key(3), 4)
    batch = steps.RolloutBatch(
        prompt_tokens=jax.random.randint(k[0], (rows, P), 0, mc.vocab_size),
        prompt_mask=jnp.ones((rows, P), bool),
        tokens=jax.random.randint(k[1], (rows, N), 0, mc.vocab_size),
        mask=jnp.ones((rows, N), jnp.float32),
        logp=-jnp.log(mc.vocab_size) + 0.01 * jax.random.normal(k[2], (rows, N)))
    return batch, jax.random.uniform(k[3], (prompts, rows // prompts))


def run_model(name: str, layers: int | None, args: argparse.Namespace,
              budget: bc.Budget) -> dict[str, Any]:
    """Compile, warm up and time the score + update step of one model; its report entry."""
    mc = bc.model_config(name, layers)
    full = bc.model_config(name).num_layers
    G, P, N = args.group_size, args.prompt_len, args.new
    rows = args.prompts * G
    over = [f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={G}",
            f"rollout.max_new_tokens={N}"]
    cfg = bc.config(name, over + ([f"train.minibatches={args.minibatches}"]
                                  if args.minibatches else []))
    opt, _ = build.build_optimizers(cfg)

    def init(key: jax.Array) -> optim.TrainState:
        return optim.init_train_state(init_params(key, mc, jnp.float32), opt)

    abstract = jax.eval_shape(init, jax.random.key(0))
    fns = steps.build_step_fns(abstract, shd.make_mesh(), opt, None, mc, cfg,
                               steps.TokenIds((), None))
    e: dict[str, Any] = {"layers": mc.num_layers, "layers_full": full, "params": mc.num_params,
                         "rows": rows, "seq_len": P + N, "minibatches": cfg.train.minibatches,
                         "remat": steps.remat_policy(cfg), "score_program": fns.score_for_update}
    if mc.num_layers != full:
        e["cut"] = f"{name} cut from {full} to {mc.num_layers} decoder layers to fit one device"
    batch, rewards = make_batch(mc, rows, args.prompts, P, N)
    key = jax.random.key(4)
    logp = jax.ShapeDtypeStruct((rows, N), jnp.float32) if fns.score_for_update else None
    t0 = time.perf_counter()
    update = fns.update.lower(abstract, batch, rewards, key, None, logp).compile()
    e["update_compile_s"] = time.perf_counter() - t0
    e["memory"] = {"update": bc.compiled_memory(update)}
    score = None
    if fns.score_for_update:
        t0 = time.perf_counter()
        score = fns.score.lower(abstract.params, batch).compile()
        e["score_compile_s"] = time.perf_counter() - t0
        e["memory"]["score"] = bc.compiled_memory(score)
    t0 = time.perf_counter()
    state = jax.block_until_ready(jax.jit(init, out_shardings=fns.state_shardings)(
        jax.random.key(0)))
    e["init_s"] = time.perf_counter() - t0
    e["memory"]["after_init"] = bc.device_memory()

    def step(st: Any) -> tuple[Any, dict, float, float]:
        lo, s_s = bc.timed(score, st.params, batch) if score is not None else (None, 0.0)
        (st, met), u_s = bc.timed(update, st, batch, rewards, key, None, lo)
        return st, met, s_s, u_s

    t0 = time.perf_counter()
    state, met, _, _ = step(state)
    e["warmup_s"] = time.perf_counter() - t0
    score_s, update_s = [], []
    for i in range(args.reps):
        if i and budget.left() < 1.2 * (score_s[-1] + update_s[-1]):
            e["note"] = f"time budget: {i} of {args.reps} reps"
            break
        state, met, s_s, u_s = step(state)
        score_s.append(s_s)
        update_s.append(u_s)
    step_s = [a + b for a, b in zip(score_s, update_s, strict=True)]
    med = bc.median(step_s)
    extra = int(fns.score_for_update)
    model_flops = flops.update_flops(mc, rows, P + N, extra_forwards=extra)
    hw_flops = flops.update_flops(mc, rows, P + N, extra_forwards=extra,
                                  remat_recompute=e["remat"] == "full")
    dev = jax.devices()[0]
    fwd, upd = flops.forward_flops(mc, rows, P + N), bc.median(update_s)
    e["update_program_only"] = {  # the update program alone: 3 forwards (+1 recomputed)
        "mfu": flops.mfu(3 * fwd, upd, dev),
        "mfu_hardware": flops.mfu((3 + (e["remat"] == "full")) * fwd, upd, dev)}
    e.update(score_s=score_s, update_s=update_s, step_s=step_s, median_step_s=med,
             median_update_s=upd, tokens_per_s=rows * (P + N) / med,
             completion_tokens_per_s=rows * N / med, model_flops=model_flops,
             hardware_flops=hw_flops, model_tflops_per_s=model_flops / med / 1e12,
             mfu=flops.mfu(model_flops, med, dev), mfu_hardware=flops.mfu(hw_flops, med, dev),
             metrics={k: float(met[k]) for k in ("loss", "grad_norm", "d_bar", "ess_ratio")
                      if k in met})
    e["memory"]["after"] = bc.device_memory()
    if args.trace:
        out = os.environ.get("OUT")
        e["trace_dir"] = os.path.join(os.path.join(out, "trace") if out else os.path.abspath(
            "gpu_update_trace"), name)
        try:  # a profiler failure must not cost the timings
            with bc.maybe_trace(e["trace_dir"]):
                state, met, _, _ = step(state)
        except Exception as err:
            e["trace_error"] = f"{type(err).__name__}: {err}"[:500]
    bc.delete_tree((state, batch, rewards))
    return e


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small model, few tokens (CPU)")
    ap.add_argument("--models", default=None, help="comma-separated HF_PRESETS names")
    ap.add_argument("--layers", default=None,
                    help="NAME=L,... decoder layers per model (default Qwen3-8B=24)")
    ap.add_argument("--prompts", type=int, default=None,
                    help="prompts per step (8; the configs' 32 takes ~4x the time)")
    ap.add_argument("--group-size", type=int, default=None, help="samples per prompt (8)")
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (128)")
    ap.add_argument("--new", type=int, default=None, help="completion tokens (512)")
    ap.add_argument("--minibatches", type=int, default=None, help="default: the config's")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--time-budget-s", type=float, default=270.0)
    ap.add_argument("--trace", action="store_true", help="profile one step into $OUT/trace")
    ap.add_argument("--xla-flags", default="",
                    help='appended to XLA_FLAGS before JAX starts: --xla-flags="--xla_..."')
    ap.add_argument("--save-docs", action="store_true")
    ap.add_argument("--docs-dir", default=os.path.join(bc.ROOT, "docs", "measurements"))
    a = ap.parse_args(argv)
    a.models = (a.models or ("tiny" if a.tiny else "Qwen3-0.6B,Qwen3-8B")).split(",")
    layers = a.layers or ("tiny=1" if a.tiny else "Qwen3-8B=24")
    a.layers = {k: int(v) for k, v in (p.split("=") for p in layers.split(",") if p)}
    a.prompts = a.prompts or (2 if a.tiny else 8)
    a.group_size = a.group_size or (4 if a.tiny else 8)
    a.prompt_len = a.prompt_len or (8 if a.tiny else 128)
    a.new = a.new or (8 if a.tiny else 512)
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every model; returns the report (also written as JSON, see the module doc)."""
    args = _args(argv)
    env = bc.setup_env(args.xla_flags)
    budget = bc.Budget(args.time_budget_s)
    data: dict[str, Any] = {
        "script": "benchmarks/gpu_update.py", "argv": list(argv or sys.argv[1:]),
        **bc.device_info(), "env": env, "mfu_formula": MFU_FORMULA,
        "settings": {"prompts": args.prompts, "group_size": args.group_size,
                     "prompt_len": args.prompt_len, "new_tokens": args.new, "reps": args.reps,
                     "time_budget_s": args.time_budget_s, "layers": args.layers},
        "notes": [bc.PEAK_NOTE, "tokens_per_s counts all prompt + completion tokens of a step"],
        "models": []}
    report = bc.Report("gpu_update", data)
    for i, name in enumerate(args.models):
        entry: dict[str, Any] = {"model": name}
        if budget.left() <= 0 or (i and budget.left() < 60 and not args.tiny):
            entry.update(status="skipped", reason=f"time budget: {budget.left():.0f} s of "
                         f"{args.time_budget_s:.0f} s left")
        else:
            try:
                entry.update(run_model(name, args.layers.get(name), args, budget), status="ok")
            except Exception as err:  # record and go on: one lease, several models
                entry.update(status="error", reason=f"{type(err).__name__}: {err}"[:2000],
                             traceback=traceback.format_exc()[-4000:])
        data["models"].append(entry)
        data["elapsed_s"] = budget.elapsed()
        report.write()
        if entry["status"] == "ok":
            e, mfu = entry, entry["mfu"]
            print(f"{name}: {e['layers']}/{e['layers_full']} layers, {e['rows']} rows x "
                  f"{e['seq_len']} tokens, compile {e['update_compile_s']:.1f} s, step "
                  f"{e['median_step_s']:.3f} s (update {e['median_update_s']:.3f} s), "
                  f"{e['tokens_per_s']:.0f} tokens/s, MFU "
                  f"{'n/a' if mfu is None else f'{mfu:.1%}'}", flush=True)
        else:
            print(f"{name}: {entry['status']}: {entry['reason']}", flush=True)
    if args.save_docs:
        print("saved", report.save_docs(args.docs_dir))
    return data


if __name__ == "__main__":
    main()
