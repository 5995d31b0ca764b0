"""Tests for ais_jax.models.peft_io: PEFT LoRA adapter files both ways, checked against peft and
transformers on tiny random Qwen3 / Llama models, and every refusal."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
from _models import TINY
from safetensors.numpy import load_file, save_file
from test_lora import LC, _random_adapters, fwd
from test_pretrained import _batch, _hf_logits, _make_hf

from ais_jax.core.errors import CheckpointError, UsageError
from ais_jax.models import lora, peft_io
from ais_jax.models.llada import model as llada
from ais_jax.models.pretrained import load_pretrained

# ----------------------------------------------------------------------------- parity with peft


def _rel_close(ours: np.ndarray, ref: np.ndarray, mask: np.ndarray, rtol: float = 1e-4) -> None:
    valid = mask.astype(bool)
    diff = float(np.abs(ours - ref)[valid].max())
    assert diff <= rtol * float(np.abs(ref[valid]).max()), f"max |logit diff| {diff:.3g}"
    np.testing.assert_array_equal(ours.argmax(-1)[valid], ref.argmax(-1)[valid])


def _ours(params, cfg, adapters, lora_cfg, tokens, mask) -> np.ndarray:
    return np.asarray(fwd(lora.with_adapters(params, adapters, lora_cfg), jnp.asarray(tokens), cfg,
                          jnp.asarray(mask)))


@pytest.mark.parametrize("case, lora_cfg", [
    ("qwen3_qk_norm", LC),
    ("llama3_rope_head_dim", lora.LoraConfig(rank=3, alpha=5.0, targets=("wq", "wv", "wo",
                                                                         "w_down"),
                                             dropout=0.1, rslora=True)),
])
def test_exported_adapter_loads_in_peft_with_the_same_logits(tmp_path, case, lora_cfg):
    hf, path = _make_hf(tmp_path, case)
    params, cfg = load_pretrained(path, dtype=jnp.float32)
    a = _random_adapters(cfg, lora_cfg)
    out = tmp_path / "adapter"
    peft_io.save_peft_adapter(a, lora_cfg, cfg, out, base_model_name_or_path=str(path))
    tokens, mask = _batch(cfg.vocab_size)
    base_logits = _hf_logits(hf, tokens, mask)
    pm = peft.PeftModel.from_pretrained(hf, out).eval()
    assert pm.peft_config["default"].r == lora_cfg.rank
    assert pm.peft_config["default"].use_rslora == lora_cfg.rslora
    ref = _hf_logits(pm, tokens, mask)
    assert np.abs(ref - base_logits).max() > 0.1  # the adapter changes the model
    _rel_close(_ours(params, cfg, a, lora_cfg, tokens, mask), ref, mask)
    back, back_cfg = peft_io.load_peft_adapter(out, cfg)  # and it round-trips exactly
    assert back_cfg == lora_cfg
    jax.tree.map(np.testing.assert_array_equal, back, a)


@pytest.mark.parametrize("case, targets, rslora", [
    ("qwen3_qk_norm", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                       "down_proj"], False),
    ("llama_untied_mha_biases", ["self_attn.k_proj", "o_proj", "up_proj"], False),
    # rsLoRA: PEFT scales by alpha / sqrt(r) = 6 here, not alpha / r = 3
    ("llama_untied_mha_biases", ["q_proj", "v_proj", "down_proj"], True),
])
def test_peft_made_adapter_loads_with_the_same_logits(tmp_path, case, targets, rslora):
    hf, path = _make_hf(tmp_path, case)
    params, cfg = load_pretrained(path, dtype=jnp.float32)
    tokens, mask = _batch(cfg.vocab_size, seed=2)
    base_logits = _hf_logits(hf, tokens, mask)
    torch.manual_seed(0)
    pm = peft.get_peft_model(hf, peft.LoraConfig(
        r=4, lora_alpha=12, lora_dropout=0.05, target_modules=targets, task_type="CAUSAL_LM",
        init_lora_weights=False, use_rslora=rslora)).eval()  # random non-zero B
    out = tmp_path / "peft_adapter"
    pm.save_pretrained(out)
    ref = _hf_logits(pm, tokens, mask)
    assert np.abs(ref - base_logits).max() > 0.1
    a, lora_cfg = peft_io.load_peft_adapter(out, cfg)
    assert (lora_cfg.rank, lora_cfg.alpha, lora_cfg.dropout, lora_cfg.rslora) == (4, 12, 0.05,
                                                                                  rslora)
    assert lora_cfg.scale == (6.0 if rslora else 3.0)
    want = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo", "gate_proj": "w_gate",
            "up_proj": "w_up", "down_proj": "w_down"}
    assert set(lora_cfg.targets) == {want[t.rpartition(".")[2]] for t in targets}
    _rel_close(_ours(params, cfg, a, lora_cfg, tokens, mask), ref, mask)


# ----------------------------------------------------------------------------- refusals


@pytest.fixture()
def adapter_dir(tmp_path):
    a = _random_adapters(TINY, LC)
    out = tmp_path / "ad"
    peft_io.save_peft_adapter(a, LC, TINY, out)
    return out, a


def _edit_config(path, **changes):
    f = path / peft_io.CONFIG_FILE
    cfg = json.loads(f.read_text())
    cfg.update(changes)
    f.write_text(json.dumps(cfg))


def test_written_files_follow_peft_names(adapter_dir):
    out, a = adapter_dir
    cfg = json.loads((out / peft_io.CONFIG_FILE).read_text())
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM" and cfg["r"] == 4
    assert cfg["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                     "up_proj", "down_proj"]
    w = load_file(out / peft_io.WEIGHTS_FILE)
    assert len(w) == 2 * 7 * TINY.num_layers
    np.testing.assert_array_equal(
        w["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"],
        a["layers"]["w_down"]["a"][1])
    assert w["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"].shape == (16, 4)


def test_default_adapter_names_and_regex_targets_load(adapter_dir):
    out, a = adapter_dir
    f = out / peft_io.WEIGHTS_FILE
    w = load_file(f)
    save_file({k.replace(".weight", ".default.weight"): v for k, v in w.items()}, f)
    _edit_config(out, target_modules=r".*\.(q|k|v|o|gate|up|down)_proj")
    back, cfg = peft_io.load_peft_adapter(out, TINY)
    assert cfg == LC
    jax.tree.map(np.testing.assert_array_equal, back, a)


@pytest.mark.parametrize("changes, match", [
    (dict(use_dora=True), "use_dora=True is not supported"),
    (dict(rank_pattern={"q_proj": 8}), "rank_pattern="),
    (dict(alpha_pattern={"q_proj": 8}), "alpha_pattern="),
    (dict(modules_to_save=["lm_head"]), "modules_to_save="),
    (dict(layers_to_transform=[0]), "layers_to_transform="),
    (dict(bias="all"), "bias='all' is not supported"),
    (dict(peft_type="IA3"), "peft_type 'IA3'"),
    (dict(task_type="SEQ_CLS"), "task_type 'SEQ_CLS'"),
    (dict(target_modules=["q_proj", "embed_tokens"]), "target module 'embed_tokens' is not one"),
    (dict(target_modules=r"model\.layers\.0\..*_proj"), "in some layers only"),
    (dict(target_modules=7), "not a list of module names"),
    (dict(r=0), r"rank\) must be a positive int, got 0"),
    (dict(lora_alpha=-4), "positive number"),
    (dict(r=8), r"has shape \(4, 32\) but the model and r=8 imply \(8, 32\)"),
])
def test_load_refuses_unsupported_configs(adapter_dir, changes, match):
    out, _ = adapter_dir
    _edit_config(out, **changes)
    with pytest.raises(CheckpointError, match=match):
        peft_io.load_peft_adapter(out, TINY)


def test_load_refuses_bad_tensors_and_models(adapter_dir, tmp_path):
    out, _ = adapter_dir
    wide = dataclasses.replace(TINY, hidden_size=40)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    with pytest.raises(CheckpointError, match=rf"'{key}' .* has shape \(4, 32\) but .* imply "
                                               r"\(4, 40\)"):
        peft_io.load_peft_adapter(out, wide)
    # an AR adapter is not a LLaDA one (LLaDA's module names: tests/test_lora_llada.py)
    with pytest.raises(CheckpointError, match=r"target module 'o_proj' is not one of .*attn_out"):
        peft_io.load_peft_adapter(out, llada.LLaDAConfig(64, 32, 48, 2, 4, 2, mask_token_id=1))
    with pytest.raises(UsageError, match="not dict"):
        peft_io.load_peft_adapter(out, {})
    f = out / peft_io.WEIGHTS_FILE
    w = load_file(f)
    extra = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"
    save_file({**w, extra: np.ones(32, np.float32)}, f)
    with pytest.raises(CheckpointError, match="holds tensors of no supported target"):
        peft_io.load_peft_adapter(out, TINY)
    bad = dict(w)
    bad[key] = np.full((4, 32), np.nan, np.float32)
    save_file(bad, f)
    with pytest.raises(CheckpointError, match=f"tensor '{key}' .* holds 128 non-finite"):
        peft_io.load_peft_adapter(out, TINY)
    save_file({k: v for k, v in w.items() if k != key}, f)
    with pytest.raises(CheckpointError, match=f"tensor '{key}' is missing"):
        peft_io.load_peft_adapter(out, TINY)
    with pytest.raises(CheckpointError, match=r"adapter_config\.json not found"):
        peft_io.load_peft_adapter(tmp_path, TINY)


def test_save_refuses_mismatched_adapters(tmp_path):
    a = _random_adapters(TINY, LC)
    with pytest.raises(CheckpointError, match=r"lora_cfg\.targets"):
        peft_io.save_peft_adapter(a, lora.LoraConfig(rank=4, targets=("wq",)), TINY, tmp_path)
    with pytest.raises(CheckpointError, match=r"adapter wq a has shape \(2, 4, 32\), expected "
                                              r"\(2, 2, 32\)"):
        peft_io.save_peft_adapter(a, lora.LoraConfig(rank=2), TINY, tmp_path)
    a["layers"]["wk"]["b"] = a["layers"]["wk"]["b"].at[0, 0, 0].set(jnp.inf)
    with pytest.raises(CheckpointError, match="adapter wk b holds 1 non-finite"):
        peft_io.save_peft_adapter(a, LC, TINY, tmp_path / "x")
    assert not (tmp_path / "x").exists()
