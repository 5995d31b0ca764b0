"""Start-up sharded from the first byte: params and train state are born in their shards.

An 8B model's train state (float32 master weights and two Adam moments) is ~96 GB, more
than any one chip holds, while its shard on each of 8 chips is ~12 GB.  So no start-up step
may build a whole leaf on one device and lay it out afterwards:

* random params come from one jitted init whose ``out_shardings`` are the trainer's layout
  (`init_on_mesh`): each device computes only its shard (JAX's partitionable threefry draws
  the same numbers whatever the layout);
* pretrained weights go straight into their shards (`load_shardings` for
  `ais_jax.models.pretrained.load_pretrained` / `ais_jax.models.llada.checkpoint.load`,
  which read each shard's slice lazily from the files);
* the optimizer state is created by one jitted program over the placed params
  (`state_on_mesh`) with the step programs' state shardings, the params donated, so Adam's
  moments appear shard by shard too.

`ais_jax.training.build.build_run` composes these; `ais_jax.run.plan` compiles the same
init program to report start-up memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax
from jax.sharding import Mesh

from ais_jax.training import optim
from ais_jax.training import sharding as shd
from ais_jax.training.placement import place

InitFn = Callable[[jax.Array, Any, Any], Any]  # (key, model_cfg, dtype) -> params


def param_shardings_of(init_fn: InitFn, model_cfg: Any, dtype: Any, mesh: Mesh) -> Any:
    """The trainer's `NamedSharding`s of the params ``init_fn`` makes, from shapes alone."""
    shapes = jax.eval_shape(lambda: init_fn(jax.random.key(0), model_cfg, dtype))
    return shd.param_shardings(shapes, mesh)


def load_shardings(init_fn: InitFn, dtype: Any, mesh: Mesh) -> Callable[[Any], Any]:
    """``model_cfg -> shardings``: the loaders' ``shardings`` argument for ``mesh``."""
    return lambda model_cfg: param_shardings_of(init_fn, model_cfg, dtype, mesh)


def init_on_mesh(init_fn: InitFn, seed: int, stream: int, model_cfg: Any, dtype: Any,
                 mesh: Mesh) -> Any:
    """Random params ``init_fn(fold_in(key(seed), stream), model_cfg, dtype)``, each leaf
    created in its trainer shards by one jitted program (the key is made inside it, so
    every process of a multi-host run compiles the same program with no host input)."""
    shardings = param_shardings_of(init_fn, model_cfg, dtype, mesh)

    def make() -> Any:
        return init_fn(jax.random.fold_in(jax.random.key(seed), stream), model_cfg, dtype)

    return jax.jit(make, out_shardings=shardings)()


def state_on_mesh(params: Any, optimizer: optax.GradientTransformation,
                  state_shardings: optim.TrainState) -> optim.TrainState:
    """A fresh `ais_jax.training.optim.TrainState` laid out with ``state_shardings``.

    ``params`` already in ``state_shardings.params`` stay where they are (a leaf placed
    otherwise is laid out first, by `ais_jax.training.placement.place`); they are donated to
    the program, which creates the optimizer state in its shards.

    Args:
      params: the params (or LoRA adapters) the state starts from.
      optimizer: the optax optimizer.
      state_shardings: the step programs' state shardings (``StepFns.state_shardings``).

    Returns:
      The train state; its params alias the donated ``params``' buffers.
    """
    params = place(params, state_shardings.params)
    init = jax.jit(lambda p: optim.init_train_state(p, optimizer),
                   in_shardings=(state_shardings.params,), out_shardings=state_shardings,
                   donate_argnums=(0,))
    return init(params)


def abstract_state(params: Any, optimizer: optax.GradientTransformation) -> optim.TrainState:
    """The `ShapeDtypeStruct` tree of the train state of ``params`` (nothing allocated)."""
    return jax.eval_shape(lambda p: optim.init_train_state(p, optimizer), params)


def full_leaves_on_one_device(tree: Any, shardings: Any) -> list[str]:
    """Paths of leaves that are whole on some device although ``shardings`` splits them.

    The start-up tests' check: for each leaf whose target sharding has more than one
    distinct shard, every device's shard must be smaller than the leaf.
    """
    bad = []

    def one(path: Any, x: Any, sharding: Any) -> None:
        if not isinstance(x, jax.Array) or x.ndim == 0:
            return
        if sharding.is_fully_replicated:
            return
        if any(s.data.shape == x.shape for s in x.addressable_shards):
            bad.append(jax.tree_util.keystr(path))

    jax.tree_util.tree_map_with_path(one, tree, shardings)
    return bad
