"""The TPU compiler's price of one token draw: the generic inverse CDF against the lane-block form.

`ais_jax.method.distributions.sample_logits_u` draws one token per row.  Its generic form
materializes ``exp(z - max z)`` in float32, pads the vocabulary to a multiple of its block
size (512 for 151,936 entries) and reduces the blocks in a kernel of their own; on TPU
(`ais_jax.method.distributions.lane_blocks`) it sums 128-entry blocks straight from the
logits.  This compiles both (deviceless, libtpu) for a ``[rows, vocab]`` bfloat16 logits input
at temperature 1, untruncated, and prints the program's summed per-instruction
``estimated_cycles`` (`_hlo_cost.program_cost`) and its most expensive instructions.

Usage: ``ALLOW_MULTIPLE_LIBTPU_LOAD=1 <libtpu venv>/bin/python benchmarks/deviceless_draw.py
[--tpu v6e,v5e,tpu7x] [--rows 64] [--vocab 151936]`` (docs/measurements/deviceless_cost.md,
"The token draw on lane blocks").
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def price(tpu: str, rows: int, vocab: int, lanes: bool) -> dict:
    """The compiled draw's `_hlo_cost.program_cost` on one chip of generation ``tpu``."""
    import _hlo_cost as hc
    import deviceless_kernels_tpu as dkt
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from ais_jax.method import distributions as dist
    from ais_jax.run import plan_target as pt

    mesh, _ = dkt._mesh(tpu)  # one chip of the generation, as deviceless_cost.py builds it
    sh = SingleDeviceSharding(mesh.devices.flat[0])
    target = pt.Target(tpu, "tpu", dkt.TPUS[tpu][0], 1, 0)
    chosen = dist.lane_blocks
    dist.lane_blocks = lambda V, backend=None: lanes and chosen(V, backend)
    try:
        with pt.backend_as(target):
            args = (
                jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=sh),
                jax.ShapeDtypeStruct((rows, vocab), jnp.bfloat16, sharding=sh),
            )
            fn = jax.jit(lambda u, z: dist.sample_logits_u(u, z, 1.0, 0, 1.0))
            text = fn.lower(*args).compile().as_text()
    finally:
        dist.lane_blocks = chosen
    return hc.program_cost(text, tpu, top=5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tpu", default="v6e,v5e,tpu7x")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    a = ap.parse_args(argv)
    import deviceless_kernels_tpu as dkt

    if dkt.libtpu_missing():
        return 2
    for tpu in a.tpu.split(","):
        costs = {
            form: price(tpu, a.rows, a.vocab, form == "lanes") for form in ("generic", "lanes")
        }
        g, lanes = (costs[f]["estimated_cycles"] for f in ("generic", "lanes"))
        print(f"{tpu}: generic {g:,.0f} cycles, lanes {lanes:,.0f} ({lanes / g:.3f}x)")
        for form, r in costs.items():
            for t in r["top"]:
                print(
                    f"  {form:<8}{t['cycles'] * t['runs']:>10,.0f}  {t['opcode']:<8}"
                    f"{t['type'][:60]}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
