"""Qwen3-0.6B-shaped attention (B 8, 16 query / 8 key-value heads, T 767, H 128, causal with
a padding mask, bf16) compiled for one v6e chip, deviceless: trip-weighted ``estimated_cycles``
of the forward and of forward + backward (under ``jax.checkpoint``), reference vs chunked.

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=$PWD /work/wt/_tpuvenv/bin/python \\
        benchmarks/deviceless_attention_gqa.py
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deviceless_attention_micro import trip_weighted_cycles

from ais_jax.models import attention as att
from ais_jax.run import plan_target as pt

B, T, Q, K, H = 8, 767, 16, 8, 128


def main() -> None:
    target = pt.parse_target("v6e-1")
    pt.prepare_env(target)
    sh = SingleDeviceSharding(pt.target_devices(target)[0])
    sq = jax.ShapeDtypeStruct((B, T, Q, H), jnp.bfloat16, sharding=sh)
    sk = jax.ShapeDtypeStruct((B, T, K, H), jnp.bfloat16, sharding=sh)
    valid = jax.ShapeDtypeStruct((B, T), jnp.bool_, sharding=sh)
    with pt.backend_as(target):
        for impl, chunk in (("reference", 0), ("chunked", 256), ("chunked", 512),
                            ("chunked", 768)):
            def loss(q, k, v, valid, impl=impl, chunk=chunk):
                o = att.attend(q, k, v, att.causal_mask(valid), impl, chunk or 256)
                return jnp.sum(o.astype(jnp.float32) ** 2)

            grad = jax.grad(jax.checkpoint(loss), argnums=(0, 1, 2))
            for name, f in (("fwd", loss), ("fwd+bwd", grad)):
                hlo = jax.jit(f).lower(sq, sk, sk, valid).compile().as_text()
                trip = -(-T // chunk) if chunk else 1
                print(f"{impl:9s} {chunk:4d} {name:8s} {trip_weighted_cycles(hlo, trip):>10d}",
                      flush=True)


if __name__ == "__main__":
    main()
