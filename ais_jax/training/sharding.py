"""Device mesh and the one table of partitioning rules (logical axes -> mesh axes).

Every `PartitionSpec` in `ais_jax` is built here.  Params are named by their
logical axes (`ais_jax.models.layout.LOGICAL_AXES`, from the parameter table); `RULES`
maps logical axes to mesh axes; a dimension that the mesh axis does not divide
stays replicated.

* Trainer params: FSDP over ``embed`` (the model width) and tensor parallel
  over heads / ffn / vocab.  An untied output head (``lm_head``) is sharded
  on its vocabulary over ``fsdp`` and ``tensor`` together and runs
  vocab-parallel (`head_constraint`): its weight is never gathered and its
  gradient never leaves its shard (for a 150k vocabulary at 8B that is 2.5 GB
  of f32 gradient and a 1.2 GB bf16 copy per device saved).
* Rollout params: re-laid out once per weight sync with the ``fsdp`` rule
  dropped (replicated or tensor parallel only), so the decode loop never
  all-gathers weights.
* Optimizer state: each leaf that mirrors a param (Adam moments, ...) takes
  exactly that param's sharding (matched by tree path, never by shape); the
  rest (step counts, scalars) is replicated.
* Batches: the leading (sequence) axis over ``("data", "fsdp")``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ais_jax.models.fp8 import QuantArray
from ais_jax.models.layout import BATCH_AXES, LOGICAL_AXES, MESH_AXES

# Logical axis -> mesh axis, or mesh axes sharding one dimension together (None: replicated).
Rule = str | tuple[str, ...] | None
RULES: dict[str, Rule] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "layers": None,
    "head_vocab": ("fsdp", "tensor"),  # the untied lm_head runs vocab-parallel
    "head_embed": None,
    "fused": None,  # the rollout's fused q/k/v and gate/up output axis (models/layout.py)
}
ROLLOUT_RULES: dict[str, Rule] = RULES | {"embed": None, "head_vocab": "tensor"}


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[Any] | None = None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh over ``data * fsdp * tensor`` devices.

    Raises:
      ValueError: the mesh needs more devices than there are, or a size is < 1.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    for name, size in sizes.items():
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh.{name} must be an int >= 1, got {size!r}")
    n = data * fsdp * tensor
    if n > len(devices):
        raise ValueError(
            f"mesh data={data} x fsdp={fsdp} x tensor={tensor} needs {n} devices but only "
            f"{len(devices)} are visible; lower the mesh sizes (on CPU, JAX_NUM_CPU_DEVICES=N "
            "simulates N devices)"
        )
    return jax.make_mesh((data, fsdp, tensor), MESH_AXES, (AxisType.Auto,) * 3,
                         devices=devices[:n])


def _dim_axes(dim: int, rule: Rule, mesh: Mesh) -> str | tuple[str, ...] | None:
    """The mesh axes of ``rule`` that shard a dimension of size ``dim``: in order, each axis
    kept while the product of the kept sizes divides ``dim`` (size-1 axes dropped)."""
    names = (rule,) if isinstance(rule, str) else tuple(rule or ())
    kept: list[str] = []
    size = 1
    for a in names:
        if mesh.shape[a] > 1 and dim % (size * mesh.shape[a]) == 0:
            kept.append(a)
            size *= mesh.shape[a]
    if isinstance(rule, str):
        return rule if dim % mesh.shape[rule] == 0 else None
    return tuple(kept) or None


def _spec(shape: tuple[int, ...], logical: tuple[str | None, ...], mesh: Mesh,
          rules: dict[str, Rule]) -> PartitionSpec:
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {logical} do not match shape {shape}")
    return PartitionSpec(*(_dim_axes(dim, rules.get(name) if name else None, mesh)
                           for dim, name in zip(shape, logical, strict=True)))


def param_specs(params: dict, mesh: Mesh, *, rollout: bool = False) -> Any:
    """PartitionSpecs for a params tree (trainer layout, or rollout layout if ``rollout``)."""
    rules = ROLLOUT_RULES if rollout else RULES

    def leaf_spec(path, leaf):
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        name = next((k for k in reversed(keys) if isinstance(k, str) and k in LOGICAL_AXES),
                    None)
        if name is None:
            return PartitionSpec()
        logical = LOGICAL_AXES[name]
        if keys and keys[-1] == "scale":  # QuantArray scale: [..., 1, 1] or [..., out, 1]
            return PartitionSpec()
        if len(logical) != leaf.ndim:
            return PartitionSpec()
        return _spec(leaf.shape, logical, mesh, rules)

    return jax.tree_util.tree_map_with_path(leaf_spec, params)


def param_shardings(params: dict, mesh: Mesh, *, rollout: bool = False) -> Any:
    """NamedShardings matching `param_specs` (works on arrays or ShapeDtypeStructs)."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(params, mesh,
                                                                      rollout=rollout),
                        is_leaf=lambda x: isinstance(x, PartitionSpec))


