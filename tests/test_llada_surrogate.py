"""The trajectory surrogate of LLaDA (diffusion.surrogate=trajectory): the policy gradient of the
replayed trajectory, checked against a replay written here step by step from the public
description (the canvas before each step, the sampler's candidates, log_softmax(logits / T),
and the low_confidence selection term with the block's eligible positions written out)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.core.errors import UsageError
from ais_jax.method import grpo
from ais_jax.method.selection import selection_logprob
from ais_jax.models.llada.model import LLaDAConfig, forward, init_params
from ais_jax.training.flops import grpo_step_flops
from ais_jax.training.llada import steps as ls
from ais_jax.training.optim import init_train_state
from ais_jax.training.trainer import loss_config

LCFG = LLaDAConfig(vocab_size=24, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=2, num_kv_heads=1, mask_token_id=23, text_vocab_size=22,
                   eos_token_id=2, pad_token_id=0)
PARAMS = jax.tree.map(lambda a: a * 3.0 if a.ndim > 1 else a, init_params(jax.random.key(0), LCFG))
LLADA_RUN = [*TINY_RUN, "model.kind=llada", "rollout.max_new_tokens=8",
             "diffusion.block_length=4", "diffusion.steps=4", "checkpoint.every=0",
             "diffusion.ratio=trajectory", "model.compute_dtype=float32"]
REWARDS = jnp.asarray([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
LR = 0.05


def _cfg(*extra: str):
    return load_config(None, [*LLADA_RUN, *extra])


_BATCH: dict = {}


def _batch():
    if not _BATCH:
        cfg = _cfg()
        prompts = jnp.asarray(np.random.default_rng(2).integers(3, 22, size=(2, 5)), jnp.int32)
        pm = jnp.ones((2, 5), jnp.bool_).at[1, :2].set(False)  # a left-padded prompt
        _BATCH["b"] = jax.jit(lambda p, k: ls.rollout(p, prompts, pm, k, LCFG, cfg, (2,)))(
            PARAMS, jax.random.key(3))
    return _BATCH["b"]


def _reference_replay(params, batch, steps: int, temperature: float,
                      block_length: int = 4) -> jax.Array:
    """``[B, N]``: each response token's log-prob on the canvas of the step that revealed it,
    plus its even share of the step's low_confidence selection term (`selection_logprob` over
    the block's positions still masked before the step and not revealed at it), one explicit
    forward per step (no vmap, no map, no remat)."""
    P = batch.prompt_tokens.shape[1]
    N = batch.tokens.shape[1]
    spb = steps // (N // block_length)
    attn = jnp.concatenate([batch.prompt_mask.astype(bool),
                            jnp.ones(batch.tokens.shape, bool)], axis=1)
    allowed = (jnp.arange(LCFG.vocab_size) < LCFG.text_vocab_size) & (
        jnp.arange(LCFG.vocab_size) != LCFG.mask_token_id)
    out = jnp.zeros(batch.tokens.shape, jnp.float32)
    for i in range(steps):
        canvas = jnp.where(batch.reveal_step < i, batch.tokens, LCFG.mask_token_id)
        logits = forward(params, jnp.concatenate([batch.prompt_tokens, canvas], 1), LCFG,
                         attn)[:, P:].astype(jnp.float32)
        logits = jnp.where(allowed, logits, -jnp.inf)
        z = jax.nn.log_softmax(logits / temperature, axis=-1)
        lp = jnp.take_along_axis(z, batch.tokens[..., None], axis=-1)[..., 0]
        revealed = batch.reveal_step == i
        lo = (i // spb) * block_length
        in_block = (jnp.arange(N) >= lo) & (jnp.arange(N) < lo + block_length)
        left = in_block & (batch.reveal_step > i)
        sel = selection_logprob(jax.nn.log_softmax(logits, axis=-1), z, batch.tokens, revealed,
                                left)  # [B]
        share = sel / jnp.sum(revealed, axis=1)
        out = out + jnp.where(revealed, lp + share[:, None], 0.0)
    return out


def _update(*extra: str):
    cfg = _cfg(*extra)
    batch = _batch()
    # SGD whose state keeps the step's gradient (a trace with decay 0): compared exactly,
    # without the rounding of params + update
    opt = optax.chain(optax.trace(decay=0.0), optax.scale(-LR))
    lo = ls.score(PARAMS, batch, LCFG, cfg)
    return jax.jit(lambda s, lo: ls.update(s, batch, REWARDS, jax.random.key(0), None, lo, opt,
                                           LCFG, cfg))(init_train_state(PARAMS, opt), lo)


def _grads(state):
    """The gradient of the step (the trace of `_update`'s optimizer)."""
    return [np.asarray(g) for g in jax.tree.leaves(state.opt_state[0].trace)]


@pytest.mark.slow  # ~30 s on 2 loaded cores: compiles three update programs with replays
def test_trajectory_surrogate_is_the_gradient_of_the_replayed_trajectory():
    cfg = _cfg("diffusion.surrogate=trajectory", "ais.mode=none")
    batch = _batch()
    T = cfg.rollout.temperature
    # The reference is jitted (one program instead of ~250 eagerly compiled ops: 20 s less).
    old = jax.lax.stop_gradient(jax.jit(lambda p: _reference_replay(p, batch, 4, T))(PARAMS))
    adv = jnp.broadcast_to(grpo.group_advantages(REWARDS).reshape(-1)[:, None], old.shape)

    def ref_loss(p):
        new = _reference_replay(p, batch, 4, T)
        return grpo.grpo_loss(new, old, adv, batch.mask, None, loss_config(cfg.train))[0]

    want = [np.asarray(x) for x in jax.tree.leaves(jax.jit(jax.grad(ref_loss))(PARAMS))]
    scale = max(np.abs(w).max() for w in want)
    assert scale > 1e-3  # a gradient that moves the params
    state, m = _update("diffusion.surrogate=trajectory", "ais.mode=none")
    assert float(m["skipped"]) == 0.0
    moved = jax.tree.leaves(state.params)[0] - jax.tree.leaves(PARAMS)[0]
    np.testing.assert_allclose(np.asarray(moved), -LR * want[0], rtol=0, atol=1e-6)
    for got, w in zip(_grads(state), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6 * scale)
    # The estimator surrogate takes another gradient with the same advantages.
    est_state, _ = _update("ais.mode=none")
    assert any(not np.allclose(a, b, rtol=1e-2, atol=1e-2 * scale)
               for a, b in zip(_grads(est_state), want, strict=True))
    # Micro-batches (whole-batch normalizers) and remat (one step at a time, recomputed in
    # the backward pass) change nothing but rounding: both at once, one program (either
    # path alone wrong would move the gradient off the reference).
    other, _ = _update("diffusion.surrogate=trajectory", "ais.mode=none",
                       "train.micro_batch_size=4", "train.remat=full")
    for got, w in zip(_grads(other), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6 * scale)


@pytest.mark.slow  # ~20 s: two update programs with AIS
def test_the_surrogate_leaves_the_correction_alone():
    s_traj, m_traj = _update("diffusion.surrogate=trajectory", "ais.mode=ais")
    s_est, m_est = _update("ais.mode=ais")
    for k in ("d_bar", "alpha", "traj/d_bar", "traj/token_ess", "est/d_bar",
              "traj/select_seq_logratio_abs", "traj/select_share"):
        assert float(m_traj[k]) == float(m_est[k]), k  # the same correction statistics
    assert np.isfinite(float(m_traj["loss"])) and float(m_traj["skipped"]) == 0.0
    assert any(not np.allclose(a, b, rtol=1e-2) for a, b in zip(_grads(s_traj), _grads(s_est),
                                                                  strict=True))


@pytest.mark.slow  # ~20 s: one update program with the trajectory surrogate
def test_a_trajectory_of_trainer_probability_zero_is_left_out_of_the_surrogate():
    """A selection term can be -inf under the trainer (no candidate of a position left masked
    ranks below the revealed ones): its tokens' ratio is 0, and the step stays finite."""
    cfg = _cfg("diffusion.surrogate=trajectory", "ais.mode=tis")
    batch = _batch()
    est, traj, sel = ls.score(PARAMS, batch, LCFG, cfg)
    zero = (jnp.arange(batch.tokens.shape[0])[:, None] == 0) & (batch.reveal_step == 0)
    traj, sel = jnp.where(zero, -jnp.inf, traj), jnp.where(zero, -jnp.inf, sel)
    opt = optax.chain(optax.trace(decay=0.0), optax.scale(-LR))
    state, m = jax.jit(lambda s, lo: ls.update(s, batch, REWARDS, jax.random.key(0), None, lo,
                                               opt, LCFG, cfg))(
        init_train_state(PARAMS, opt), (est, traj, sel))
    assert float(m["skipped"]) == 0.0 and np.isfinite(float(m["loss"]))
    assert all(np.isfinite(g).all() for g in _grads(state))
    assert np.isfinite(float(m["traj/select_share"]))


def test_trajectory_surrogate_needs_the_trajectory_ratio():
    with pytest.raises(UsageError, match=r"diffusion\.surrogate=trajectory.*"
                                         r"diffusion\.ratio=trajectory"):
        _cfg("diffusion.ratio=estimator", "diffusion.surrogate=trajectory")
    with pytest.raises(UsageError, match=r"diffusion\.surrogate"):
        _cfg("diffusion.surrogate=foo")
    assert _cfg("diffusion.surrogate=trajectory").diffusion.surrogate == "trajectory"


def test_flops_count_a_replay_per_gradient_pass():
    est = grpo_step_flops(_cfg("diffusion.inner_iterations=2"), LCFG, 5, 8, kl=True,
                          score_separately=True)
    traj = grpo_step_flops(_cfg("diffusion.inner_iterations=2", "diffusion.surrogate=trajectory"),
                           LCFG, 5, 8, kl=True, score_separately=True)
    fwd = est.update / (3 * 2 + 2)  # M = 2 passes of 3 forwards' cost, M reference forwards
    assert traj.update == fwd * 4 * (3 * 2 + 1)  # steps = 4 forwards a pass, one reference replay
    assert traj.rollout == est.rollout and traj.score == est.score
