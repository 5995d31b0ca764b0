"""LoRA adapters: their own pytree beside the frozen base, applied inside `fp8.linear`, merged.

An adapter pytree ``{"layers": {name: {"a": [L, r, in], "b": [L, out, r]}}}`` holds one low-rank
pair per targeted decoder-block linear (``wq wk wv wo w_gate w_up w_down``, the table names the
AR decoder and LLaDA share).  `with_adapters` puts `LoraWeight` leaves (base, A, B) into a copy
of the params, and `ais_jax.models.fp8.linear` computes ``x W^T + scale (x A^T) B^T`` for them,
so `forward`, the layer scan, remat and the chunked log-probs run unchanged and no merged weight
is made; differentiating with respect to the adapters only leaves the base a constant (no base
gradient is computed).  `merge` folds the adapters in (``W + scale B A``) for the FP8 rollout
copy and for export.  PEFT's file format: `ais_jax.models.peft_io`.

Written by hand rather than with ``qwix`` (Tunix's LoRA): qwix injects adapters by intercepting
flax linen / nnx modules, whereas this model is a pure function of a params pytree with one
`linear` to dispatch in.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from ais_jax.core.errors import UsageError
from ais_jax.models import layout

# The linears LoRA can target: the parameter table's decoder-block linears, in table order.
TARGETS: tuple[str, ...] = tuple(k for k, v in layout.LAYER_PARAMS.items() if v.fp8 == "always")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Static, hashable LoRA settings (LoRA off is the absence of a config, not rank 0).

    The model-free checks run at construction (`UsageError`, a ValueError);
    `validate_lora` adds those that need the model.
    """

    rank: int = 8  # r: the inner dimension of B A
    alpha: float = 16.0  # the update is scaled by alpha / r (alpha / sqrt(r) with rslora)
    targets: tuple[str, ...] = TARGETS  # table names of the adapted linears (stored in table order)
    dropout: float = 0.0  # dropout on the LoRA branch's input (only where a dropout key is given)
    rslora: bool = False  # rank-stabilized scaling alpha / sqrt(r) (PEFT's use_rslora)

    def __post_init__(self) -> None:
        r = self.rank
        if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
            raise UsageError(f"LoRA rank (lora.rank) must be a positive int, got {r!r}")
        a = self.alpha
        if isinstance(a, bool) or not isinstance(a, int | float) or not a > 0 or math.isinf(a):
            raise UsageError(f"LoRA alpha (lora.alpha) must be a positive number, got {a!r}")
        if isinstance(self.targets, str):
            raise UsageError(f"LoRA targets (lora.targets) must be a list of names, got the "
                             f"string {self.targets!r}; write [{self.targets!r}]")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
            raise UsageError(f"LoRA targets (lora.targets) must be distinct names among "
                             f"{list(TARGETS)}, got {list(self.targets)!r}")
        p = self.dropout
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p < 1:
            raise UsageError(f"LoRA dropout (lora.dropout) must be in [0, 1), got {p!r}")
        object.__setattr__(self, "targets", tuple(t for t in TARGETS if t in self.targets))

    @property
    def scale(self) -> float:
        """The factor of the update: ``alpha / rank``, or ``alpha / sqrt(rank)`` with rslora."""
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


@struct.dataclass
class LoraWeight:
    """A base weight with its LoRA pair, consumed by `ais_jax.models.fp8.linear`.

    Per-layer slices (inside the layer scan) drop the leading ``L`` of every array field.

    Attributes:
      base: the frozen weight ``[L, out, in]`` (an array or a quantized array).
      a: ``[L, r, in]``.
      b: ``[L, out, r]``.
      key: ``[L]`` PRNG keys of the branch's dropout, or None (no dropout).
      scale: ``alpha / r`` (static).
      dropout: dropout rate of the branch's input (static; used only with a key).
    """

    base: Any
    a: jax.Array
    b: jax.Array
    key: jax.Array | None = None
    scale: float = struct.field(pytree_node=False, default=1.0)
    dropout: float = struct.field(pytree_node=False, default=0.0)

    @property
    def shape(self) -> tuple[int, ...]:
        """The base weight's shape."""
        return tuple(self.base.shape)


