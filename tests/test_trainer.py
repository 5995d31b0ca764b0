"""The update program: one forward when exact (logp_old from the differentiated pass) equals
the two-pass update, and a logp_old scored in its own program equals the one scored inside."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ais_jax import model as model_lib
from ais_jax import optim, trainer
from ais_jax.config import load_config
from ais_jax.steps import RolloutBatch

MC = model_lib.ModelConfig(vocab_size=37, hidden_size=32, intermediate_size=48, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64)
PN, G, P, N = 3, 4, 5, 6


def _setup(overrides=(), seed=0):
    cfg = load_config(None, [f"rollout.prompts_per_step={PN}", f"rollout.group_size={G}",
                             f"rollout.max_new_tokens={N}", "model.compute_dtype=float32",
                             "train.logprob_chunk=4", *overrides])
    ks = jax.random.split(jax.random.key(seed), 6)
    params = model_lib.init_params(ks[0], MC)
    params["embed"] = params["embed"] * 10.0  # sharper distributions, larger gradients
    B = PN * G
    pmask = jnp.arange(P)[None, :] >= (jnp.arange(B) % 3)[:, None]
    mask = (jnp.arange(N)[None, :] <= (jnp.arange(B) % N)[:, None]).astype(jnp.float32)
    batch = RolloutBatch(jax.random.randint(ks[1], (B, P), 0, MC.vocab_size), pmask,
                         jax.random.randint(ks[2], (B, N), 0, MC.vocab_size), mask,
                         -2.0 - jax.random.uniform(ks[3], (B, N)))  # sampler log-probs
    rewards = jax.random.bernoulli(ks[4], 0.5, (PN, G)).astype(jnp.float32)
    return cfg, params, batch, rewards, ks[5]


def _run(cfg, params, batch, rewards, key, ref=None, **kw):
    opt = optax.sgd(1.0)  # params' change = -gradient: compares gradients, not Adam's signs
    state = optim.init_train_state(params, opt)
    new, mets = jax.jit(lambda s, b, r, k, rp: trainer.update(
        s, b, r, k, rp, opt, MC, cfg, **kw))(state, batch, rewards, key, ref)
    grads = jax.tree.map(lambda a, b: b - a, new.params, params)
    return grads, {k: float(v) for k, v in mets.items()}


@pytest.mark.parametrize("overrides", [
    (), ("ais.mode=tis",), ("train.beta_kl=0.05",), ("train.loss_aggregation=constant",),
    ("rollout.top_k=5",)])
def test_single_forward_equals_two_passes(overrides):
    cfg, params, batch, rewards, key = _setup(overrides)
    assert trainer.single_forward(cfg)
    ref = jax.tree.map(lambda x: x * 0.9, params) if cfg.train.beta_kl else None
    g1, m1 = _run(cfg, params, batch, rewards, key, ref, one_pass=True)
    g2, m2 = _run(cfg, params, batch, rewards, key, ref, one_pass=False)
    assert set(m1) == set(m2)
    for k in m2:
        np.testing.assert_allclose(m1[k], m2[k], rtol=1e-6, atol=1e-7, err_msg=k)
    assert m2["alpha"] > 0 or cfg.ais.mode != "ais"  # AIS really ran
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        scale = float(jnp.max(jnp.abs(b)))
        assert scale > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6 * scale)


def test_logp_old_from_the_score_program_equals_the_inline_one():
    cfg, params, batch, rewards, key = _setup(("train.minibatches=2", "train.epochs=2"))
    assert not trainer.single_forward(cfg)
    lo = jax.jit(lambda p, b: trainer.score(p, b, MC, cfg, None))(params, batch)
    g1, m1 = _run(cfg, params, batch, rewards, key, logp_old=lo)
    g2, m2 = _run(cfg, params, batch, rewards, key)
    for k in m2:
        np.testing.assert_allclose(m1[k], m2[k], rtol=1e-6, atol=1e-7, err_msg=k)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                   atol=1e-6 * float(jnp.max(jnp.abs(b))))


def test_single_forward_needs_one_epoch_one_minibatch_no_accumulation():
    base = ["rollout.prompts_per_step=4", "rollout.group_size=4"]
    assert trainer.single_forward(load_config(None, base))
    assert trainer.single_forward(load_config(None, [*base, "train.micro_batch_size=16"]))
    for extra in ("train.epochs=2", "train.minibatches=2", "train.micro_batch_size=8"):
        assert not trainer.single_forward(load_config(None, [*base, extra])), extra
    cfg, params, batch, rewards, key = _setup(("train.minibatches=2",))
    with pytest.raises(ValueError, match="one_pass"):
        _run(cfg, params, batch, rewards, key, one_pass=True)
