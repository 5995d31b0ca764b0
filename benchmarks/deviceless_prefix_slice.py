"""Does the TPU compiler fuse a static prefix slice of a KV-cache buffer into the decode attention?

`ais_jax.models.decode.whole_cache_default`: on TPU the sampler allocates the decode's cache
once at its final length and each decode segment attends to a static prefix of it
(`ais_jax.models.kv_cache.prefix`).  This compiles (deviceless, libtpu) a decode loop whose
attention reads ``W`` slots, Qwen3-0.6B's shapes at 256 rows, two ways: ``slice`` (a
767-slot buffer, its first ``W`` slots sliced) and ``exact`` (a ``W``-slot buffer), and
prints the loop body's fusions with the compiler's ``estimated_cycles``: a slice that is
copied shows up as a fusion of its own the size of the prefix.

Usage: ``ALLOW_MULTIPLE_LIBTPU_LOAD=1 <libtpu venv>/bin/python
benchmarks/deviceless_prefix_slice.py {slice,exact} [--target v6e-1]``.
"""

from __future__ import annotations

import argparse
import re
import sys

B, K, G, H, FULL, W = 256, 8, 2, 128, 767, 575  # rows, kv heads, group, head dim, slots


def decode_loop(mode: str):
    """A while loop of decode steps (slots 320 .. W-1): write one key / value, attend to ``W``."""
    import jax
    import jax.numpy as jnp

    def body(c):
        i, o, ck, cv, q, new = c
        ck = jax.lax.dynamic_update_slice(ck, new, (0, 0, i, 0))  # keys [B, K, S, H]
        cv = jax.lax.dynamic_update_slice(cv, new.transpose(0, 1, 3, 2), (0, 0, 0, i))
        k, v = (ck[:, :, :W], cv[..., :W]) if mode == "slice" else (ck, cv)
        s = jnp.einsum("bkgh,bksh->bkgs", q, k, preferred_element_type=jnp.float32)
        p = jax.nn.softmax(s, -1).astype(jnp.bfloat16)
        o = o + jnp.einsum("bkgs,bkhs->bkgh", p, v, preferred_element_type=jnp.float32)
        return i + 1, o, ck, cv, q, new

    def loop(q, ck, cv, new):
        init = (jnp.int32(320), jnp.zeros((B, K, G, H)), ck, cv, q, new)
        return jax.lax.while_loop(lambda c: c[0] < W, body, init)[1]

    return loop


def body_fusions(hlo: str) -> list[tuple[int, str]]:
    """``(estimated_cycles, instruction)`` of the while body's instructions over 5000 cycles."""
    out, comp = [], ""
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and "{" in line:
            comp = line.split(" ")[0]
        m = re.search(r'"estimated_cycles":"(\d+)"', line)
        if m and "region" in comp and int(m.group(1)) > 5000:
            out.append((int(m.group(1)), line.strip()[:120]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("slice", "exact"))
    ap.add_argument("--target", default="v6e-1")
    a = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from ais_jax.run import plan_target as pt

    target = pt.parse_target(a.target)
    pt.prepare_env(target)
    sh = SingleDeviceSharding(pt.target_devices(target)[0])
    S = FULL if a.mode == "slice" else W

    def sds(shape):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=sh)

    with pt.backend_as(target):
        args = (sds((B, K, G, H)), sds((B, K, S, H)), sds((B, K, H, S)), sds((B, K, 1, H)))
        hlo = jax.jit(decode_loop(a.mode)).lower(*args).compile().as_text()
    fusions = body_fusions(hlo)
    print(f"{a.mode}: {W} of {S} slots, loop body {sum(c for c, _ in fusions):,} cycles")
    for cycles, line in fusions:
        print(f"  {cycles:>9,} {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
