"""train.proximal=behaviour (AReaL's naive PPO): the update's loss and gradient equal a
reference written here, ``-min(r A, clip(r, 1 - e, 1 + e) A)`` with
``r = exp(logp_theta - logp_sampler)`` and no importance weight; the config refuses it where
it has no meaning."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ais_jax.config.load import load_config
from ais_jax.core.errors import UsageError
from ais_jax.models import model as model_lib
from ais_jax.training import optim, policy, trainer
from ais_jax.training.trainer import RolloutBatch

MC = model_lib.ModelConfig(vocab_size=23, hidden_size=16, intermediate_size=24, num_layers=1,
                           num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=32)
PN, G, P, N = 2, 4, 3, 5


def _setup(overrides=()):
    cfg = load_config(None, [f"rollout.prompts_per_step={PN}", f"rollout.group_size={G}",
                             f"rollout.max_new_tokens={N}", "model.compute_dtype=float32",
                             "train.logprob_chunk=0", *overrides])
    ks = jax.random.split(jax.random.key(3), 6)
    params = model_lib.init_params(ks[0], MC)
    params["embed"] = params["embed"] * 10.0  # sharp distributions: ratios far from 1
    B = PN * G
    mask = (jnp.arange(N)[None, :] <= (jnp.arange(B) % N)[:, None]).astype(jnp.float32)
    prompts = jax.random.randint(ks[1], (B, P), 0, MC.vocab_size)
    pmask, tokens = jnp.ones((B, P), jnp.bool_), jax.random.randint(ks[2], (B, N), 0, 23)
    lp = policy.trainer_logprobs(params, prompts, pmask, tokens, MC,
                                 trainer.scoring(cfg, None, MC.vocab_size))
    # the sampler's log-probs: the trainer's +- 0.4, so the clip acts on some tokens only
    batch = RolloutBatch(prompts, pmask, tokens, mask,
                         lp + jax.random.uniform(ks[3], (B, N), minval=-0.4, maxval=0.4))
    rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]], jnp.float32)
    return cfg, params, batch, rewards, ks[5]


def _reference_loss(params, batch, rewards, cfg):
    """Naive PPO by hand: group-normalised advantages (sample std), ratio to the sampler."""
    r = np.asarray(rewards, np.float64)
    adv = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)
    adv = jnp.asarray(np.repeat(adv.reshape(-1, 1), N, axis=1), jnp.float32)  # [B, N]
    sc = trainer.scoring(cfg, None, MC.vocab_size)
    lp = policy.trainer_logprobs(params, batch.prompt_tokens, batch.prompt_mask, batch.tokens,
                                 MC, sc)
    ratio = jnp.exp(lp - batch.logp)
    per_tok = -jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.2) * adv)
    return jnp.sum(per_tok * batch.mask) / jnp.sum(batch.mask)


def _update(cfg, params, batch, rewards, key, one_pass):
    lr = 1e4  # params' change = -lr x gradient, large beside float32's rounding of params
    opt = optax.sgd(lr)
    state = optim.init_train_state(params, opt)
    new, mets = jax.jit(lambda s: trainer.update(s, batch, rewards, key, None, opt, MC, cfg,
                                                 one_pass=one_pass))(state)
    return jax.tree.map(lambda a, b: (a - b) / lr, params, new.params), mets


@pytest.mark.slow  # ~6-16 s on 2 busy cores (compiles two updates and the reference)
@pytest.mark.parametrize("one_pass", [True, False])
def test_behaviour_proximal_equals_the_reference_loss_and_gradient(one_pass):
    cfg, params, batch, rewards, key = _setup(
        ["train.proximal=behaviour", "ais.mode=none", "train.clip_norm=0"])
    grads, mets = _update(cfg, params, batch, rewards, key, one_pass)
    ref_loss, ref_grads = jax.value_and_grad(_reference_loss)(params, batch, rewards, cfg)
    np.testing.assert_allclose(float(mets["loss"]), float(ref_loss), rtol=1e-5)
    assert 0.05 < float(mets["clip_frac"]) < 0.95  # the clip acts on some tokens, not all
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        scale = float(jnp.max(jnp.abs(b)))
        assert scale > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * scale)
    # the current proximal (ratio 1, no clip at one epoch) takes another step on this batch
    cur, cur_mets = _update(_setup(["ais.mode=none", "train.clip_norm=0"])[0], params, batch,
                            rewards, key, one_pass)
    assert float(cur_mets["clip_frac"]) == 0.0
    diff = max(float(jnp.max(jnp.abs(a - b)))
               for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(cur), strict=True))
    assert diff > 1e-3 * max(float(jnp.max(jnp.abs(b))) for b in jax.tree.leaves(cur))


@pytest.mark.parametrize(("overrides", "needle"), [
    (["train.proximal=behaviour", "ais.mode=tis"], "set ais.mode=none"),
    (["train.proximal=behaviour", "ais.mode=none", "rollout.top_k=5"], "rollout.top_k=0"),
    (["train.proximal=behaviour", "ais.mode=none", "model.kind=llada"], "LLaDA"),
    (["train.proximal=sampler"], "train.proximal"),
])
def test_config_refuses_behaviour_where_it_has_no_meaning(overrides, needle):
    with pytest.raises(UsageError, match=needle):
        load_config(None, overrides)
