"""Tests of ais_jax.run.checkpoint: bit-exact round trips, keep-N, atomicity, errors, sharding."""

import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ais_jax.core.errors import CheckpointError
from ais_jax.run import checkpoint as ckpt


def _state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    f32 = rng.standard_normal((3, 4)).astype(np.float32)
    f32[0, 0] = np.float32(1e-39)  # a subnormal survives only a bit-exact write
    params = {
        "w": jnp.asarray(f32),
        "b": jnp.asarray(rng.standard_normal(5).astype(ml_dtypes.bfloat16)),
        "q": jnp.asarray((rng.standard_normal(6) * 10).astype(ml_dtypes.float8_e4m3fn)),
    }
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    return {
        "params": params,
        "opt_state": opt.init(params),
        "step": jnp.int32(7 + seed),
        "rng": jax.random.key_data(jax.random.key(seed + 11)),
        "data_pos": jnp.int32(1234 + seed),
        "counters": {
            "tokens": jnp.asarray(2**40 + seed, dtype=jnp.int64)
            if jax.config.jax_enable_x64
            else jnp.int32(2**30 + seed)
        },
    }


def _zeros_like(tree):
    return jax.tree.map(jnp.zeros_like, tree)


def _assert_bit_exact(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


def test_round_trip_is_bit_exact_for_all_leaf_dtypes(tmp_path):
    state = _state()
    m = ckpt.open_manager(tmp_path, keep=3)
    assert ckpt.latest_step(m) is None
    assert ckpt.save(m, 7, state, {"config": {"train": {"steps": 3}}, "note": "x"})
    ckpt.close(m)
    m = ckpt.open_manager(tmp_path, keep=3)  # a fresh process would do this
    assert ckpt.latest_step(m) == 7
    out = ckpt.restore(m, 7, _zeros_like(state))
    _assert_bit_exact(out, state)
    assert out["params"]["q"].dtype == jnp.float8_e4m3fn
    assert out["params"]["b"].dtype == jnp.bfloat16
    assert ckpt.read_metadata(m, 7) == {"config": {"train": {"steps": 3}}, "note": "x"}
    ckpt.close(m)


def test_typed_prng_keys_round_trip(tmp_path):
    key = jax.random.key(5)
    m = ckpt.open_manager(tmp_path, keep=1)
    ckpt.save(m, 0, {"key": key, "x": jnp.ones(2)})
    out = ckpt.restore(m, 0, {"key": jax.random.key(0), "x": jnp.zeros(2)})
    assert jax.dtypes.issubdtype(out["key"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(out["key"]), jax.random.key_data(key))
    np.testing.assert_array_equal(jax.random.normal(out["key"], (3,)), jax.random.normal(key, (3,)))
    with pytest.raises(TypeError, match="abstract PRNG key"):
        ckpt.restore(m, 0, {"key": jax.eval_shape(lambda: key), "x": jnp.zeros(2)})
    ckpt.close(m)


def test_keep_n_and_latest_step(tmp_path):
    m = ckpt.open_manager(tmp_path, keep=2)
    for step in (1, 2, 3, 5):
        assert ckpt.save(m, step, _state(step), {"step": step})
    assert ckpt.all_steps(m) == [3, 5]
    assert ckpt.latest_step(m) == 5
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "5"]
    _assert_bit_exact(ckpt.restore(m, 3, _zeros_like(_state())), _state(3))
    assert ckpt.read_metadata(m, 5) == {"step": 5}
    # Saving an existing step is a no-op; an older step is refused.
    assert ckpt.save(m, 5, _state(0)) is False
    _assert_bit_exact(ckpt.restore(m, 5, _zeros_like(_state())), _state(5))
    with pytest.raises(CheckpointError, match="already holds the later step 5"):
        ckpt.save(m, 4, _state(0))
    assert ckpt.all_steps(m) == [3, 5]
    ckpt.close(m)


def test_open_manager_returns_after_orbax_startup_cleanup(tmp_path, monkeypatch):
    """Orbax cleans temporary step directories in a background thread that ``close`` does not
    wait for; `open_manager` waits for it, so a run closed right after opening (bad input)
    leaves no orbax thread behind to print a traceback at exit.  A slowed cleanup makes the
    race deterministic: without the wait, the cleanup is still running when open returns."""
    import asyncio

    from orbax.checkpoint import checkpoint_manager as cm

    original = cm.temporary_paths.cleanup_temporary_paths
    done = []

    async def slow_cleanup(*args, **kwargs):
        await asyncio.sleep(0.5)
        out = await original(*args, **kwargs)
        done.append(True)
        return out

    monkeypatch.setattr(cm.temporary_paths, "cleanup_temporary_paths", slow_cleanup)
    manager = ckpt.open_manager(tmp_path, keep=1)
    assert done == [True]
    ckpt.close(manager)


def test_leftover_tmp_dir_from_a_crash_is_not_the_latest(tmp_path):
    m = ckpt.open_manager(tmp_path, keep=3)
    ckpt.save(m, 2, _state(2))
    ckpt.close(m)
    # A save of step 4 killed before orbax's final rename leaves only this:
    tmp = tmp_path / "checkpoints" / "4.orbax-checkpoint-tmp"
    (tmp / "state").mkdir(parents=True)
    (tmp / "state" / "_METADATA").write_text("{truncated")
    m = ckpt.open_manager(tmp_path, keep=3)
    assert ckpt.all_steps(m) == [2]
    assert ckpt.latest_step(m) == 2
    _assert_bit_exact(ckpt.restore(m, 2, _zeros_like(_state())), _state(2))
    # The interrupted step can be saved again and then restores normally.
    assert ckpt.save(m, 4, _state(4))
    assert ckpt.latest_step(m) == 4
    _assert_bit_exact(ckpt.restore(m, 4, _zeros_like(_state())), _state(4))
    ckpt.close(m)


def _listing(root):
    return sorted(
        (os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f)))
        for d, _, files in os.walk(root)
        for f in files
    )