def lora_delta(x: jax.Array, w: LoraWeight) -> jax.Array:
    """The LoRA branch ``scale * (drop(x) A^T) B^T`` of one layer's linear.

    Both products run in ``x.dtype`` (the adapters are cast to it) with float32
    accumulation, as `ais_jax.models.fp8.linear`'s base product does.

    Args:
      x: activations ``[..., in]``.
      w: one layer's `LoraWeight` (``a`` ``[r, in]``, ``b`` ``[out, r]``, ``key`` ``[]``).

    Returns:
      ``[..., out]`` float32.
    """
    if w.key is not None and w.dropout > 0:
        keep = jax.random.bernoulli(w.key, 1.0 - w.dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - w.dropout), 0).astype(x.dtype)
    dims = (((x.ndim - 1,), (1,)), ((), ()))
    h = jax.lax.dot_general(x, w.a.astype(x.dtype), dims, preferred_element_type=jnp.float32)
    h = h.astype(x.dtype)  # [..., r]
    y = jax.lax.dot_general(h, w.b.astype(x.dtype), dims, preferred_element_type=jnp.float32)
    return w.scale * y  # [..., out]


def _shapes(model_cfg: Any, name: str) -> tuple[int, int, int]:
    """``(L, out, in)`` of block linear ``name`` (AR `ModelConfig` or LLaDA config)."""
    L, out, inp = layout.LAYER_PARAMS[name].shape(model_cfg)
    return L, out, inp


def validate_lora(lora_cfg: LoraConfig, model_cfg: Any) -> None:
    """Check LoRA settings against a model (the model-free checks ran at construction).

    Args:
      lora_cfg: LoRA settings.
      model_cfg: `ais_jax.models.layout.ModelConfig` or a LLaDA config.

    Raises:
      UsageError: a rank larger than a target's smaller dimension (one line naming both).
    """
    for name in lora_cfg.targets:
        _, out, inp = _shapes(model_cfg, name)
        if lora_cfg.rank > min(out, inp):
            raise UsageError(f"LoRA rank (lora.rank) {lora_cfg.rank} exceeds {name}'s smaller "
                             f"dimension ({out} x {inp}); use lora.rank <= {min(out, inp)}")


