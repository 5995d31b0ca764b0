"""The update program: one forward when exact (logp_old from the differentiated pass) equals
the two-pass update, and a logp_old scored in its own program equals the one scored inside."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ais_jax.config.load import load_config
from ais_jax.models import model as model_lib
from ais_jax.training import optim, trainer
from ais_jax.training.trainer import RolloutBatch

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


@pytest.mark.xla_optimized  # two programs' gradients agree to 1e-6 of the largest: as a user's run
@pytest.mark.slow  # ~22 s in the full suite on 2 busy cores
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


@pytest.mark.slow  # ~16 s in the full suite on 2 busy cores
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


@pytest.mark.slow  # ~9 s in the full suite on 2 busy cores
def test_truncation_with_kl_skips_no_update_and_stays_finite():
    # Random tokens: most fall outside the trainer's top-5 set (trainer probability 0).
    cfg, params, batch, rewards, key = _setup(("rollout.top_k=5", "train.beta_kl=0.05",
                                               "train.minibatches=2"))
    opt = optax.adam(1e-3)
    state = optim.init_train_state(params, opt)
    ref = jax.tree.map(lambda x: x * 0.9, params)
    step = jax.jit(lambda s, k: trainer.update(s, batch, rewards, k, ref, opt, MC, cfg))
    for i in range(3):
        state, m = step(state, jax.random.fold_in(key, i))
        m = {k: float(v) for k, v in m.items()}
        assert m["skipped"] == 0, m
        assert np.isfinite(m["loss"]) and np.isfinite(m["kl"]) and m["kl"] > 0, m
        assert m["zero_prob_tokens"] > 0 and m["loss_tokens"] == float(jnp.sum(batch.mask)), m
    assert int(state.skipped) == 0


@pytest.mark.slow  # ~15 s in the full suite on 2 busy cores
def test_arms_train_on_the_same_token_set_under_truncation():
    seen = {}
    for mode in ("none", "tis", "ais"):
        cfg, params, batch, rewards, key = _setup(("rollout.top_k=5", f"ais.mode={mode}"))
        g, m = _run(cfg, params, batch, rewards, key)
        assert m["skipped"] == 0 and np.isfinite(m["loss"]), (mode, m)
        assert m["zero_prob_tokens"] > 0, m
        seen[mode] = (m["loss_tokens"], m["zero_prob_tokens"], m["dropped_tokens"])
        if mode == "none":  # trains on the sampled tokens the trainer's top-5 excludes too
            assert all(float(jnp.max(jnp.abs(x))) > 0 for x in jax.tree.leaves(g))
    assert seen["none"] == seen["tis"] == seen["ais"], seen
    assert seen["none"][0] == float(jnp.sum(batch.mask)) and seen["none"][2] == 0


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
@pytest.mark.parametrize("mode", ["token_mask", "seq_tis", "seq_mask", "geo_mask"])
def test_peer_modes_run_through_the_update(mode):
    cfg, params, batch, rewards, key = _setup((f"ais.mode={mode}", "ais.C=2.0"))
    _, m = _run(cfg, params, batch, rewards, key)
    assert m["skipped"] == 0 and np.isfinite(m["loss"]), m
    valid = float(jnp.sum(batch.mask))
    assert m["loss_tokens"] + m["dropped_tokens"] == valid, m
    for k in ("kl_k1", "kl_k3", "log_ratio_p50", "d_bar", "alpha"):
        assert np.isfinite(m[k]), (k, m)
    assert m["alpha"] == 0.0  # alpha's parts are logged, alpha itself is not applied


def test_nan_sampler_logprob_skips_the_update():
    cfg, params, batch, rewards, key = _setup()
    batch = batch._replace(logp=batch.logp.at[0, 0].set(jnp.nan))  # a valid position
    grads, m = _run(cfg, params, batch, rewards, key)
    assert m["skipped"] == 1
    assert all(float(jnp.max(jnp.abs(x))) == 0 for x in jax.tree.leaves(grads))


def test_warmup_counts_rl_steps_and_starts_above_zero():
    from ais_jax.training.optim import rl_warmup

    sched = rl_warmup(1e-3, warmup_steps=10, updates_per_step=4)  # e.g. 4 minibatches
    lrs = np.array([float(sched(c)) for c in range(48)])
    assert lrs[0] == pytest.approx(1e-4)  # the first update moves the weights
    for s in range(12):  # every update of one RL step runs at that step's rate
        np.testing.assert_allclose(lrs[4 * s:4 * s + 4], 1e-3 * min(1.0, (s + 1) / 10),
                                   rtol=1e-6)
    assert lrs[4 * 9] == pytest.approx(1e-3) and lrs[4 * 8] < 1e-3
