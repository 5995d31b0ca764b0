"""LLaDA checkpoint files get the autoregressive loader's checks (ais_jax.models.weight_files).

A tiny checkpoint written with `ais_jax.models.llada.checkpoint.save`, then corrupted: one
NaN / inf in a tensor, a truncated safetensors file, an index naming shards outside the
directory, a missing shard, a missing or malformed config.json.  Each is a one-line
`CheckpointError` naming the file or tensor (before: NaN loaded silently and failed much
later as ``token id 99 is out of range``; a truncated file raised a ``SafetensorError``
traceback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from _tiny import TINY_RUN
from safetensors.numpy import load_file, save_file

from ais_jax.core.errors import CheckpointError
from ais_jax.models.llada.checkpoint import load, save
from ais_jax.models.llada.model import LLaDAConfig, init_params
from ais_jax.tasks import CharTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = CharTokenizer()
# A scratch-style LLaDA over the character tokenizer (saved beside it), as a run exports.
CFG = LLaDAConfig(vocab_size=TOK.vocab_size + 1, hidden_size=32, intermediate_size=64,
                  num_layers=2, num_heads=2, num_kv_heads=1, mask_token_id=TOK.vocab_size,
                  text_vocab_size=TOK.vocab_size, eos_token_id=TOK.eos_id,
                  pad_token_id=TOK.pad_id)
Q1 = "model.transformer.blocks.1.q_proj.weight"
WTE = "model.transformer.wte.weight"


def _ckpt(tmp_path) -> str:
    d = str(tmp_path / "llada")
    save(d, init_params(jax.random.key(0), CFG), CFG)
    TOK.save(d)
    return d


def _set(d: str, name: str, value: float) -> None:
    """Write ``value`` into element [3, 4] of tensor ``name`` of ``d``'s model.safetensors."""
    f = os.path.join(d, "model.safetensors")
    tensors = load_file(f)
    tensors[name] = tensors[name].copy()
    tensors[name][3, 4] = value
    save_file(tensors, f, metadata={"format": "pt"})


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, CheckpointError)
    return msg


def test_clean_checkpoint_loads(tmp_path):
    params, cfg = load(_ckpt(tmp_path))
    assert cfg == CFG
    want = init_params(jax.random.key(0), CFG)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name,value", [(Q1, np.nan), (WTE, np.inf), (WTE, -np.inf)])
def test_non_finite_tensor_is_named(tmp_path, name, value):
    d = _ckpt(tmp_path)
    _set(d, name, value)
    with pytest.raises(CheckpointError) as e:
        load(d)
    msg = _one_line(e)
    assert f"tensor {name!r} in {d} holds 1 non-finite values" in msg, msg
    params, _ = load(d, check_finite=False)  # the check can be skipped
    leaf = params["layers"]["wq"][1] if name == Q1 else params["embed"]
    assert not np.isfinite(np.asarray(leaf)[3, 4])


def test_truncated_file_is_one_line(tmp_path):
    d = _ckpt(tmp_path)
    f = os.path.join(d, "model.safetensors")
    with open(f, "rb") as src:
        data = src.read()
    for cut in (len(data) - 100, 40):  # data cut short; header cut short
        with open(f, "wb") as out:
            out.write(data[:cut])
        with pytest.raises(CheckpointError) as e:
            load(d)
        assert f"{f} is not a readable safetensors file" in _one_line(e)


def _shard(d: str, weight_map: dict) -> None:
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def test_index_shards_stay_inside_the_directory(tmp_path):
    d = _ckpt(tmp_path)
    names = list(load_file(os.path.join(d, "model.safetensors")))
    # A valid index over the renamed file loads.
    os.rename(os.path.join(d, "model.safetensors"), os.path.join(d, "part-1.safetensors"))
    _shard(d, dict.fromkeys(names, "part-1.safetensors"))
    params, _ = load(d)
    assert params["layers"]["wq"].shape == (2, 32, 32)  # [L, Q*H, D]
    for bad in ("../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors"):
        _shard(d, {**dict.fromkeys(names, "part-1.safetensors"), Q1: bad})
        with pytest.raises(CheckpointError) as e:
            load(d)
        assert "outside the model directory" in _one_line(e)
    _shard(d, {**dict.fromkeys(names, "part-1.safetensors"), Q1: "part-2.safetensors"})
    with pytest.raises(CheckpointError) as e:
        load(d)
    assert "part-2.safetensors is missing" in _one_line(e)
    _shard(d, {n: "part-1.safetensors" for n in names if n != Q1})
    with pytest.raises(CheckpointError) as e:
        load(d)
    assert f"missing tensor {Q1}" in _one_line(e)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError) as e:
        load(d)
    assert "is not valid JSON" in _one_line(e)


def test_missing_or_malformed_config(tmp_path):
    d = _ckpt(tmp_path)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path, "w") as f:
        f.write('{"d_model": 32,')
    with pytest.raises(CheckpointError) as e:
        load(d)
    assert "config.json is not valid JSON" in _one_line(e)
    os.remove(cfg_path)
    with pytest.raises(CheckpointError) as e:
        load(d)
    assert "config.json not found" in _one_line(e)


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
def test_training_cli_refuses_a_nan_checkpoint_in_one_line(tmp_path):
    d = _ckpt(tmp_path)
    _set(d, Q1, np.nan)
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run(
        [sys.executable, "-m", "ais_jax.train", *TINY_RUN, "model.kind=auto",
         f"model.source={d}", "rollout.max_new_tokens=8", "diffusion.block_length=4",
         "diffusion.steps=4", "checkpoint.every=0", f"out_dir={tmp_path}/r"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    err = proc.stderr.strip()
    assert proc.returncode == 2, err[-1500:]
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err[-1500:]
    assert Q1 in err and "non-finite" in err
