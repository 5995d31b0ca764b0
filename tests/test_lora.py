"""Tests for ais_jax.models.lora: the config, adapters, the unmerged linear, merge, gradients.

PEFT's file format (ais_jax.models.peft_io) is tested in tests/test_peft_io.py."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _models import FULL, TINY, random_params

from ais_jax.core.errors import UsageError
from ais_jax.models import fp8, lora, model
from ais_jax.models.llada import model as llada
from ais_jax.training.logprobs import completion_logprobs

fwd = jax.jit(model.forward, static_argnums=2)
merge = jax.jit(lora.merge, static_argnums=2)  # eager, each op would compile on its own
LC = lora.LoraConfig(rank=4, alpha=8.0)


def _random_adapters(cfg, lora_cfg, seed: int = 1, b_std: float = 0.3) -> dict:
    """init_adapters' A with a non-zero random B (numpy draws: nothing to compile)."""
    a = lora.init_adapters(jax.random.key(seed), cfg, lora_cfg)
    rng = np.random.default_rng(seed)
    return {"layers": {n: {"a": p["a"], "b": jnp.asarray(
        b_std * rng.standard_normal(p["b"].shape, np.float32))} for n, p in a["layers"].items()}}


def _tokens(cfg, B=2, T=7, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, (B, T)))


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("kwargs, match", [
    (dict(rank=0), r"lora.rank\) must be a positive int, got 0"),
    (dict(rank=-2), "positive int"),
    (dict(rank=2.0), "positive int"),
    (dict(rank=True), "positive int"),
    (dict(alpha=0.0), r"lora.alpha\) must be a positive number, got 0.0"),
    (dict(alpha=-1), "positive number"),
    (dict(alpha=math.inf), "positive number"),
    (dict(targets=("wq", "lm_head")), "'lm_head'"),
    (dict(targets=("q_proj",)), "distinct names among"),
    (dict(targets=()), "distinct names"),
    (dict(targets=("wq", "wq")), "distinct names"),
    (dict(targets="wq"), r"the string 'wq'; write \['wq'\]"),
    (dict(dropout=1.0), r"lora.dropout\) must be in \[0, 1\)"),
    (dict(dropout=-0.1), r"\[0, 1\)"),
])
def test_lora_config_refuses(kwargs, match):
    with pytest.raises(UsageError, match=match):
        lora.LoraConfig(**kwargs)


def test_lora_config_scale_order_and_validation():
    assert LC.scale == 2.0 and LC.targets == lora.TARGETS == fp8.BLOCK_LINEARS
    assert lora.LoraConfig(rank=4, alpha=8, rslora=True).scale == 4.0  # alpha / sqrt(r)
    assert lora.LoraConfig(targets=("w_down", "wq")).targets == ("wq", "w_down")  # table order
    hash(LC)  # static jit argument
    # TINY: wk / wv are [16, 32]; the others are >= 32 on both sides.
    with pytest.raises(UsageError, match=r"rank\) 17 exceeds wk's smaller dimension \(16 x 32\); "
                                         r"use lora.rank <= 16"):
        lora.validate_lora(lora.LoraConfig(rank=17), TINY)
    lora.validate_lora(lora.LoraConfig(rank=17, targets=("wq", "w_up")), TINY)
    assert issubclass(UsageError, ValueError)