def test_shape_mismatch_raises_and_keeps_files(tmp_path):
    state = _state()
    m = ckpt.open_manager(tmp_path, keep=3)
    ckpt.save(m, 3, state)
    before = _listing(tmp_path)
    bad = _zeros_like(state)
    bad["params"]["w"] = jnp.zeros((3, 5))
    with pytest.raises(CheckpointError) as info:
        ckpt.restore(m, 3, bad)
    msg = str(info.value)
    assert "\n" not in msg
    assert os.path.join("checkpoints", "3") in msg
    assert "params/w" in msg and "use a new out_dir or delete it" in msg
    bad = _zeros_like(state)
    bad["params"]["b"] = jnp.zeros(5, jnp.float32)  # dtype change: no silent cast
    with pytest.raises(CheckpointError, match="params/b"):
        ckpt.restore(m, 3, bad)
    assert _listing(tmp_path) == before
    assert ckpt.latest_step(m) == 3
    _assert_bit_exact(ckpt.restore(m, 3, _zeros_like(state)), state)
    ckpt.close(m)


# After a failed read, orbax's tensorstore callbacks hit a closed event loop (harmless noise).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_structure_mismatch_and_corrupt_files_raise(tmp_path):
    state = _state()
    m = ckpt.open_manager(tmp_path, keep=3)
    ckpt.save(m, 1, state)
    extra = _zeros_like(state)
    extra["params"]["new_layer"] = jnp.zeros(2)
    with pytest.raises(CheckpointError, match="'params/new_layer' of the train state is not"):
        ckpt.restore(m, 1, extra)
    fewer = _zeros_like(state)
    del fewer["params"]["b"]
    with pytest.raises(
        CheckpointError, match="has leaf 'params/b' that the train state lacks"
    ):
        ckpt.restore(m, 1, fewer)
    with pytest.raises(CheckpointError, match=r"no checkpoint .*available steps: \[1\]"):
        ckpt.restore(m, 9, _zeros_like(state))
    # Corrupt every stored data file of the state item.
    state_dir = tmp_path / "checkpoints" / "1" / "state"
    for d, _, files in os.walk(state_dir):
        for f in files:
            if f not in ("_METADATA", "_CHECKPOINT_METADATA", "_sharding"):
                with open(os.path.join(d, f), "wb") as fh:
                    fh.write(b"garbage")
    before = _listing(tmp_path)
    with pytest.raises(CheckpointError) as info:
        ckpt.restore(m, 1, _zeros_like(state))
    assert "\n" not in str(info.value) and "use a new out_dir or delete it" in str(info.value)
    assert _listing(tmp_path) == before
    ckpt.close(m)


