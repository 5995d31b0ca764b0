"""Tests for ais_jax.models.model: params layout, numerics, masking (cached decode:
test_decode.py)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _models import FULL, TINY
from _models import left_padded as _left_padded
from _models import random_params as _random_params

from ais_jax.models import fp8, layout, model

forward = jax.jit(model.forward, static_argnums=2)


# ----------------------------------------------------------------------------- params


@pytest.mark.parametrize("cfg", [
    TINY, FULL, dataclasses.replace(TINY, tie_embeddings=True, num_kv_heads=4),
    dataclasses.replace(TINY, qkv_bias=True),
])
def test_init_params_layout(cfg):
    params = model.init_params(jax.random.key(0), cfg, dtype=jnp.bfloat16)
    L, D, F, H, Q, K, V = (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.head_dim,
                           cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size)
    layers = params["layers"]
    expect = {"attn_norm": (L, D), "mlp_norm": (L, D), "wq": (L, Q * H, D), "wk": (L, K * H, D),
              "wv": (L, K * H, D), "wo": (L, D, Q * H), "w_gate": (L, F, D), "w_up": (L, F, D),
              "w_down": (L, D, F)}
    if cfg.qkv_bias:
        expect |= {"bq": (L, Q * H), "bk": (L, K * H), "bv": (L, K * H)}
    if cfg.o_bias:
        expect["bo"] = (L, D)
    if cfg.mlp_bias:
        expect |= {"b_gate": (L, F), "b_up": (L, F), "b_down": (L, D)}
    if cfg.qk_norm:
        expect |= {"q_norm": (L, H), "k_norm": (L, H)}
    assert {k: v.shape for k, v in layers.items()} == expect
    assert params["embed"].shape == (V, D) and params["final_norm"].shape == (D,)
    assert ("lm_head" in params) == (not cfg.tie_embeddings)
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    assert sum(x.size for x in jax.tree_util.tree_leaves(params)) == cfg.num_params
    np.testing.assert_array_equal(layers["attn_norm"], 1.0)
    assert float(jnp.std(layers["wq"].astype(jnp.float32))) == pytest.approx(0.02, rel=0.1)


def _init_params_before_the_table(key, cfg, dtype):
    """`init_params` as written before `ais_jax.models.layout` (the reference for bit-identity)."""
    D, F, H, Q, K, V, L = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim,
                           cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size, cfg.num_layers)
    keys = iter(jax.random.split(key, 16))
    std = 0.02

    def normal(shape, scale=std):
        return (scale * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

    out_std = std / math.sqrt(2 * L)
    layers = {
        "attn_norm": jnp.ones((L, D), dtype), "mlp_norm": jnp.ones((L, D), dtype),
        "wq": normal((L, Q * H, D)), "wk": normal((L, K * H, D)), "wv": normal((L, K * H, D)),
        "wo": normal((L, D, Q * H), out_std), "w_gate": normal((L, F, D)),
        "w_up": normal((L, F, D)), "w_down": normal((L, D, F), out_std),
    }
    if cfg.qkv_bias:
        layers |= {"bq": jnp.zeros((L, Q * H), dtype), "bk": jnp.zeros((L, K * H), dtype),
                   "bv": jnp.zeros((L, K * H), dtype)}
    if cfg.o_bias:
        layers["bo"] = jnp.zeros((L, D), dtype)
    if cfg.mlp_bias:
        layers |= {"b_gate": jnp.zeros((L, F), dtype), "b_up": jnp.zeros((L, F), dtype),
                   "b_down": jnp.zeros((L, D), dtype)}
    if cfg.qk_norm:
        layers |= {"q_norm": jnp.ones((L, H), dtype), "k_norm": jnp.ones((L, H), dtype)}
    params = {"embed": normal((V, D)), "layers": layers, "final_norm": jnp.ones((D,), dtype)}
    if not cfg.tie_embeddings:
        params["lm_head"] = normal((V, D))
    return params


@pytest.mark.parametrize(("cfg", "dtype", "seed"), [
    (TINY, jnp.float32, 0), (FULL, jnp.float32, 1), (FULL, jnp.bfloat16, 2),
    (dataclasses.replace(TINY, tie_embeddings=True, qk_norm=True), jnp.bfloat16, 3),
    (dataclasses.replace(TINY, qkv_bias=True, num_layers=5, num_kv_heads=4), jnp.float32, 4),
    (dataclasses.replace(TINY, mlp_bias=True, o_bias=True, tie_embeddings=True), jnp.float32, 5),
])
def test_init_params_bit_identical_to_the_pre_table_algorithm(cfg, dtype, seed):
    key = jax.random.key(seed)
    new, old = model.init_params(key, cfg, dtype), _init_params_before_the_table(key, cfg, dtype)
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(old)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(new),
                            jax.tree_util.tree_leaves(old), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                      err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("cfg", [TINY, FULL, dataclasses.replace(TINY, tie_embeddings=True)])
def test_param_table_describes_init_params(cfg):
    table = layout.param_table(cfg)
    is_info = lambda x: isinstance(x, layout.ArrayInfo)  # noqa: E731
    infos, spec = jax.tree_util.tree_flatten(table, is_leaf=is_info)
    leaves, structure = jax.tree_util.tree_flatten(model.init_params(jax.random.key(0), cfg))
    assert spec == structure
    assert [x.shape for x in leaves] == [i.shape(cfg) for i in infos]
    assert all(len(i.axes) == len(i.dims) for i in infos)
    assert all(i.dims[0] == "L" and i.axes[0] == "layers" for i in table["layers"].values())
    assert sum(math.prod(i.shape(cfg)) for i in infos) == cfg.num_params
    rows = layout.TOP_PARAMS | layout.LAYER_PARAMS
    assert len({r.hf for r in rows.values()}) == len({r.gguf for r in rows.values()}) == len(rows)
    assert fp8.BLOCK_LINEARS == ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
    assert fp8.OPTIONAL_LINEARS == ("lm_head",)
    assert layout.hf_name("wq", 3) == "model.layers.3.self_attn.q_proj.weight"
    assert layout.gguf_name("w_down", 0) == "blk.0.ffn_down.weight"
    assert layout.hf_name("embed") == "model.embed_tokens.weight"


def test_model_config_validation():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        dataclasses.replace(TINY, num_kv_heads=3)
    with pytest.raises(ValueError, match="head_dim must be even"):
        dataclasses.replace(TINY, head_dim=7)
    with pytest.raises(ValueError, match="vocab_size"):
        dataclasses.replace(TINY, vocab_size=0)


# ----------------------------------------------------------------------------- numerics


def test_rms_norm_known_answer():
    x = jnp.array([[3.0, 4.0]])
    out = model.rms_norm(x, jnp.array([1.0, 2.0]), eps=0.0)
    rms = math.sqrt((9 + 16) / 2)
    np.testing.assert_allclose(out, [[3 / rms, 8 / rms]], rtol=1e-6)
    assert model.rms_norm(x.astype(jnp.bfloat16), jnp.ones(2), 1e-6).dtype == jnp.bfloat16


def test_rope_inv_freq_known_answers():
    cfg = dataclasses.replace(TINY, head_dim=16, rope_theta=100.0)
    base = 100.0 ** -(np.arange(0, 16, 2) / 16)
    np.testing.assert_allclose(model.rope_inv_freq(cfg), base, rtol=1e-6)
    lin = dataclasses.replace(cfg, rope_linear_factor=4.0)
    np.testing.assert_allclose(model.rope_inv_freq(lin), base / 4.0, rtol=1e-6)
    # llama3 with original context 64: wavelengths < 16 kept, > 64 divided by 8, smooth between.
    l3 = np.asarray(model.rope_inv_freq(dataclasses.replace(cfg, rope_scaling=(8.0, 1.0, 4.0, 64))))
    wavelen = 2 * np.pi / base
    np.testing.assert_allclose(l3[wavelen < 16], base[wavelen < 16], rtol=1e-6)
    np.testing.assert_allclose(l3[wavelen > 64], base[wavelen > 64] / 8, rtol=1e-6)
    mid = (wavelen >= 16) & (wavelen <= 64)
    assert mid.any()
    smooth = (64 / wavelen[mid] - 1) / 3
    np.testing.assert_allclose(l3[mid], (1 - smooth) * base[mid] / 8 + smooth * base[mid],
                               rtol=1e-6)


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
def test_apply_rope_rotates_by_relative_position():
    inv = model.rope_inv_freq(TINY)
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, TINY.head_dim))
    at = lambda x, p: model.apply_rope(x, jnp.array([[p]]), inv)  # noqa: E731
    np.testing.assert_allclose(at(q, 0), q, rtol=1e-6)
    np.testing.assert_allclose(jnp.linalg.norm(at(q, 7)), jnp.linalg.norm(q), rtol=1e-5)
    dot = lambda m, n: float(jnp.sum(at(q, m) * at(k, n)))  # noqa: E731
    assert dot(5, 2) == pytest.approx(dot(13, 10), rel=1e-4)
    assert dot(5, 2) != pytest.approx(dot(5, 3), rel=1e-2)


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
def test_forward_is_causal_and_padding_invariant():
    params = _random_params(FULL)
    tokens, _ = _left_padded(FULL, 1, 8, [0])
    full = forward(params, tokens, FULL)
    changed = forward(params, tokens.at[0, 5].set((tokens[0, 5] + 1) % 64), FULL)
    np.testing.assert_allclose(changed[:, :5], full[:, :5], atol=1e-5)
    assert float(jnp.abs(changed[:, 5:] - full[:, 5:]).max()) > 1e-3
    # The same 8 tokens left-padded by 3 (arbitrary pad ids) give the same logits.
    padded = jnp.concatenate([jnp.full((1, 3), 7), tokens], 1)
    mask = jnp.arange(11)[None] >= 3
    out = forward(params, padded, FULL, mask)
    np.testing.assert_allclose(out[:, 3:], full, atol=1e-5)


@pytest.mark.slow  # ~13 s in the full suite on 2 busy cores
def test_fp8_rollout_params_halve_weight_bytes_and_stay_close():
    cfg = dataclasses.replace(TINY, hidden_size=64, intermediate_size=128, head_dim=16)
    params = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), _random_params(cfg))
    rollout = fp8.to_rollout_params(params, quantize_lm_head=True)
    quantized = {n: rollout["layers"][n] for n in fp8.BLOCK_LINEARS} | {"head": rollout["lm_head"]}
    original = {n: params["layers"][n] for n in fp8.BLOCK_LINEARS} | {"head": params["lm_head"]}
    for q in quantized.values():
        assert isinstance(q, fp8.QuantArray) and q.value.dtype == jnp.float8_e4m3fn
    ratio = fp8.tree_nbytes(quantized) / fp8.tree_nbytes(original)
    assert 0.5 <= ratio <= 0.51, ratio
    tokens, mask = _left_padded(cfg, 2, 8, [0, 3])
    lp = jax.nn.log_softmax(forward(params, tokens, cfg, mask))
    lq = jax.nn.log_softmax(forward(rollout, tokens, cfg, mask))
    delta = np.abs(np.asarray(lp - lq))[np.asarray(mask)]
    assert 0 < delta.mean() < 0.1, delta.mean()  # FP8 moves log-probs, but only a little
