"""Tests of ais_jax.training.sharding: param specs from the parameter table, optimizer-state
shardings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

from ais_jax.models import fp8, layout, model
from ais_jax.training import sharding as shd

# q/o and gate/down projections share a shape ([L, 32, 32]) but not a layout.
SQUARE = model.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_layers=2,
                           num_heads=2, num_kv_heads=2, head_dim=16)
MESH = AbstractMesh((1, 2, 2), shd.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
OPTIMIZERS = {
    "chain": optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)),
    "adamw": optax.adamw(1e-3),
    # Adam on ndim >= 2 only: the moments hold MaskedNodes where final_norm is.
    "masked": optax.chain(optax.clip_by_global_norm(1.0), optax.masked(
        optax.adam(1e-3), lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))),
}


def _abstract_state(optimizer):
    params = jax.eval_shape(lambda: model.init_params(jax.random.key(0), SQUARE))
    return params, jax.eval_shape(optimizer.init, params)


def _param_path(path) -> tuple | None:
    """The params path of a moment leaf (after ``.mu`` / ``.nu``), else None."""
    names = [getattr(k, "name", None) for k in path]
    for i, name in enumerate(names):
        if name in ("mu", "nu"):
            return tuple(path[i + 1:])
    return None


def _old_by_shape_rule(params, pspec, opt_state, mesh):
    """trainer.state_shardings before opt_state_shardings: the first param of the same shape."""
    by_shape: dict = {}
    for leaf, sh in zip(jax.tree.leaves(params), jax.tree.leaves(pspec), strict=True):
        by_shape.setdefault((leaf.shape, str(leaf.dtype)), sh)
    return jax.tree.map(lambda x: by_shape.get((x.shape, str(x.dtype)), shd.replicated(mesh)),
                        opt_state)


def test_logical_axes_come_from_the_table():
    assert shd.LOGICAL_AXES is layout.LOGICAL_AXES
    assert set(shd.LOGICAL_AXES) == (set(layout.TOP_PARAMS) | set(layout.LAYER_PARAMS)
                                     | set(layout.ROLLOUT_FUSED))
    used = {a for axes in shd.LOGICAL_AXES.values() for a in axes if a is not None}
    assert used <= set(shd.RULES)


def test_param_specs_trainer_and_rollout_layouts():
    params = jax.eval_shape(lambda: model.init_params(jax.random.key(0), SQUARE))
    specs = shd.param_specs(params, MESH)
    layers = specs["layers"]
    assert layers["wq"] == PartitionSpec(None, "tensor", "fsdp")
    assert layers["wo"] == PartitionSpec(None, "fsdp", "tensor")
    assert layers["w_down"] == PartitionSpec(None, "fsdp", "tensor")
    assert specs["embed"] == PartitionSpec("tensor", "fsdp")
    assert layers["attn_norm"] == PartitionSpec(None, None)
    rollout = jax.eval_shape(lambda p: fp8.to_rollout_params(p, quantize_lm_head=True), params)
    rspecs = shd.param_specs(rollout, MESH, rollout=True)
    assert rspecs["layers"]["wq"].value == PartitionSpec(None, "tensor", None)
    assert rspecs["layers"]["wq"].scale == PartitionSpec()
    assert rspecs["lm_head"].value == PartitionSpec("tensor", None)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_moments_take_their_own_params_sharding(name):
    params, opt_state = _abstract_state(OPTIMIZERS[name])
    pspec = shd.param_shardings(params, MESH)
    by_path = dict(jax.tree_util.tree_flatten_with_path(pspec)[0])
    out = shd.opt_state_shardings(opt_state, pspec, MESH)
    assert jax.tree.structure(out) == jax.tree.structure(opt_state)
    moments = 0
    for path, sh in jax.tree_util.tree_flatten_with_path(out)[0]:
        assert isinstance(sh, NamedSharding)
        ppath = _param_path(path)
        if ppath is None:  # counts, clip / schedule states
            assert sh.spec == PartitionSpec(), jax.tree_util.keystr(path)
        else:
            assert sh.spec == by_path[ppath].spec, jax.tree_util.keystr(path)
            moments += 1
    adam_params = [x for x in jax.tree.leaves(params) if name != "masked" or x.ndim >= 2]
    assert moments == 2 * len(adam_params) and len(adam_params) >= 10
    # The test is meaningful: wq and wo share a shape but not a layout, and the
    # shape-matching rule this replaces gives their moments the wrong one.
    assert params["layers"]["wq"].shape == params["layers"]["wo"].shape
    assert pspec["layers"]["wq"].spec != pspec["layers"]["wo"].spec
    old = _old_by_shape_rule(params, pspec, opt_state, MESH)
    wrong = [jax.tree_util.keystr(p) for (p, a), b in zip(
        jax.tree_util.tree_flatten_with_path(out)[0], jax.tree.leaves(old), strict=True)
        if a.spec != b.spec]
    assert any(w.endswith("mu['layers']['wq']") for w in wrong), wrong  # got w_down's spec


def test_mismatched_leaves_and_partition_specs():
    mesh = MESH  # PartitionSpecs are accepted in place of NamedShardings
    pspec = {"w": PartitionSpec("fsdp", "tensor"), "b": PartitionSpec("tensor")}
    state = {"m": {"w": jax.ShapeDtypeStruct((4, 6), jnp.float32),  # 6 % 2 == 0: kept
                   "b": jax.ShapeDtypeStruct((3,), jnp.float32)},  # 3 % 2 != 0: replicated
             "row": {"w": jax.ShapeDtypeStruct((4,), jnp.float32)},  # factored: rank 1 < 2
             "count": jnp.zeros((), jnp.int32)}
    out = shd.opt_state_shardings(state, pspec, mesh)
    assert out["m"]["w"].spec == PartitionSpec("fsdp", "tensor")
    assert out["m"]["b"].spec == PartitionSpec()
    assert out["row"]["w"].spec == PartitionSpec()
    assert out["count"].spec == PartitionSpec()


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
def test_opt_state_shardings_place_and_update_on_four_devices():
    """Real (simulated) devices: the shardings place the state and serve a jitted update."""
    code = textwrap.dedent("""
        import jax, optax
        from ais_jax.models import model
        from ais_jax.training import sharding as shd
        cfg = model.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=32,
                                num_layers=2, num_heads=2, num_kv_heads=2, head_dim=16)
        mesh = shd.make_mesh(1, 2, 2)
        opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
        psh = shd.param_shardings(jax.eval_shape(
            lambda: model.init_params(jax.random.key(0), cfg)), mesh)
        params = jax.device_put(model.init_params(jax.random.key(0), cfg), psh)
        osh = shd.opt_state_shardings(jax.eval_shape(opt.init, params), psh, mesh)
        state = jax.device_put(opt.init(params), osh)
        step = jax.jit(lambda g, s, p: opt.update(g, s, p), in_shardings=(psh, osh, psh),
                       out_shardings=(psh, osh))
        _, state = step(params, state, params)
        mu = state[1][0].mu["layers"]
        assert mu["wq"].sharding.spec == params["layers"]["wq"].sharding.spec, mu["wq"].sharding
        assert mu["wo"].sharding.spec == params["layers"]["wo"].sharding.spec, mu["wo"].sharding
        assert mu["wq"].sharding.spec != mu["wo"].sharding.spec
        print("ok", len(jax.devices()))
    """)
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "4"]
