"""One causal attention (bf16, B=8, 16 heads, T=1024, H=128) compiled for one v6e chip,
deviceless: how the TPU compiler prices the reference, the chunked attention at several
chunk sizes and the Pallas flash-attention kernel (issue 54, item 1).

For each program: the sum of the per-instruction ``estimated_cycles`` of the optimized HLO
(the compiler's own price; a while body counted ``T / chunk`` times, its trip count) and
``cost_analysis()``'s flops / optimal_seconds (which count a loop body once).  The Pallas
kernel is one ``tpu_custom_call`` without ``estimated_cycles``: the cycle sum prices it at 0.

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=$PWD /work/wt/_tpuvenv/bin/python \\
        benchmarks/deviceless_attention_micro.py
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

from ais_jax.models import attention as att
from ais_jax.run import plan_target as pt

B, N, T, H = 8, 16, 1024, 128


def trip_weighted_cycles(hlo: str, trip: int) -> int:
    """Entry computation's ``estimated_cycles`` plus ``trip`` times each while body's."""
    comps: dict[str, dict] = {}
    cur = None
    for line in hlo.splitlines():
        m = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if m:
            cur = "__entry__" if m.group(1) else m.group(2)
            comps[cur] = {"cyc": 0, "bodies": []}
            continue
        if cur is None:
            continue
        c = re.search(r'"estimated_cycles":"?(\d+)', line)
        if c:
            comps[cur]["cyc"] += int(c.group(1))
        w = re.search(r"while\(.*body=%?([\w.\-]+)", line)
        if w:
            comps[cur]["bodies"].append(w.group(1))

    def total(name: str) -> int:
        c = comps.get(name, {"cyc": 0, "bodies": []})
        return c["cyc"] + sum(trip * total(b) for b in c["bodies"])

    return total("__entry__")


def main() -> None:
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    target = pt.parse_target("v6e-1")
    pt.prepare_env(target)
    sds = jax.ShapeDtypeStruct((B, N, T, H), jnp.bfloat16,
                               sharding=SingleDeviceSharding(pt.target_devices(target)[0]))
    mask = att.causal_mask(jnp.ones((B, T), bool))

    def ours(impl: str, chunk: int = 256):
        def f(q, k, v):  # [B, N, T, H] -> attend's [B, T, N, H]
            q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))
            return att.attend(q, k, v, mask, impl, chunk)
        return f

    programs = [("pallas flash_attention", lambda q, k, v: fa.flash_attention(
        q, k, v, causal=True, sm_scale=H ** -0.5), 1), ("reference", ours("reference"), 1)]
    programs += [(f"chunked {c}", ours("chunked", c), T // c) for c in (1024, 512, 256, 128)]
    with pt.backend_as(target):
        for name, f, trip in programs:
            compiled = jax.jit(f).lower(sds, sds, sds).compile()
            hlo = compiled.as_text()
            ca = compiled.cost_analysis()
            ca = ca[0] if isinstance(ca, list) else ca
            calls = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))
            print(f"{name:24s} cycles {trip_weighted_cycles(hlo, trip):>9d}  flops(body once) "
                  f"{ca.get('flops', 0):.3e}  optimal_s {ca.get('optimal_seconds', 0):.3e}  "
                  f"custom calls {calls}")


if __name__ == "__main__":
    main()
