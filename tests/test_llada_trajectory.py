"""The trajectory ratio of LLaDA (diffusion.ratio=trajectory): the replay of the sampler's
trajectory reproduces its records (token and selection parts), is a known function of the
earlier-revealed tokens only, and drives the correction (never the surrogate) of diffu-GRPO.
The selection part's values: tests/test_llada_trajectory_selection.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.core.errors import UsageError
from ais_jax.method.ais import ais_coefficient
from ais_jax.models.llada.model import LLaDAConfig, forward, init_params, to_rollout_params
from ais_jax.rollout.llada_sampler import generate
from ais_jax.training.llada import steps as ls
from ais_jax.training.llada.trajectory import trajectory_logprobs
from ais_jax.training.optim import init_train_state
from ais_jax.training.steps import rollout_params

# Ids 22 (past the text vocabulary) and 23 (mask) are never proposed.
LCFG = LLaDAConfig(vocab_size=24, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=2, num_kv_heads=1, mask_token_id=23, text_vocab_size=22,
                   eos_token_id=2, pad_token_id=0)
# Weights x3 (the stress setting): peaked enough for a visible FP8 mismatch.
PARAMS = jax.tree.map(lambda a: a * 3.0 if a.ndim > 1 else a, init_params(jax.random.key(0), LCFG))
WEIGHTS = {"f32": PARAMS, "fp8": to_rollout_params(PARAMS),
           "bf16": jax.tree.map(lambda a: a.astype(jnp.bfloat16), PARAMS)}
G = 2
PROMPT = jnp.asarray(np.random.default_rng(0).integers(3, 22, size=(3, 5)), jnp.int32)
PMASK = jnp.ones((3, 5), jnp.bool_).at[0, :2].set(False)  # the first prompt is left-padded
ROWS, ROW_MASK = jnp.repeat(PROMPT, G, axis=0), jnp.repeat(PMASK, G, axis=0)
LLADA_RUN = [*TINY_RUN, "model.kind=llada", "rollout.max_new_tokens=8",
             "diffusion.block_length=4", "diffusion.steps=4", "checkpoint.every=0"]


SELECT_KEYS = ("traj/seq_logratio_abs", "traj/select_seq_logratio_abs", "traj/select_share")
_SAMPLES: dict = {}


def _sample(name, gen_length, block_length, steps, temperature, remasking="low_confidence"):
    """The sampler's output with params ``name`` (cached: each setting compiles once)."""
    k = (name, gen_length, block_length, steps, temperature, remasking)
    if k not in _SAMPLES:
        _SAMPLES[k] = generate(WEIGHTS[name], LCFG, PROMPT, jax.random.key(1),
                               gen_length=gen_length, block_length=block_length, steps=steps,
                               temperature=temperature, remasking=remasking, num_samples=G,
                               prompt_mask=PMASK)
    return _SAMPLES[k]


def _replay(name, out, steps, temperature, block=4, remasking="low_confidence", chunk=0,
            parts=False):
    got = trajectory_logprobs(WEIGHTS[name], LCFG, ROWS, out.tokens, out.reveal_step,
                              steps=steps, temperature=temperature, block_length=block,
                              remasking=remasking, prompt_mask=ROW_MASK, chunk=chunk,
                              parts=parts)
    return tuple(np.asarray(a) for a in got) if parts else np.asarray(got)


def _complete(out):
    """The sampler's complete record: token part plus selection share."""
    return np.asarray(out.logprobs) + np.asarray(out.select_logprobs)


