"""The selection term in the trajectory log-probability of LLaDA (issue 42): the sampler's
complete record (token part + selection share) is the probability of what it did, checked
against its own empirical outcome frequencies, and the replay's complete log-prob and its
gradient equal a replay written here step by step with the eligible positions spelled out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ais_jax.method.selection import selection_logprob
from ais_jax.models.llada.model import LLaDAConfig, forward, init_params
from ais_jax.rollout.llada_sampler import generate
from ais_jax.training.llada.trajectory import trajectory_logprobs

# Monte Carlo model: 4 candidate ids (4 is past the text vocabulary, 5 the mask).
MC_CFG = LLaDAConfig(vocab_size=6, hidden_size=16, intermediate_size=32, num_layers=1,
                     num_heads=2, num_kv_heads=1, mask_token_id=5, text_vocab_size=4)
MC_PARAMS = jax.tree.map(lambda a: a * 2.5 if a.ndim > 1 else a,
                         init_params(jax.random.key(3), MC_CFG))
MC_PROMPT = jnp.asarray([[1, 2]], jnp.int32)
MC_ROWS = 40000


def _outcomes(keys: np.ndarray, logp: np.ndarray):
    """``{outcome: (count, log-prob)}`` over rows; each row's log-prob is checked to agree
    with the other rows of its outcome (the same canvases, so the same numbers)."""
    uniq, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    out = {}
    for u in range(len(uniq)):
        lp = logp[inverse == u]
        assert lp.max() - lp.min() < 1e-4
        out[tuple(uniq[u])] = (int(counts[u]), float(lp[0]))
    return out


def _max_z(outcomes: dict, n: int) -> float:
    """The largest ``|frequency - exp(log-prob)| / standard error`` over the outcomes expected
    at least 30 times (asserting there are at least 10 of them)."""
    zs = [(count / n - p) / np.sqrt(p * (1 - p) / n)
          for count, p in ((c, float(np.exp(lp))) for c, lp in outcomes.values()) if p * n >= 30]
    assert len(zs) >= 10
    return float(np.max(np.abs(zs)))


def _mc_sample(gen_length: int, steps: int, temperature: float):
    return generate(MC_PARAMS, MC_CFG, MC_PROMPT, jax.random.key(11), gen_length=gen_length,
                    block_length=gen_length, steps=steps, temperature=temperature,
                    num_samples=MC_ROWS)


@pytest.mark.xla_optimized  # bit-identical to another program: compiled as a user's run
@pytest.mark.slow  # ~18 s in the full suite on 2 busy cores
def test_one_step_reveal_frequencies_match_the_complete_record():
    """4 masked positions, the first step reveals the 2 most confident candidates: each
    outcome (which 2, which tokens) occurs with probability exp(sum over the 2 tokens of
    logprobs + select_logprobs), within 4 standard errors; the same check rejects the token
    part alone and selection terms that rank by the tempered log-probs or weigh by the
    untempered ones (the check has the power to see such mistakes)."""
    T = 0.5
    out = _mc_sample(4, 2, T)
    toks = np.asarray(out.tokens)[:, 2:]
    first = np.asarray(out.reveal_step) == 0
    assert (first.sum(1) == 2).all()
    keys = np.where(first, toks, -1)  # the step's outcome: revealed set and tokens
    tok = np.where(first, np.asarray(out.logprobs), 0).sum(1)
    sel = np.where(first, np.asarray(out.select_logprobs), 0).sum(1)
    # a log-probability: <= 0 up to float32 rounding (1.2e-7 under XLA's SSE4_2 code: issue 58);
    # 0 where every candidate ranks below
    assert (sel <= 1e-6).all() and (sel < -1e-6).mean() > 0.5
    outcomes = _outcomes(keys, tok + sel)
    assert _max_z(outcomes, MC_ROWS) < 4
    assert 1 - 1e-4 < sum(np.exp(lp) for _, lp in outcomes.values()) <= 1 + 1e-4
    token_only = sum(np.exp(lp) for _, lp in _outcomes(keys, tok).values())
    assert token_only > 2  # no distribution over outcomes without the selection term
    # the step's canvas is all masks: its logits give the wrong terms to compare
    logits = forward(MC_PARAMS, jnp.concatenate([MC_PROMPT, jnp.full((1, 4), 5)], 1),
                     MC_CFG)[:, 2:]
    logits = jnp.where(jnp.arange(6) < 4, logits, -jnp.inf)
    raw, z = jax.nn.log_softmax(logits, -1), jax.nn.log_softmax(logits / T, -1)
    for conf, mass in ((z, z), (raw, raw)):
        wrong = {}
        for key, (count, lp) in outcomes.items():
            k = np.asarray(key)[None]
            args = (jnp.asarray(np.maximum(k, 0)), jnp.asarray(k >= 0), jnp.asarray(k < 0))
            wrong[key] = (count, lp - float(selection_logprob(raw, z, *args)[0])
                          + float(selection_logprob(conf, mass, *args)[0]))
        assert _max_z(wrong, MC_ROWS) > 6


def test_whole_trajectory_frequencies_match_the_complete_record():
    """3 positions revealed 2 then 1: each whole trajectory (reveal order and all tokens)
    occurs with probability exp(row sum of logprobs + select_logprobs)."""
    out = _mc_sample(3, 2, 1.3)
    keys = np.concatenate([np.asarray(out.tokens)[:, 2:], np.asarray(out.reveal_step)], 1)
    logp = (np.asarray(out.logprobs) + np.asarray(out.select_logprobs)).sum(1)
    outcomes = _outcomes(keys, logp)
    assert _max_z(outcomes, MC_ROWS) < 4
    assert sum(np.exp(lp) for _, lp in outcomes.values()) <= 1 + 1e-4


# Gradient model: a 1-layer tiny LLaDA (22 candidate ids).
LCFG = LLaDAConfig(vocab_size=24, hidden_size=32, intermediate_size=64, num_layers=1,
                   num_heads=2, num_kv_heads=1, mask_token_id=23, text_vocab_size=22)
PARAMS = jax.tree.map(lambda a: a * 3.0 if a.ndim > 1 else a, init_params(jax.random.key(0), LCFG))
PROMPT = jnp.asarray(np.random.default_rng(0).integers(3, 22, size=(2, 5)), jnp.int32)
N, BLOCK, STEPS, T, G = 8, 4, 4, 0.8, 2  # 2 of 4, then 2 of 2 masked positions per block


def _hand_replay(params, rows, tokens, reveal_step):
    """``[R, N]`` complete per-token log-probs, one explicit forward per step: the token's
    log_softmax(logits / T) plus an equal share of `selection_logprob` over the positions
    of step i's block that are still masked before step i and not revealed at it."""
    R, P = rows.shape
    spb = STEPS // (N // BLOCK)
    allowed = jnp.arange(LCFG.vocab_size) < LCFG.text_vocab_size  # mask id 23 is past it
    out = jnp.zeros((R, N), jnp.float32)
    for i in range(STEPS):
        canvas = jnp.where(reveal_step < i, tokens, LCFG.mask_token_id)
        logits = forward(params, jnp.concatenate([rows, canvas], 1), LCFG)[:, P:]
        logits = jnp.where(allowed, logits, -jnp.inf)
        z = jax.nn.log_softmax(logits / T, axis=-1)
        lp = jnp.take_along_axis(z, tokens[..., None], axis=-1)[..., 0]
        revealed = reveal_step == i
        block = (i // spb) * BLOCK
        left = np.zeros((R, N), bool)
        for r in range(R):
            for j in range(block, block + BLOCK):
                rs = int(reveal_step[r, j])
                left[r, j] = rs > i or rs == -1  # still masked after step i
        sel = selection_logprob(jax.nn.log_softmax(logits, axis=-1), z, tokens, revealed,
                                jnp.asarray(left))
        n = jnp.sum(revealed, axis=1)
        out = out + jnp.where(revealed, lp + (sel / n)[:, None], 0.0)
    return out


@pytest.fixture(scope="module")
def sample():
    out = generate(PARAMS, LCFG, PROMPT, jax.random.key(5), gen_length=N, block_length=BLOCK,
                   steps=STEPS, temperature=T, num_samples=G)
    rows = jnp.repeat(PROMPT, G, axis=0)
    return rows, out.tokens[:, 5:], out.reveal_step, out


def _replay(p, rows, tokens, reveal_step, **kw):
    return trajectory_logprobs(p, LCFG, rows, tokens, reveal_step, steps=STEPS, temperature=T,
                               block_length=BLOCK, remasking="low_confidence", **kw)


@pytest.mark.slow  # ~30 s on 2 loaded cores: compiles the gradients of four replays
def test_replay_and_its_gradient_equal_a_step_by_step_replay(sample):
    rows, tokens, reveal_step, out = sample
    rs = np.asarray(reveal_step)
    w = jnp.asarray(np.random.default_rng(1).normal(size=tokens.shape), jnp.float32)
    want, vjp = jax.jit(lambda p: jax.vjp(lambda q: _hand_replay(q, rows, tokens, rs), p))(
        PARAMS)  # the loop unrolled in one program: its gradient compiles once
    np.testing.assert_allclose(np.asarray(want), np.asarray(out.logprobs + out.select_logprobs),
                               rtol=0, atol=1e-5)
    g_want = jax.tree.leaves(vjp(w)[0])
    scale = max(float(jnp.abs(g).max()) for g in g_want)

    def parts(p):  # the two parts' weighted sums: their gradients in one program
        tok, sel = _replay(p, rows, tokens, reveal_step, parts=True)
        return jnp.stack([jnp.sum(w * tok), jnp.sum(w * sel)])

    g_tok, g_sel = zip(*(jnp.unstack(g) for g in jax.tree.leaves(
        jax.jit(jax.jacrev(parts))(PARAMS))), strict=True)  # jitted: one program, not op by op
    assert max(float(jnp.abs(g).max()) for g in g_sel) > 1e-2 * scale  # a gradient of its own
    for a, b, c in zip(g_tok, g_sel, g_want, strict=True):
        np.testing.assert_allclose(np.asarray(a + b), np.asarray(c), rtol=1e-4,
                                   atol=1e-5 * scale)
    # one step at a time under remat, and chunks of 3 vmapped steps (padded to 6)
    for chunk, remat in ((1, True), (3, False)):
        got, grads = jax.jit(jax.value_and_grad(lambda p, c=chunk, r=remat: jnp.sum(w * _replay(
            p, rows, tokens, reveal_step, chunk=c, remat=r))))(PARAMS)
        np.testing.assert_allclose(float(got), float(jnp.sum(w * want)), rtol=1e-5)
        for a, b in zip(jax.tree.leaves(grads), g_want, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4,
                                       atol=1e-5 * scale)
