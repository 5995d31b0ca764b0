"""The TPU compiler's price of the decode step and of the update, compiled without a TPU.

``/work/wt/_tpuvenv/bin/python benchmarks/deviceless_cost.py [--decode MODEL,...]
[--arms bf16,fp8,...] [--tpu v5e,v6e,tpu7x] [--rows 64] [--prompt-len 128] [--new 128]
[--update CONFIG@TARGET[+override...],...] [--out JSON] [--hlo-dir DIR] [--from-hlo | --reuse]``

Needs libtpu in its own venv (``python -m venv --system-site-packages VENV && VENV/bin/pip
install "libtpu==0.0.42.*"``; docs/measurements/plan_targets.md), no TPU; without it the script
prints one line and exits 2 (``--from-hlo`` re-reads saved ``.hlo`` files instead).

Programs:

* decode: the rollout program of each ``--decode`` model and arm of `gpu_rollout.ARMS`, built
  as `deviceless_kernels_tpu` builds it (`deviceless_kernels.compile_arm`: ``rows / 8`` prompts
  x 8 samples, abstract random-init bf16 params) for a one-chip topology per generation; priced
  per decode step: the body of the costliest decode segment (the last, which attends to the
  longest prefix), run once (`_hlo_cost.decode_body`); ``mean_segment_vs_bf16`` is the ratio of
  the mean over the segments' bodies (the segments run about as many steps each: 65 and 63 of
  128 new tokens).
* update: the update program ``python -m ais_jax.plan --config CONFIG --target TARGET``
  compiles (`update_hlo`: the same state, batch and step functions, prompt bucket 256);
  priced whole (loops x trip count).

Per program (`_hlo_cost.program_cost`): the sum of the compiler's per-instruction
``estimated_cycles`` and the seconds at the clock assumed (`_hlo_cost.CHIPS`); the
HloCostAnalysis-style roofline rebuilt per instruction (FLOPs, bytes, ``max(flops / peak,
bytes / HBM bandwidth)`` summed); the ten most expensive instructions by cycles.  Decode arms
also get their ratio to the same generation's ``bf16`` arm; the update the model-MFU bound:
model FLOPs (`ais_jax.training.flops.grpo_step_flops`' update) / devices / (roofline seconds x
peak).  Limits (also in the JSON): the cycle model is the compiler's static estimate (no
launch overhead, no measured stalls); the roofline has one BF16 flop rate for every dtype,
charges on-chip (VMEM) copies as HBM traffic and has no interconnect (collectives priced as
their local copies); custom calls count 0; nothing ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _hlo_cost as hc  # pure text, no jax
import deviceless_kernels_tpu as dkt

LIMITS = ("estimated_cycles: the TPU compiler's static per-instruction estimate (dtype-aware), "
          "summed with loop trip counts; no launch overhead, no host, no measured stalls. "
          "roofline: per instruction max(flops / BF16 peak, bytes / HBM bandwidth), one flop "
          "rate for every dtype, on-chip VMEM copies charged as HBM traffic, no interconnect, "
          "custom calls 0 except a Pallas TPU flash attention (_hlo_cost.flash_cost: its own "
          "roofline, FLOPs c x B x N x Tq x Tk x D with c = 4 forward / 8 dkv / 6 dq, every "
          "block counted, bytes = operands + results once; no estimated_cycles: it adds 0 "
          "cycles). Compile-only: nothing ran.")


def _short(r: dict) -> dict:
    return {k: r[k] for k in ("estimated_cycles", "estimated_s", "flops", "bytes", "roofline_s")
            if k in r}


def decode_rows(a: argparse.Namespace) -> list[dict]:
    """Price one decode step of every (model, generation, arm)."""
    rows = []
    for model in a.decode:
        for tpu in a.tpu:
            mesh = None if a.from_hlo else dkt._mesh(tpu)[0]  # libtpu starts (no compile)
            for arm in a.arms:
                stem = os.path.join(a.hlo_dir, f"{model}_{tpu}_{arm}_{a.rows}_{a.new}")
                if a.from_hlo and a.skip_missing and not os.path.exists(stem + ".hlo"):
                    continue
                out = {"program": "decode", "model": model, "tpu": tpu, "arm": arm,
                       "rows": a.rows, "prompt_len": a.prompt_len, "new": a.new}
                try:
                    text = _decode_text(a, model, tpu, arm, mesh, stem, out)
                except Exception as e:  # the compiler's refusal: recorded, the sweep goes on
                    out["error"] = " ".join(str(e).split())[:300]
                    rows.append(out)
                    print(json.dumps(out), flush=True)
                    continue
                out.update(hc.program_cost(text, tpu, decode=True))
                base = next((r for r in rows if r.get("tpu") == tpu and r.get("model") == model
                             and r["arm"] == "bf16" and "estimated_cycles" in r), None)
                if base and "estimated_cycles" in out:
                    out["cycles_vs_bf16"] = out["estimated_cycles"] / base["estimated_cycles"]
                    out["roofline_vs_bf16"] = out["roofline_s"] / base["roofline_s"]
                    mean = lambda r: sum(r["segment_cycles"]) / len(r["segment_cycles"])  # noqa: E731
                    out["mean_segment_vs_bf16"] = mean(out) / mean(base)
                rows.append(out)
                print(json.dumps({k: v for k, v in out.items() if k != "top"}), flush=True)
    return rows


def _decode_text(a, model: str, tpu: str, arm: str, mesh, stem: str, out: dict) -> str:
    if a.from_hlo or (a.reuse and os.path.exists(stem + ".hlo")):
        with open(stem + ".hlo") as f:
            return f.read()
    import deviceless_kernels as dk

    from ais_jax.run import plan_target as pt

    target = pt.Target(tpu, "tpu", dkt.TPUS[tpu][0], 1, 0)
    with pt.backend_as(target):
        text, meta = dk.compile_arm(model, arm, a.rows, a.prompt_len, a.new, mesh)
    out.update(libtpu=_libtpu(), **meta)
    with open(stem + ".hlo", "w") as f:
        f.write(text)
    return text


def _libtpu_or_none() -> str | None:
    """The installed libtpu's version (the compiler of ``--from-hlo`` files), else None."""
    try:
        return _libtpu()
    except Exception:  # importlib.metadata.PackageNotFoundError
        return None


