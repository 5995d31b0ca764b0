"""FP8 cast-and-scale: `QuantArray`, quantize / dequantize, the FP8 matmul, rollout params.

The rollout copy of the policy stores its decoder-block linear weights as real
1-byte float8 values plus a float32 scale; activations are quantized
dynamically at the input of every such matmul (docs/spec.md section 2).  All FP8
arithmetic in `ais_jax` goes through this module.

The matmul converts the float8 operands to a wide type inside the dot and
rescales the float32 result by ``s_x * s_w``, so the weights are read as 1-byte
values and no dequantized copy is materialized; on CPU the same program is an
exact emulation of the FP8 rounding (never faster).  Whether XLA turns it into
a native FP8 GEMM on Hopper is checked by `benchmarks/gpu_sampler_check.py`.

``to_rollout_params(dtype="nvfp4" | "mxfp4")`` makes block-scaled FP4 weights
instead (`ais_jax.models.fp4.BlockQuantArray`, weight-only); `qdot`, `linear` and
`dequantize` dispatch to `ais_jax.models.fp4` for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.models import fp4, int8, layout, lora
from ais_jax.models.qarray import E4M3, E5M2, FP4_FORMATS, FP8_DTYPES, QuantArray, fp8_max

ROLLOUT_FORMATS = (*FP8_DTYPES, *FP4_FORMATS)  # to_rollout_params(dtype=...) as strings
ACT_SCALINGS = ("tensor", "token", "prefill")
# act_scaling="prefill": the decode steps quantize each linear input with a fixed scale,
# PREFILL_HEADROOM times the prefill's masked amax of that input over the format's max
# (`prefill_scale`); larger values saturate (clip), never NaN.
PREFILL_HEADROOM = 2.0

# Per-layer params the rollout copy always quantizes (the decoder-block linears,
# wq wk wv wo w_gate w_up w_down), and those quantized only on request (lm_head).
BLOCK_LINEARS: tuple[str, ...] = tuple(
    k for k, v in layout.LAYER_PARAMS.items() if v.fp8 == "always")
OPTIONAL_LINEARS: tuple[str, ...] = tuple(
    k for k, v in layout.TOP_PARAMS.items() if v.fp8 == "option")


def _resolve_dtype(dtype: Any) -> Any:
    if isinstance(dtype, str):
        if dtype not in FP8_DTYPES:
            raise ValueError(f"unknown fp8 format {dtype!r}; use one of {sorted(FP8_DTYPES)}")
        return FP8_DTYPES[dtype]
    if jnp.dtype(dtype) not in (jnp.dtype(E4M3), jnp.dtype(E5M2)):
        raise ValueError(f"fp8 dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    return dtype


def quantize(
    x: jax.Array,
    *,
    dtype: Any = E4M3,
    axes: int | Sequence[int] | None = None,
    act_scaling: str = "tensor",
    valid: jax.Array | None = None,
) -> QuantArray:
    """Dynamic cast-and-scale to FP8: ``scale = amax / fmax``, ``q = clip(x / scale)``.

    Args:
      x: array of any float dtype and shape.
      dtype: ``jnp.float8_e4m3fn`` (default), ``jnp.float8_e5m2`` or ``"e4m3"`` / ``"e5m2"``.
      axes: axes the amax is taken over (keepdims). ``None``: the whole tensor
        (one scale). ``(-2, -1)`` on stacked weights ``[L, out, in]``: one scale
        per layer. ``-1`` on ``[..., out, in]``: one scale per output channel.
      act_scaling: stored on the result for `qdot` (``"tensor"``, ``"token"`` or
        ``"prefill"``).
      valid: optional bool array broadcastable to ``x`` (e.g. ``[..., T, 1]``
        rows): only these entries enter the amax (padding and finished rows
        never set a scale); the others are still quantized, with the scale of
        the valid ones.

    Returns:
      `QuantArray` with float8 ``value`` (same shape as ``x``) and float32 ``scale``.
      An all-zero slice gets scale 1 (never a division by zero); values are
      clipped to the format's finite range before the cast, so no NaN appears
      for finite inputs of any magnitude.
    """
    if act_scaling not in ACT_SCALINGS:
        raise ValueError(f"act_scaling must be one of {ACT_SCALINGS}, got {act_scaling!r}")
    if int8.is_int8(dtype):  # INT8 W8A8: ais_jax.models.int8
        return int8.quantize(x, axes=axes, act_scaling=act_scaling, valid=valid)
    dtype = _resolve_dtype(dtype)
    fmax = fp8_max(dtype)
    xf = x.astype(jnp.float32)
    if axes is None:
        axes = tuple(range(x.ndim))
    ax = jnp.abs(xf) if valid is None else jnp.where(valid, jnp.abs(xf), 0.0)
    amax = jnp.max(ax, axis=axes, keepdims=True)
    scale = jnp.where(amax > 0, amax / fmax, 1.0).astype(jnp.float32)
    q = jnp.clip(xf / scale, -fmax, fmax).astype(dtype)
    return QuantArray(value=q, scale=scale, act_scaling=act_scaling)


def dequantize(q: QuantArray, dtype: Any = jnp.float32) -> jax.Array:
    """``q.value * q.scale`` in ``dtype`` (same shape as ``q.value``; FP4 blocks:
    `ais_jax.models.fp4`)."""
    if getattr(q, "fmt", None) in FP4_FORMATS:  # an ais_jax.models.fp4.BlockQuantArray
        return fp4.dequantize_blocks(q, dtype)
    return (q.value.astype(jnp.float32) * q.scale).astype(dtype)


def quantize_static(x: jax.Array, scale: jax.Array, *, dtype: Any = E4M3) -> QuantArray:
    """Cast-and-scale with a given scale: ``q = clip(x / scale)``, no reduction.

    Args:
      x: array of any float dtype and shape.
      scale: float32 scale broadcastable to ``x`` (e.g. a scalar from `prefill_scale`).
      dtype: float8 format.

    Returns:
      `QuantArray` (``value`` float8 of ``x``'s shape, ``scale`` as given).  Values
      beyond ``scale * fmax`` saturate to the format's largest finite value.
    """
    if int8.is_int8(dtype):
        return int8.quantize_static(x, scale)
    dtype = _resolve_dtype(dtype)
    fmax = fp8_max(dtype)
    scale = jnp.asarray(scale, jnp.float32)
    q = jnp.clip(x.astype(jnp.float32) / scale, -fmax, fmax).astype(dtype)
    return QuantArray(value=q, scale=scale, act_scaling="prefill")


def act_amax(x: jax.Array, valid: jax.Array | None = None) -> jax.Array:
    """Float32 scalar ``max |x|`` over the rows ``valid`` (``[...]`` of ``x`` ``[..., in]``)."""
    ax = jnp.abs(x.astype(jnp.float32))
    if valid is not None:
        ax = jnp.where(valid[..., None], ax, 0.0)
    return jnp.max(ax)


def prefill_scale(amax: jax.Array, dtype: Any = E4M3,
                  headroom: float = PREFILL_HEADROOM) -> jax.Array:
    """The fixed scale ``headroom * amax / fmax`` for an amax seen in the prefill (any shape).

    An amax of 0 (an input the prefill never saw nonzero) gives scale 1.
    """
    if int8.is_int8(dtype):
        return int8.prefill_scale(amax, headroom)
    fmax = fp8_max(_resolve_dtype(dtype))
    amax = jnp.asarray(amax, jnp.float32)
    return jnp.where(amax > 0, headroom * amax / fmax, 1.0).astype(jnp.float32)


def cast_fp8(x: jax.Array, dtype: Any = E4M3) -> jax.Array:
    """Plain saturating cast (no scaling): clip to the finite range, then cast.

    This is the rounding in docs/spec.md's golden example: ``[1.06, 1.00, 0.94]`` ->
    ``[1.0, 1.0, 0.9375]``.
    """
    dtype = _resolve_dtype(dtype)
    fmax = fp8_max(dtype)
    return jnp.clip(x.astype(jnp.float32), -fmax, fmax).astype(dtype)


def _contract_last(x: jax.Array, w: jax.Array, preferred: Any) -> jax.Array:
    # x [..., in] . w [out, in] -> [..., out]: both operands contract their last
    # axis (the "TN" layout cuBLASLt FP8 GEMMs want; fastest on XLA CPU too).
    return jax.lax.dot_general(
        x, w, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=preferred
    )


def qdot(
    x: jax.Array,
    w: QuantArray,
    *,
    compute_dtype: Any = jnp.float32,
    out_dtype: Any | None = None,
    valid: jax.Array | None = None,
    act_scale: jax.Array | None = None,
) -> jax.Array:
    """FP8 matmul ``x @ w.T`` with dynamic (or given) activation quantization.

    The activation is quantized per tensor (or per token when
    ``w.act_scaling == "token"``) to the weight's float8 format; the product of
    the float8 operands (converted exactly to ``compute_dtype``) accumulates in
    float32 and is rescaled by ``s_x * s_w`` afterwards, as the paper describes.
    On CPU this is an exact emulation of the FP8 GEMM's rounding.

    Args:
      x: activations ``[..., in]`` (any float dtype).
      w: quantized weight with ``value`` ``[out, in]`` and scale ``[1, 1]``
        (per tensor) or ``[out, 1]`` (per channel).
      compute_dtype: the wide type the float8 operands are converted to.
      out_dtype: result dtype; defaults to ``x.dtype``.
      valid: optional ``[...]`` bool mask of the rows of ``x`` that may set a
        per-tensor activation scale (padding and finished rows excluded, so
        a sequence's FP8 numbers do not depend on how it is padded).
      act_scale: optional float32 scalar, a fixed activation scale
        (`quantize_static`; no amax reduction, ``valid`` unused): what the decode
        steps of ``act_scaling="prefill"`` pass (`prefill_scale`).  None: the
        weight's ``act_scaling`` decides (``"prefill"`` without a scale, e.g.
        in the prefill itself, scales per tensor like ``"tensor"``).

    Returns:
      ``[..., out]`` in ``out_dtype``.

    An FP4 weight (`ais_jax.models.fp4.BlockQuantArray`) goes to `ais_jax.models.fp4.block_qdot`
    instead: weight-only W4A16, activations unquantized (``compute_dtype`` and
    ``valid`` unused).
    """
    if getattr(w, "fmt", None) in FP4_FORMATS:  # an ais_jax.models.fp4.BlockQuantArray
        return fp4.block_qdot(x, w, out_dtype=out_dtype)
    if w.value.ndim != 2:
        raise ValueError(f"qdot expects a 2-D weight [out, in], got shape {w.value.shape}")
    if int8.is_int8(w.value.dtype):  # INT8 W8A8: int32 accumulation
        return int8.qdot(x, w, out_dtype=out_dtype, valid=valid, act_scale=act_scale)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    per_token = w.act_scaling == "token" and act_scale is None
    rows = None if valid is None or per_token else valid[..., None]
    xq = (quantize_static(x, act_scale, dtype=w.value.dtype) if act_scale is not None else
          quantize(x, dtype=w.value.dtype, axes=-1 if per_token else None, valid=rows))
    # The float8 operands are only converted (exactly) to the wide type, and the
    # float32 product is rescaled afterwards: the GEMM reads the 1-byte weights
    # (XLA fuses the convert into the dot operand) and never materializes a
    # dequantized copy of the weight.
    y = _contract_last(xq.value.astype(compute_dtype), w.value.astype(compute_dtype),
                       jnp.float32)  # [..., out]
    s_x = xq.scale.reshape(()) if not per_token else xq.scale  # [] or [..., 1]
    s_w = w.scale.reshape(()) if w.scale.size == 1 else w.scale[:, 0]  # [] or [out]
    y = y * s_x * s_w
    return y.astype(out_dtype)


def linear(x: jax.Array, w: jax.Array | QuantArray | lora.LoraWeight, b: jax.Array | None = None,
           valid: jax.Array | None = None, act_scale: jax.Array | None = None) -> jax.Array:
    """``x @ w.T + b`` for a full-precision or quantized weight ``w`` ``[out, in]``.

    Full-precision weights multiply in ``x.dtype`` with float32 accumulation;
    `QuantArray` weights go through `qdot` (``valid``: ``[...]`` rows that may
    set its activation scale; ``act_scale``: a fixed one, see `qdot`).  A
    `ais_jax.models.lora.LoraWeight` multiplies its base weight the same way and
    adds its LoRA branch
    (`ais_jax.models.lora.lora_delta`, float32) before the bias, unmerged.
    Returns ``[..., out]`` in ``x.dtype``.
    """
    adapter = w if isinstance(w, lora.LoraWeight) else None
    if adapter is not None:
        w = adapter.base
    if isinstance(w, QuantArray):
        y = qdot(x, w, out_dtype=jnp.float32, valid=valid, act_scale=act_scale)
    else:
        y = _contract_last(x, w.astype(x.dtype), jnp.float32)
    if adapter is not None:
        y = y + lora.lora_delta(x, adapter)  # [..., out] float32
    if b is not None:
        y = y + b.astype(jnp.float32)
    return y.astype(x.dtype)


def quantize_weight(
    w: jax.Array, *, dtype: Any = E4M3, weight_scaling: str = "tensor", act_scaling: str = "tensor"
) -> QuantArray:
    """Quantize a (possibly layer-stacked) weight ``[..., out, in]``.

    ``weight_scaling="tensor"`` gives one scale per ``[out, in]`` matrix,
    ``"channel"`` one per output row.
    """
    if weight_scaling == "tensor":
        axes: tuple[int, ...] = (-2, -1)
    elif weight_scaling == "channel":
        axes = (-1,)
    else:
        raise ValueError(f"weight_scaling must be 'tensor' or 'channel', got {weight_scaling!r}")
    return quantize(w, dtype=dtype, axes=axes, act_scaling=act_scaling)


def to_rollout_params(
    params: dict,
    *,
    dtype: Any = E4M3,
    quantize_lm_head: bool = False,
    weight_scaling: str = "tensor",
    act_scaling: str = "tensor",
) -> dict:
    """The FP8 rollout copy of trainer params (re-run at every weight sync).

    The leaves `ais_jax.models.layout` marks ``fp8="always"`` (the decoder-block
    linears ``params["layers"][name]`` for ``name`` in `BLOCK_LINEARS`, stacked
    ``[L, out, in]``) become `QuantArray`s with real 1-byte float8 values and a
    float32 scale per layer (or per channel).  Embeddings, norms and biases are
    kept as they are.  With ``quantize_lm_head=True`` the ``fp8="option"``
    output projection is quantized too (for tied embeddings a quantized
    ``lm_head`` copy of the embedding is added; the embedding lookup stays full
    precision).

    Args:
      params: trainer params (see `ais_jax.models.model.init_params`).
      dtype: float8 format (E4M3 default; E5M2 as an option), or ``"nvfp4"`` /
        ``"mxfp4"``: block-scaled FP4 weights (`ais_jax.models.fp4.BlockQuantArray`,
        weight-only W4A16; every quantized weight's input dim must be a multiple
        of the block size, 16 / 32, else ValueError).
      quantize_lm_head: also quantize the output projection.
      weight_scaling: ``"tensor"`` (paper) or ``"channel"``; FP4 formats fix
        their own scales and accept only the default ``"tensor"`` (ignored).
      act_scaling: ``"tensor"`` (paper; one activation scale per matmul input
        tensor), ``"token"`` (one per row) or ``"prefill"`` (one per tensor in
        the prefill, then fixed for the decode steps: `prefill_scale`); FP4 formats do not quantize
        activations and accept only the default ``"tensor"`` (ignored).

    Returns:
      A new params dict of the same structure (plus ``lm_head`` when tied and
      ``quantize_lm_head``); the input is not modified.
    """
    if "layers" not in params:
        raise ValueError("params has no 'layers' entry; expected a tree from ais_jax.models.model")
    if isinstance(dtype, str) and dtype in FP4_FORMATS:
        if (weight_scaling, act_scaling) != ("tensor", "tensor"):
            raise ValueError(f"{dtype} has fixed block scales and unquantized activations; "
                             "weight_scaling and act_scaling must stay 'tensor'")
        q = lambda w, n: fp4.quantize_blocks(w, dtype, name=n)  # noqa: E731
    elif int8.is_int8(dtype):  # per output channel always (weight_scaling is FP8's)
        q = lambda w, n: int8.quantize_weight(w, act_scaling)  # noqa: E731
    else:
        dtype = _resolve_dtype(dtype)
        if act_scaling not in ACT_SCALINGS:
            raise ValueError(f"act_scaling must be one of {ACT_SCALINGS}, got {act_scaling!r}")
        q = lambda w, n: quantize_weight(  # noqa: E731
            w, dtype=dtype, weight_scaling=weight_scaling, act_scaling=act_scaling
        )
    layers = dict(params["layers"])
    for name in BLOCK_LINEARS:
        if name in layers and not isinstance(layers[name], QuantArray):
            layers[name] = q(layers[name], f"layers.{name}")
    out = dict(params)
    out["layers"] = layers
    for name in OPTIONAL_LINEARS if quantize_lm_head else ():
        head = params.get(name, params["embed"])  # lm_head; the embedding when tied
        if not isinstance(head, QuantArray):
            out[name] = q(head, name)
    return out


def tree_nbytes(tree: Any) -> int:
    """Total bytes of all array leaves (a `QuantArray` counts values plus scales)."""
    return sum(int(x.nbytes) for x in jax.tree_util.tree_leaves(tree))