def test_init_adapters_shapes_and_peft_init():
    cfg = dataclasses.replace(TINY, num_layers=3)
    a = lora.init_adapters(jax.random.key(0), cfg, LC)
    shapes = {n: (p["a"].shape, p["b"].shape) for n, p in a["layers"].items()}
    assert shapes == {"wq": ((3, 4, 32), (3, 32, 4)), "wk": ((3, 4, 32), (3, 16, 4)),
                      "wv": ((3, 4, 32), (3, 16, 4)), "wo": ((3, 4, 32), (3, 32, 4)),
                      "w_gate": ((3, 4, 32), (3, 48, 4)), "w_up": ((3, 4, 32), (3, 48, 4)),
                      "w_down": ((3, 4, 48), (3, 32, 4))}
    for n, p in a["layers"].items():
        bound = 1 / math.sqrt(p["a"].shape[-1])  # kaiming_uniform(a=sqrt(5)) on [r, in]
        assert p["a"].dtype == jnp.float32 and float(jnp.abs(p["a"]).max()) <= bound
        assert float(jnp.abs(p["a"]).max()) > 0.9 * bound, n  # uniform, not a narrow normal
        assert not jnp.any(p["b"])
    assert not jnp.array_equal(a["layers"]["wq"]["a"][0], a["layers"]["wq"]["a"][1])
    assert lora.num_adapter_params(cfg, LC) == sum(
        p["a"].size + p["b"].size for p in a["layers"].values())
    assert lora.adapter_nbytes(a) == 4 * lora.num_adapter_params(cfg, LC)
    bf = lora.init_adapters(jax.random.key(0), cfg, LC, dtype=jnp.bfloat16)
    assert lora.adapter_nbytes(bf) == 2 * lora.num_adapter_params(cfg, LC)
    axes = lora.logical_axes(LC)
    assert jax.tree.structure(axes, is_leaf=lambda x: isinstance(x, tuple)) == \
        jax.tree.structure(a)
    assert axes["layers"]["wo"] == {"a": ("layers", None, "heads"), "b": ("layers", "embed", None)}


# ----------------------------------------------------------------------------- the linear


def test_lora_linear_known_answer():
    x = jnp.array([[1.0, 2.0, 3.0], [0.0, -1.0, 1.0]])  # [2, in=3]
    w = jnp.array([[1.0, 0.0, -1.0], [2.0, 1.0, 0.0]])  # [out=2, in=3]
    a = jnp.array([[1.0, 1.0, 0.0]])  # [r=1, in]
    b = jnp.array([[1.0], [-2.0]])  # [out, r]
    bias = jnp.array([0.5, 0.0])
    # W x = [[-2, 4], [-1, -1]]; A x = [3, -1]; 2 * B A x = [[6, -12], [-2, 4]]; + bias
    want = np.array([[4.5, -8.0], [-2.5, 3.0]], np.float32)
    lw = lora.LoraWeight(w, a, b, scale=2.0)
    np.testing.assert_array_equal(fp8.linear(x, lw, bias), want)
    got16 = fp8.linear(x.astype(jnp.bfloat16), lw, bias)
    assert got16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got16, np.float32), want)
    np.testing.assert_array_equal(fp8.linear(x, lw), want - np.asarray(bias))
    # numpy reference with a random rank-3 pair, via LoraConfig's scale and rslora
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((5, 6), np.float32), rng.standard_normal((4, 6), np.float32)
    a, b = rng.standard_normal((3, 6), np.float32), rng.standard_normal((4, 3), np.float32)
    s = lora.LoraConfig(rank=3, alpha=6.0, rslora=True).scale
    got = fp8.linear(jnp.asarray(x), lora.LoraWeight(jnp.asarray(w), jnp.asarray(a),
                                                     jnp.asarray(b), scale=s))
    np.testing.assert_allclose(got, x @ w.T + (6.0 / math.sqrt(3)) * (x @ a.T) @ b.T, rtol=1e-5,
                               atol=1e-5)


def test_dropout_masks_the_lora_input_only_with_a_key():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 5, 8), np.float32))
    w, a, b = (jnp.asarray(rng.standard_normal(s, np.float32)) for s in ((6, 8), (2, 8), (6, 2)))
    key = jax.random.key(7)
    plain = fp8.linear(x, lora.LoraWeight(w, a, b, scale=1.5))
    dropped = fp8.linear(x, lora.LoraWeight(w, a, b, key, scale=1.5, dropout=0.25))
    keep = np.asarray(jax.random.bernoulli(key, 0.75, x.shape))
    xd = np.where(keep, np.asarray(x) / 0.75, 0)
    want = np.asarray(x) @ np.asarray(w).T + 1.5 * (xd @ np.asarray(a).T) @ np.asarray(b).T
    np.testing.assert_allclose(dropped, want, rtol=1e-5, atol=1e-5)
    assert 0.15 < 1 - keep.mean() < 0.35 and float(jnp.abs(dropped - plain).max()) > 0.1
    # no key: no dropout; B = 0: the base alone, whatever the mask
    np.testing.assert_array_equal(fp8.linear(x, lora.LoraWeight(w, a, b, scale=1.5,
                                                                 dropout=0.25)), plain)
    zero = lora.LoraWeight(w, a, jnp.zeros_like(b), key, scale=1.5, dropout=0.25)
    np.testing.assert_array_equal(fp8.linear(x, zero), fp8.linear(x, w))