def _libtpu() -> str:
    from importlib.metadata import version

    return version("libtpu")


def update_hlo(config: str, target_name: str, overrides: list[str], prompt_len: int = 256
               ) -> tuple[str, dict]:
    """The optimized HLO of the update program ``plan --target`` compiles, and its facts
    (``model_flops`` of the update, ``devices`` of the mesh, device kind, compile seconds)."""
    import jax
    import jax.numpy as jnp

    from ais_jax.run import plan, plan_report
    from ais_jax.run import plan_target as pt
    from ais_jax.training import build, flops, steps
    from ais_jax.training import sharding as shd

    cfg = plan.load_plan_config(config, overrides)
    target = pt.parse_target(target_name)
    devices = pt.target_devices(target)
    m = cfg.mesh
    mesh = shd.make_mesh(m.data, m.fsdp, m.tensor, devices=devices)
    model_cfg, _ = plan.resolve_model_config(cfg)
    r = cfg.rollout
    Pn, B, N = r.prompts_per_step, r.prompts_per_step * r.group_size, r.max_new_tokens
    eos = tuple(model_cfg.eos_token_ids) or ((model_cfg.eos_token_id,)
                                             if model_cfg.eos_token_id is not None else ())
    pad = model_cfg.pad_token_id if model_cfg.pad_token_id is not None else (eos[0] if eos else 0)
    with pt.backend_as(target):
        optimizer, _ = build.build_optimizers(cfg)
        state = plan_report.abstract_state(cfg, model_cfg, mesh, optimizer)
        fns = steps.build_step_fns(state, mesh, optimizer, None, model_cfg, cfg,
                                   steps.TokenIds(eos, pad))
        sds = jax.ShapeDtypeStruct
        batch = steps.RolloutBatch(sds((B, prompt_len), jnp.int32),
                                   sds((B, prompt_len), jnp.bool_), sds((B, N), jnp.int32),
                                   sds((B, N), jnp.float32), sds((B, N), jnp.float32))
        ref = state.params if cfg.train.beta_kl > 0 else None
        logp_old = sds((B, N), jnp.float32) if fns.score_for_update else None
        t0 = time.time()
        lowered = fns.update.lower(state, batch, sds((Pn, r.group_size), jnp.float32),
                                   jax.eval_shape(lambda: jax.random.key(0)), ref, logp_old)
        compiled = lowered.compile()
    f = flops.grpo_step_flops(cfg, model_cfg, prompt_len, N, kl=cfg.train.beta_kl > 0,
                              score_separately=False)
    return compiled.as_text(), {"model_flops": f.update, "devices": m.data * m.fsdp * m.tensor,
                                "device_kind": devices[0].device_kind,
                                "compile_s": round(time.time() - t0, 1), "libtpu": _libtpu()}


