"""Hostile and broken user input ends as one line and exit 2, fast, never as a traceback.

Config parsing is bounded (aliases, depth, number length, duplicate keys),
every user error takes the `UsageError` path (datasets, seed, task
difficulty, model dims, out_dir), and pretrained weights are checked at
load (non-finite values, shard paths outside the model directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ais_jax.config.load import load_config
from ais_jax.core.errors import CheckpointError, UsageError
from ais_jax.core.safe_yaml import clip
from ais_jax.models import layout, model
from ais_jax.models.hf_config import model_config_from_hf
from ais_jax.models.pretrained import load_pretrained, save_pretrained
from ais_jax.tasks import load_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BOMB_ROWS = [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 10)]
BOMB_YAML = "\n".join(["l0: &l0 [x, x, x, x, x, x, x, x, x]", *_BOMB_ROWS, "seed: *l9"]) + "\n"
BOMB_OVERRIDE = "seed=[&a [1,1,1,1,1,1,1,1,1], " + ", ".join(
    f"&{b} [" + ",".join([f"*{a}"] * 9) + "]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
) + "]"


def _cli(*args: str, cwd: str = ROOT) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ais_jax.train", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - start


def _assert_one_line_exit_2(proc: subprocess.CompletedProcess, needle: str) -> None:
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(err.splitlines()) <= 3 and len(err.encode()) < 500, err[:2000]
    assert err.startswith("error: ") and "Traceback" not in err
    assert needle in err, err


# ----------------------------------------------------------------------------- config parsing


def test_alias_bomb_file_and_override_exit_2_fast(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB_YAML)
    for args in (["--config", str(bomb)], [BOMB_OVERRIDE]):
        proc, seconds = _cli("--print-config", *args)
        _assert_one_line_exit_2(proc, "anchors and aliases")
        assert seconds < 2 + 3, seconds  # < 2 s of parsing; the rest is interpreter start-up
    start = time.monotonic()  # in-process, without the interpreter start-up
    for path, overrides in ((bomb, ()), (None, [BOMB_OVERRIDE])):
        with pytest.raises(UsageError) as e:
            load_config(path, overrides)
        assert len(str(e.value).encode()) < 500
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("text,needle", [
    ("seed: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested more than 32 deep"),
    ("seed: " + "9" * 5000 + "\n", "number of 5000 characters"),
    ("seed: 1\nout_dir: x\nseed: 2\n", "line 3: duplicate key 'seed' (first at line 1)"),
    ("task:\n  difficulty: {digits: 2, digits: 3}\n", "duplicate key 'digits'"),
])
def test_bounded_yaml_file(tmp_path, text, needle):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match="YAML syntax error") as e:
        load_config(path)
    msg = str(e.value)
    assert needle in msg and len(msg) < 500 and "\n" not in msg


@pytest.mark.parametrize("override,needle", [
    ("seed=" + "[" * 100_000, "nested more than 32 deep"),
    ("seed=" + "9" * 5000, "number of 5000 characters"),
    ("task.difficulty={digits: 2, digits: 3}", "duplicate key 'digits'"),
    ("train.steps=" + "x" * 100_000, "must be an int"),
    ("x" * 100_000 + "=1", "unknown config key"),
])
def test_bounded_overrides_and_clipped_messages(override, needle):
    with pytest.raises(UsageError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert needle in msg and len(msg) < 500 and "\n" not in msg


def test_clip_bounds_any_value():
    assert len(clip("x" * 10_000)) < 120
    assert "digits" in clip(10**5000)


def test_empty_config_file_means_defaults(tmp_path):
    assert load_config(os.devnull) == load_config(None)


# ----------------------------------------------------------------------------- config values


@pytest.mark.parametrize("override,needle", [
    ("seed=-1", "seed must be in [0, 2**32), got -1"),
    ("task.difficulty.digits=99", "task.difficulty is invalid for task arithmetic: digits"),
    ("task.difficulty.digitz=2", "'digitz', which task arithmetic does not take"),
    ("task.difficulty.ops=5", "task.difficulty.ops=5 must be a str for task arithmetic"),
])
def test_bad_values_are_usage_errors(override, needle):
    with pytest.raises(UsageError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_out_dir_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is an existing file, not a directory"):
        load_config(None, [f"out_dir={tmp_path / 'f'}"])


def test_seed_cli_exit_2():
    proc, _ = _cli("--print-config", "seed=-1")
    _assert_one_line_exit_2(proc, "seed must be in")


# ----------------------------------------------------------------------------- datasets


def test_malformed_dataset_row_exits_2(tmp_path):
    data = tmp_path / "gsm.jsonl"
    data.write_text('{"question": "1+1?", "answer": "so #### 2"}\n{"question": 5}\n')
    proc, _ = _cli(f"out_dir={tmp_path / 'run'}", "task.name=gsm8k", f"task.train_file={data}",
                   "task.difficulty={}", "log.tensorboard=false", "log.progress=false")
    _assert_one_line_exit_2(proc, f"{data}:2: field 'question'")


@pytest.mark.parametrize("row,needle", [
    ('{"problem": "p", "answer": 1e400}', "must be a finite number"),
    ('{"problem": "p", "answer": NaN}', "must be a finite number"),
    ('{"problem": "p", "answer": ' + "9" * 5000 + "}", "unreadable JSON"),
    ("[" * 100_000, "JSON"),
])
def test_bad_answers_name_file_and_line(tmp_path, row, needle):
    data = tmp_path / "m.jsonl"
    data.write_text('{"problem": "ok", "answer": 1}\n' + row + "\n")
    with pytest.raises(UsageError) as e:
        load_jsonl(data)
    assert str(e.value).startswith(f"{data}:2:") and needle in str(e.value)


# ----------------------------------------------------------------------------- model files


def test_zero_or_negative_dims_in_hf_config():
    base = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 1, "num_attention_heads": 4}
    assert model_config_from_hf(base).head_dim == 8
    for key in ("num_attention_heads", "hidden_size", "num_hidden_layers", "vocab_size"):
        for bad in (0, -2):
            with pytest.raises(CheckpointError, match=f"'{key}' must be a positive int"):
                model_config_from_hf(base | {key: bad})


@pytest.fixture
def hf_dir(tmp_path):
    cfg = model.ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2,
                            num_heads=2, num_kv_heads=1, head_dim=8, arch="llama")
    save_pretrained(model.init_params(jax.random.key(0), cfg), cfg, tmp_path / "hf")
    return tmp_path / "hf"


@pytest.mark.slow  # ~5 s in the full suite on 2 busy cores
def test_heads_0_in_config_json(hf_dir):
    config = json.loads((hf_dir / "config.json").read_text())
    del config["head_dim"]
    (hf_dir / "config.json").write_text(json.dumps(config | {"num_attention_heads": 0}))
    with pytest.raises(CheckpointError, match="'num_attention_heads' must be a positive int"):
        load_pretrained(hf_dir)


def test_non_finite_safetensors_weights_name_the_tensor(hf_dir):
    tensors = load_file(hf_dir / "model.safetensors")
    name = sorted(n for n in tensors if n.startswith("model.layers.1."))[0]
    tensors[name] = tensors[name].copy()
    tensors[name].flat[3] = np.nan
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"tensor '{name}' in .* holds 1 non-finite"):
        load_pretrained(hf_dir, dtype=jnp.float32)
    params, _ = load_pretrained(hf_dir, dtype=jnp.float32, check_finite=False)  # opt-out
    assert not all(bool(jnp.isfinite(x).all()) for x in jax.tree_util.tree_leaves(params))


def test_overflow_on_cast_is_refused(hf_dir):
    tensors = load_file(hf_dir / "model.safetensors")
    name = layout.hf_name("embed")
    tensors[name] = tensors[name].copy()
    tensors[name][0, 0] = 1e38  # finite in float32, inf in float16
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"tensor '{name}'.*overflow the load dtype"):
        load_pretrained(hf_dir, dtype=jnp.float16)


def test_non_finite_gguf_weights_name_the_tensor(hf_dir, tmp_path):
    import gguf

    c = json.loads((hf_dir / "config.json").read_text())
    tensors = load_file(hf_dir / "model.safetensors")
    cfg = model.ModelConfig(64, 16, 32, 2, 2, 1, 8, tie_embeddings=c["tie_word_embeddings"])
    table = layout.param_table(cfg)
    names = {layout.hf_name(k): layout.gguf_name(k) for k in table if k != "layers"}
    names |= {layout.hf_name(k, i): layout.gguf_name(k, i) for k in table["layers"]
              for i in range(2)}
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    for add, key in ((w.add_block_count, "num_hidden_layers"),
                     (w.add_context_length, "max_position_embeddings"),
                     (w.add_embedding_length, "hidden_size"),
                     (w.add_feed_forward_length, "intermediate_size"),
                     (w.add_head_count, "num_attention_heads"),
                     (w.add_head_count_kv, "num_key_value_heads"), (w.add_key_length, "head_dim")):
        add(c[key])
    bad = layout.gguf_name(sorted(table["layers"])[0], 1)
    for hf_name, t in sorted(tensors.items()):
        t = t.astype(np.float32)
        if names[hf_name] == bad:
            t[..., 0] = np.inf
        w.add_tensor(names[hf_name], t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=f"tensor '{bad}' in .* non-finite"):
        load_pretrained(tmp_path / "m.gguf", dtype=jnp.float32)


@pytest.mark.parametrize("shard", ["../../etc/passwd", "/etc/passwd", "a/../../x.safetensors"])
def test_shard_paths_outside_the_directory_are_refused_before_opening(hf_dir, shard,
                                                                     monkeypatch):
    tensors = load_file(hf_dir / "model.safetensors")
    weight_map = dict.fromkeys(tensors, "model.safetensors")
    weight_map[sorted(tensors)[0]] = shard
    (hf_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    opened = []
    import safetensors

    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open",
                        lambda f, **kw: opened.append(f) or real(f, **kw))
    with pytest.raises(CheckpointError, match="outside the model directory; refusing"):
        load_pretrained(hf_dir)
    assert opened == []


def test_shard_in_a_subdirectory_still_loads(hf_dir):
    tensors = load_file(hf_dir / "model.safetensors")
    (hf_dir / "sub").mkdir()
    os.replace(hf_dir / "model.safetensors", hf_dir / "sub" / "w.safetensors")
    index = {"weight_map": dict.fromkeys(tensors, "sub/./w.safetensors")}
    (hf_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    params, _ = load_pretrained(hf_dir, dtype=jnp.float32)
    assert params["layers"]
