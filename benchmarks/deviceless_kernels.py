"""Kernels and GEMMs per decode step of the rollout program, compiled for an H200 without a GPU.

``/tmp/cudavenv/bin/python benchmarks/deviceless_kernels.py [--model Qwen3-0.6B] [--rows 64]
[--prompt-len 128] [--new 512] [--arms bf16,bf16_fused,fp8,fp8_fused,fp8_kv]
[--target h200.txtpb] [--out DIR] [--from-hlo]``

Needs the CUDA PJRT plugin (``jax-cuda12-plugin`` + ``jax-cuda12-pjrt``, installed with
``--no-deps`` into a venv beside the project's jax; docs/measurements/deviceless_gpu_compile.md)
but no GPU, driver or CUDA library: the program is compiled for a compile-only topology built
from XLA's H200 target spec (``--target``; default: `ais_jax.run.plan_target.gpu_spec`,
XLA's ``h200.txtpb`` without the ``collective_memory_granularity`` field 0.10.2 does not know).
Without the plugin the script prints one line and exits 2.

Per arm (`gpu_rollout.ARMS`; a ``_fused`` suffix adds ``rollout.fused_linears=true``) it builds the
rollout program of ``steps.build_step_fns`` for the model's YAML config with ``rows / 8``
prompts x 8 samples on abstract (``jax.eval_shape``) random-init bf16 params, lowers and
compiles it, and reports from the optimized HLO (`_hlo_stats.decode_loop_stats`) the kernels per
decode step (fusions + custom calls of the largest decode loop body), the FP8 GEMMs per step,
and (`gemm_stats` here) the GEMM kernels per step: fusions holding a ``dot`` and cuBLAS custom
calls, with the output shapes of their dots (a split-K GEMM's dot has the split as a leading
batch dimension, e.g. ``f32[8,64,1024]``).
`jax.default_backend()` stays ``"cpu"`` without a driver, so it is patched to ``"gpu"`` before
the program is built: the sampler then picks the layout an H200 run compiles (unrolled layers,
no weight transposes).  No autotuning happens (GEMMs get default Triton tiles, split-K for
small decode matmuls), so counts are close to, not equal to, a device's; there are no times.

Writes ``DIR/<model>_<arm>_<rows>_<new>.{json,hlo}`` per arm and prints a table;
``--from-hlo`` re-reads saved ``.hlo`` files instead of compiling.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter

os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # the check needs CUDA libraries
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _hlo_stats as hs  # pure text parsing, no jax

from ais_jax.run.plan_target import gpu_spec  # the H100 / H200 target spec texts

G = 8
# XLA's xla/backends/gpu/target_config/specs/h200.txtpb (openxla/xla 4336d12e) with the line
# "collective_memory_granularity: 2097152" removed (jax 0.10.2's proto has no such field)
H200_SPEC = gpu_spec("h200")
_GEMM_TARGET = re.compile(r"gemm|matmul|cublas", re.I)


def _dots(mod: hs.HloModule, comp: str, seen: tuple[str, ...] = ()) -> list[hs.Instr]:
    """The ``dot`` (and ``convolution``: TPU HLO's form of a dot) instructions of a fused
    computation and of the computations it calls."""
    if comp in seen:
        return []
    out = []
    for ins in mod.computations.get(comp, []):
        if ins.opcode in ("dot", "convolution"):
            out.append(ins)
        for names in ins.called().values():
            for name in names:
                out.extend(_dots(mod, name, (*seen, comp)))
    return out


def _gemm_counts(mod: hs.HloModule, comp: str, seen: tuple[str, ...] = ()) -> Counter:
    """GEMM kernels one run of ``comp`` launches (walked like `_hlo_stats.kernel_counts`)."""
    c: Counter = Counter()
    if comp in seen:
        return c
    seen = (*seen, comp)
    for ins in mod.computations.get(comp, []):
        calls = ins.called()
        if ins.opcode == "fusion":
            dots = _dots(mod, (calls.get("calls") or ("",))[0])
            if dots:
                c["gemm"] += 1
                c["shape " + " ".join(d.type.split("{")[0] for d in dots)] += 1
        elif ins.opcode == "custom-call":
            m = hs._TARGET.search(ins.attrs)
            if m and _GEMM_TARGET.search(m.group(1)):
                c["gemm"] += 1
                c["shape " + ins.type.split("{")[0]] += 1
        elif ins.opcode == "while":
            n = ins.trip_count or 1
            for k, v in (_gemm_counts(mod, calls["body"][0], seen) if "body" in calls
                         else Counter()).items():
                c[k] += v * n
        elif ins.opcode in ("call", "async-start"):
            for name in calls.get("to_apply", ()) + calls.get("calls", ()):
                c.update(_gemm_counts(mod, name, seen))
        elif ins.opcode == "conditional":
            branches = [_gemm_counts(mod, b, seen) for key in
                        ("branch_computations", "true_computation", "false_computation")
                        for b in calls.get(key, ())]
            if branches:
                c.update(max(branches, key=lambda b: b["gemm"]))
    return c


def gemm_stats(text: str) -> dict:
    """GEMM kernels per decode step (the loop `decode_loop_stats` reports) of compiled HLO."""
    mod = hs.parse_hlo(text)
    decode = [w for w in hs.top_level_whiles(mod) if w.trip_count is None]
    if not decode:
        return {}
    w = max(decode, key=lambda w: sum(hs.kernel_counts(mod, w.called()["body"][0])[k]
                                      for k in ("fusion", "custom-call")))
    c = _gemm_counts(mod, w.called()["body"][0])
    return {"gemms_per_step": c["gemm"],
            "gemm_dot_shapes_per_step": {k[6:]: v for k, v in sorted(c.items())
                                         if k.startswith("shape ")}}


def analyse(text: str) -> dict:
    s = hs.decode_loop_stats(text)
    s.pop("while_loops", None)
    return {**s, **gemm_stats(text)}


def compile_arm(name: str, arm: str, rows: int, prompt_len: int, new: int, mesh) -> tuple:
    import _bench_common as bc
    import gpu_rollout as gr
    import jax
    import jax.numpy as jnp

    from ais_jax.models.model import init_params
    from ais_jax.training import optim, steps

    base, fused = (arm[:-6], True) if arm.endswith("_fused") else (arm, False)
    mc = bc.model_config(name)
    cfg = bc.config(name, [f"rollout.prompts_per_step={rows // G}", f"rollout.group_size={G}",
                           f"rollout.max_new_tokens={new}", "train.minibatches=1",
                           *gr.ARMS[base], f"rollout.fused_linears={str(fused).lower()}"])
    opt = optim.make_optimizer(1e-6)
    params = jax.eval_shape(lambda: init_params(jax.random.key(0), mc, jnp.bfloat16))
    state = jax.eval_shape(lambda p: optim.init_train_state(p, opt), params)
    fns = steps.build_step_fns(state, mesh, opt, None, mc, cfg, steps.TokenIds((), None))
    args = (params, jax.ShapeDtypeStruct((rows // G, prompt_len), jnp.int32),
            jax.ShapeDtypeStruct((rows // G, prompt_len), jnp.bool_),
            jax.eval_shape(lambda: jax.random.key(1)))
    t = time.time()
    lowered = fns.rollout.trace(*args).lower()
    t_lower = time.time() - t
    t = time.time()
    compiled = lowered.compile()
    t_compile = time.time() - t
    return compiled.as_text(), {"lower_s": round(t_lower, 1), "compile_s": round(t_compile, 1),
                                "memory": bc.compiled_memory(compiled)}



def cuda_plugin_missing(script: str) -> bool:
    """Whether the CUDA PJRT plugin is absent (then one line naming ``script`` is printed)."""
    try:
        plugin = importlib.util.find_spec("jax_plugins.xla_cuda12")
    except ModuleNotFoundError:  # no jax_plugins package at all
        plugin = None
    if plugin is None:
        print(f"{script}: the CUDA PJRT plugin (jax-cuda12-plugin, jax-cuda12-pjrt) is not "
              "installed; see docs/measurements/deviceless_gpu_compile.md")
    return plugin is None

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Qwen3-0.6B")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new", type=int, default=512)
    p.add_argument("--arms", default="bf16,bf16_fused,fp8,fp8_fused,fp8_kv")
    p.add_argument("--target", default=None, help="GpuTargetConfigProto text (default: H200)")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "deviceless_kernels"))
    p.add_argument("--from-hlo", action="store_true", help="analyse saved .hlo, no compile")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    arms = [x for x in a.arms.split(",") if x]
    mesh = None
    if not a.from_hlo:
        if cuda_plugin_missing("deviceless_kernels"):
            return 2
        import jax
        from jax.experimental import topologies

        from ais_jax.training import sharding as shd

        spec = H200_SPEC
        if a.target:
            with open(a.target) as f:
                spec = f.read()
        topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                            target_config=spec)
        mesh = shd.make_mesh(devices=topo.devices)
        jax.default_backend = lambda: "gpu"  # the sampler's GPU layout (see the docstring)
    rows_out = []
    for arm in arms:
        stem = os.path.join(a.out, f"{a.model}_{arm}_{a.rows}_{a.new}")
        if a.from_hlo:
            with open(stem + ".hlo") as f:
                text, meta = f.read(), {}
            if os.path.exists(stem + ".json"):  # keep the compile's times and memory
                with open(stem + ".json") as f:
                    old = json.load(f)
                meta = {k: old[k] for k in ("lower_s", "compile_s", "memory") if k in old}
        else:
            text, meta = compile_arm(a.model, arm, a.rows, a.prompt_len, a.new, mesh)
            with open(stem + ".hlo", "w") as f:
                f.write(text)
        out = {"model": a.model, "arm": arm, "rows": a.rows, "prompt_len": a.prompt_len,
               "new": a.new, **meta, "hlo": analyse(text)}
        with open(stem + ".json", "w") as f:
            json.dump(out, f, indent=1)
        print(json.dumps(out), flush=True)
        rows_out.append(out)
    base = next((r["hlo"].get("kernels_per_step") for r in rows_out if r["arm"] == "bf16"), None)
    print(f"\n{'arm':<16}{'kernels/step':>14}{'x bf16':>8}{'GEMMs/step':>12}"
          f"{'FP8 GEMMs':>11}{'lower s':>9}{'compile s':>11}")
    for r in rows_out:
        h = r["hlo"]
        k = h.get("kernels_per_step")
        ratio = f"{k / base:.3f}" if k and base else "-"  # the issue-43 targets: <= 1.1 / 1.2
        print(f"{r['arm']:<16}{k if k is not None else '-':>14}{ratio:>8}"
              f"{h.get('gemms_per_step', '-'):>12}"
              f"{h.get('fp8_gemms_per_step', '-'):>11}{r.get('lower_s', '-'):>9}"
              f"{r.get('compile_s', '-'):>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
