"""Run by tests/test_startup.py in a process with 4 simulated devices (``mesh.fsdp=4``).

For each start-up path (scratch, HF directory, GGUF-free LLaDA scratch and directory, LoRA
over an HF base) it builds the model with the mesh and then the whole run, and after each
phase inspects every array alive: a leaf the mesh shards must never sit whole on one
device.  Prints one JSON line: ``{path: {"params": [...bad], "state": [...bad], "live": [...]}}``
plus the digests that tie the sharded start-up to the single-device one.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

from ais_jax.config.load import load_config
from ais_jax.training import build, startup
from ais_jax.training import sharding as shd
from ais_jax.training.steps import model_shardings


def whole_on_one_device(shapes: set) -> list[str]:
    """Live single-device arrays of the full shape of a leaf the mesh splits."""
    return [f"{x.shape}" for x in jax.live_arrays()
            if len(x.sharding.device_set) == 1 and tuple(x.shape) in shapes]


def digest(tree) -> str:
    import hashlib

    h = hashlib.sha256()
    for x in jax.tree.leaves(tree):
        h.update(np.asarray(jax.device_get(x)).tobytes())
    return h.hexdigest()


def probe(over: list[str]) -> dict:
    cfg = load_config(None, over)
    task = build.build_task(cfg)
    mesh = build.build_mesh(cfg)
    params, _, _ = build.build_model(cfg, task, mesh)
    sh = shd.param_shardings(params, mesh)
    # the shapes of the leaves the mesh splits: no array of such a shape may be whole on one
    # device (a shard of another leaf never has a split leaf's full shape here: all differ)
    split = {tuple(x.shape) for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(sh),
                                            strict=True) if not s.is_fully_replicated}
    out = {"params": startup.full_leaves_on_one_device(params, sh),
           "live_after_model": whole_on_one_device(split), "split_leaves": len(split)}
    ref, _, _ = build.build_model(cfg, task)  # the single-device start-up, for the digest
    out["same_params"] = digest(ref) == digest(params)
    del params, ref
    run = build.build_run(cfg)
    out["state"] = startup.full_leaves_on_one_device(run.state, run.fns.state_shardings)
    if run.lora is not None:
        out["base"] = startup.full_leaves_on_one_device(run.lora.base, model_shardings(run.fns))
    out["live_after_run"] = whole_on_one_device(split)
    out["step"] = int(run.state.step)
    return out


if __name__ == "__main__":
    cases = json.loads(sys.argv[1])
    print(json.dumps({name: probe(over) for name, over in cases.items()}))