_KILLED_CHILD = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_checkpoint import _state
from ais_jax.run import checkpoint as ckpt
m = ckpt.open_manager({out!r}, keep=2)
ckpt.save(m, 3, _state(3), {{"ok": True}})
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sigkill_right_after_save_leaves_a_complete_checkpoint(tmp_path):
    code = _KILLED_CHILD.format(tests=os.path.dirname(__file__), out=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    m = ckpt.open_manager(tmp_path, keep=2)
    assert ckpt.latest_step(m) == 3
    _assert_bit_exact(ckpt.restore(m, 3, _zeros_like(_state())), _state(3))
    assert ckpt.read_metadata(m, 3) == {"ok": True}
    ckpt.close(m)


def test_restore_into_sharded_target_on_a_mesh(tmp_path):
    state = _state()
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))
    m = ckpt.open_manager(tmp_path, keep=1)
    with jax.set_mesh(mesh):
        sharding = NamedSharding(mesh, PartitionSpec("fsdp", None))
        sharded = dict(state)
        sharded["params"] = dict(state["params"], w=jax.device_put(state["params"]["w"], sharding))
        ckpt.save(m, 0, sharded)
        target = jax.tree.map(jnp.zeros_like, sharded)
        target["params"]["w"] = jax.device_put(jnp.zeros((3, 4)), sharding)
        out = ckpt.restore(m, 0, target)
        assert out["params"]["w"].sharding == sharding
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target
        )
        out2 = ckpt.restore(m, 0, abstract)
        assert out2["params"]["w"].sharding == sharding
    _assert_bit_exact(out, state)
    _assert_bit_exact(out2, state)
    ckpt.close(m)


def test_open_manager_errors(tmp_path):
    with pytest.raises(CheckpointError, match="keep must be an int >= 1"):
        ckpt.open_manager(tmp_path, keep=0)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").write_text("not a dir")
    with pytest.raises(CheckpointError, match="is not a directory"):
        ckpt.open_manager(tmp_path / "run", keep=1)


def test_non_json_metadata_raises(tmp_path):
    m = ckpt.open_manager(tmp_path, keep=1)
    with pytest.raises(CheckpointError, match="JSON-serializable"):
        ckpt.save(m, 0, {"x": jnp.ones(1)}, {"bad": object()})
    assert ckpt.latest_step(m) is None
    ckpt.close(m)


_TWO_DEVICE_CHILD = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from ais_jax.run import checkpoint as ckpt
assert len(jax.devices()) == 2
mesh = Mesh(np.array(jax.devices()).reshape(2, 1), ("fsdp", "tensor"))
rows = NamedSharding(mesh, P("fsdp", None))
cols = NamedSharding(mesh, P(None, "fsdp"))
w = jax.device_put(jnp.arange(32, dtype=jnp.bfloat16).reshape(4, 8), rows)
m = ckpt.open_manager({out!r}, keep=1)
ckpt.save(m, 1, {{"w": w, "step": jnp.int32(1)}})
target = {{"w": jax.ShapeDtypeStruct((4, 8), jnp.bfloat16, sharding=cols),
          "step": jnp.int32(0)}}
out = ckpt.restore(m, 1, target)
assert out["w"].sharding == cols, out["w"].sharding
assert len(out["w"].addressable_shards) == 2
assert out["w"].addressable_shards[0].data.shape == (4, 4)
np.testing.assert_array_equal(np.asarray(out["w"]), np.asarray(w))
ckpt.close(m)
print("OK")
"""


def test_restore_reshards_across_two_devices(tmp_path):
    code = _TWO_DEVICE_CHILD.format(out=str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]


_HOLDER = """
import os, sys
from ais_jax.run.stderr_hold import stderr_held
os.write(2, b"before\\n")
with stderr_held() as held:
    os.write(2, b"held line\\n")  # as C++ writes it: straight to descriptor 2
    held.drop = sys.argv[1] == "drop"
    if sys.argv[1] == "abort":  # a fatal error inside a save (a peer's death, a C++ check)
        os.abort()
os.write(2, b"after\\n")
"""


@pytest.mark.parametrize("how, expected", [
    ("keep", "before\nheld line\nafter\n"),
    ("drop", "before\nafter\n"),
    ("abort", "before\nheld line\n"),  # once swallowed: the held text died with the process
])
def test_stderr_held_during_a_save_is_written_dropped_or_kept_on_a_crash(how, expected):
    proc = subprocess.run([sys.executable, "-c", _HOLDER, how], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == (-signal.SIGABRT if how == "abort" else 0), proc.stderr
    assert proc.stderr == expected
