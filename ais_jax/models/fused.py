"""The rollout copy's fused layout: q/k/v and gate/up as one weight each.

A decode step of a small or medium model on an accelerator is bound by
per-kernel overhead, not by weight bytes (docs/performance.md): each FP8
linear costs an activation amax, a cast and a GEMM.  The linears that read the
same input (``wq wk wv`` read the attention norm's output, ``w_gate w_up`` the
MLP norm's) are concatenated on their output axis once per weight sync, so the
program holds 4 GEMMs per layer instead of 7 and quantizes each input once
(`ais_jax.models.layout.ROLLOUT_FUSED` declares the fused names).  The model's
layer function (`ais_jax.models.model`) splits the fused output back.  Measured
on an H200 compile (docs/measurements/deviceless_gpu_compile.md), XLA already
does the same to the unfused program: the kernels per decode step are
identical, so the layout is off by default (``rollout.fused_linears``) until a
run on the device shows a difference.

Exactness: an FP8 weight keeps its own per-tensor scale as a per-row scale of
the fused weight (``[L, out, 1]``), and the activation is quantized once with
the same per-tensor (or per-token) scale the three linears computed
separately, so every output element is the same dot product rescaled by the
same two scales; only the GEMM's summation order may differ (float rounding).
Block-scaled FP4 weights (`ais_jax.models.fp4.BlockQuantArray`) carry one
tensor scale per matrix in a form the FP4 matmul applies per matrix; they stay
unfused.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ais_jax.models.layout import ROLLOUT_FUSED
from ais_jax.models.qarray import FP4_FORMATS, QuantArray

__all__ = ["fuse_linears", "split_sizes"]


def _is_fp4(w: Any) -> bool:
    return getattr(w, "fmt", None) in FP4_FORMATS


def _concat_quant(parts: list[QuantArray]) -> QuantArray:
    """Concatenate FP8 weights ``[L, out_i, in]`` on ``out``; scales become per-row."""
    modes = {p.act_scaling for p in parts}
    dtypes = {jnp.dtype(p.value.dtype) for p in parts}
    if len(modes) != 1 or len(dtypes) != 1:
        raise ValueError(f"cannot fuse FP8 weights of different formats {sorted(map(str, dtypes))}"
                         f" / activation scalings {sorted(modes)}")
    value = jnp.concatenate([p.value for p in parts], axis=-2)  # [L, sum(out_i), in]
    scale = jnp.concatenate(  # [L, sum(out_i), 1]: each part's scale on its rows
        [jnp.broadcast_to(p.scale, (*p.value.shape[:-1], 1)) for p in parts], axis=-2)
    return QuantArray(value=value, scale=scale, act_scaling=modes.pop())


def fuse_linears(params: dict) -> dict:
    """The rollout copy in the fused layout (run at each weight sync, inside the jit).

    Args:
      params: rollout params (plain arrays or FP8 `QuantArray` leaves) with
        per-layer linears stacked ``[L, out, in]`` and biases ``[L, out]``.

    Returns:
      A new params dict whose ``layers`` hold ``wqkv`` ``[L, QH + 2 KH, D]`` and
      ``w_gate_up`` ``[L, 2 F, D]`` (plus ``bqkv`` / ``b_gate_up`` when the
      model has those biases) in place of their parts.  FP4 weights and groups
      with a missing part are left as they are.  The input is not modified.

    Raises:
      ValueError: the parts mix plain and quantized weights, or FP8 formats.
    """
    layers = dict(params["layers"])
    for fused, names in ROLLOUT_FUSED.items():
        if not all(n in layers for n in names):
            continue
        parts = [layers[n] for n in names]
        if any(_is_fp4(p) for p in parts):
            continue
        quant = [isinstance(p, QuantArray) for p in parts]
        if all(quant):
            layers[fused] = _concat_quant(parts)
        elif not any(quant):
            layers[fused] = jnp.concatenate(parts, axis=parts[0].ndim - (2 if fused[0] == "w"
                                                                          else 1))
        else:
            raise ValueError(f"cannot fuse {names}: some are quantized and some are not")
        for n in names:
            del layers[n]
    return {**params, "layers": layers}


def split_sizes(name: str, q_out: int, kv_out: int, ffn: int) -> list[int]:
    """Split points of a fused output: ``wqkv`` -> ``[QH, QH + KH]``, ``w_gate_up`` -> ``[F]``."""
    if name == "wqkv":
        return [q_out, q_out + kv_out]
    if name == "w_gate_up":
        return [ffn]
    raise ValueError(f"unknown fused linear {name!r}; known: wqkv, w_gate_up")