def update_rows(a: argparse.Namespace) -> list[dict]:
    """Price every ``--update CONFIG@TARGET[+override...]`` (loops x trip counts)."""
    rows = []
    for spec in a.update:
        head, *overrides = spec.split("+")
        config, target = head.split("@")
        tpu = target.split("-")[0]
        stem = os.path.join(a.hlo_dir, "update_" + "_".join(
            x.replace("/", "_").replace("=", "-") for x in (os.path.basename(config), target,
                                                               *overrides)))
        out = {"program": "update", "config": config, "target": target, "overrides": overrides}
        try:
            if a.from_hlo or (a.reuse and os.path.exists(stem + ".hlo")):
                with open(stem + ".hlo") as f:
                    text = f.read()
                with open(stem + ".json") as f:
                    out.update(json.load(f))
            else:
                text, meta = update_hlo(config, target, overrides)
                out.update(meta)
                with open(stem + ".hlo", "w") as f:
                    f.write(text)
                with open(stem + ".json", "w") as f:
                    json.dump(meta, f)
        except Exception as e:  # the compiler's refusal: recorded, the sweep goes on
            out["error"] = " ".join(str(e).split())[:300]
            rows.append(out)
            print(json.dumps(out), flush=True)
            continue
        out.update(hc.program_cost(text, tpu))
        peak = hc.CHIPS[tpu][1]
        out["mfu_bound"] = out["model_flops"] / out["devices"] / (out["roofline_s"] * peak)
        out["mfu_at_estimated_cycles"] = (out["model_flops"] / out["devices"]
                                          / (out["estimated_s"] * peak))
        rows.append(out)
        print(json.dumps({k: v for k, v in out.items() if k != "top"}), flush=True)
    return rows


def print_tables(rows: list[dict]) -> None:
    """One line per program, then the ten most expensive instructions of each."""
    print(f"\n{'program':<44}{'Mcycles':>9}{'est ms':>9}{'x bf16':>8}{'GFLOP':>9}{'GB':>8}"
          f"{'roof ms':>9}{'x bf16':>8}{'MFU bound':>10}{'seg x':>7}")
    for r in rows:
        name = (f"decode {r['model']} {r['tpu']} {r['arm']}" if r["program"] == "decode"
                else f"update {os.path.basename(r['config'])} {r['target']}")
        if "error" in r:
            print(f"{name:<44}error: {r['error'][:120]}")
            continue
        ratio = lambda k, r=r: f"{r[k]:.3f}" if k in r else "-"  # noqa: E731
        mfu = f"{100 * r['mfu_bound']:.1f}%" if "mfu_bound" in r else "-"
        print(f"{name:<44}{r['estimated_cycles'] / 1e6:>9.3f}{r['estimated_s'] * 1e3:>9.3f}"
              f"{ratio('cycles_vs_bf16'):>8}{r['flops'] / 1e9:>9.1f}{r['bytes'] / 1e9:>8.2f}"
              f"{r['roofline_s'] * 1e3:>9.3f}{ratio('roofline_vs_bf16'):>8}"
              f"{mfu:>10}{ratio('mean_segment_vs_bf16'):>7}")
    for r in rows:
        if "top" in r:
            print(f"\n{r['program']} {r.get('model', r.get('config'))} "
                  f"{r.get('tpu', r.get('target'))} {r.get('arm', '')}: top instructions by cycles")
            for t in r["top"]:
                print(f"  {t['share'] * 100:5.1f}%  {t['cycles'] * t['runs'] / 1e6:9.3f} Mcyc  "
                      f"x{t['runs']:<5}{t['opcode']:<10}{t['name'][:40]:<42}{t['type'][:60]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--decode", default="Qwen3-0.6B", help="models, comma-separated ('' none)")
    p.add_argument("--arms", default="bf16,fp8,fp8_prefill,fp8_prefill_kv,int8,int8_kv")
    p.add_argument("--tpu", default="v5e,v6e,tpu7x", help="generations: " + ",".join(dkt.TPUS))
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--update", default="configs/qwen3_0p6b_gsm8k.yaml@v6e-1",
                   help="CONFIG@TARGET[+override...], comma-separated ('' none)")
    p.add_argument("--out", default=None, help="JSON file (docs/measurements/...)")
    p.add_argument("--hlo-dir", default="/tmp/deviceless_cost")
    p.add_argument("--from-hlo", action="store_true", help="price saved .hlo, no compile")
    p.add_argument("--skip-missing", action="store_true",
                   help="with --from-hlo: leave out the programs with no saved .hlo")
    p.add_argument("--reuse", action="store_true",
                   help="price a program's saved .hlo when there is one, compile the others")
    a = p.parse_args(argv)
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    a.decode, a.arms, a.tpu, a.update = (split(a.decode), split(a.arms), split(a.tpu),
                                         split(a.update))
    os.makedirs(a.hlo_dir, exist_ok=True)
    if not a.from_hlo and dkt.libtpu_missing():
        return 2
    rows = decode_rows(a) + update_rows(a)
    print_tables(rows)
    if a.out:
        import jax

        with open(a.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__,
                       "libtpu": next((r["libtpu"] for r in rows if "libtpu" in r), None)
                    or _libtpu_or_none(),
                       "clocks_hz": {k: v[3] for k, v in hc.CHIPS.items()},
                       "peaks": {k: {"bf16_flops": v[1], "hbm_bytes_s": v[2]}
                                 for k, v in hc.CHIPS.items()},
                       "limits": LIMITS, "argv": sys.argv[1:], "programs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