@pytest.mark.xla_optimized  # bit-identical to another program: compiled as a user's run
@pytest.mark.slow  # ~9 s in the full suite on 2 busy cores
@pytest.mark.parametrize("n,block,steps,temperature,remasking", [
    (8, 4, 4, 1.0, "low_confidence"),  # 2 of 4, then 2 of 2 masked positions per block
    (8, 8, 4, 0.7, "low_confidence"),  # 2 of 8, 6, 4, 2
    (12, 6, 4, 1.0, "low_confidence"),  # 3 of 6, then 3 of 3
    (8, 8, 8, 0.7, "random"),  # the choice is policy-free: no selection part
    (6, 3, 2, 0.0, "low_confidence"),  # greedy: raw log-softmax, 3 tokens per step, no part
])
def test_fp8_replay_reproduces_the_sampler_records(n, block, steps, temperature, remasking):
    out = _sample("fp8", n, block, steps, temperature, remasking)
    rs = np.asarray(out.reveal_step)
    assert rs.min() >= 0 and rs.max() == steps - 1  # every token revealed, every step used
    want, want_sel = np.asarray(out.logprobs), np.asarray(out.select_logprobs)
    assert np.all(want < 0) and np.isfinite(want).all()
    if remasking == "random" or temperature == 0:
        assert (want_sel == 0).all()
    else:
        assert (want_sel < 0).any() and np.isfinite(want_sel).all()
    # one step at a time is the sampler's own per-step program: bit for bit
    tok, sel = _replay("fp8", out, steps, temperature, block, remasking, chunk=1, parts=True)
    np.testing.assert_array_equal(tok, want)
    np.testing.assert_array_equal(sel, want_sel)
    # all steps batched (vmap): the same up to the rounding of a batched matmul
    tok, sel = _replay("fp8", out, steps, temperature, block, remasking, parts=True)
    np.testing.assert_allclose(tok, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(sel, want_sel, rtol=0, atol=1e-5)
    if remasking == "random" or temperature == 0:
        assert (sel == 0).all()  # exactly: the part is not computed
    # the default return is the complete record
    np.testing.assert_allclose(_replay("fp8", out, steps, temperature, block, remasking),
                               _complete(out), rtol=0, atol=1e-5)


@pytest.mark.slow  # ~10 s in the full suite on 2 busy cores
def test_same_weights_give_ratio_one_and_fp8_does_not():
    out = _sample("f32", 8, 4, 4, 1.0)
    np.testing.assert_allclose(_replay("f32", out, 4, 1.0), _complete(out), rtol=0, atol=1e-5)
    # BF16 sampler and replay: exact one step at a time; batched, BF16 rounding of the
    # batched matmuls (the floor of a bf16-rollout run's trajectory ratio)
    outb = _sample("bf16", 8, 4, 4, 1.0)
    np.testing.assert_array_equal(_replay("bf16", outb, 4, 1.0, chunk=1), _complete(outb))
    # the FP8 copy's samples replayed by the f32 weights: a real precision mismatch, in
    # both parts
    out8 = _sample("fp8", 8, 4, 4, 1.0)
    tok, sel = _replay("f32", out8, 4, 1.0, parts=True)
    d = np.abs(tok - np.asarray(out8.logprobs))
    assert d.mean() > 1e-3 and np.isfinite(d).all()
    d_sel = np.abs(sel - np.asarray(out8.select_logprobs))
    assert d_sel.mean() > 1e-4 and np.isfinite(d_sel).all()


def _log_softmax(x):
    return x - (np.log(np.sum(np.exp(x - x.max()))) + x.max())


@pytest.mark.slow  # ~5 s in the full suite on 2 busy cores
def test_a_token_depends_on_earlier_revealed_tokens_only():
    """Known answer: position 0 is revealed at step 2, after positions 1 (step 0) and 3
    (step 1), before position 2 (step 3); its log-prob is log_softmax(logits / T) on the
    canvas [prompt, MASK, t1, MASK, t3], with the mask id and ids >= 22 excluded, and its
    selection term (one token revealed, so all of it) is the q_T mass of the tokens of
    position 2, left masked, whose raw log-prob is below that of token 5 at position 0."""
    prompt, pm = ROWS[:1], ROW_MASK[:1]
    tokens = jnp.asarray([[5, 6, 7, 8]], jnp.int32)
    reveal = jnp.asarray([[2, 0, 3, 1]], jnp.int32)
    T = 0.7

    def lp(toks, rev=reveal, part=None):
        got = trajectory_logprobs(PARAMS, LCFG, prompt, toks, rev, steps=4, temperature=T,
                                  block_length=4, remasking="low_confidence", prompt_mask=pm,
                                  parts=part is not None)
        return np.asarray(got if part is None else got[part])[0]

    base = lp(tokens)
    m = LCFG.mask_token_id
    canvas = jnp.concatenate([prompt, jnp.asarray([[m, 6, m, 8]], jnp.int32)], axis=1)
    logits = np.asarray(forward(PARAMS, canvas, LCFG, jnp.concatenate(
        [pm, jnp.ones((1, 4), jnp.bool_)], axis=1)), np.float64)[0, 5:, :22]
    np.testing.assert_allclose(lp(tokens, part=0)[0], _log_softmax(logits[0] / T)[5], rtol=0,
                               atol=1e-5)
    below = _log_softmax(logits[2]) < _log_softmax(logits[0])[5]
    want_sel = np.log(np.sum(np.exp(_log_softmax(logits[2] / T)[below])))
    assert 0 < below.sum() < 22
    np.testing.assert_allclose(lp(tokens, part=1)[0], want_sel, rtol=0, atol=1e-5)
    np.testing.assert_allclose(base[0], lp(tokens, part=0)[0] + want_sel, rtol=0, atol=1e-5)
    assert lp(tokens, part=1)[2] == 0.0  # the block's last step leaves nothing masked
    earlier = lp(tokens.at[0, 1].set(9))  # changes the canvas of step 2
    assert abs(earlier[0] - base[0]) > 1e-4
    later = lp(tokens.at[0, 2].set(9))  # revealed after position 0
    assert later[0] == base[0] and later[1] == base[1] and later[3] == base[3]
    assert later[2] != base[2]  # ... but its own log-prob moved
    assert lp(tokens, reveal.at[0, 2].set(-1))[2] == 0.0  # never revealed: 0


def test_chunked_replay_equals_unchunked():
    out = _sample("f32", 8, 4, 4, 1.0)
    full = _replay("f32", out, 4, 1.0, parts=True)
    # chunks of 3 vmapped steps (padded to 6 steps: they reveal nothing and leave nothing):
    # the batch size's rounding only
    for a, b in zip(_replay("f32", out, 4, 1.0, chunk=3, parts=True), full, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_bad_replay_arguments_raise_one_line():
    out = _sample("f32", 8, 4, 4, 1.0)
    kw = dict(steps=4, temperature=1.0, block_length=4, remasking="low_confidence")
    with pytest.raises(ValueError, match="chunk must be an int >= 0"):
        trajectory_logprobs(PARAMS, LCFG, ROWS, out.tokens, out.reveal_step, chunk=-1, **kw)
    with pytest.raises(ValueError, match="sample_tokens must be"):
        trajectory_logprobs(PARAMS, LCFG, ROWS, out.tokens[:, :7], out.reveal_step, **kw)
    for bad, match in ((dict(block_length=3), "block_length"),
                       (dict(steps=3), "divisible by the number of blocks"),
                       (dict(remasking="top"), "remasking")):
        with pytest.raises(ValueError, match=match) as e:
            trajectory_logprobs(PARAMS, LCFG, ROWS, out.tokens, out.reveal_step,
                                **{**kw, **bad})
        assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="block_length"):  # the sampler's settings are required
        trajectory_logprobs(PARAMS, LCFG, ROWS, out.tokens, out.reveal_step, steps=4,
                            temperature=1.0, remasking="random")


def _cfg(ratio: str, mode: str):
    return load_config(None, [*LLADA_RUN, "diffusion.inner_iterations=2", f"ais.mode={mode}",
                              f"diffusion.ratio={ratio}", "model.compute_dtype=bfloat16"])


_ROLLOUT: dict = {}


def _batch():
    if not _ROLLOUT:
        cfg = _cfg("estimator", "ais")  # the rollout does not depend on the ratio
        prompts = jnp.asarray(np.random.default_rng(2).integers(3, 22, size=(2, 5)), jnp.int32)
        pm = jnp.ones((2, 5), jnp.bool_)
        _ROLLOUT["b"] = jax.jit(lambda p, k: ls.rollout(p, prompts, pm, k, LCFG, cfg, (2,)))(
            PARAMS, jax.random.key(3))
    return _ROLLOUT["b"]


@pytest.mark.slow  # ~12 s in the full suite on 2 busy cores
def test_rollout_records_the_trajectory_and_score_replays_it():
    batch = _batch()
    assert batch.traj_logp.shape == batch.reveal_step.shape == batch.tokens.shape == (8, 8)
    est = ls.score(PARAMS, batch, LCFG, _cfg("estimator", "ais"))
    assert not isinstance(est, tuple) and est.shape == (2, 8, 8)  # no replay
    lo, traj, traj_sel = ls.score(PARAMS, batch, LCFG, _cfg("trajectory", "ais"))
    np.testing.assert_array_equal(np.asarray(lo), np.asarray(est))
    bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), PARAMS)
    kw = dict(steps=4, temperature=1.0, block_length=4, remasking="low_confidence",
              prompt_mask=batch.prompt_mask)
    want = trajectory_logprobs(bf16, LCFG, batch.prompt_tokens, batch.tokens, batch.reveal_step,
                               parts=True, **kw)
    np.testing.assert_array_equal(np.asarray(traj), np.asarray(want[0] + want[1]))
    np.testing.assert_array_equal(np.asarray(traj_sel), np.asarray(want[1]))
    # the batch's record is the sampler's complete one: the FP8 copy's replay, both parts
    fp8 = rollout_params(PARAMS, _cfg("trajectory", "ais").rollout)
    tok, sel = trajectory_logprobs(fp8, LCFG, batch.prompt_tokens, batch.tokens,
                                   batch.reveal_step, parts=True, **kw)
    np.testing.assert_allclose(np.asarray(batch.traj_logp), np.asarray(tok + sel), rtol=0,
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(batch.traj_select), np.asarray(sel), rtol=0,
                               atol=1e-5)
    assert float(jnp.min(sel)) < -1e-3
    # the FP8 sampler against the BF16 trainer: a small, nonzero mismatch
    d = np.abs(np.asarray(traj) - np.asarray(batch.traj_logp))
    assert 0 < d.mean() < 0.5