# ----------------------------------------------------------------------------- the model


def test_with_adapters_dropout_keys():
    p = random_params(TINY)
    lc = dataclasses.replace(LC, dropout=0.2)
    a = _random_adapters(TINY, lc)
    tokens = _tokens(TINY)
    keyed = lora.with_adapters(p, a, lc, dropout_key=jax.random.key(0))
    keys = [jax.random.key_data(keyed["layers"][n].key) for n in lc.targets]  # [L, 2] each
    assert all(k.shape == (TINY.num_layers, 2) for k in keys)
    assert len({np.asarray(k).tobytes() for k in keys}) == len(keys)  # per target
    assert not np.array_equal(keys[0][0], keys[0][1])  # per layer
    assert lora.with_adapters(p, a, LC, dropout_key=jax.random.key(0))["layers"]["wq"].key is None
    eval_ = fwd(lora.with_adapters(p, a, lc), tokens, TINY)  # no key: no dropout
    np.testing.assert_array_equal(eval_, fwd(lora.with_adapters(p, a, LC), tokens, TINY))
    train = fwd(keyed, tokens, TINY)
    np.testing.assert_array_equal(train, fwd(lora.with_adapters(
        p, a, lc, dropout_key=jax.random.key(0)), tokens, TINY))  # a function of the key
    other = fwd(lora.with_adapters(p, a, lc, dropout_key=jax.random.key(1)), tokens, TINY)
    assert float(jnp.abs(train - eval_).max()) > 1e-2 and float(jnp.abs(train - other).max()) > 1e-2


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fresh_adapters_leave_the_forward_bit_identical(dtype):
    p = jax.tree.map(lambda x: x.astype(dtype), random_params(FULL))  # biases, q/k norm, GQA
    a0 = lora.init_adapters(jax.random.key(3), FULL, LC)  # float32 masters over a dtype base
    tokens = _tokens(FULL)
    base = fwd(p, tokens, FULL)
    np.testing.assert_array_equal(fwd(lora.with_adapters(p, a0, LC), tokens, FULL), base)
    wrapped = lora.with_adapters(p, a0, LC)
    assert isinstance(wrapped["layers"]["wq"], lora.LoraWeight)
    assert wrapped["layers"]["bq"] is p["layers"]["bq"] and wrapped["embed"] is p["embed"]
    assert not isinstance(p["layers"]["wq"], lora.LoraWeight)  # the input is not modified


def test_merge_matches_the_unmerged_forward():
    p = random_params(FULL)
    lc = lora.LoraConfig(rank=4, alpha=6.0, targets=("wq", "wv", "w_gate", "w_down"))
    a = _random_adapters(FULL, lc)
    tokens = _tokens(FULL)
    merged = merge(p, a, lc)
    assert jax.tree.structure(merged) == jax.tree.structure(p)
    np.testing.assert_array_equal(merged["layers"]["wk"], p["layers"]["wk"])  # not a target
    want = fwd(merged, tokens, FULL)
    got = fwd(lora.with_adapters(p, a, lc), tokens, FULL)
    assert float(jnp.abs(got - fwd(p, tokens, FULL)).max()) > 0.1  # the adapters matter
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(jnp.abs(want).max()))
    bf = merge(jax.tree.map(lambda x: x.astype(jnp.bfloat16), p), a, lc)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(bf))
    w = np.asarray(p["layers"]["wq"][1], np.float64)
    ba = np.asarray(a["layers"]["wq"]["b"][1], np.float64) @ np.asarray(a["layers"]["wq"]["a"][1])
    np.testing.assert_allclose(merged["layers"]["wq"][1], w + 1.5 * ba, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="pass the config the adapters were made with"):
        lora.merge(p, a, LC)


