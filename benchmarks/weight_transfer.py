"""The weight sync of split rollout devices on its own: bytes and time of the rollout copy.

With ``mesh.rollout_devices = R`` (`ais_jax.training.split_rollout`) every rollout starts by
quantizing the trainer's params into the rollout copy on the trainer's devices and sending
that copy to the R rollout devices (issue 40 item 2: FP8 on the wire, half the bytes of
BF16).  This script builds the run of a config (default: the embedded default,
``configs/tiny_arithmetic.yaml``, with ``--set`` overrides), then, for each rollout
precision (``bf16``, ``fp8``), makes the copy with the run's own quantization
(`ais_jax.training.steps.rollout_params`, laid out as the split sampler lays it out) and
times ``jax.device_put`` of it onto the rollout mesh, blocked until it has arrived
(median of ``--reps`` transfers after one untimed warm-up).  It prints, per precision, the
copy's leaves, bytes and the transfer's median seconds and GB/s, and the FP8 / BF16 ratios.

    JAX_NUM_CPU_DEVICES=2 python benchmarks/weight_transfer.py [--reps 20] [--set KEY=V ...]
    # a wider scratch model, so that bytes rather than per-leaf overhead dominate:
    JAX_NUM_CPU_DEVICES=2 python benchmarks/weight_transfer.py --set model.hidden_size=1024 \
        model.intermediate_size=4096 model.num_layers=8 model.head_dim=256

On a CPU a "transfer" is a copy between host buffers, so only the byte ratio carries over;
on a GPU or TPU host with 2+ chips the same command (without ``JAX_NUM_CPU_DEVICES``)
measures the interconnect.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any


def copy_bytes(tree: Any) -> tuple[int, int]:
    """``(leaves, bytes)`` of a pytree of arrays (FP8 leaves count 1 byte per element)."""
    import jax

    leaves = jax.tree.leaves(tree)
    return len(leaves), sum(int(x.size) * x.dtype.itemsize for x in leaves)


def measure(precision: str, overrides: list[str], reps: int) -> dict[str, float]:
    """Bytes and median transfer seconds of one precision's rollout copy (see module doc)."""
    import jax

    from ais_jax.config.load import load_config
    from ais_jax.config.schema import DEFAULT_CONFIG_PATH
    from ais_jax.training import sharding as shd
    from ais_jax.training.build import build_run
    from ais_jax.training.split_rollout import rollout_mesh
    from ais_jax.training.steps import rollout_params

    out = tempfile.mkdtemp(prefix="weight_transfer_")
    cfg = load_config(DEFAULT_CONFIG_PATH, [f"out_dir={out}", "checkpoint.every=0",
                                            "mesh.rollout_devices=1", *overrides,
                                            f"rollout.precision={precision}"])
    run = build_run(cfg)
    params = run.state.params
    trainer_devices = len(jax.tree.leaves(params)[0].sharding.device_set)
    rmesh = rollout_mesh(cfg, trainer_devices)
    copy = jax.jit(lambda p: rollout_params(p, cfg.rollout))(params)
    jax.block_until_ready(copy)
    dst = shd.param_shardings(jax.eval_shape(lambda: copy), rmesh, rollout=True)
    jax.block_until_ready(jax.device_put(copy, dst))  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(jax.device_put(copy, dst))
        times.append(time.perf_counter() - t0)
    leaves, nbytes = copy_bytes(copy)
    med = statistics.median(times)
    return {"leaves": leaves, "bytes": nbytes, "seconds": med, "gb_per_s": nbytes / med / 1e9}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="timed transfers per precision")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides KEY=VALUE")
    a = ap.parse_args(argv)
    import jax

    if len(jax.devices()) < 2:
        raise SystemExit("needs 2+ devices: run with JAX_NUM_CPU_DEVICES=2 on a CPU")
    res = {p: measure(p, a.set, a.reps) for p in ("bf16", "fp8")}
    print(f"devices: {len(jax.devices())} x {jax.devices()[0].device_kind}; trainer "
          f"{len(jax.devices()) - 1}, rollout 1; overrides: {' '.join(a.set) or 'none'}")
    for p, r in res.items():
        print(f"{p:>5}: {r['leaves']} leaves, {r['bytes'] / 1e6:.3f} MB, transfer "
              f"{r['seconds'] * 1e3:.3f} ms (median of {a.reps}), {r['gb_per_s']:.2f} GB/s")
    b, f = res["bf16"], res["fp8"]
    print(f"fp8 / bf16: bytes {f['bytes'] / b['bytes']:.3f}x, "
          f"transfer time {f['seconds'] / b['seconds']:.3f}x")


if __name__ == "__main__":
    main()
