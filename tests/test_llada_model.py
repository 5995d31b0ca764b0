"""LLaDA model + checkpoint: parity with an independent PyTorch reference, round trip, errors."""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file

from ais_jax.models.fp8 import QuantArray
from ais_jax.models.llada.checkpoint import config_from_dict, load, save
from ais_jax.models.llada.model import LLaDAConfig, forward, init_params, to_rollout_params

CFG = LLaDAConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, mask_token_id=60, rope_theta=500000.0,
                  text_vocab_size=61)


def _torch_reference(path: str, tokens: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """LLaDA forward from the public description, reading the checkpoint directly (float64)."""
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    w = {k: v.double() for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
    t = "model.transformer."
    D, nh = c["d_model"], c["n_heads"]
    nkv = c.get("n_kv_heads") or nh
    hd, eps = D // nh, c["rms_norm_eps"]
    x = w[t + "wte.weight"][torch.as_tensor(tokens)]  # [B, T, D]
    B, T = tokens.shape

    def rms(h, g):
        return g * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)

    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos(), ang.sin()

    def rope(h):  # [B, heads, T, hd], rotate-half layout
        h1, h2 = h[..., : hd // 2], h[..., hd // 2:]
        return h * cos + torch.cat([-h2, h1], -1) * sin

    bias = torch.zeros(B, 1, 1, T, dtype=torch.float64)
    bias[torch.as_tensor(~valid)[:, None, None, :]] = float("-inf")
    for i in range(c["n_layers"]):
        p = f"{t}blocks.{i}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = (h @ w[p + "q_proj.weight"].T).view(B, T, nh, hd).transpose(1, 2)
        k = (h @ w[p + "k_proj.weight"].T).view(B, T, nkv, hd).transpose(1, 2)
        v = (h @ w[p + "v_proj.weight"].T).view(B, T, nkv, hd).transpose(1, 2)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, -1) @ v
        x = x + att.transpose(1, 2).reshape(B, T, D) @ w[p + "attn_out.weight"].T
        h = rms(x, w[p + "ff_norm.weight"])
        gate, up = h @ w[p + "ff_proj.weight"].T, h @ w[p + "up_proj.weight"].T
        act = torch.nn.functional.silu(gate) * up
        x = x + act @ w[p + "ff_out.weight"].T
    x = rms(x, w[t + "ln_f.weight"])
    head = w[t + "wte.weight"] if c.get("weight_tying") else w[t + "ff_out.weight"]
    return (x @ head.T).numpy()


def _inputs(rng: np.random.Generator, V: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = rng.integers(0, V, size=(3, 9))
    valid = np.ones((3, 9), bool)
    valid[1, :3] = False  # left padding
    valid[2, :1] = False
    return tokens, valid


def _check_parity(path: str, seed: int = 0) -> None:
    params, cfg = load(path)
    tokens, valid = _inputs(np.random.default_rng(seed), cfg.vocab_size)
    ours = np.asarray(forward(params, jnp.asarray(tokens), cfg, jnp.asarray(valid)))
    ref = _torch_reference(path, tokens, valid)
    err = np.abs(ours - ref)[valid].max() / np.abs(ref[valid]).max()
    assert err < 1e-4, err


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
def test_parity_hand_built_checkpoint(tmp_path):
    """A checkpoint written with numpy + safetensors only (GQA, padded embedding, untied)."""
    rng = np.random.default_rng(1)
    D, F, L, nh, nkv, V = 32, 40, 3, 4, 2, 72
    hd = D // nh
    t = "model.transformer."
    tensors = {t + "wte.weight": rng.normal(0, 1, (V, D)), t + "ln_f.weight": rng.normal(1, .1, D),
               t + "ff_out.weight": rng.normal(0, .2, (V, D))}
    for i in range(L):
        p = f"{t}blocks.{i}."
        shapes = {"q_proj": (D, D), "k_proj": (nkv * hd, D), "v_proj": (nkv * hd, D),
                  "attn_out": (D, D), "ff_proj": (F, D), "up_proj": (F, D), "ff_out": (D, F)}
        for name, shape in shapes.items():
            tensors[p + name + ".weight"] = rng.normal(0, 0.3, shape)
        tensors[p + "attn_norm.weight"] = rng.normal(1, 0.1, D)
        tensors[p + "ff_norm.weight"] = rng.normal(1, 0.1, D)
    save_file({k: v.astype(np.float32) for k, v in tensors.items()},
              str(tmp_path / "model.safetensors"))
    config = {"d_model": D, "n_heads": nh, "n_kv_heads": nkv, "n_layers": L,
              "mlp_hidden_size": F, "vocab_size": 70, "embedding_size": V, "rope_theta": 10000.0,
              "rms_norm_eps": 1e-5, "mask_token_id": 69, "weight_tying": False,
              "block_type": "llama", "activation_type": "silu", "include_bias": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    _check_parity(str(tmp_path))
    _, cfg = load(str(tmp_path))
    assert (cfg.vocab_size, cfg.text_vocab_size, cfg.intermediate_size) == (V, 70, F)


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
@pytest.mark.parametrize("tied", [False, True])
def test_parity_saved_and_round_trip(tmp_path, tied):
    import dataclasses

    cfg = dataclasses.replace(CFG, tie_embeddings=tied)
    params = init_params(jax.random.key(3), cfg)
    params = jax.tree.map(lambda a: a * 5.0 if a.ndim > 1 else a, params)  # larger logits
    save(str(tmp_path), params, cfg)
    _check_parity(str(tmp_path), seed=2)
    loaded, cfg2 = load(str(tmp_path))
    assert cfg2 == cfg
    assert ("lm_head" in loaded) == (not tied)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # ~9 s in the full suite on 2 busy cores
def test_padding_does_not_change_real_logits():
    params = init_params(jax.random.key(0), CFG)
    toks = jax.random.randint(jax.random.key(1), (1, 6), 0, 60)
    padded = jnp.concatenate([jnp.zeros((1, 3), toks.dtype), toks], 1)
    mask = jnp.arange(9)[None] >= 3
    a = forward(params, toks, CFG)
    b = forward(params, padded, CFG, mask)[:, 3:]
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.slow  # ~11 s in the full suite on 2 busy cores
def test_fp8_rollout_copy():
    params = init_params(jax.random.key(0), CFG)
    q = to_rollout_params(params)
    assert isinstance(q["layers"]["wq"], QuantArray) and not isinstance(q["embed"], QuantArray)
    toks = jax.random.randint(jax.random.key(1), (2, 7), 0, 64)
    a, b = forward(params, toks, CFG), forward(q, toks, CFG)
    assert float(jnp.abs(a - b).max()) < 0.05 * float(jnp.abs(a).max()) + 1e-3
    assert not np.array_equal(np.asarray(a), np.asarray(b))


_GOOD = {"d_model": 32, "n_heads": 4, "n_layers": 2, "mlp_hidden_size": 48, "vocab_size": 64,
         "mask_token_id": 63}


@pytest.mark.parametrize("change", [
    {"mask_token_id": None}, {"mask_token_id": 64}, {"mask_token_id": -1},
    {"mask_token_id": "126336"}, {"n_heads": 5}, {"include_bias": True},
    {"activation_type": "gelu"}, {"d_model": None}, {"embedding_size": 32},
    {"scale_logits": True},
])
def test_bad_config(change):
    d = {k: v for k, v in {**_GOOD, **change}.items() if v is not None}
    with pytest.raises(ValueError) as e:
        config_from_dict(d)
    assert "\n" not in str(e.value)


def test_llada_8b_config_parses():
    d = {"d_model": 4096, "n_heads": 32, "n_kv_heads": 32, "n_layers": 32,
         "mlp_hidden_size": 12288, "vocab_size": 126464, "embedding_size": 126464,
         "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "mask_token_id": 126336,
         "weight_tying": False, "block_type": "llama", "activation_type": "silu",
         "include_bias": False, "layer_norm_type": "rms", "rope": True, "alibi": False}
    cfg = config_from_dict(d)
    assert cfg.mask_token_id == 126336 and cfg.head_dim == 128 and cfg.intermediate_size == 12288


def test_constrain_mesh_reaches_attention(monkeypatch):
    """``hidden_states(constrain=...)`` hands ``constrain.mesh`` (as
    `ais_jax.training.sharding.batch_constraint` carries it) to `attend`, so the TPU kernel
    can run under ``jax.shard_map`` on a multi-device mesh; the values are unchanged."""
    from ais_jax.models.llada import model as llada

    seen, real = [], llada.attend

    def spy(q, k, v, mask, impl, chunk, mesh=None):
        seen.append(mesh)
        return real(q, k, v, mask, impl, chunk)

    mesh = object()  # stands in for a jax Mesh: only its identity is checked

    def pin(x):
        return x

    pin.mesh = mesh
    params = init_params(jax.random.key(0), CFG)
    toks = jax.random.randint(jax.random.key(1), (2, 5), 0, 60)
    want = llada.hidden_states(params, toks, CFG)
    monkeypatch.setattr(llada, "attend", spy)
    got = llada.hidden_states(params, toks, CFG, constrain=pin)
    assert seen and all(m is mesh for m in seen)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    seen.clear()
    llada.hidden_states(params, toks, CFG)
    assert seen and all(m is None for m in seen)


def test_mesh_reaches_attention_in_sampler_and_replay(monkeypatch):
    """The programs that call `forward` (sampler, estimator, trajectory replay) hand their
    ``mesh`` keyword on to `attend` (the TPU kernel's ``jax.shard_map`` on several devices)."""
    from ais_jax.models.llada import model as llada
    from ais_jax.rollout.llada_sampler import generate
    from ais_jax.training.llada.estimator import completion_logprobs
    from ais_jax.training.llada.trajectory import trajectory_logprobs

    seen, real = [], llada.attend

    def spy(q, k, v, mask, impl, chunk, mesh=None):
        seen.append(mesh)
        return real(q, k, v, mask, impl, chunk)

    monkeypatch.setattr(llada, "attend", spy)
    mesh = object()  # hashable (a static jit argument, as a jax Mesh is); identity checked
    params = init_params(jax.random.key(0), CFG)
    prompt = jax.random.randint(jax.random.key(1), (2, 3), 0, 60)
    kw = {"steps": 2, "block_length": 2}
    out = generate(params, CFG, prompt, jax.random.key(2), gen_length=2, mesh=mesh, **kw)
    completion_logprobs(params, CFG, prompt, out.tokens[:, 3:], jax.random.key(3), mesh=mesh)
    trajectory_logprobs(params, CFG, prompt, out.tokens, out.reveal_step, temperature=0.0,
                        remasking="low_confidence", mesh=mesh, **kw)
    assert len(seen) >= 3 and all(m is mesh for m in seen)