def test_llada_shares_the_table_names_and_the_linear():
    cfg = llada.LLaDAConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                            num_heads=4, num_kv_heads=2, mask_token_id=63)
    rng = np.random.default_rng(0)  # init_params' tree, numpy-filled (eager init compiles slowly)
    p = jax.tree.map(lambda x: jnp.asarray(0.2 * rng.standard_normal(x.shape, np.float32)),
                     jax.eval_shape(lambda: llada.init_params(jax.random.key(0), cfg)))
    f = jax.jit(llada.forward, static_argnums=2)
    tokens = _tokens(cfg)
    a0 = lora.init_adapters(jax.random.key(1), cfg, LC)
    np.testing.assert_array_equal(f(lora.with_adapters(p, a0, LC), tokens, cfg), f(p, tokens, cfg))
    a = _random_adapters(cfg, LC, b_std=3.0)
    got, want = f(lora.with_adapters(p, a, LC), tokens, cfg), f(merge(p, a, LC), tokens, cfg)
    assert float(jnp.abs(got - f(p, tokens, cfg)).max()) > 1e-3
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(jnp.abs(want).max()))


def _dot_shapes(jaxpr) -> list[tuple[int, ...]]:
    """Output shapes of every dot_general in a jaxpr and its sub-jaxprs (scan, remat, jit)."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(tuple(eqn.outvars[0].aval.shape))
        for v in eqn.params.values():
            for sub in v if isinstance(v, list | tuple) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    out += _dot_shapes(inner)
    return out


def _grad_case():
    """TINY params, random adapters, and the trainer's log-prob loss of params."""
    cfg = TINY
    p = random_params(cfg)
    a = _random_adapters(cfg, LC)
    prompt = _tokens(cfg, T=5)
    pmask = jnp.arange(5)[None] >= jnp.array([[0], [2]])  # second row left-padded
    comp = _tokens(cfg, T=4, seed=1)

    def loss(params, remat="none", chunk=0):
        return -completion_logprobs(params, prompt, pmask, comp, cfg, chunk=chunk,
                                    remat=remat).sum()

    def lora_loss(adapters, base):  # differentiated argument first; the base is a constant
        # remat per layer, head in chunks: the trainer's log-prob path
        return loss(lora.with_adapters(base, adapters, LC), remat="full", chunk=2)

    return p, a, loss, lora_loss


def test_adapter_gradient_is_the_chain_rule_of_the_merged_weight():
    p, a, _, lora_loss = _grad_case()
    # One compile: the adapters' gradient and the base's, which is dL/dW' of the merged
    # W' = W + s B A (the base enters W' with coefficient 1).
    grads, g_base = jax.jit(jax.grad(lora_loss, argnums=(0, 1)))(a, p)
    assert jax.tree.structure(grads) == jax.tree.structure(a)
    # dL/dA = s B^T dL/dW', dL/dB = s dL/dW' A^T.
    for n in LC.targets:
        g_w = np.asarray(g_base["layers"][n])
        ga = LC.scale * np.einsum("lor,loi->lri", a["layers"][n]["b"], g_w)
        gb = LC.scale * np.einsum("loi,lri->lor", g_w, a["layers"][n]["a"])
        for got, want in ((grads["layers"][n]["a"], ga), (grads["layers"][n]["b"], gb)):
            assert np.abs(want).max() > 1e-3, n
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_no_base_gradient_is_computed():
    p, a, loss, lora_loss = _grad_case()
    # No dot_general of the adapters' gradient program yields a per-layer [out, in] weight (or
    # the [V, D] head), while the full gradient's program has them all (the check can fail).
    base_shapes = {tuple(x.shape[1:]) for x in p["layers"].values() if x.ndim == 3}
    base_shapes |= {tuple(p["lm_head"].shape)}
    lora_dots = _dot_shapes(jax.make_jaxpr(jax.grad(lora_loss))(a, p).jaxpr)
    full_dots = _dot_shapes(jax.make_jaxpr(jax.grad(loss))(p).jaxpr)
    assert base_shapes <= set(full_dots)
    assert not base_shapes & set(lora_dots), sorted(base_shapes & set(lora_dots))
    assert {(4, 32), (4, 48), (32, 4), (16, 4), (48, 4)} <= set(lora_dots)  # dA, dB per target
