"""LLaDA training: masked-diffusion SFT, diffu-GRPO with shared masks and every correction mode,
the CLI end to end (export, auto-detection, resume) and its bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.core.errors import UsageError
from ais_jax.models.llada.model import LLaDAConfig, forward, init_params
from ais_jax.rollout.llada_sampler import completion_mask
from ais_jax.training.llada import steps as ls
from ais_jax.training.llada.estimator import completion_logprobs
from ais_jax.training.llada.sft import T_MIN, sft_loss
from ais_jax.training.optim import init_train_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LCFG = LLaDAConfig(vocab_size=24, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=2, num_kv_heads=1, mask_token_id=23, text_vocab_size=23,
                   eos_token_id=2, pad_token_id=0)
PARAMS = init_params(jax.random.key(0), LCFG)
# Tiny LLaDA runs of the CLI (8 prompts x 4 samples, responses of 8 tokens in 2 blocks).
LLADA_RUN = [*TINY_RUN, "model.kind=llada", "rollout.max_new_tokens=8",
             "diffusion.block_length=4", "diffusion.steps=4", "checkpoint.every=0"]
_BATCHES: dict = {}


def test_completion_mask_known_answer():
    toks = jnp.asarray([[5, 6, 2, 2, 7], [2, 5, 5, 5, 5], [5, 5, 5, 5, 5]])
    want = [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    np.testing.assert_array_equal(np.asarray(completion_mask(toks, (2,))), np.asarray(want, bool))
    assert bool(completion_mask(toks, ()).all())


def _sft_inputs():
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, 23, size=(3, 10)).astype(np.int32)
    tokens[0, :2] = 0  # left padding of the first prompt
    lm = np.zeros((3, 10), np.float32)
    lm[:, 4:] = 1.0  # P = 4 prompt positions, N = 6 response positions
    return jnp.asarray(tokens), jnp.asarray(lm)


@pytest.mark.slow  # ~15 s in the full suite on 2 busy cores
def test_sft_loss_matches_a_numpy_reference():
    """LLaDA eq. 5 recomputed from the documented draws: t ~ U(T_MIN, 1] per row, masks
    u < t on response positions, CE / t summed per row over masked positions, / N, mean."""
    tokens, lm = _sft_inputs()
    key = jax.random.key(7)
    loss, aux = sft_loss(PARAMS, tokens, lm, key, LCFG, 0, jnp.float32)
    kt, km = jax.random.split(key)
    t = np.asarray((1 - T_MIN) * jax.random.uniform(kt, (3, 1)) + T_MIN)
    masked = (np.asarray(jax.random.uniform(km, (3, 10))) < t) & (np.asarray(lm) > 0)
    x = np.where(masked, LCFG.mask_token_id, np.asarray(tokens))
    valid = (np.asarray(lm) > 0) | (np.asarray(tokens) != 0)
    logits = np.asarray(forward(PARAMS, jnp.asarray(x), LCFG, jnp.asarray(valid)), np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    nll = logz - np.take_along_axis(logits, np.asarray(tokens)[..., None], -1)[..., 0]
    want = np.mean(np.sum(nll * masked / t, axis=1) / 6.0)
    assert masked.any()
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    assert 0.0 <= float(aux["accuracy"]) <= 1.0


def _batch(precision: str = "fp8", inner: int = 2, mode: str = "ais", **over):
    """A run config and a rollout of 2 prompts x 4 samples (cached per rollout setting)."""
    cfg = load_config(None, [*LLADA_RUN, f"rollout.precision={precision}",
                             f"diffusion.inner_iterations={inner}", f"ais.mode={mode}",
                             "model.compute_dtype=bfloat16",
                             *[f"{k}={v}" for k, v in over.items()]])
    if (precision, inner) not in _BATCHES:
        prompts = jnp.asarray(np.random.default_rng(2).integers(3, 23, size=(2, 5)), jnp.int32)
        pm = jnp.ones((2, 5), jnp.bool_)
        _BATCHES[precision, inner] = jax.jit(
            lambda p, k: ls.rollout(p, prompts, pm, k, LCFG, cfg, (2,)))(PARAMS,
                                                                        jax.random.key(3))
    return cfg, _BATCHES[precision, inner]


@pytest.mark.slow  # ~27 s in the full suite on 2 busy cores
def test_rollout_and_trainer_estimates_share_masks():
    # BF16 rollout copy == BF16 trainer: identical params and masks give identical estimates.
    cfg, batch = _batch("bf16", inner=3)
    assert batch.logp.shape == (3, 8, 8) and batch.mask_keys.shape == (3, 2)
    lo = ls.score(PARAMS, batch, LCFG, cfg)
    np.testing.assert_array_equal(np.asarray(lo), np.asarray(batch.logp))
    # ... and each inner iteration's estimate is the estimator under its own mask key
    bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), PARAMS)
    for i in range(3):
        want = completion_logprobs(bf16, LCFG, batch.prompt_tokens, batch.tokens,
                                   jax.random.wrap_key_data(batch.mask_keys[i]),
                                   cfg.diffusion.p_mask, batch.prompt_mask)
        np.testing.assert_array_equal(np.asarray(lo[i]), np.asarray(want))
    assert len({tuple(np.asarray(k)) for k in batch.mask_keys}) == 3  # fresh masks
    # FP8 rollouts: same masks, a small nonzero precision mismatch
    cfg8, b8 = _batch("fp8", inner=1)
    d = np.abs(np.asarray(ls.score(PARAMS, b8, LCFG, cfg8)) - np.asarray(b8.logp))
    assert 0 < d.mean() < 0.5


@pytest.mark.slow  # ~33 s in the full suite on 2 busy cores
def test_update_gradient_equals_a_reference_loss():
    """One inner iteration, mode none, SGD lr 1: the param change is minus the gradient of
    -sum_kept(A * exp(logp - logp_old)) / kept under the batch's mask key (ratio 1 at the
    old params, so no clipping)."""
    cfg, batch = _batch("bf16", inner=1, mode="none", **{"model.compute_dtype": "float32"})
    rewards = jnp.asarray([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    state = init_train_state(PARAMS, optax.sgd(1.0))
    new, mets = ls.update(state, batch, rewards, jax.random.key(0), None, None, optax.sgd(1.0),
                          LCFG, cfg)
    from ais_jax.method.grpo import group_advantages

    adv = np.repeat(np.asarray(group_advantages(rewards)).reshape(-1, 1), 8, 1)
    mask = np.asarray(batch.mask)
    key = jax.random.wrap_key_data(batch.mask_keys[0])

    def ref(p):
        lp = completion_logprobs(p, LCFG, batch.prompt_tokens, batch.tokens, key,
                                 cfg.diffusion.p_mask, batch.prompt_mask)
        ratio = jnp.exp(lp - jax.lax.stop_gradient(lp))
        return -jnp.sum(adv * ratio * mask) / mask.sum()

    g = jax.grad(ref)(PARAMS)
    for a, b, gg in zip(jax.tree.leaves(PARAMS), jax.tree.leaves(new.params), jax.tree.leaves(g),
                        strict=True):
        np.testing.assert_allclose(np.asarray(a - b), np.asarray(gg), atol=2e-5)
    # bf16 rollout copy vs float32 trainer: rounding only
    assert float(mets["skipped"]) == 0 and 0 < float(mets["d_bar"]) < 0.01


# One token-level, one sequence-level and the adaptive mode: the update calls the same
# `correction_weights` for every mode (tests/test_corrections.py covers each mode's formula);
# each mode compiles its own update (~5-15 s on 2 cores), hence three, not seven.
@pytest.mark.slow  # ~19 s in the full suite on 2 busy cores
@pytest.mark.parametrize("mode", ["tis", "seq_mask", "ais"])
def test_correction_modes_update_with_fp8_rollouts(mode):
    cfg, batch = _batch("fp8", inner=2, mode=mode)
    rewards = jnp.asarray([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    opt = optax.adam(1e-2)
    state = init_train_state(PARAMS, opt)
    lo = ls.score(PARAMS, batch, LCFG, cfg)
    new, mets = jax.jit(lambda s, b, lo: ls.update(s, b, rewards, jax.random.key(0), None, lo,
                                                   opt, LCFG, cfg))(state, batch, lo)
    for k in ("loss", "d_bar", "ess_ratio", "alpha", "alpha_ess", "alpha_mis", "alpha_var",
              "response_len", "clip_frac"):
        assert np.isfinite(float(mets[k])), k
    assert float(mets["d_bar"]) > 0 and float(mets["skipped"]) == 0
    moved = any(not np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(jax.tree.leaves(PARAMS), jax.tree.leaves(new.params),
                                strict=True))
    assert moved


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "ais_jax.train", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)


@pytest.mark.parametrize("over,needle", [
    (["rollout.max_new_tokens=6"], "must divide rollout.max_new"),
    (["diffusion.steps=3"], "multiple of the number of blocks"),
    (["diffusion.block_length=2", "diffusion.steps=12"], "must be <= rollout.max_new_tokens"),
    (["train.epochs=2"], "inner_iterations"),
    (["diffusion.p_mask=1.5"], "diffusion.p_mask"),
    (["rollout.top_k=5"], "top-k"),
    (["rollout.act_scaling=prefill"], "no prefill / decode steps to fix FP8 scales"),
])
def test_bad_diffusion_settings_are_usage_errors(tmp_path, over, needle):
    with pytest.raises(UsageError, match=needle):
        load_config(None, [*LLADA_RUN, f"out_dir={tmp_path}/r", *over])


def test_bad_diffusion_setting_exits_2_from_the_cli(tmp_path):
    proc = _cli(*LLADA_RUN, f"out_dir={tmp_path}/r", "diffusion.steps=3")
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert "diffusion.steps=3" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_llada_checkpoint_without_mask_token_exits_2(tmp_path):
    from ais_jax.models.llada.checkpoint import save

    d = tmp_path / "ck"
    save(str(d), PARAMS, LCFG)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["mask_token_id"]
    (d / "config.json").write_text(json.dumps(cfg))
    proc = _cli(*LLADA_RUN, "model.kind=auto", f"model.source={d}", f"out_dir={tmp_path}/r")
    assert proc.returncode == 2 and "mask_token_id" in proc.stderr, proc.stderr[-1500:]
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # ~40 s: two short CLI runs (warm start + 2 GRPO steps, then a resume)
def test_cli_trains_exports_and_reloads_a_llada_policy(tmp_path):
    from ais_jax.run.cli import run

    out = str(tmp_path / "run")
    cfg = load_config(None, [*LLADA_RUN, f"out_dir={out}", "train.steps=2", "sft.steps=3",
                             "sft.warmup_steps=1", "diffusion.inner_iterations=2",
                             "eval.num_samples=2", "log.completions_every=1"])
    res = run(cfg)
    assert len(res.metrics) == 2
    for k in ("alpha", "d_bar", "ess_ratio", "alpha_mis", "reward_mean", "response_len"):
        assert all(np.isfinite(m[k]) for m in res.metrics), k
    assert res.eval_after is not None and "sampled_accuracy" in res.eval_after
    with open(os.path.join(out, "completions.jsonl")) as f:
        rows = [json.loads(x) for x in f]
    assert rows and all("completion" in r for r in rows)
    final = os.path.join(out, "final")
    with open(os.path.join(final, "config.json")) as f:
        assert json.load(f)["model_type"] == "llada"
    # model.kind=auto recognises the exported LLaDA directory (and its character tokenizer)
    cfg2 = load_config(None, [*LLADA_RUN, "model.kind=auto", f"model.source={final}",
                              f"out_dir={tmp_path}/run2", "train.steps=1", "sft.steps=0"])
    res2 = run(cfg2)
    assert len(res2.metrics) == 1 and np.isfinite(res2.metrics[0]["loss"])


def _char_llada_dir(tmp_path) -> str:
    """A random scratch-style LLaDA checkpoint with its character tokenizer."""
    from ais_jax.models.llada.checkpoint import save
    from ais_jax.tasks import CharTokenizer

    tok = CharTokenizer()
    cfg = LLaDAConfig(vocab_size=tok.vocab_size + 1, hidden_size=32, intermediate_size=64,
                      num_layers=1, num_heads=2, num_kv_heads=1, mask_token_id=tok.vocab_size,
                      text_vocab_size=tok.vocab_size, eos_token_id=tok.eos_id,
                      pad_token_id=tok.pad_id)
    params = jax.tree.map(lambda a: a * 5.0 if a.ndim > 1 else a,
                          init_params(jax.random.key(4), cfg))
    d = str(tmp_path / "llada")
    save(d, params, cfg)
    tok.save(d)
    return d


@pytest.mark.slow  # ~15 s in the full suite on 2 busy cores
def test_mismatch_cli_on_a_llada_checkpoint(tmp_path, capsys):
    from ais_jax.run import mismatch

    d = _char_llada_dir(tmp_path)
    out = str(tmp_path / "m.json")
    rc = mismatch.main(["--model", d, "--task", "countdown", "--num-prompts", "2",
                        "--samples", "2", "--max-new-tokens", "8", "--block-length", "4",
                        "--diffusion-steps", "4", "--json", out])
    assert rc == 0
    with open(out) as f:
        res = json.load(f)
    arm = res["arms"]["fp8"]
    assert res["family"] == "llada" and arm["num_sequences"] == 4
    assert 0 < arm["d_bar"] < 1 and 0 < arm["ess_ratio"] <= 1
    assert "shared prompt mask" in capsys.readouterr().out
    rc = mismatch.main(["--model", d, "--max-new-tokens", "8", "--block-length", "3"])
    assert rc == 2 and "block_length (3) must divide" in capsys.readouterr().err


@pytest.mark.slow  # ~21 s in the full suite on 2 busy cores
def test_kl_to_the_reference_uses_the_same_masks():
    """beta_kl > 0: the reference's estimate shares each iteration's mask, so with the
    reference = the rollout's params the k3 KL is exactly 0 at the first inner iteration
    and positive at the second (after one update)."""
    cfg, batch = _batch("bf16", inner=2, mode="none", **{"train.beta_kl": 0.5})
    rewards = jnp.asarray([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    opt = optax.sgd(0.5)
    lo = ls.score(PARAMS, batch, LCFG, cfg)
    lref = ls.score(PARAMS, batch, LCFG, cfg)
    np.testing.assert_array_equal(np.asarray(lo), np.asarray(lref))
    state = init_train_state(PARAMS, opt)
    _, mets = ls.update(state, batch, rewards, jax.random.key(0), PARAMS, lo, opt, LCFG, cfg)
    # the logged kl is the mean over the two iterations: 0 for the first, > 0 for the second
    assert np.isfinite(float(mets["kl"])) and float(mets["kl"]) > 0
    cfg1, b1 = _batch("bf16", inner=1, mode="none", **{"train.beta_kl": 0.5})
    _, m1 = ls.update(init_train_state(PARAMS, opt), b1, rewards, jax.random.key(0), PARAMS,
                      None, opt, LCFG, cfg1)
    assert abs(float(m1["kl"])) < 1e-6
