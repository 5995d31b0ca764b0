"""Tests for ais_jax.models.fused: the rollout copy's fused q/k/v and gate/up layout.

The fused layout must give the same tokens and log-probs as the table's layout
(up to GEMM summation order), for BF16 / f32 weights, FP8 with per-tensor,
per-channel and per-token scales, biases, the KV-cached sampler and the full
forward; FP4 stays unfused; the config refuses it where it cannot apply.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ais_jax.config.load import load_config
from ais_jax.core.errors import UsageError
from ais_jax.models import fp8, fused, model
from ais_jax.models.model import ModelConfig
from ais_jax.models.qarray import QuantArray
from ais_jax.rollout.sampler import pad_prompts, sample

CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64,
                  qk_norm=True)
BIASED = dataclasses.replace(CFG, qkv_bias=True, mlp_bias=True, o_bias=True, qk_norm=False)
TOKENS, MASK = pad_prompts([[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]], bucket=False)


def _params(cfg=CFG, seed=0):
    p = model.init_params(jax.random.key(seed), cfg)
    p["embed"] = p["embed"] * 30  # sharp next-token distributions
    p["lm_head"] = p["lm_head"] * 30
    if cfg.qkv_bias or cfg.mlp_bias:  # non-zero biases, so their fusion is exercised
        keys = iter(jax.random.split(jax.random.key(seed + 1), 8))
        p["layers"] = {k: (0.1 * jax.random.normal(next(keys), v.shape) if k.startswith("b")
                           else v) for k, v in p["layers"].items()}
    return p


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
def test_fused_structure_shapes_and_per_row_scales():
    q = fp8.to_rollout_params(_params())
    f = fused.fuse_linears(q)
    lay = f["layers"]
    for name in ("wq", "wk", "wv", "w_gate", "w_up"):
        assert name not in lay
    assert set(q["layers"]) - set(lay) == {"wq", "wk", "wv", "w_gate", "w_up"}
    QH, KH, F, L = 32, 16, 64, 2
    assert lay["wqkv"].value.shape == (L, QH + 2 * KH, 32)
    assert lay["wqkv"].value.dtype == jnp.float8_e4m3fn
    assert lay["w_gate_up"].value.shape == (L, 2 * F, 32)
    # each part's per-tensor scale is on its own rows: a known answer per layer
    s = np.asarray(lay["wqkv"].scale[..., 0])  # [L, QH + 2 KH]
    for layer in range(L):
        np.testing.assert_array_equal(s[layer, :QH], float(q["layers"]["wq"].scale[layer, 0, 0]))
        np.testing.assert_array_equal(s[layer, QH:QH + KH],
                                      float(q["layers"]["wk"].scale[layer, 0, 0]))
        np.testing.assert_array_equal(s[layer, QH + KH:],
                                      float(q["layers"]["wv"].scale[layer, 0, 0]))
    np.testing.assert_array_equal(np.asarray(lay["wqkv"].value[:, QH:QH + KH]).view(np.uint8),
                                  np.asarray(q["layers"]["wk"].value).view(np.uint8))
    assert fp8.tree_nbytes(f) == fp8.tree_nbytes(q) + 4 * L * (QH + 2 * KH + 2 * F - 5)


@pytest.mark.slow  # ~5 s in the full suite on 2 busy cores
def test_biases_fuse_in_order():
    p = _params(BIASED)
    f = fused.fuse_linears(p)["layers"]
    np.testing.assert_array_equal(
        f["bqkv"], jnp.concatenate([p["layers"][n] for n in ("bq", "bk", "bv")], -1))
    np.testing.assert_array_equal(
        f["b_gate_up"], jnp.concatenate([p["layers"]["b_gate"], p["layers"]["b_up"]], -1))
    assert "bo" in f and "b_down" in f  # the unfused linears keep their biases


@pytest.mark.slow  # ~9 s in the full suite on 2 busy cores
@pytest.mark.parametrize("cfg,kind", [
    (CFG, "f32"), (CFG, "bf16"), (BIASED, "f32"), (CFG, "e4m3"), (CFG, "e4m3_token"),
    (CFG, "e4m3_channel"), (BIASED, "e5m2"),
])
def test_forward_matches_unfused(cfg, kind):
    p = _params(cfg)
    if kind == "bf16":
        p = jax.tree.map(lambda x: x.astype(jnp.bfloat16), p)
    elif kind != "f32":
        fmt, _, scaling = kind.partition("_")
        p = fp8.to_rollout_params(p, dtype=fmt, act_scaling="token" if scaling == "token"
                                  else "tensor",
                                  weight_scaling="channel" if scaling == "channel" else "tensor")
    toks = jnp.asarray(TOKENS)
    a = model.forward(p, toks, cfg, jnp.asarray(MASK))
    b = model.forward(fused.fuse_linears(p), toks, cfg, jnp.asarray(MASK))
    tol = 5e-2 if kind == "bf16" else 1e-4
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=tol, rtol=tol)


@pytest.mark.slow  # ~10 s in the full suite on 2 busy cores
@pytest.mark.parametrize("kind", ["f32", "e4m3", "e4m3_kv"])
def test_sampler_tokens_and_logp_match_unfused(kind):
    p = _params()
    if kind != "f32":
        p = fp8.to_rollout_params(p)
    kw = {"max_new_tokens": 10, "temperature": 1.0, "decode_segments": 2,
          "kv_fp8": kind == "e4m3_kv", "num_samples": 2}
    a = sample(p, TOKENS, MASK, jax.random.key(5), CFG, **kw)
    b = sample(fused.fuse_linears(p), TOKENS, MASK, jax.random.key(5), CFG, **kw)
    np.testing.assert_array_equal(np.asarray(b.tokens), np.asarray(a.tokens))
    np.testing.assert_allclose(np.asarray(b.logp), np.asarray(a.logp), atol=1e-5)
    # and the fused copy is actually different from the unfused program's params
    assert "wqkv" in fused.fuse_linears(p)["layers"]


def test_fp4_stays_unfused_and_mixed_parts_are_refused():
    # jitted: the MXFP4 cast as one program, not ~100 ops compiled one by one
    p = jax.jit(lambda w: fp8.to_rollout_params(w, dtype="mxfp4"))(_params())
    assert set(fused.fuse_linears(p)["layers"]) == set(p["layers"])
    q = fp8.to_rollout_params(_params())
    mixed = {**q, "layers": {**q["layers"], "wk": _params()["layers"]["wk"]}}
    with pytest.raises(ValueError, match="some are quantized"):
        fused.fuse_linears(mixed)
    token = fp8.to_rollout_params(_params(), act_scaling="token")
    odd = {**q, "layers": {**q["layers"], "wv": token["layers"]["wv"]}}
    with pytest.raises(ValueError, match="activation scalings"):
        fused.fuse_linears(odd)
    assert isinstance(fused.fuse_linears(q)["layers"]["wqkv"], QuantArray)


def test_split_sizes_known_answers():
    assert fused.split_sizes("wqkv", 32, 16, 0) == [32, 48]
    assert fused.split_sizes("w_gate_up", 0, 0, 64) == [64]
    with pytest.raises(ValueError, match="unknown fused"):
        fused.split_sizes("wo", 1, 1, 1)


def test_config_refuses_fused_with_tensor_parallel_and_llada():
    c = load_config("configs/tiny_arithmetic.yaml", ["rollout.fused_linears=true"])
    assert c.rollout.fused_linears
    with pytest.raises(UsageError, match=r"mesh\.tensor=1"):
        load_config("configs/tiny_arithmetic.yaml",
                    ["rollout.fused_linears=true", "mesh.tensor=2"])
    with pytest.raises(UsageError, match="LLaDA model has no fused"):
        load_config("configs/tiny_llada_countdown.yaml", ["rollout.fused_linears=true"])
