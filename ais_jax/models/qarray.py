"""The quantized-array type shared by the FP8 and FP4 paths, and the float8 formats.

`QuantArray` (float8 values + float32 scale) is the leaf type of the rollout
copy; `ais_jax.models.fp4.BlockQuantArray` extends it with block scales.  The
arithmetic lives in `ais_jax.models.fp8` (per-tensor / per-channel FP8) and
`ais_jax.models.fp4` (block-scaled FP4).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

E4M3 = jnp.float8_e4m3fn
E5M2 = jnp.float8_e5m2
FP8_DTYPES = {"e4m3": E4M3, "e5m2": E5M2}
FP4_FORMATS = ("nvfp4", "mxfp4")  # block-scaled FP4 weights: ais_jax.models.fp4

@struct.dataclass
class QuantArray:
    """A quantized tensor: ``value * scale`` approximates the original.

    Attributes:
      value: float8 values (1 byte each), any shape ``[..., out, in]`` for weights.
      scale: float32 scale, broadcastable against ``value`` (keepdims layout):
        ``[..., 1, 1]`` per tensor, ``[..., out, 1]`` per output channel.
      act_scaling: how the matmul quantizes its activation input: ``"tensor"``
        (one scale per activation tensor, the paper's recipe) or ``"token"``
        (one scale per row, i.e. per token).  Static (not traced).
    """

    value: jax.Array
    scale: jax.Array
    act_scaling: str = struct.field(pytree_node=False, default="tensor")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    @property
    def dtype(self) -> Any:
        return self.value.dtype

    @property
    def ndim(self) -> int:
        return self.value.ndim

    @property
    def nbytes(self) -> int:
        return int(self.value.nbytes + self.scale.nbytes)


def fp8_max(dtype: Any = E4M3) -> float:
    """Largest finite value of a float8 dtype (448 for E4M3, 57344 for E5M2)."""
    return float(jnp.finfo(dtype).max)




# rollout.precision=auto: the fastest quantized format each device multiplies natively, keyed
# by a lowercase substring of jax's ``device.device_kind`` (first match wins); anything else
# (CPU, unknown devices) keeps BF16.  Sources: NVIDIA's Hopper / Blackwell data sheets (FP8
# tensor cores); Google's TPU pages (INT8 at 2x BF16 on v5e / v6e, v5p's int8 MXU path; FP8
# native only on tpu7x / Ironwood); the TPU compiler's own cycle estimates agree
# (docs/accelerators.md, "Native formats").
NATIVE_FORMATS: tuple[tuple[str, str], ...] = (
    ("h100", "fp8"), ("h200", "fp8"), ("h800", "fp8"), ("b200", "fp8"), ("gb200", "fp8"),
    ("tpu7x", "fp8"), ("tpu v5 lite", "int8"), ("tpu v5e", "int8"), ("tpu v5", "int8"),
    ("tpu v6", "int8"))


def native_precision(device_kind: str) -> str:
    """``rollout.precision`` that ``auto`` means on a device: ``"fp8"`` (E4M3), ``"int8"`` or
    ``"bf16"`` (`NATIVE_FORMATS`; e.g. ``"TPU v6 lite"`` -> ``"int8"``, ``"cpu"`` -> ``"bf16"``)."""
    kind = str(device_kind).lower()
    return next((fmt for key, fmt in NATIVE_FORMATS if key in kind), "bf16")
