"""Kernels and weight bytes per decode step of the rollout program, compiled for TPUs without one.

``/work/tpuvenv/bin/python benchmarks/deviceless_kernels_tpu.py [--model Qwen3-0.6B]
[--rows 64] [--prompt-len 128] [--new 128] [--arms bf16,bf16_fused,fp8,fp8_fused,fp8_kv]
[--tpu v5e,v6e,tpu7x] [--out DIR] [--from-hlo]``

The TPU counterpart of ``benchmarks/deviceless_kernels.py`` (same programs: `compile_arm` there,
``steps.build_step_fns``' rollout on abstract random-init bf16 params, ``rows / 8`` prompts x 8,
the arms of `gpu_rollout.ARMS`, ``_fused`` adding ``rollout.fused_linears=true``).  Needs libtpu
(``pip install "libtpu==0.0.42.*"`` in a venv beside the project's jax;
docs/measurements/plan_targets.md) but no TPU: each generation is a one-chip compile-only
topology (``v5e:1x1``, ``v6e:1x1``, ``tpu7x:1x1x1`` with ``chips_per_host_bounds=(1, 1, 1)``;
a tpu7x chip has two devices, the mesh takes the first).  ``jax.default_backend`` answers
``"tpu"`` while the program is built (`plan_target.backend_as`: the sampler's accelerator layout,
unrolled layers).  Without libtpu the script prints one line and exits 2.

From the optimized HLO it reports per decode step (the largest decode loop body, as
`_hlo_stats.decode_loop_stats` picks it): fusions, custom calls (by target; TPU's are mostly
buffer and bitcast helpers, listed), kernels (fusions + custom calls, the GPU script's
definition), the other unfused instructions (TPU leaves copies, async slices, dynamic updates
outside fusions), GEMM kernels (fusions holding a dot or convolution), the weight bytes the step
reads (`_hlo_weights.weight_reads_per_step`: loop-invariant arrays that reach a GEMM, by dtype;
the ratio to the same generation's ``bf16`` arm), and the dequantized-copy verdict
(`_hlo_weights.dequant_copies`).  Compile-time counts, not speed.

Writes ``DIR/<model>_<tpu>_<arm>_<rows>_<new>.{json,hlo}`` and prints a table per model;
``--from-hlo`` re-reads saved ``.hlo`` files (no libtpu needed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _hlo_stats as hs  # pure text parsing, no jax
import _hlo_weights as hw
import deviceless_kernels as dk

# generation: (libtpu topology name, get_topology_desc keyword arguments)
TPUS = {"v5e": ("v5e:1x1", {"chips_per_host_bounds": (1, 1, 1)}),
        "v6e": ("v6e:1x1", {"chips_per_host_bounds": (1, 1, 1)}),
        "tpu7x": ("tpu7x:1x1x1", {"chips_per_host_bounds": (1, 1, 1)})}


def custom_call_targets(mod: hs.HloModule, comp: str, seen: tuple[str, ...] = ()) -> Counter:
    """Custom-call targets one run of ``comp`` executes (loops times their known trip count,
    counted once when unknown; fused computations not entered: a custom call there is part of
    its fusion's kernel)."""
    c: Counter = Counter()
    if comp in seen:
        return c
    for ins in mod.computations.get(comp, []):
        calls = ins.called()
        if ins.opcode == "custom-call":
            m = hs._TARGET.search(ins.attrs)
            c[m.group(1) if m else "?"] += 1
        elif ins.opcode == "while" and "body" in calls:
            for k, v in custom_call_targets(mod, calls["body"][0], (*seen, comp)).items():
                c[k] += v * (ins.trip_count or 1)
        elif ins.opcode in ("call", "async-start", "conditional"):
            for names in calls.values():
                for name in names:
                    c.update(custom_call_targets(mod, name, (*seen, comp)))
    return c


def analyse(text: str) -> dict:
    """`deviceless_kernels.analyse` (kernels, GEMMs) plus weight bytes and the copy verdict."""
    out = dk.analyse(text)
    reads = hw.weight_reads_per_step(text)
    mod = hs.parse_hlo(text)
    out["custom_call_targets_per_step"] = dict(custom_call_targets(mod, reads.get("body", "")))
    out["weight_reads_per_step"] = reads
    out["dot_operand_dtypes_per_step"] = hw.dot_operand_dtypes(text)
    copies = hw.dequant_copies(text)
    out["dequant"] = {**copies, "other_f8_converts": copies["other_f8_converts"][:20],
                      "other_f8_converts_n": len(copies["other_f8_converts"])}
    return out


def libtpu_missing() -> bool:
    """Whether libtpu is absent (then one line saying how to install it is printed)."""
    if importlib.util.find_spec("libtpu") is None:
        print('deviceless_kernels_tpu: libtpu is not installed (pip install "libtpu==0.0.42.*" '
              "in its own venv); see docs/measurements/plan_targets.md")
        return True
    return False


def _mesh(tpu: str):
    from jax.experimental import topologies

    from ais_jax.training import sharding as shd

    name, kwargs = TPUS[tpu]
    topo = topologies.get_topology_desc(topology_name=name, platform="tpu", **kwargs)
    return shd.make_mesh(devices=list(topo.devices)[:1]), topo.devices[0].device_kind


def _row(r: dict, base: dict | None) -> str:
    h = r.get("hlo", {})
    if "error" in r:
        return f"{r['tpu']:<7}{r['arm']:<12}error: {r['error'][:150]}"
    w = h.get("weight_reads_per_step", {})
    wb, bb = w.get("weight_bytes"), (base or {}).get("weight_bytes")
    ratio = f"{wb / bb:.3f}" if wb and bb else "-"
    f8 = sum(v for k, v in w.get("weight_bytes_by_dtype", {}).items() if k.startswith("f8"))
    other = sum(h.get("other_ops_per_step", {}).values())
    return (f"{r['tpu']:<7}{r['arm']:<12}{h.get('kernels_per_step', '-'):>8}"
            f"{h.get('fusions_per_step', '-'):>9}{h.get('custom_calls_per_step', '-'):>7}"
            f"{other:>7}{h.get('gemms_per_step', '-'):>7}"
            f"{(wb or 0) / 1e6:>11.1f}{f8 / 1e6:>8.1f}{ratio:>7}  "
            f"{h.get('dequant', {}).get('verdict', '-'):<28}{r.get('compile_s', '-'):>8}")


def print_table(rows: list[dict]) -> None:
    """The table of one model: a line per generation and arm."""
    print(f"\n{rows[0]['model']}, {rows[0]['rows']} rows, {rows[0]['prompt_len']} + "
          f"{rows[0]['new']} tokens; per decode step:")
    print(f"{'tpu':<7}{'arm':<12}{'kernels':>8}{'fusions':>9}{'ccalls':>7}{'other':>7}"
          f"{'GEMMs':>7}{'weight MB':>11}{'f8 MB':>8}{'/bf16':>7}  "
          f"{'dequantized copy verdict':<28}{'compile s':>8}")
    for r in rows:
        base = next((b for b in rows if b["tpu"] == r["tpu"] and b["arm"] == "bf16"
                     and "hlo" in b), None)
        print(_row(r, base and base["hlo"].get("weight_reads_per_step")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Qwen3-0.6B")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--arms", default="bf16,bf16_fused,fp8,fp8_fused,fp8_kv")
    p.add_argument("--tpu", default="v5e,v6e,tpu7x", help="generations: " + ",".join(TPUS))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "deviceless_kernels_tpu"))
    p.add_argument("--from-hlo", action="store_true", help="analyse saved .hlo, no compile")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    arms = [x for x in a.arms.split(",") if x]
    tpus = [x for x in a.tpu.split(",") if x]
    if not a.from_hlo and libtpu_missing():
        return 2
    rows_out = []
    for tpu in tpus:
        mesh, kind, err = None, "", None
        if not a.from_hlo:
            try:
                mesh, kind = _mesh(tpu)
            except Exception as e:  # libtpu's errors have no common type
                err = f"topology {TPUS[tpu][0]!r} refused: " + " ".join(str(e).split())[:300]
        for arm in arms:
            stem = os.path.join(a.out, f"{a.model}_{tpu}_{arm}_{a.rows}_{a.new}")
            out = {"model": a.model, "tpu": tpu, "arm": arm, "rows": a.rows,
                   "prompt_len": a.prompt_len, "new": a.new}
            if err:
                rows_out.append({**out, "error": err})
                print(json.dumps(rows_out[-1]), flush=True)
                continue
            if a.from_hlo:
                with open(stem + ".hlo") as f:
                    text = f.read()
                if os.path.exists(stem + ".json"):  # keep the compile's metadata
                    with open(stem + ".json") as f:
                        old = json.load(f)
                    out.update({k: old[k] for k in ("device_kind", "lower_s", "compile_s",
                                                    "memory", "libtpu") if k in old})
            else:
                from importlib.metadata import version

                from ais_jax.run import plan_target as pt

                target = pt.Target(tpu, "tpu", TPUS[tpu][0], 1, 0)
                try:
                    with pt.backend_as(target):
                        text, meta = dk.compile_arm(a.model, arm, a.rows, a.prompt_len, a.new,
                                                    mesh)
                except Exception as e:  # record the compiler's refusal, go on
                    rows_out.append({**out, "error": " ".join(str(e).split())[:300]})
                    print(json.dumps(rows_out[-1]), flush=True)
                    continue
                out.update(device_kind=kind, libtpu=version("libtpu"), **meta)
                with open(stem + ".hlo", "w") as f:
                    f.write(text)
            out["hlo"] = analyse(text)
            with open(stem + ".json", "w") as f:
                json.dump(out, f, indent=1)
            brief = {k: v for k, v in out.items() if k != "hlo"}
            h = out["hlo"]
            print(json.dumps({**brief, "kernels_per_step": h.get("kernels_per_step"),
                              "weight_reads_per_step": h["weight_reads_per_step"],
                              "custom_calls": h["custom_call_targets_per_step"],
                              "dot_dtypes": h["dot_operand_dtypes_per_step"],
                              "other_ops_per_step": h.get("other_ops_per_step"),
                              "dequant": {k: h["dequant"][k] for k in
                                          ("verdict", "weight_copies", "f8_dot_kernels",
                                           "other_f8_converts_n")}}), flush=True)
            rows_out.append(out)
    if rows_out:
        print_table(rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