_SCORES: dict = {}


def _update(ratio: str, mode: str):
    cfg = _cfg(ratio, mode)
    batch = _batch()
    rewards = jnp.asarray([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    opt = optax.adam(1e-2)
    if ratio not in _SCORES:
        _SCORES[ratio] = ls.score(PARAMS, batch, LCFG, cfg)
    lo = _SCORES[ratio]
    return jax.jit(lambda s, lo: ls.update(s, batch, rewards, jax.random.key(0), None, lo, opt,
                                           LCFG, cfg))(init_train_state(PARAMS, opt), lo)


@pytest.mark.slow  # ~60 s on 2 loaded cores: compiles three update programs
def test_trajectory_ratio_changes_only_the_correction():
    new_t, m_t = _update("trajectory", "ais")
    for k in ("traj/d_bar", "traj/token_ess", "est/d_bar", "est/token_ess", "alpha", "loss",
              *SELECT_KEYS):
        assert np.isfinite(float(m_t[k])), k
    assert float(m_t["traj/d_bar"]) > 0 and float(m_t["est/d_bar"]) > 0
    assert float(m_t["d_bar"]) == float(m_t["traj/d_bar"])  # the correction's ratio
    assert float(m_t["traj/d_bar"]) != float(m_t["est/d_bar"])
    # est/*: d1's pair of each inner iteration (the estimator mode's d_bar), averaged
    cfg, batch = _cfg("trajectory", "ais"), _batch()
    lo, traj_old, sel_old = _SCORES["trajectory"]
    valid = batch.mask > 0
    # traj/select_*: per-sequence |trainer - sampler| of the selection part and of the whole
    seq = {k: np.abs(np.where(np.asarray(valid), np.asarray(a) - np.asarray(b), 0).sum(1)).mean()
           for k, a, b in (("full", traj_old, batch.traj_logp),
                           ("sel", sel_old, batch.traj_select))}
    assert seq["sel"] > 1e-4  # the selection part does move with precision
    np.testing.assert_allclose(float(m_t["traj/seq_logratio_abs"]), seq["full"], rtol=1e-5)
    np.testing.assert_allclose(float(m_t["traj/select_seq_logratio_abs"]), seq["sel"],
                               rtol=1e-5)
    np.testing.assert_allclose(float(m_t["traj/select_share"]), seq["sel"] / seq["full"],
                               rtol=1e-5)
    est = [ais_coefficient(lo[i], batch.logp[i], jnp.zeros_like(lo[i]), valid, C=cfg.ais.C,
                           mode="none") for i in range(2)]
    np.testing.assert_allclose(float(m_t["est/d_bar"]), np.mean([e.d_bar for e in est]),
                               rtol=1e-5)
    np.testing.assert_allclose(float(m_t["est/token_ess"]),
                               np.mean([e.ess_ratio for e in est]), rtol=1e-5)
    # ais.mode=none: no correction, so the ratio cannot change the update
    new_tn, _ = _update("trajectory", "none")
    new_en, m_en = _update("estimator", "none")
    assert not any(k.startswith(("traj/", "est/")) for k in m_en)  # estimator mode: no replay
    for a, b in zip(jax.tree.leaves(new_tn.params), jax.tree.leaves(new_en.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    moved = any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                zip(jax.tree.leaves(new_t.params), jax.tree.leaves(new_en.params), strict=True))
    assert moved  # ... while AIS on the trajectory ratio does


def test_update_refuses_a_logp_old_of_the_other_ratio():
    cfg = _cfg("trajectory", "ais")
    batch = _batch()
    est = ls.score(PARAMS, batch, LCFG, _cfg("estimator", "ais"))
    with pytest.raises(ValueError, match=r"diffusion\.ratio=trajectory"):
        ls.update(init_train_state(PARAMS, optax.sgd(0.1)), batch, jnp.zeros((2, 4)),
                  jax.random.key(0), None, est, optax.sgd(0.1), LCFG, cfg)


@pytest.mark.slow  # ~20 s: one CLI run (compiles the rollout, score and update programs)
def test_cli_run_with_the_trajectory_ratio_logs_traj_metrics(tmp_path):
    from ais_jax.run.cli import run

    cfg = load_config(None, [*LLADA_RUN, f"out_dir={tmp_path}/r", "train.steps=1",
                             "diffusion.ratio=trajectory", "log.completions_every=1"])
    res = run(cfg)
    m = res.metrics[0]
    for k in ("traj/d_bar", "traj/token_ess", "est/d_bar", "est/token_ess", "d_bar", "loss",
              *SELECT_KEYS):
        assert np.isfinite(m[k]), k
    assert m["d_bar"] == m["traj/d_bar"]


def test_bad_ratio_is_a_usage_error_and_exits_2(tmp_path):
    import os
    import subprocess
    import sys

    with pytest.raises(UsageError, match=r"diffusion\.ratio"):
        load_config(None, [*LLADA_RUN, "diffusion.ratio=foo"])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "ais_jax.train", *LLADA_RUN,
                           f"out_dir={tmp_path}/r", "diffusion.ratio=foo"], capture_output=True,
                          text=True, cwd=root, env={**os.environ, "PYTHONPATH": root},
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert "diffusion.ratio" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
