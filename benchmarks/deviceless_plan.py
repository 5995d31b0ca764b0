"""``python -m ais_jax.plan`` for an H200 target without a GPU: memory of the compiled programs.

``/tmp/cudavenv/bin/python benchmarks/deviceless_plan.py --config PATH [k=v ...]
[--prompt-len 256] [--device-memory 141GB] [--target h200.txtpb] [--triton-gemm] [--json]``

Runs `ais_jax.run.plan.make_plan` (the abstract state, LoRA adapters if ``lora.rank > 0``, the
update and rollout programs of ``steps.build_step_fns``) with two substitutions: the mesh is
built over the devices of a compile-only CUDA topology (XLA's H200 target spec, the copy in
``deviceless_kernels.H200_SPEC`` unless ``--target``), and ``jax.default_backend`` answers
``"gpu"`` so the sampler picks the layout an H200 run compiles.  The numbers are therefore XLA's
GPU compiler's ``memory_analysis()``, without the CPU backend's float32 widening of bf16 / FP8
dot operands; they are not a measurement on a device, and no autotuning happens.  The
target's ``device_memory_size`` matters: XLA's GPU compiler rematerializes to fit about 79% of
it (an update over that limit is changed, not just reported), so for an 80 GB device pass a
``--target`` whose ``device_memory_size`` is 80 GB.

``--xla_gpu_enable_triton_gemm=false`` is appended to ``XLA_FLAGS`` (cuBLAS GEMMs) unless
``--triton-gemm``: without autotuning the Triton emitter finds no tile sizes for some of the
8B update's GEMMs (docs/measurements/deviceless_gpu_compile.md, "Limits").

Needs the CUDA PJRT plugin (``jax-cuda12-plugin`` + ``jax-cuda12-pjrt``, installed with
``--no-deps`` into a venv beside the project's jax) but no GPU, driver or CUDA library; without
the plugin the script prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # the check needs CUDA libraries
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="YAML config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. mesh.fsdp=1")
    p.add_argument("--prompt-len", type=int, default=256, help="prompt bucket P (default 256)")
    p.add_argument("--device-memory", default="141GB", help="memory of one device (default 141GB)")
    p.add_argument("--target", default=None, help="GpuTargetConfigProto text (default: H200)")
    p.add_argument("--triton-gemm", action="store_true",
                   help="keep XLA's Triton GEMMs (default: --xla_gpu_enable_triton_gemm=false)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_intermixed_args(argv)
    from deviceless_kernels import cuda_plugin_missing

    if cuda_plugin_missing("deviceless_plan"):
        return 2
    if not a.triton_gemm and "xla_gpu_enable_triton_gemm" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_gpu_enable_triton_gemm=false").strip()

    import jax
    from deviceless_kernels import H200_SPEC
    from jax.experimental import topologies

    from ais_jax.core.errors import UsageError
    from ais_jax.run import plan
    from ais_jax.run.plan_report import format_plan, parse_bytes
    from ais_jax.training import build
    from ais_jax.training import sharding as shd

    try:
        cfg = plan.load_plan_config(a.config, a.overrides)
        m = cfg.mesh
        n = m.data * m.fsdp * m.tensor
        spec = H200_SPEC
        if a.target:
            with open(a.target) as f:
                spec = f.read()
        topo = topologies.get_topology_desc(platform="cuda", topology=f"1x1x{n}",
                                            target_config=spec)
        build.build_mesh = lambda c: shd.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor,
                                                   devices=topo.devices)
        jax.default_backend = lambda: "gpu"  # the sampler's GPU layout
        result = plan.make_plan(cfg, n, parse_bytes(a.device_memory), a.prompt_len)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result["target"] = topo.devices[0].device_kind
    result["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    print(json.dumps(result) if a.json else format_plan(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
