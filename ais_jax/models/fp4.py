"""FP4 (E2M1) block-scaled rollout weights: NVFP4 and MXFP4, weight-only (W4A16).

Two formats of 4-bit E2M1 values (grid ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` and their
negatives) with one scale per block of consecutive elements along the
contraction (input, last) axis of a weight ``[..., out, in]``:

* ``nvfp4``: 16-element blocks, E4M3 (``float8_e4m3fn``) block scales and one
  float32 scale per matrix (NVIDIA's two-level scheme)::

      s_t = amax(W) / (448 * 6)                      # float32, per [out, in] matrix
      s_b = e4m3(min(amax(block) / 6 / s_t, 448))    # per 16-element block
      q   = e2m1(clip(w / (s_b * s_t), -6, 6))       # a block with s_b == 0 stores 0

* ``mxfp4``: 32-element blocks, E8M0 (``float8_e8m0fnu``, powers of two) block
  scales, no tensor scale (OCP Microscaling spec v1.0)::

      s_b = 2 ** (floor(log2(amax(block))) - 2)      # emax(E2M1) = 2; exponent in [-126, 127]
      q   = e2m1(clip(w / s_b, -6, 6))               # an all-zero block gets s_b = 1

  The spec's scale can leave ``amax / s_b`` in ``[4, 8)``, so the largest
  values of a block are clipped to 6 (an error of up to ``2 * s_b``).

All roundings are round-to-nearest-even (the ``ml_dtypes`` casts).  Only the
weights are 4-bit: the matmul (`block_qdot`, reached through `ais_jax.models.fp8.qdot`
and `ais_jax.models.fp8.linear`) keeps the activations in their dtype (BF16 in the
rollout copy) and multiplies them with ``value * s_b`` (exact in BF16: at most
2 x 4 significant bits), accumulating in float32, then rescales by ``s_t``.
This is W4A16.  On CPU it is an emulation of the rounding (no FP4 kernel
exists there, and it is slower than BF16); no FP4 GEMM is requested anywhere.

Storage: the E2M1 values are packed two per byte (``uint8`` ``[..., out, in / 2]``;
element ``2k`` of a row in the low nibble of byte ``k``, element ``2k + 1`` in the
high nibble), each as its 4-bit E2M1 code (sign bit 3, exponent bits 2-1, mantissa
bit 0: codes 0-7 are the grid ``0 ... 6`` in order, 8-15 their negatives).
`block_qdot` and `dequantize_blocks` unpack them inside the jitted computation,
so only the packed bytes are stored.  ``in`` is always even (a multiple of the
block size, else `quantize_blocks` refuses the weight).  Bytes per weight as
stored (``nbytes``, `bytes_per_weight`): NVFP4 ``1/2 + 1/16 = 0.5625`` (plus 4
bytes per matrix), MXFP4 ``1/2 + 1/32 = 0.53125``, against FP8's 1 byte.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from ais_jax.models.qarray import E4M3, QuantArray

E2M1 = jnp.float4_e2m1fn
E8M0 = jnp.float8_e8m0fnu
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_EMAX = 2  # exponent of E2M1's largest power of two (4 = 2**2), the OCP MX emax_elem
E2M1_GRID: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# format -> (block size along the input axis, block-scale dtype)
FP4_FORMATS: dict[str, tuple[int, Any]] = {"nvfp4": (16, E4M3), "mxfp4": (32, E8M0)}


@struct.dataclass
class BlockQuantArray(QuantArray):
    """A block-scaled FP4 weight: ``value * scale (per block) * tensor_scale`` approximates it.

    A subclass of `ais_jax.models.fp8.QuantArray`, so everything that keeps quantized
    leaves apart (the models' ``isinstance`` checks, ``cast_params``, sharding)
    treats it as quantized; `ais_jax.models.fp8.qdot` / `ais_jax.models.fp8.linear` /
    `ais_jax.models.fp8.dequantize` dispatch to this module.

    ``shape`` / ``ndim`` / ``dtype`` describe the logical weight (``[..., out, in]``,
    ``float4_e2m1fn``); ``value`` holds the packed bytes.

    Attributes:
      value: ``uint8`` ``[..., out, in // 2]``: two 4-bit E2M1 codes per byte
        (`pack_e2m1`; element ``2k`` in the low nibble).
      scale: block scales ``[..., out, in // block]``: ``float8_e4m3fn`` (nvfp4)
        or ``float8_e8m0fnu`` (mxfp4).
      act_scaling: unused (activations are not quantized); always ``"tensor"``.
      tensor_scale: float32 ``[..., 1, 1]`` (nvfp4), or None (mxfp4).
      fmt: ``"nvfp4"`` or ``"mxfp4"`` (static).
    """

    tensor_scale: jax.Array | None = None
    fmt: str = struct.field(pytree_node=False, default="nvfp4")

    @property
    def block_size(self) -> int:
        return FP4_FORMATS[self.fmt][0]

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical (unpacked) shape ``[..., out, in]``."""
        return (*self.value.shape[:-1], 2 * self.value.shape[-1])

    @property
    def dtype(self) -> Any:
        """The logical element type, ``float4_e2m1fn`` (``value`` is packed ``uint8``)."""
        return E2M1

    @property
    def nbytes(self) -> int:
        extra = 0 if self.tensor_scale is None else int(self.tensor_scale.nbytes)
        return int(self.value.nbytes + self.scale.nbytes) + extra

    def values(self, dtype: Any = jnp.float32) -> jax.Array:
        """The unscaled E2M1 values ``[..., out, in]`` in ``dtype`` (`unpack_e2m1` of ``value``)."""
        return unpack_e2m1(self.value, dtype)


def _check_format(fmt: str) -> tuple[int, Any]:
    if fmt not in FP4_FORMATS:
        raise ValueError(f"unknown fp4 format {fmt!r}; use one of {sorted(FP4_FORMATS)}")
    return FP4_FORMATS[fmt]


def cast_e2m1(v: jax.Array) -> jax.Array:
    """Saturating round-to-nearest-even cast to E2M1: clip to ``[-6, 6]``, then cast.

    Args:
      v: any float array (already divided by its scale).

    Returns:
      ``float4_e2m1fn`` array of the same shape.
    """
    return jnp.clip(v.astype(jnp.float32), -E2M1_MAX, E2M1_MAX).astype(E2M1)


def pack_e2m1(v: jax.Array) -> jax.Array:
    """Pack E2M1 values two per byte along the last axis.

    Args:
      v: ``[..., n]`` values on the E2M1 grid (``float4_e2m1fn``, or any float
        dtype holding grid values exactly); ``n`` even.

    Returns:
      ``[..., n // 2]`` uint8: byte ``k`` = code of ``v[..., 2k]`` (low nibble)
      ``| code of v[..., 2k + 1] << 4``; the code of ``-0.0`` is 8.

    Raises:
      ValueError: ``n`` is odd.
    """
    n = v.shape[-1]
    if n % 2:
        raise ValueError(f"pack_e2m1 needs an even last dimension, got shape {v.shape}")
    f = v.astype(jnp.float32)
    mag = jnp.abs(f)
    # grid 0, .5, 1, 1.5 -> codes 0-3 (2 * mag); 2, 3, 4 -> 4-6 (mag + 2); 6 -> 7
    idx = jnp.where(mag < 2.0, 2.0 * mag, jnp.where(mag > 4.0, 7.0, mag + 2.0))
    code = idx.astype(jnp.uint8) | (jnp.signbit(f).astype(jnp.uint8) << 3)
    pairs = code.reshape(*v.shape[:-1], n // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_e2m1(packed: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
    """The E2M1 values of packed codes (inverse of `pack_e2m1`), exact in any float dtype.

    Args:
      packed: ``[..., m]`` uint8, two codes per byte (low nibble first).
      dtype: result dtype (float32, BF16, ``float4_e2m1fn``, ...).

    Returns:
      ``[..., 2 m]`` values in ``dtype``.
    """
    codes = jnp.stack([packed & 0xF, packed >> 4], axis=-1)
    codes = codes.reshape(*packed.shape[:-1], 2 * packed.shape[-1])
    e = (codes >> 1) & 3  # exponent field; 0: subnormal (0 or 0.5)
    m = (codes & 1).astype(jnp.float32)
    pow2 = jnp.where(e == 1, 1.0, jnp.where(e == 2, 2.0, 4.0))
    mag = jnp.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * pow2)
    return jnp.where(codes >= 8, -mag, mag).astype(dtype)


def mx_scale_exponent(block_amax: jax.Array) -> jax.Array:
    """OCP MX shared exponent ``floor(log2(amax)) - 2``, clipped to ``[-126, 127]``; 0 for amax 0.

    ``floor(log2)`` comes from ``frexp`` (exact, also for powers of two).  The
    lower clip keeps ``2**e`` a normal float32 (E8M0 itself reaches ``2**-127``).

    Args:
      block_amax: ``[...]`` float32 block maxima of ``|w|``.

    Returns:
      ``[...]`` int32 exponents.
    """
    _, ex = jnp.frexp(block_amax)  # amax = m * 2**ex, m in [0.5, 1): floor(log2 amax) = ex - 1
    e = jnp.clip(ex.astype(jnp.int32) - 1 - E2M1_EMAX, -126, 127)
    return jnp.where(block_amax > 0, e, 0)


def quantize_blocks(x: jax.Array, fmt: str = "nvfp4", *, name: str = "weight") -> BlockQuantArray:
    """Quantize ``x`` ``[..., out, in]`` to block-scaled FP4 along its last axis.

    Args:
      x: float array with ``ndim >= 2``; ``in`` must be a multiple of the block
        size (16 for nvfp4, 32 for mxfp4).  The nvfp4 tensor scale is taken per
        trailing ``[out, in]`` matrix (per layer for stacked weights ``[L, out, in]``).
      fmt: ``"nvfp4"`` or ``"mxfp4"``.
      name: the tensor's name, for the error message.

    Returns:
      `BlockQuantArray`: ``value`` packed E2M1 ``[..., out, in // 2]`` uint8, ``scale``
      ``[..., out, in // block]``, ``tensor_scale`` ``[..., 1, 1]`` (nvfp4) or None.

    Raises:
      ValueError: unknown format, ``ndim < 2``, or ``in`` not a multiple of the block size.
    """
    block, scale_dtype = _check_format(fmt)
    if x.ndim < 2:
        raise ValueError(f"{name}: fp4 quantization needs a weight [..., out, in], got shape "
                         f"{x.shape}")
    n_in = x.shape[-1]
    if n_in % block:
        raise ValueError(f"{name}: input dim {n_in} is not a multiple of the {fmt} block size "
                         f"{block}; use rollout.fp8_format=e4m3 (or a model whose input dims "
                         f"are multiples of {block})")
    xf = x.astype(jnp.float32)
    xb = xf.reshape(*x.shape[:-1], n_in // block, block)  # [..., out, nb, block]
    bmax = jnp.max(jnp.abs(xb), axis=-1)  # [..., out, nb]
    if fmt == "nvfp4":
        amax = jnp.max(jnp.abs(xf), axis=(-2, -1), keepdims=True)  # [..., 1, 1]
        s_t = jnp.where(amax > 0, amax / (E4M3_MAX * E2M1_MAX), 1.0).astype(jnp.float32)
        s_b = jnp.minimum(bmax / E2M1_MAX / s_t, E4M3_MAX).astype(scale_dtype)
        eff = s_b.astype(jnp.float32) * s_t  # [..., out, nb]
        tensor_scale: jax.Array | None = s_t
    else:
        s_b = jnp.ldexp(jnp.float32(1.0), mx_scale_exponent(bmax)).astype(scale_dtype)
        eff = s_b.astype(jnp.float32)
        tensor_scale = None
    ok = eff > 0  # nvfp4: a block far below the tensor's amax can get s_b = 0
    v = jnp.where(ok[..., None], xb / jnp.where(ok, eff, 1.0)[..., None], 0.0)
    value = pack_e2m1(cast_e2m1(v).reshape(x.shape))
    return BlockQuantArray(value=value, scale=s_b, tensor_scale=tensor_scale, fmt=fmt)


def _scaled_blocks(q: BlockQuantArray, dtype: Any) -> jax.Array:
    """``value * block scale`` ``[..., out, in]`` in ``dtype`` (exact in BF16 and float32)."""
    b, shape = q.block_size, q.shape
    v = q.values(jnp.float32).reshape(*shape[:-1], -1, b)  # unpacked here, inside the jit
    return (v * q.scale.astype(jnp.float32)[..., None]).reshape(shape).astype(dtype)


def dequantize_blocks(q: BlockQuantArray, dtype: Any = jnp.float32) -> jax.Array:
    """``value * block scale * tensor_scale`` in ``dtype``, shape ``[..., out, in]``."""
    w = _scaled_blocks(q, jnp.float32)
    if q.tensor_scale is not None:
        w = w * q.tensor_scale
    return w.astype(dtype)


def block_qdot(x: jax.Array, w: BlockQuantArray, *, out_dtype: Any | None = None) -> jax.Array:
    """W4A16 matmul ``x @ dequant(w).T``: activations unquantized, float32 accumulation.

    The weight operand is ``value * block scale`` in the activation dtype (exact
    for BF16 and float32); the float32 product is multiplied by the nvfp4
    tensor scale afterwards.

    Args:
      x: activations ``[..., in]`` (BF16 in the rollout copy; any float dtype).
      w: `BlockQuantArray` of logical shape ``[out, in]`` (packed ``value`` ``[out, in // 2]``).
      out_dtype: result dtype; defaults to ``x.dtype``.

    Returns:
      ``[..., out]`` in ``out_dtype``.
    """
    if w.value.ndim != 2:
        raise ValueError(f"block_qdot expects a 2-D weight [out, in], got shape {w.shape}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    cd = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    wd = _scaled_blocks(w, cd)  # [out, in]
    y = jax.lax.dot_general(x.astype(cd), wd, (((x.ndim - 1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)  # [..., out]
    if w.tensor_scale is not None:
        y = y * w.tensor_scale.reshape(())
    return y.astype(out_dtype)


def bytes_per_weight(q: BlockQuantArray) -> float:
    """Stored bytes per weight element: ``nbytes`` (packed values + scales) / logical size.

    Measured from the arrays: about 0.5625 for NVFP4 and 0.53125 for MXFP4.
    """
    return q.nbytes / math.prod(q.shape)
