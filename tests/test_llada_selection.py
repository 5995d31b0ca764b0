"""The selection term of a low_confidence denoising step (ais_jax/method/selection.py),
against enumeration of every candidate draw of one step (3 positions, vocabulary 4), with and
without ties in the confidences."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ais_jax.method.selection import masked_logsumexp, selection_logprob

N, V, T = 3, 4, 0.7


def _logprobs(logits):
    raw = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    z = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32) / T, axis=-1)
    return np.asarray(raw), np.asarray(z)


def _enumerate(raw, z, k):
    """Every outcome (revealed positions, their tokens) of one step that reveals the ``k`` most
    confident of ``N`` candidates (stable order: equal confidences, lower position first), with
    its probability summed over all ``V ** N`` draws (float64)."""
    out = {}
    for c in itertools.product(range(V), repeat=N):
        p = float(np.prod([np.exp(np.float64(z[i, c[i]])) for i in range(N)]))
        conf = np.array([raw[i, c[i]] for i in range(N)])
        order = np.argsort(-conf, kind="stable")
        s = tuple(sorted(int(i) for i in order[:k]))
        key = (s, tuple(c[i] for i in s))
        out[key] = out.get(key, 0.0) + p
    return out


@pytest.mark.slow  # ~21 s in the full suite on 2 busy cores
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("k", [1, 2])
def test_outcome_probabilities_equal_enumeration(k, tied):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(1 if tied else N, V)) * 1.5
    raw, z = _logprobs(np.broadcast_to(logits, (N, V)))  # tied: every position alike
    want = _enumerate(raw, z, k)
    assert abs(sum(want.values()) - 1) < 1e-6
    outcomes = list(want)
    revealed = np.zeros((len(outcomes), N), bool)
    tokens = np.zeros((len(outcomes), N), np.int32)
    for r, (s, toks) in enumerate(outcomes):
        revealed[r, list(s)] = True
        tokens[r, list(s)] = toks
    R = len(outcomes)
    sel = selection_logprob(jnp.broadcast_to(raw, (R, N, V)), jnp.broadcast_to(z, (R, N, V)),
                            jnp.asarray(tokens), jnp.asarray(revealed), jnp.asarray(~revealed))
    kept = np.take_along_axis(np.broadcast_to(z, (R, N, V)), tokens[..., None], -1)[..., 0]
    got = np.exp(np.sum(np.where(revealed, kept, 0.0), axis=1) + np.asarray(sel))
    np.testing.assert_allclose(got, [want[o] for o in outcomes], rtol=2e-5, atol=1e-9)


@pytest.mark.slow  # ~10 s in the full suite on 2 busy cores
def test_nothing_revealed_or_nothing_left_is_zero_and_no_room_is_minus_inf():
    raw, z = _logprobs(np.random.default_rng(0).normal(size=(N, V)))
    raw3, z3 = jnp.asarray(raw)[None], jnp.asarray(z)[None]
    none = jnp.zeros((1, N), bool)
    tok = jnp.zeros((1, N), jnp.int32)
    assert float(selection_logprob(raw3, z3, tok, none, ~none)[0]) == pytest.approx(0, abs=1e-6)
    assert float(selection_logprob(raw3, z3, tok, ~none, none)[0]) == 0.0
    # reveal position 0's least likely token: no token at position 1 ranks below it when
    # position 1 is a copy of position 0 and sits after it... except that very token (a tie)
    same = jnp.broadcast_to(raw3[:, :1], (1, N, V)), jnp.broadcast_to(z3[:, :1], (1, N, V))
    least = int(np.argmin(raw[0]))
    rev = jnp.asarray([[True, False, False]])
    left = jnp.asarray([[False, True, False]])
    tok = jnp.asarray([[least, 0, 0]], jnp.int32)
    got = float(selection_logprob(*same, tok, rev, left)[0])
    assert got == pytest.approx(float(z[0, least]), abs=1e-6)  # only the tied token counts
    # the same threshold before the revealed position: a tie ranks first, so nothing is left
    got = float(selection_logprob(*same, jnp.asarray([[0, least, 0]], jnp.int32),
                                  jnp.asarray([[False, True, False]]),
                                  jnp.asarray([[True, False, False]]))[0])
    assert got == -np.inf


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
def test_masked_logsumexp_is_stable_and_has_finite_gradients():
    x = jnp.asarray([[-200.0, -201.0, 0.0], [1.0, 2.0, 3.0]])
    keep = jnp.asarray([[True, True, False], [False, False, False]])
    got = masked_logsumexp(x, keep)
    assert float(got[0]) == pytest.approx(-200 + np.log1p(np.exp(-1.0)), abs=1e-4)
    assert float(got[1]) == -np.inf
    g = jax.grad(lambda a: jnp.sum(jnp.where(keep.any(-1), masked_logsumexp(a, keep), 0.0)))(x)
    assert np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_allclose(np.asarray(g[0]), [1 / (1 + np.exp(-1)), np.exp(-1) /
                                                 (1 + np.exp(-1)), 0.0], rtol=1e-5)