def init_adapters(key: jax.Array, model_cfg: Any, lora_cfg: LoraConfig,
                  dtype: Any = jnp.float32) -> dict:
    """Fresh adapters, initialized as PEFT does: the model starts as the base.

    ``A`` is kaiming-uniform with ``a = sqrt(5)``, i.e. ``U(-1/sqrt(in), 1/sqrt(in))``; ``B = 0``.
    One ``U(-1, 1)`` draw from ``key`` fills the ``A`` of all targets, in table order.

    Args:
      key: PRNG key.
      model_cfg: model config (AR or LLaDA).
      lora_cfg: LoRA settings (checked with `validate_lora`).
      dtype: adapter dtype (float32: the adapters are the trained master weights).

    Returns:
      ``{"layers": {name: {"a": [L, r, in], "b": [L, out, r]}}}`` for ``lora_cfg.targets``.
    """
    validate_lora(lora_cfg, model_cfg)
    return _init(key, model_cfg, lora_cfg, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _init(key: jax.Array, model_cfg: Any, lora_cfg: LoraConfig, dtype: Any) -> dict:
    r, shapes = lora_cfg.rank, [_shapes(model_cfg, n) for n in lora_cfg.targets]
    sizes = [L * r * inp for L, _, inp in shapes]
    u = jax.random.uniform(key, (sum(sizes),), jnp.float32, -1.0, 1.0)  # one draw: fast to compile
    layers, start = {}, 0
    for name, (L, out, inp), size in zip(lora_cfg.targets, shapes, sizes, strict=True):
        a = u[start:start + size].reshape(L, r, inp) / math.sqrt(inp)  # [L, r, in]
        layers[name] = {"a": a.astype(dtype), "b": jnp.zeros((L, out, r), dtype)}  # [L, out, r]
        start += size
    return {"layers": layers}


def _pairs(params: dict, adapters: dict, lora_cfg: LoraConfig) -> dict[str, tuple[Any, dict]]:
    """Name -> (base weight, {"a", "b"}) for each target, checking the trees agree."""
    got = tuple(adapters.get("layers", {}))
    if sorted(got) != sorted(lora_cfg.targets):
        raise ValueError(f"adapters hold {list(got)} but lora_cfg.targets is "
                         f"{list(lora_cfg.targets)}; pass the config the adapters were made with")
    out = {}
    for name in lora_cfg.targets:
        base, pair = params["layers"][name], adapters["layers"][name]
        a, b = pair["a"], pair["b"]
        L, o, i = base.shape
        if a.shape != (L, lora_cfg.rank, i) or b.shape != (L, o, lora_cfg.rank):
            raise ValueError(f"adapter {name}: a {tuple(a.shape)} / b {tuple(b.shape)} do not fit "
                             f"the base {(L, o, i)} at rank {lora_cfg.rank} (expected "
                             f"{(L, lora_cfg.rank, i)} / {(L, o, lora_cfg.rank)})")
        out[name] = (base, pair)
    return out


def with_adapters(params: dict, adapters: dict, lora_cfg: LoraConfig, *,
                  dropout_key: jax.Array | None = None) -> dict:
    """Params whose targeted linears are `LoraWeight` leaves (``W x + scale B A x``, unmerged).

    Cheap (no arithmetic; call it inside the differentiated function).  The
    result goes to `ais_jax.models.model.forward`, the log-prob functions or
    LLaDA's forward unchanged.  Dropout (rate ``lora_cfg.dropout``) applies
    only when ``dropout_key`` is given (training); without it the branch is
    deterministic (log-probs, evaluation), as a PEFT model in inference mode.

    Args:
      params: full-precision (or quantized) base params; not modified.
      adapters: ``{"layers": {name: {"a", "b"}}}`` from `init_adapters`.
      lora_cfg: LoRA settings (its targets must be the adapters' names).
      dropout_key: PRNG key of the dropout masks (one per target and layer), or None.

    Returns:
      A new params dict sharing all leaves with ``params`` but the targets.
    """
    pairs = _pairs(params, adapters, lora_cfg)
    L = params["layers"][lora_cfg.targets[0]].shape[0]
    keys = (None if dropout_key is None or lora_cfg.dropout == 0 else
            jax.random.split(dropout_key, (len(pairs), L)))  # [targets, L]
    layers = dict(params["layers"])
    for t, (name, (base, pair)) in enumerate(pairs.items()):
        layers[name] = LoraWeight(base, pair["a"], pair["b"], None if keys is None else keys[t],
                                  scale=lora_cfg.scale, dropout=lora_cfg.dropout)
    return {**params, "layers": layers}


def merge(params: dict, adapters: dict, lora_cfg: LoraConfig) -> dict:
    """Params with the adapters folded in: ``W + scale * B @ A`` per target.

    The sum is computed in float32 (full-precision matmul) and cast back to
    ``W``'s dtype.  This feeds the FP8 rollout copy
    (``to_rollout_params(merge(base, adapters, cfg))``) and plain HF export.

    Args:
      params: full-precision base params (not quantized); not modified.
      adapters: ``{"layers": {name: {"a": [L, r, in], "b": [L, out, r]}}}``.
      lora_cfg: LoRA settings.

    Returns:
      A new params dict of the base's structure, dtypes and shapes.
    """
    layers = dict(params["layers"])
    for name, (w, pair) in _pairs(params, adapters, lora_cfg).items():
        ba = jnp.einsum("lor,lri->loi", pair["b"].astype(jnp.float32),
                        pair["a"].astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST)  # [L, out, in]
        layers[name] = (w.astype(jnp.float32) + lora_cfg.scale * ba).astype(w.dtype)
    return {**params, "layers": layers}


def logical_axes(lora_cfg: LoraConfig) -> dict:
    """Logical axes of the adapter leaves, from the parameter table (for sharding rules).

    ``a`` ``[L, r, in]`` shares its base weight's ``layers`` and input axes, ``b``
    ``[L, out, r]`` its ``layers`` and output axes; the rank axis is replicated (None).

    Returns:
      ``{"layers": {name: {"a": (layers, None, in_axis), "b": (layers, out_axis, None)}}}``.
    """
    axes = {n: layout.LAYER_PARAMS[n].axes for n in lora_cfg.targets}
    return {"layers": {n: {"a": (lay, None, i), "b": (lay, o, None)}
                       for n, (lay, o, i) in axes.items()}}


def num_adapter_params(model_cfg: Any, lora_cfg: LoraConfig) -> int:
    """Trainable parameter count: ``sum over targets of L * r * (in + out)``."""
    total = 0
    for name in lora_cfg.targets:
        L, out, inp = _shapes(model_cfg, name)
        total += L * lora_cfg.rank * (inp + out)
    return total


def adapter_nbytes(adapters: dict) -> int:
    """Bytes of all adapter arrays."""
    return sum(int(x.nbytes) for x in jax.tree_util.tree_leaves(adapters))
