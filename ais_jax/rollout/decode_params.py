"""The params as the sampler's decode loop reads them (`ais_jax.rollout.sampler`).

Prepared once per `ais_jax.rollout.sampler.sample` call, outside the decode loop: the RMSNorm
weights in float32 (`norms_f32`); unrolled layers unstacked; on CPU the full-precision linear
weights stored transposed (``[in, out]``) behind an optimization barrier and viewed back as
``[out, in]`` inside the loop (`view_params`), which XLA folds into the matmuls.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.models import decode as decode_lib
from ais_jax.models import model as model_lib
from ais_jax.models.fp8 import BLOCK_LINEARS, QuantArray
from ais_jax.models.layout import ROLLOUT_FUSED

__all__ = ["FUSED_LINEARS", "norms_f32", "prepare_params", "view_params"]

FUSED_LINEARS = tuple(n for n in ROLLOUT_FUSED if n.startswith("w"))  # wqkv, w_gate_up


def _transposable(name: str, w: Any) -> bool:
    # FP8 weights are left alone: XLA CPU hoists their dequantization out of the
    # decode loop, and transposing them measured no faster.
    return (
        name in (*BLOCK_LINEARS, *FUSED_LINEARS, "lm_head")
        and not isinstance(w, QuantArray)
        and w.ndim == 2
    )


def _t(w: Any) -> Any:
    return w.T if _transposable("lm_head", w) else w


def prepare_params(
    params: dict, cfg: model_lib.ModelConfig, transpose: bool, scan_layers: bool
) -> dict:
    """Params as the decode loop reads them.

    Scanned layers read the stacked params as they are.  Unrolled layers are
    unstacked once, and with ``transpose`` (CPU) their linear weights are
    stored as ``[in, out]`` behind an optimization barrier, so that XLA keeps
    the copies; `view_params` turns them back into logical ``[out, in]`` views
    inside the loop, which XLA folds into the matmuls.  The RMSNorm weights are
    float32 in both (`norms_f32`).

    Args:
      params: the rollout params (layers stacked ``[L, ...]``).
      cfg: the model's config.
      transpose: store the full-precision linear weights transposed (unrolled layers only).
      scan_layers: whether the decode step scans the stacked layers.

    Returns:
      the params dict: stacked layers (``scan_layers``) or a tuple of per-layer dicts.
    """
    params = norms_f32(params)
    if scan_layers:
        return params
    p = decode_lib.unstack_layers(params, cfg)
    if not transpose:
        return p
    p = dict(p)
    p.setdefault("lm_head", p["embed"])  # tied: a transposed head beside the embedding
    return jax.lax.optimization_barrier(view_params(p, True))


def norms_f32(params: dict) -> dict:
    """``params`` with the RMSNorm weights (``*_norm``) in float32, converted once before the
    decode loop: `ais_jax.models.model.rms_norm` multiplies in float32 anyway (the same
    numbers), and the TPU compiler otherwise converts each of them in a small kernel of its own
    in every step (113 per Qwen3-0.6B step)."""

    def f32(d: dict) -> dict:
        return {k: w.astype(jnp.float32) if k.endswith("_norm") else w for k, w in d.items()}

    layers = params["layers"]
    layers = tuple(f32(lp) for lp in layers) if isinstance(layers, tuple | list) else f32(layers)
    return {**f32(params), "layers": layers}


def view_params(p: dict, transpose: bool) -> dict:
    """Swap the last two axes of the full-precision 2-D linear weights of ``p`` (unrolled
    layers, a tuple of per-layer dicts, and ``lm_head``); its own inverse.  ``transpose``
    False: ``p`` unchanged."""
    if not transpose:
        return p
    layers = tuple(
        {k: _t(w) if _transposable(k, w) else w for k, w in lp.items()} for lp in p["layers"]
    )
    return {**p, "layers": layers, "lm_head": _t(p["lm_head"])}