def _fits(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> bool:
    """Whether ``spec`` can lay out an array of ``shape`` on ``mesh`` (rank and divisibility)."""
    if len(spec) > len(shape):
        return False
    for dim, entry in zip(shape, spec, strict=False):
        axes = entry if isinstance(entry, tuple) else (entry,)
        size = int(np.prod([mesh.shape[a] for a in axes if a is not None]))
        if dim % size:
            return False
    return True


def opt_state_shardings(opt_state: Any, param_shardings: Any, mesh: Mesh) -> Any:
    """Shardings of an optimizer state: param mirrors take their param's, the rest replicated.

    A leaf whose tree path ends with the full path of a param (optax moments:
    ``ScaleByAdamState.mu["layers"]["wq"]`` ends with ``["layers"]["wq"]``) gets
    exactly that param's sharding, whatever the shapes (so ``wq``'s moments never
    take ``wo``'s layout when the two shapes coincide).  Everything else (step
    counts, scalars, schedule states), and a matched leaf the param's spec cannot
    lay out (a different rank or an indivisible dim, e.g. factored moments), is
    replicated.

    Args:
      opt_state: optimizer state (arrays or ShapeDtypeStructs), e.g. from
        ``optimizer.init(params)`` or ``jax.eval_shape`` of it.
      param_shardings: the params' `NamedSharding`s (or `PartitionSpec`s), e.g.
        `param_shardings(params, mesh)`.
      mesh: the mesh (also for the replicated leaves).

    Returns:
      A tree of `NamedSharding` with the structure of ``opt_state``.
    """
    is_spec = lambda x: isinstance(x, NamedSharding | PartitionSpec)  # noqa: E731
    by_path = {
        tuple(path): sh.spec if isinstance(sh, NamedSharding) else sh
        for path, sh in jax.tree_util.tree_flatten_with_path(param_shardings, is_leaf=is_spec)[0]
    }
    rep = replicated(mesh)

    def leaf_sharding(path, leaf):
        path = tuple(path)
        spec = next((by_path[path[i:]] for i in range(len(path)) if path[i:] in by_path), None)
        if spec is None or not _fits(spec, tuple(getattr(leaf, "shape", ())), mesh):
            return rep
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(leaf_sharding, opt_state)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Leading axis over ``("data", "fsdp")``, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated over the mesh."""
    return NamedSharding(mesh, PartitionSpec())


def batch_constraint(mesh: Mesh, axis: int = 0) -> Any:
    """``x -> x`` pinned to rows sharded over ``("data", "fsdp")`` on dimension ``axis``.

    Used on activations inside the update, so FSDP gathers each layer's weights
    (ZeRO-3) instead of replicating the minibatch against width-sharded weights.  The
    function carries ``mesh`` (``constrain.mesh``): the trunk runs its TPU attention
    kernel under ``jax.shard_map`` over it (`ais_jax.models.attention_pallas.flash_heads`).
    """
    def constrain(x: jax.Array) -> jax.Array:
        spec = [None] * x.ndim
        spec[axis] = BATCH_AXES
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))
    constrain.mesh = mesh  # type: ignore[attr-defined]  # the trunk's kernels shard_map over it
    return constrain


def head_constraint(mesh: Mesh, vocab_size: int) -> Any:
    """Constraint for the rows entering a vocab-parallel ``lm_head``, or None.

    When the untied head's vocabulary is sharded over ``fsdp`` (`RULES`
    ``head_vocab``), each device computes the logits of every row of its
    ``data`` group against its vocabulary slice: the head's input ``[B, c, D]``
    (small) is gathered over ``fsdp`` instead of the weight ``[V, D]`` (large),
    the log-softmax reduces across the slices, and the weight's gradient stays
    local.  Returns None when ``fsdp`` does not shard the vocabulary (size 1, or
    ``vocab_size`` not divisible), where rows stay batch-sharded.

    Args:
      mesh: the mesh.
      vocab_size: rows of ``lm_head``.

    Returns:
      ``x -> x`` pinning dimension 0 to ``"data"`` only, or None.
    """
    axes = _dim_axes(vocab_size, RULES["head_vocab"], mesh)
    if axes is None or "fsdp" not in axes:
        return None

    def constrain(x: jax.Array) -> jax.Array:
        spec = PartitionSpec("data", *([None] * (x.ndim - 1)))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
    return constrain


def batch_divisor(mesh: Mesh) -> int:
    """Number of shards of the batch axis (batch sizes must be multiples of it)."""
    return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def is_quant(x: Any) -> bool:
    """True for `QuantArray` leaves (for ``is_leaf`` in tree maps)."""
    return isinstance(x, QuantArray)
