"""LLaDA sampler: greedy low-confidence decoding equals a plain Python loop; schedule; the
selection record's shape (its values: tests/test_llada_trajectory.py, test_llada_selection_mc.py);
errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ais_jax.models.llada.model import LLaDAConfig, forward, init_params
from ais_jax.rollout.llada_sampler import generate, transfer_schedule

CFG = LLaDAConfig(vocab_size=48, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, mask_token_id=47)
# Weights x5 and prompt seed 5: every greedy decision of the reference loop below clears
# MARGIN (smallest 2.7e-3 over the four cases on AMD EPYC; x20 and seed 0 had a 0.0 tie of
# two saturated confidences, which another CPU's rounding broke the other way: issue 58).
PARAMS = jax.tree.map(lambda a: a * 5.0 if a.ndim > 1 else a, init_params(jax.random.key(0), CFG))
_FWD = jax.jit(forward, static_argnums=2)
PROMPT = np.random.default_rng(5).integers(0, 47, size=(2, 5))
# Two float32 programs (the jitted sampler, the reference's forward) differ by last-bit
# rounding, and another CPU's vector code (XLA's ISA) by more: ~1e-6 on these logits.  A
# decision whose margin is under MARGIN could go either way on some CPU, so the test checks
# the margins before it claims equal tokens.
MARGIN = 1e-3


def _reference(prompt: np.ndarray, gen_length: int, block_length: int,
               steps: int) -> tuple[np.ndarray, float]:
    """LLaDA's reverse process at temperature 0, low_confidence remasking, step by step.

    Returns the tokens and the smallest margin of any decision: a revealed token's logit
    over the runner-up's, and the log-prob confidence of a step's last revealed position
    over its first one left masked.
    """
    m = CFG.mask_token_id
    P = prompt.shape[1]
    x = np.concatenate([prompt, np.full((prompt.shape[0], gen_length), m)], 1)
    n_blocks = gen_length // block_length
    spb = steps // n_blocks
    margins = []
    for b in range(n_blocks):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        n_masked = int((x[0, lo:hi] == m).sum())
        counts = [n_masked // spb + (1 if s < n_masked % spb else 0) for s in range(spb)]
        for s in range(spb):
            logits = np.asarray(_FWD(PARAMS, jnp.asarray(x), CFG), np.float64)
            logits[..., m] = -np.inf
            top = logits.max(-1, keepdims=True)
            logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
            x0 = logits.argmax(-1)
            runner_up = np.sort(logits, -1)[..., -2]
            for r in range(x.shape[0]):
                cand = [j for j in range(lo, hi) if x[r, j] == m]
                conf = {j: logp[r, j, x0[r, j]] for j in cand}
                cand.sort(key=lambda j, c=conf: (-c[j], j))
                k = counts[s]
                if k < len(cand):
                    margins.append(conf[cand[k - 1]] - conf[cand[k]])
                for j in cand[:k]:
                    margins.append(logits[r, j, x0[r, j]] - runner_up[r, j])
                    x[r, j] = x0[r, j]  # only masked positions are ever written
    return x, min(margins)


@pytest.mark.xla_optimized  # equal to another program's tokens: compiled as a user's run
@pytest.mark.parametrize("gen_length,block_length,steps", [(8, 8, 8), (12, 4, 6), (10, 5, 4),
                                                            (6, 6, 4)])
def test_greedy_matches_reference_loop(gen_length, block_length, steps):
    out = generate(PARAMS, CFG, jnp.asarray(PROMPT), jax.random.key(1), gen_length=gen_length,
                   block_length=block_length, steps=steps)
    ref, margin = _reference(PROMPT, gen_length, block_length, steps)
    assert margin > MARGIN, f"a decision's margin {margin:.2e} is in reach of rounding: " \
        "choose inputs whose decisions are all clear"
    np.testing.assert_array_equal(np.asarray(out.tokens), ref)


@pytest.mark.parametrize("remasking,temperature", [("low_confidence", 1.0), ("random", 0.7)])
def test_schedule_and_invariants(remasking, temperature):
    N, bl, steps, G = 12, 4, 6, 3
    out = generate(PARAMS, CFG, jnp.asarray(PROMPT), jax.random.key(2), gen_length=N,
                   block_length=bl, steps=steps, temperature=temperature, remasking=remasking,
                   num_samples=G)
    tokens, rstep = np.asarray(out.tokens), np.asarray(out.reveal_step)
    assert tokens.shape == (2 * G, 5 + N)
    np.testing.assert_array_equal(tokens[:, :5], np.repeat(PROMPT, G, 0))
    assert not (tokens == CFG.mask_token_id).any()
    spb = steps // (N // bl)
    sched = transfer_schedule(bl, spb)
    assert sched.tolist() == [2, 2]
    for r in range(2 * G):
        counts = np.bincount(rstep[r], minlength=steps)
        np.testing.assert_array_equal(counts, np.tile(sched, N // bl))
        # only inside the current block; every position written exactly once (never changed)
        np.testing.assert_array_equal(rstep[r] // spb, np.arange(N) // bl)
        assert (rstep[r] >= 0).all()
    lp = np.asarray(out.logprobs)
    assert np.isfinite(lp).all() and (lp <= 1e-6).all()  # log-probs, up to float32 rounding
    sel = np.asarray(out.select_logprobs)
    if remasking == "random":  # the choice does not depend on the policy
        assert (sel == 0).all()
    else:  # each step's term split evenly over its tokens; the block's last step leaves none
        assert np.isfinite(sel).all() and (sel <= 1e-6).all() and (sel < -1e-6).any()
        for r in range(2 * G):
            for i in range(steps):
                np.testing.assert_array_equal(sel[r, rstep[r] == i], sel[r, rstep[r] == i][0])
            assert (sel[r, rstep[r] % spb == spb - 1] == 0).all()


def test_schedule_remainder_to_first_steps():
    assert transfer_schedule(10, 4).tolist() == [3, 3, 2, 2]
    assert transfer_schedule(8, 8).tolist() == [1] * 8


@pytest.mark.slow  # ~10 s in the full suite on 2 busy cores
def test_greedy_logprobs_are_model_logprobs():
    out = generate(PARAMS, CFG, jnp.asarray(PROMPT), jax.random.key(4), gen_length=4,
                   block_length=4, steps=1)  # one step: all revealed from the all-mask input
    x = jnp.concatenate([jnp.asarray(PROMPT), jnp.full((2, 4), CFG.mask_token_id)], 1)
    logits = forward(PARAMS, x, CFG)[:, 5:].at[..., CFG.mask_token_id].set(-jnp.inf)
    lp = jax.nn.log_softmax(logits, -1)
    want = jnp.take_along_axis(lp, out.tokens[:, 5:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(want), atol=1e-5)


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_greedy_has_no_selection_term(remasking):
    """At T = 0 there is no sampling distribution: the selection record is exactly 0."""
    out = generate(PARAMS, CFG, jnp.asarray(PROMPT), jax.random.key(4), gen_length=8,
                   block_length=8, steps=4, remasking=remasking)
    assert (np.asarray(out.select_logprobs) == 0).all()
    assert out.select_logprobs.shape == out.logprobs.shape == (2, 8)


@pytest.mark.parametrize("kw", [dict(gen_length=8, block_length=3, steps=4),
                                dict(gen_length=8, block_length=4, steps=3),
                                dict(gen_length=4, block_length=4, steps=8),
                                dict(gen_length=4, block_length=4, steps=4, remasking="top"),
                                dict(gen_length=4, block_length=4, steps=4, temperature=-1.0)])
def test_bad_arguments(kw):
    with pytest.raises(ValueError) as e:
        generate(PARAMS, CFG, jnp.asarray(PROMPT), jax.random.key(0), **kw)
    assert "\n" not in str(e.value)


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
def test_fp8_params_sample():
    from ais_jax.models.llada.model import to_rollout_params

    out = generate(to_rollout_params(PARAMS), CFG, jnp.asarray(PROMPT), jax.random.key(5),
                   gen_length=8, block_length=4, steps=4, temperature=1.0, num_samples=2)
    assert not (np.asarray(out.tokens) == CFG.mask_token_id).any()
