"""Tests of ais_jax.method.grpo: advantages, log-probs, the clipped k3-KL objective, the guarded
update."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ais_jax.method import grpo
from ais_jax.method.distributions import token_logprobs
from ais_jax.models.model import ModelConfig, forward, init_params
from ais_jax.training import optim, policy


def test_group_advantages_known_answer():
    a = grpo.group_advantages(jnp.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 3.0]]))
    s = np.sqrt(1 / 3)  # ddof=1 std of [1, 0, 0, 1]
    np.testing.assert_allclose(np.asarray(a[0]), np.array([0.5, -0.5, -0.5, 0.5]) / (s + 1e-6),
                               rtol=1e-6)
    np.testing.assert_allclose(float(a[1, 3]), 2.25 / (1.5 + 1e-6), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grpo.group_advantages(jnp.array([[1.0, 3.0]]),
                                                                scale=False)), [[-1.0, 1.0]])


@pytest.mark.slow  # ~6 s in the full suite on 2 busy cores
def test_equal_rewards_give_exactly_zero_advantage():
    r = jnp.array([[0.1, 0.1, 0.1], [7.3, 7.3, 7.3], [0.0, 0.0, 0.0]])
    a = grpo.group_advantages(r)
    assert np.all(np.asarray(a) == 0.0)
    assert np.all(np.asarray(grpo.group_advantages(jnp.array([[5.0], [1.0]]))) == 0.0)
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        grpo.group_advantages(jnp.ones(4))


def test_token_logprobs_applies_temperature():
    logits = jnp.array([[2.0, 1.0, 0.0, -1.0]])
    for T in (1.0, 0.5, 2.0):
        z = np.array([2.0, 1.0, 0.0, -1.0]) / T
        ref = z[2] - np.log(np.exp(z).sum())
        np.testing.assert_allclose(float(token_logprobs(logits, jnp.array([2]), T)[0]), ref,
                                   rtol=1e-6)
    # temperature 0 is greedy decoding, scored at temperature 1 (as the sampler records it)
    z = np.array([2.0, 1.0, 0.0, -1.0])
    np.testing.assert_allclose(float(token_logprobs(logits, jnp.array([2]), 0.0)[0]),
                               z[2] - np.log(np.exp(z).sum()), rtol=1e-6)


# --------------------------------------------------------- loss vs NumPy reference

def _np_loss_and_grad(ln, lo, adv, mask, lref, beta, eps_lo, eps_hi, agg, normalizer=None):
    """Hand-written loss and d loss / d logp_new in float64."""
    v = mask.astype(bool)
    r = np.exp(ln - lo)
    unclipped, clipped = r * adv, np.clip(r, 1 - eps_lo, 1 + eps_hi) * adv
    use_unclipped = unclipped <= clipped
    per = -np.minimum(unclipped, clipped)
    dper = np.where(use_unclipped, -r * adv, 0.0)  # clipped branch is constant in ln
    if lref is not None:
        d = lref - ln
        per = per + beta * (np.exp(d) - d - 1)
        dper = dper + beta * (1 - np.exp(d))
    per, dper = np.where(v, per, 0.0), np.where(v, dper, 0.0)
    if agg == "token_mean":
        n = max(v.sum(), 1)
        return per.sum() / n, dper / n
    if agg == "seq_mean_token_mean":
        cnt = v.sum(-1)
        has = cnt > 0
        w = np.where(has, 1.0 / np.maximum(cnt, 1), 0.0)[:, None] / max(has.sum(), 1)
        return (per * w).sum(), dper * w
    norm = per.shape[-1] if normalizer is None else normalizer
    return per.sum() / (per.shape[0] * norm), dper / (per.shape[0] * norm)


@pytest.mark.slow  # ~6 s in the full suite on 2 busy cores
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "constant"])
@pytest.mark.parametrize("with_kl", [False, True])
def test_loss_and_grad_match_numpy(agg, with_kl):
    rng = np.random.default_rng(1)
    B, N = 3, 5
    lo = rng.normal(-1.5, 0.5, (B, N))
    ln = lo + rng.normal(0, 0.3, (B, N))  # some ratios outside [0.8, 1.2]
    adv = rng.normal(size=(B, N))
    mask = (rng.random((B, N)) < 0.7).astype(np.float32)
    mask[2] = 0  # one sequence without valid tokens
    lref = lo + rng.normal(0, 0.2, (B, N)) if with_kl else None
    garbage = np.where(mask > 0, 0.0, np.nan)  # masked slots hold NaN
    cfg = grpo.LossConfig(clip_eps=0.2, clip_eps_high=0.28, beta_kl=0.05, aggregation=agg)
    args = [jnp.asarray(x + garbage, jnp.float32) for x in (lo, adv)]
    lref_j = None if lref is None else jnp.asarray(lref + garbage, jnp.float32)

    def f(ln_):
        return grpo.grpo_loss(ln_, args[0], args[1], jnp.asarray(mask), lref_j, cfg)[0]

    loss, g = jax.value_and_grad(f)(jnp.asarray(ln + garbage, jnp.float32))
    ref_loss, ref_g = _np_loss_and_grad(ln, lo, adv, mask, lref, 0.05, 0.2, 0.28, agg)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g), ref_g, rtol=1e-4, atol=1e-7)


@pytest.mark.slow  # ~5 s in the full suite on 2 busy cores
def test_loss_metrics_and_bad_aggregation():
    ln = jnp.log(jnp.array([[1.0, 1.5, 0.5]]))
    loss, m = grpo.grpo_loss(ln, jnp.zeros((1, 3)), jnp.ones((1, 3)), jnp.ones((1, 3)))
    np.testing.assert_allclose(float(m["clip_frac"]), 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(float(m["ratio_mean"]), 1.0, rtol=1e-6)
    np.testing.assert_allclose(float(loss), -(1.0 + 1.2 + 0.5) / 3, rtol=1e-6)
    with pytest.raises(ValueError, match="aggregation 'sum'"):
        grpo.grpo_loss(ln, ln, ln, ln, loss_cfg=grpo.LossConfig(aggregation="sum"))


# --------------------------------------------------------------- model-level pieces

CFG = ModelConfig(vocab_size=23, hidden_size=16, intermediate_size=32, num_layers=2,
                  num_heads=2, num_kv_heads=1, head_dim=8)


def _batch(key, B=4, P=3, N=5):
    k1, k2 = jax.random.split(key)
    prompt = jax.random.randint(k1, (B, P), 0, CFG.vocab_size)
    pmask = jnp.ones((B, P), bool).at[0, 0].set(False)  # a left-padded row
    toks = jax.random.randint(k2, (B, N), 0, CFG.vocab_size)
    return prompt, pmask, toks


@pytest.mark.slow  # ~11 s in the full suite on 2 busy cores
def test_sequence_logprobs_matches_manual_forward():
    params = init_params(jax.random.key(0), CFG)
    prompt, pmask, toks = _batch(jax.random.key(1))
    # Both sides jitted and the reference read in numpy: a few programs, not ~150 eager ops.
    got = jax.jit(lambda p: policy.sequence_logprobs(p, prompt, pmask, toks, CFG,
                                                     temperature=0.7))(params)
    manual = jax.jit(lambda p, seq: jax.nn.log_softmax(forward(p, seq, CFG)[0] / 0.7))
    tok = np.asarray(toks)
    for b in range(prompt.shape[0]):
        keep = np.asarray(pmask[b])
        seq = jnp.concatenate([prompt[b][keep], toks[b]])[None]
        lp = np.asarray(manual(params, seq))
        P = int(keep.sum())
        ref = [lp[P - 1 + n, tok[b, n]] for n in range(tok.shape[1])]
        np.testing.assert_allclose(np.asarray(got[b]), ref, atol=2e-5)


def _update_setup(adv_value):
    params = init_params(jax.random.key(0), CFG)
    prompt, pmask, toks = _batch(jax.random.key(1))
    logp_old = policy.sequence_logprobs(params, prompt, pmask, toks, CFG)
    mask = jnp.ones(toks.shape, jnp.float32)
    batch = grpo.GRPOBatch(prompt, pmask, toks, mask, logp_old,
                           jnp.full(toks.shape, adv_value, jnp.float32))
    opt = optim.make_optimizer(1e-2, clip_norm=1.0)
    f32 = policy.Scoring(compute_dtype=jnp.float32)
    loss_fn = lambda p, b: policy.policy_loss(p, b, CFG, scoring=f32)  # noqa: E731
    step = jax.jit(lambda s, b: optim.apply_update(s, b, loss_fn, opt))
    return params, batch, opt, step, logp_old


@pytest.mark.slow  # ~17 s in the full suite on 2 busy cores
def test_update_raises_logp_of_positive_advantage_tokens():
    params, batch, opt, step, logp_old = _update_setup(1.0)
    state = optim.init_train_state(params, opt)
    for _ in range(3):
        state, metrics = step(state, batch)
    new = policy.sequence_logprobs(state.params, batch.prompt_tokens, batch.prompt_mask,
                                 batch.tokens, CFG)
    assert float(jnp.mean(new - logp_old)) > 0.01
    assert int(state.step) == 3 and int(state.skipped) == 0
    assert float(metrics["skipped"]) == 0.0 and np.isfinite(float(metrics["grad_norm"]))


@pytest.mark.parametrize("poison", ["advantage_nan", "logp_old_inf"])
def test_nonfinite_step_is_skipped_bit_identically(poison):
    params, batch, opt, step, _ = _update_setup(1.0)
    state = optim.init_train_state(params, opt)
    state, _ = step(state, batch)  # one real step so the optimizer moments are nonzero
    if poison == "advantage_nan":
        bad = batch._replace(advantages=batch.advantages.at[0, 0].set(jnp.nan))
    else:
        bad = batch._replace(logp_old=batch.logp_old.at[1, 2].set(-jnp.inf))
    new, metrics = step(state, bad)
    assert float(metrics["skipped"]) == 1.0
    assert int(new.skipped) == 1 and int(new.step) == 2
    for a, b in zip(jax.tree.leaves((state.params, state.opt_state)),
                    jax.tree.leaves((new.params, new.opt_state)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # and the next finite step proceeds normally from the untouched state
    after, m = step(new, batch)
    assert float(m["skipped"]) == 0.0 and int(after.skipped) == 1


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
def test_optimizer_without_clipping_is_plain_adamw():
    opt = optim.make_optimizer(0.1, clip_norm=None)
    p = {"w": jnp.ones(3)}
    u, _ = opt.update({"w": jnp.full(3, 100.0)}, opt.init(p), p)
    ref, _ = optax.adamw(0.1, weight_decay=0.0).update({"w": jnp.full(3, 100.0)},
                                                       optax.adamw(0.1).init(p), p)
    np.testing.assert_allclose(np.asarray(u["w"]), np.asarray(ref["w"]), rtol=1e-6)
