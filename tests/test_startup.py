"""Start-up is sharded from the first byte (issue 37 item 1; `ais_jax.training.startup`).

A subprocess with 4 simulated devices (``mesh.fsdp=4``) builds each start-up path and
checks, after the model is built and after the whole run is built, that no leaf the mesh
shards sits whole on one device and that no large single-device array is alive; the
params equal the single-device start-up's bit for bit.  The loaders' sharded reading is
also checked in-process against the whole-array reading.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests._tiny import TINY_MODEL, child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = [*TINY_MODEL, "model.hidden_size=64", "model.intermediate_size=128",
        "mesh.fsdp=4", "rollout.prompts_per_step=4", "rollout.group_size=2", "sft.steps=0",
        "task.eval_size=4", "log.tensorboard=false", "log.progress=false"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny scratch model saved as an HF directory (char tokenizer beside it)."""
    from ais_jax.config.load import load_config
    from ais_jax.models.pretrained import save_pretrained
    from ais_jax.training import build

    cfg = load_config(None, BASE)
    params, mcfg, codec = build.build_model(cfg, build.build_task(cfg))
    out = tmp_path_factory.mktemp("hf")
    save_pretrained(params, mcfg, out)
    codec.tokenizer.save(str(out))
    return str(out)


@pytest.fixture(scope="module")
def llada_dir(tmp_path_factory):
    """A tiny scratch LLaDA policy saved in the LLaDA format."""
    from ais_jax.config.load import load_config
    from ais_jax.models.llada import checkpoint as llada_ckpt
    from ais_jax.training import build

    cfg = load_config(None, [*BASE, "model.kind=llada"])
    params, lcfg, codec = build.build_model(cfg, build.build_task(cfg))
    out = tmp_path_factory.mktemp("llada")
    llada_ckpt.save(str(out), params, lcfg)
    codec.tokenizer.save(str(out))
    return str(out)


@pytest.mark.slow  # one subprocess building five runs on 4 simulated devices (~40 s)
def test_startup_never_holds_a_sharded_leaf_whole_on_one_device(hf_dir, llada_dir):
    cases = {
        "scratch": BASE,
        "hf": [*BASE, f"model.source={hf_dir}"],
        "llada_scratch": [*BASE, "model.kind=llada"],
        "llada_dir": [*BASE, f"model.source={llada_dir}"],
        "lora_hf": [*BASE, f"model.source={hf_dir}", "lora.rank=4", "lora.alpha=8"],
    }
    env = child_env()
    env.update(JAX_NUM_CPU_DEVICES="4", JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "_startup_probe.py"),
                        json.dumps(cases)], capture_output=True, text=True, timeout=600,
                       env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for name, r in got.items():
        assert r["split_leaves"] >= 3, (name, r)  # the mesh really splits the linears
        assert r["params"] == [], (name, r)
        assert r["state"] == [], (name, r)
        assert r.get("base", []) == [], (name, r)
        assert r["live_after_model"] == [], (name, r)
        assert r["live_after_run"] == [], (name, r)
        assert r["same_params"], name
        assert r["step"] == 0


@pytest.mark.slow  # ~11 s in the full suite on 2 busy cores
def test_sharded_load_reads_the_same_weights_as_the_whole_load(tmp_path):
    """`load_pretrained(shardings=...)` gives the whole load's values in the given layout,
    and each shard callback reads only its slice (the callback sees shard-sized indices)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from ais_jax.models import weight_files
    from ais_jax.models.model import ModelConfig, init_params
    from ais_jax.models.pretrained import load_pretrained, save_pretrained

    mc = ModelConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_layers=3,
                     num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    save_pretrained(init_params(jax.random.key(3), mc), mc, tmp_path)
    whole, _ = load_pretrained(tmp_path, np.float32)
    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    layer_split = NamedSharding(mesh, PartitionSpec())

    reads: list[tuple] = []
    orig = weight_files.safetensors_tensor

    def spy(handle, name):
        t = orig(handle, name)
        return weight_files.LazyTensor(t.shape, lambda idx: (reads.append(idx), t.read(idx))[1])

    weight_files.safetensors_tensor = spy
    try:
        got, _ = load_pretrained(tmp_path, np.float32,
                                 shardings=lambda cfg: jax.tree.map(lambda _: layer_split, whole))
    finally:
        weight_files.safetensors_tensor = orig
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert b.sharding == layer_split
    assert reads, "the sharded load read nothing through the lazy tensors"


def test_build_leaf_reads_only_the_requested_layers():
    """A stacked leaf's callback for layers [1, 3) reads layers 1 and 2 only, sliced."""
    from ais_jax.models import weight_files

    layers = [np.full((4, 6), i, np.float32) for i in range(4)]
    seen: list[tuple[int, tuple]] = []

    def lazy(i):
        return weight_files.LazyTensor((4, 6), lambda idx: (seen.append((i, idx)),
                                                             layers[i][idx])[1])

    parts = [lazy(i) for i in range(4)]
    captured = {}

    class Spy:  # a stand-in sharding: build_leaf hands it to make_array_from_callback
        pass

    orig = jax.make_array_from_callback

    def fake(shape, sharding, cb):
        captured["shape"] = shape
        return cb((slice(1, 3), slice(0, 2), slice(None)))

    jax.make_array_from_callback = fake
    try:
        out = weight_files.build_leaf(parts, [f"l{i}" for i in range(4)], True, np.float32,
                                      "src", True, Spy())
    finally:
        jax.make_array_from_callback = orig
    assert captured["shape"] == (4, 4, 6)
    assert out.shape == (2, 2, 6)
    np.testing.assert_array_equal(out[:, 0, 0], [1.0, 2.0])
    assert [i for i, _ in seen] == [1, 2]
    assert all(idx == (slice(0, 2), slice(None)) for _, idx in seen)


def test_build_leaf_refuses_non_finite_slices():
    from ais_jax.core.errors import CheckpointError
    from ais_jax.models import weight_files

    bad = np.ones((2, 3), np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(CheckpointError, match="'w' in src holds 1 non-finite"):
        weight_files.build_leaf([weight_files.array_tensor(bad)], ["w"], False, np.float32,
                                "src", True)
