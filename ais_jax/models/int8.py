"""INT8 W8A8 rollouts: symmetric int8 quantizers, the integer GEMM and its float epilogue.

``rollout.precision=int8`` (docs/accelerators.md): the rollout copy stores every
decoder-block linear weight as int8 with one float32 scale per output channel
(``scale = amax / 127``); each linear's input is quantized to int8 dynamically (per
token by default, per tensor, or with the prefill's fixed scale: the same
``act_scaling`` modes as FP8), the two int8 operands multiply with int32
accumulation (``lax.dot_general(..., preferred_element_type=int32)``: the MXU's
native int8 path on TPU v5e / v5p / v6e), and the int32 result is dequantized by
``s_x * s_w`` in the epilogue.  Integer products and sums are exact, so CPU runs the
same numbers a TPU does (up to the float32 epilogue's rounding).  An int8 KV cache
(``rollout.kv_cache_int8``) uses the same quantizers through `ais_jax.models.kv_cache`; its
per-(row, token) scales multiply the attention's scores and probabilities
(`ais_jax.models.attention.reference`), so the cache is never dequantized into a copy.

Rounding is to nearest, ties to even (``jnp.round``); values beyond ``127 x scale``
saturate to +-127 (never wrap); -128 is never produced (symmetric range).  The
`ais_jax.models.fp8` entry points (`quantize`, `quantize_static`, `prefill_scale`,
`qdot`, `to_rollout_params`) dispatch here for the ``int8`` dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ais_jax.models.qarray import QuantArray

INT8 = jnp.int8
QMAX = 127.0  # symmetric: [-127, 127]
# smallest dynamic scale: float32's smallest normal number, so a scale is never zero or
# subnormal (TPUs flush subnormals) and ``x / scale`` never divides by zero
SCALE_FLOOR = float(jnp.finfo(jnp.float32).tiny)
INV_QMAX = float(np.float32(1.0) / np.float32(QMAX))  # float32's 1 / 127 (`amax_scale`)


def is_int8(dtype: Any) -> bool:
    """Whether ``dtype`` (a dtype or the string ``"int8"``) is the INT8 rollout format."""
    if isinstance(dtype, str):
        return dtype == "int8"
    try:
        return jnp.dtype(dtype) == jnp.dtype(INT8)
    except TypeError:
        return False


def round_clip(y: jax.Array) -> jax.Array:
    """``y`` (float32, already divided by its scale) rounded half to even and saturated to
    ``[-127, 127]``, as int8 (same shape)."""
    return jnp.clip(jnp.round(y), -QMAX, QMAX).astype(INT8)


def quantize(
    x: jax.Array,
    *,
    axes: int | Sequence[int] | None = None,
    act_scaling: str = "tensor",
    valid: jax.Array | None = None,
) -> QuantArray:
    """Dynamic symmetric int8 quantization: ``scale = amax / 127``, ``q = round(x / scale)``.

    Args:
      x: array of any float dtype and shape.
      axes: axes the amax is taken over (keepdims); None: the whole tensor; ``-1`` on a
        weight ``[..., out, in]``: one scale per output channel; ``-1`` on activations
        ``[..., in]``: one scale per token.
      act_scaling: stored on the result (how `qdot` quantizes a weight's activations).
      valid: optional bool mask broadcastable to ``x``: only these entries set the amax.

    Returns:
      `QuantArray`: int8 ``value`` (``x``'s shape), float32 ``scale`` (keepdims), at
      least `SCALE_FLOOR` (an all-zero slice: scale `SCALE_FLOOR`, values 0).
    """
    xf = x.astype(jnp.float32)
    if axes is None:
        axes = tuple(range(x.ndim))
    ax = jnp.abs(xf) if valid is None else jnp.where(valid, jnp.abs(xf), 0.0)
    scale = amax_scale(ax, axes)
    return QuantArray(value=round_clip(xf / scale), scale=scale, act_scaling=act_scaling)


def amax_scale(ax: jax.Array, axes: int | Sequence[int]) -> jax.Array:
    """``max(amax * INV_QMAX, SCALE_FLOOR)`` over ``axes`` of ``ax = |x|`` (keepdims), float32.

    ``INV_QMAX`` is float32's ``1 / 127``: what XLA (CPU and TPU) compiles ``amax / 127`` to,
    so the scale is ``amax / 127`` as every compiled int8 program computed it (within one ulp
    of the exact quotient).  One reduction and nothing after it: ``max_i fl(|x_i| * c) ==
    fl(max_i |x_i| * c)`` for a positive ``c`` (rounding is monotone), and the floor is the
    reduction's initial value, so the scale is the reduction's own output (no ``where(amax >
    0)`` kernel); above ``127 * SCALE_FLOOR`` the floor never acts.
    """
    axes = tuple(a % ax.ndim for a in ((axes,) if isinstance(axes, int) else axes))
    scaled = ax.astype(jnp.float32) * jnp.float32(INV_QMAX)
    scale = jax.lax.reduce(scaled, jnp.float32(SCALE_FLOOR), jax.lax.max, axes)
    return jnp.expand_dims(scale, axes)


def quantize_static(x: jax.Array, scale: jax.Array) -> QuantArray:
    """Int8 quantization with a given float32 ``scale`` (broadcastable; no reduction);
    ``act_scaling="prefill"`` on the result."""
    scale = jnp.asarray(scale, jnp.float32)
    return QuantArray(
        value=round_clip(x.astype(jnp.float32) / scale), scale=scale, act_scaling="prefill"
    )


def prefill_scale(amax: jax.Array, headroom: float) -> jax.Array:
    """The fixed scale ``headroom * amax / 127`` (1 where ``amax`` is 0), any shape."""
    amax = jnp.asarray(amax, jnp.float32)
    return jnp.where(amax > 0, headroom * amax / QMAX, 1.0).astype(jnp.float32)


def int_matmul(xq: jax.Array, wq: jax.Array) -> jax.Array:
    """Exact integer GEMM ``xq @ wq.T``: int8 ``[..., in]`` x int8 ``[out, in]`` -> int32
    ``[..., out]`` (int32 accumulation; exact for ``in < 2**31 / 127**2``, about 133k)."""
    return jax.lax.dot_general(
        xq, wq, (((xq.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.int32
    )


def qdot(
    x: jax.Array,
    w: QuantArray,
    *,
    out_dtype: Any | None = None,
    valid: jax.Array | None = None,
    act_scale: jax.Array | None = None,
) -> jax.Array:
    """W8A8 matmul ``x @ w.T``: int8 activations x int8 weights, int32 accumulation, float32
    epilogue ``acc * s_x * s_w``.

    Args:
      x: activations ``[..., in]`` (any float dtype).
      w: int8 weight, ``value`` ``[out, in]``, ``scale`` ``[out, 1]`` (or ``[1, 1]``).
      out_dtype: result dtype (default ``x.dtype``).
      valid: ``[...]`` rows that may set a per-tensor activation scale.
      act_scale: a fixed float32 scalar activation scale (``act_scaling="prefill"`` decode
        steps); None: ``w.act_scaling`` decides (``"token"``: one scale per row; otherwise
        one per tensor over the ``valid`` rows).

    Returns:
      ``[..., out]`` in ``out_dtype``.
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    per_token = w.act_scaling == "token" and act_scale is None
    if act_scale is not None:
        xq = quantize_static(x, act_scale)
    else:
        rows = None if valid is None or per_token else valid[..., None]
        xq = quantize(x, axes=-1 if per_token else None, valid=rows)
    acc = int_matmul(xq.value, w.value)  # [..., out] int32
    s_x = xq.scale if per_token else xq.scale.reshape(())  # [..., 1] or []
    s_w = w.scale.reshape(()) if w.scale.size == 1 else w.scale[:, 0]  # [] or [out]
    # both scales multiply the int32 result elementwise (left to right, as the FP8 qdot): the
    # epilogue of the GEMM's fusion, no separate op for the product of the scales
    return (acc.astype(jnp.float32) * s_x * s_w).astype(out_dtype)


def quantize_weight(w: jax.Array, act_scaling: str = "tensor") -> QuantArray:
    """A (possibly layer-stacked) weight ``[..., out, in]`` as int8 with one float32 scale
    per output channel (``scale`` ``[..., out, 1]``)."""
    return quantize(w, axes=(-1,), act_scaling=act_scaling)
