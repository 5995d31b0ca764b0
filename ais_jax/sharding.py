"""Device mesh and the one table of partitioning rules (logical axes -> mesh axes).

Every `PartitionSpec` in `ais_jax` is built here.  Params are named by their
logical axes (`LOGICAL_AXES`); `RULES` maps logical axes to mesh axes; a
dimension that the mesh axis does not divide stays replicated.

* Trainer params: FSDP over ``embed`` (the model width) and tensor parallel
  over heads / ffn / vocab.
* Rollout params: re-laid out once per weight sync with the ``fsdp`` rule
  dropped (replicated or tensor parallel only), so the decode loop never
  all-gathers weights.
* Batches: the leading (sequence) axis over ``("data", "fsdp")``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ais_jax.fp8 import QuantArray

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical axes of each parameter (stacked layers first); see ais_jax/model.py.
LOGICAL_AXES: dict[str, tuple[str | None, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("vocab", "embed"),
    "final_norm": (None,),
    "attn_norm": ("layers", None),
    "mlp_norm": ("layers", None),
    "wq": ("layers", "heads", "embed"),
    "wk": ("layers", "kv_heads", "embed"),
    "wv": ("layers", "kv_heads", "embed"),
    "wo": ("layers", "embed", "heads"),
    "w_gate": ("layers", "mlp", "embed"),
    "w_up": ("layers", "mlp", "embed"),
    "w_down": ("layers", "embed", "mlp"),
    "bq": ("layers", "heads"),
    "bk": ("layers", "kv_heads"),
    "bv": ("layers", "kv_heads"),
    "bo": ("layers", None),
    "b_gate": ("layers", "mlp"),
    "b_up": ("layers", "mlp"),
    "b_down": ("layers", None),
    "q_norm": ("layers", None),
    "k_norm": ("layers", None),
}

# Logical axis -> mesh axis (None: replicated).
RULES: dict[str, str | None] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "layers": None,
}
ROLLOUT_RULES: dict[str, str | None] = RULES | {"embed": None}


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


def _spec(shape: tuple[int, ...], logical: tuple[str | None, ...], mesh: Mesh,
          rules: dict[str, str | None]) -> PartitionSpec:
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {logical} do not match shape {shape}")
    axes = []
    for dim, name in zip(shape, logical, strict=True):
        mesh_axis = rules.get(name) if name else None
        if mesh_axis is not None and dim % mesh.shape[mesh_axis] == 0:
            axes.append(mesh_axis)
        else:
            axes.append(None)
    return PartitionSpec(*axes)


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


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Leading axis over ``("data", "fsdp")``, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated over the mesh."""
    return NamedSharding(mesh, PartitionSpec())


def batch_divisor(mesh: Mesh) -> int:
    """Number of shards of the batch axis (batch sizes must be multiples of it)."""
    return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def is_quant(x: Any) -> bool:
    """True for `QuantArray` leaves (for ``is_leaf`` in tree maps)."""
    return isinstance(x, QuantArray)
