"""``model.source`` and ``model.adapter`` in a bucket (issue 56), against the in-memory GCS
emulator: the same params, digest and adapters as from a local copy, read in ranges."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _models import TINY
from test_lora import LC, _random_adapters

from ais_jax.core import storage
from ais_jax.models import model, peft_io, weight_files
from ais_jax.models.base_digest import source_digest
from ais_jax.models.pretrained import load_pretrained, save_pretrained


def _upload(local, remote):
    storage.upload_dir(str(local), remote)
    return remote


def test_weights_from_a_bucket_equal_the_local_copy(gcs_bucket, tmp_path, monkeypatch):
    cfg = model.ModelConfig(96, 32, 48, 2, 4, 2, 8)
    params = model.init_params(jax.random.key(0), cfg)
    save_pretrained(jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), cfg, tmp_path / "m")
    remote = _upload(tmp_path / "m", f"{gcs_bucket}/Qwen-tiny")
    monkeypatch.chdir(tmp_path / "m")  # nothing may be written locally while loading
    before = sorted(os.listdir("."))
    want, want_cfg = load_pretrained(str(tmp_path / "m"))
    got, got_cfg = load_pretrained(remote)
    assert got_cfg == want_cfg
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert source_digest(remote) == source_digest(str(tmp_path / "m"))
    assert sorted(os.listdir(".")) == before


def test_remote_slices_read_only_their_rows(gcs_bucket, tmp_path, monkeypatch):
    from safetensors.numpy import save_file

    arr = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    save_file({"w": arr, "s": np.array(3.0, np.float32)}, str(tmp_path / "x.safetensors"))
    remote = f"{gcs_bucket}/x.safetensors"
    storage.write_bytes(remote, (tmp_path / "x.safetensors").read_bytes())
    f = weight_files.RemoteSafetensors(remote)
    reads = []
    real = storage.read_bytes
    monkeypatch.setattr(
        storage, "read_bytes", lambda p, a=None, b=None: reads.append((a, b)) or real(p, a, b)
    )
    part = f.get_slice("w")
    assert part.get_shape() == [6, 5]
    np.testing.assert_array_equal(part[(slice(2, 4), slice(1, 3))], arr[2:4, 1:3])
    assert len(reads) == 1 and reads[0][1] - reads[0][0] == 2 * 5 * 4  # two rows, no more
    np.testing.assert_array_equal(part[(slice(None), slice(None))], arr)
    np.testing.assert_array_equal(f.get_slice("s")[()], np.float32(3.0))


def test_peft_adapter_from_a_bucket(gcs_bucket, tmp_path):
    a = _random_adapters(TINY, LC)
    peft_io.save_peft_adapter(a, LC, TINY, tmp_path / "ad")
    remote = _upload(tmp_path / "ad", f"{gcs_bucket}/ad")
    want, want_cfg = peft_io.load_peft_adapter(str(tmp_path / "ad"), TINY)
    got, got_cfg = peft_io.load_peft_adapter(remote, TINY)
    assert got_cfg == want_cfg
    jax.tree.map(np.testing.assert_array_equal, got, want)


@pytest.mark.slow  # ~8 s: the transformers import
def test_tokenizer_from_a_bucket_leaves_the_weights_there(gcs_bucket, tmp_path, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ais_jax.models.pretrained import load_tokenizer

    t = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1, "there": 2}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]").save_pretrained(tmp_path / "t")
    (tmp_path / "t" / "model.safetensors").write_bytes(b"not read")
    remote = _upload(tmp_path / "t", f"{gcs_bucket}/tok")
    read = []
    real = storage.read_bytes
    monkeypatch.setattr(
        storage, "read_bytes", lambda p, a=None, b=None: read.append(p) or real(p, a, b)
    )
    tok = load_tokenizer(remote)
    assert tok("hi there")["input_ids"] == [1, 2]
    assert read and not [p for p in read if p.endswith(".safetensors")]


def test_llada_dir_from_a_bucket_equals_the_local_copy(gcs_bucket, tmp_path, monkeypatch):
    from ais_jax.config.load import load_config
    from ais_jax.models.llada import checkpoint as llada_ckpt
    from ais_jax.models.llada.model import LLaDAConfig, init_params
    from ais_jax.tasks import CharTokenizer
    from ais_jax.training.build import build_llada, build_task, model_kind

    tok = CharTokenizer()  # a LLaDA policy exported by a scratch run: its tokenizer beside it
    cfg = LLaDAConfig(
        vocab_size=tok.vocab_size + 1, hidden_size=32, intermediate_size=64, num_layers=2,
        num_heads=2, num_kv_heads=1, mask_token_id=tok.vocab_size,
        text_vocab_size=tok.vocab_size, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
    )  # fmt: skip
    llada_ckpt.save(str(tmp_path / "l"), init_params(jax.random.key(0), cfg), cfg)
    tok.save(str(tmp_path / "l"))
    remote = _upload(tmp_path / "l", f"{gcs_bucket}/LLaDA-tiny")
    monkeypatch.chdir(tmp_path / "l")  # nothing may be written locally while loading
    before = sorted(os.listdir("."))
    want, want_cfg = llada_ckpt.load(str(tmp_path / "l"))
    got, got_cfg = llada_ckpt.load(remote)
    assert got_cfg == want_cfg == cfg
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert llada_ckpt.is_llada_dir(remote) and not llada_ckpt.is_llada_dir(f"{gcs_bucket}/none")
    run_cfg = load_config(None, [f"model.source={remote}", "task.prompt_style=compact"])
    assert model_kind(run_cfg) == "llada"  # model.kind=auto reads the bucket's config.json
    params, _, codec = build_llada(run_cfg, build_task(run_cfg, None))  # as a run starts
    assert isinstance(codec.tokenizer, CharTokenizer)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b.astype(a.dtype)), params, want)
    assert source_digest(remote) == source_digest(str(tmp_path / "l"))
    assert sorted(os.listdir(".")) == before


def test_gguf_in_a_bucket_is_refused_with_its_fix(gcs_bucket, tmp_path, monkeypatch, capsys):
    from _tiny import TINY_RUN

    from ais_jax.run import cli

    monkeypatch.chdir(tmp_path)
    src = f"{gcs_bucket}/SmolLM2.Q4_1.gguf"
    argv = [f"out_dir={tmp_path / 'run'}", *TINY_RUN, f"model.source={src}"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"model.source {src!r}: GGUF files are not read from a bucket; copy it to" in err
    assert os.listdir(tmp_path) == []  # refused before anything is written
