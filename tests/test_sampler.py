"""Tests for ais_jax.rollout.sampler: distribution, log-prob fidelity, EOS, groups, compilation,
errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from ais_jax.method import distributions
from ais_jax.method.distributions import sample_logits, token_logprobs, truncate_logits
from ais_jax.models import decode as decode_lib
from ais_jax.models import fp8, kv_cache
from ais_jax.models import model as model_lib
from ais_jax.models.model import ModelConfig
from ais_jax.rollout import decode_params, sampler
from ais_jax.rollout.sampler import bucket_length, default_segments, pad_prompts, sample

CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64)


def _params(dtype=jnp.float32, seed=0, sharpness=40.0):
    """Random tiny params with sharp-ish next-token distributions (scaled embeddings)."""
    p = model_lib.init_params(jax.random.key(seed), CFG)
    p["embed"] = p["embed"] * sharpness
    p["lm_head"] = p["lm_head"] * sharpness
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), p)


PARAMS = _params()
_forward = jax.jit(model_lib.forward, static_argnums=2)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15]]
TOKENS, MASK = pad_prompts(PROMPTS, bucket=False)  # [4, 6]


def _rescore(params, prompt_tokens, prompt_mask, out, G, temperature, top_k=0, top_p=1.0):
    """Log-probs of the sampled tokens from a full `forward` of prompt + completion."""
    P = prompt_tokens.shape[1]
    seq = jnp.concatenate([jnp.repeat(jnp.asarray(prompt_tokens), G, 0), out.tokens], 1)
    seq_mask = jnp.concatenate([jnp.repeat(jnp.asarray(prompt_mask), G, 0),
                                jnp.ones(out.tokens.shape, bool)], 1)
    logits = _forward(params, seq[:, :-1], CFG, seq_mask[:, :-1])[:, P - 1:]
    return token_logprobs(logits, out.tokens, temperature, top_k, top_p), logits


# ----------------------------------------------------------------------------- helpers


def test_bucket_length_and_pad_prompts():
    assert [bucket_length(n) for n in (0, 1, 5, 16, 17, 40, 512, 600)] == [
        16, 16, 16, 16, 32, 64, 512, 608]
    assert bucket_length(20, multiple=8, pow2_max=0) == 24
    toks, mask = pad_prompts([[5, 6], [7]], pad_id=0)
    assert toks.shape == (2, 16) and toks.dtype == np.int32
    np.testing.assert_array_equal(toks[:, -2:], [[5, 6], [0, 7]])
    np.testing.assert_array_equal(mask.sum(-1), [2, 1])
    assert not mask[:, :-2].any()
    with pytest.raises(ValueError, match="empty batch"):
        pad_prompts([])
    with pytest.raises(ValueError, match="shorter than the longest"):
        pad_prompts([[1, 2, 3]], length=2)


def _reference_probs(logits, T, k, p):
    """Independent numpy top-k / top-p (Hugging Face order: temperature, top-k, top-p)."""
    z = np.asarray(logits, np.float64) / T
    if k:
        z = np.where(z >= np.sort(z)[-k], z, -np.inf)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if p < 1:
        order = np.argsort(-probs, kind="stable")
        keep = np.zeros_like(probs, bool)
        mass = 0.0
        for i in order:
            keep[i] = True
            mass += probs[i]
            if mass >= p:
                break
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    return probs


@pytest.mark.parametrize("T,k,p", [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.5, 7, 1.0),
                                   (1.0, 0, 0.7), (0.8, 10, 0.85)])
def test_draws_match_the_truncated_softmax(T, k, p):
    """Chi-square over 40,000 draws from one row of 24 logits, and the recorded log-probs."""
    V, n = 24, 40_000
    logits = jax.random.normal(jax.random.key(3), (V,)) * 1.5
    probs = _reference_probs(logits, T, k, p)
    draw = jax.jit(lambda key, lg: sample_logits(key, lg, T, k, p))
    tok, logp = draw(jax.random.key(7), jnp.broadcast_to(logits, (n, V)))
    tok, logp = np.asarray(tok), np.asarray(logp)
    assert probs[tok].min() > 0, "drew a token outside the truncated set"
    np.testing.assert_allclose(logp, np.log(probs[tok]), atol=2e-5)
    kept = probs > 0
    counts = np.bincount(tok, minlength=V)[kept]
    res = stats.chisquare(counts, n * probs[kept])
    assert res.pvalue > 1e-3, (res, counts, n * probs[kept])
    # The trainer-side scorer agrees with what the sampler recorded.
    ref = token_logprobs(jnp.broadcast_to(logits, (8, V)), jnp.asarray(tok[:8]),
                                     T, k, p)
    np.testing.assert_allclose(ref, logp[:8], atol=1e-5)


def test_inverse_cdf_handles_zero_weights_and_large_vocab():
    V = 1000  # not a multiple of the block size: padded blocks
    w = jnp.zeros((4096, V)).at[:, 0].set(0.0).at[:, 999].set(1.0).at[:, 500].set(3.0)
    idx = np.asarray(distributions.categorical_inverse_cdf(jax.random.key(0), w))
    assert set(np.unique(idx)) <= {500, 999}
    assert abs((idx == 500).mean() - 0.75) < 0.03


def test_truncate_logits_known_values():
    z = jnp.log(jnp.array([0.5, 0.2, 0.2, 0.1]))
    np.testing.assert_array_equal(np.isfinite(truncate_logits(z, 1)), [1, 0, 0, 0])
    np.testing.assert_array_equal(np.isfinite(truncate_logits(z, 2)), [1, 1, 1, 0])  # tie kept
    np.testing.assert_array_equal(np.isfinite(truncate_logits(z, 0, 0.5)), [1, 0, 0, 0])
    np.testing.assert_array_equal(np.isfinite(truncate_logits(z, 0, 0.6)), [1, 1, 1, 0])
    np.testing.assert_array_equal(np.isfinite(truncate_logits(z, 0, 1.0)), [1, 1, 1, 1])
    lp = token_logprobs(z, jnp.array(0), 1.0, 0, 0.6)
    np.testing.assert_allclose(lp, np.log(0.5 / 0.9), rtol=1e-6)
    # Temperature scales before the softmax (the pitfall docs/spec.md warns about).
    lp2 = token_logprobs(z, jnp.array(3), 2.0)
    np.testing.assert_allclose(lp2, jax.nn.log_softmax(z / 2.0)[3], rtol=1e-6)


# ----------------------------------------------------------------------------- sample


# One static configuration shared by several tests (one compilation); several decode
# segments, so the cache grows between segments.
BASE = {"max_new_tokens": 12, "temperature": 0.7, "num_samples": 2, "decode_segments": 3}


@pytest.mark.slow  # ~5 s in the full suite on 2 busy cores
def test_logp_matches_full_forward_rescore():
    out = sample(PARAMS, TOKENS, MASK, jax.random.key(0), CFG, **BASE)
    assert out.tokens.shape == out.mask.shape == out.logp.shape == (8, 12)
    assert out.tokens.dtype == jnp.int32 and out.logp.dtype == jnp.float32
    assert float(out.mask.min()) == 1.0  # no EOS given: every row runs to the budget
    ref, _ = _rescore(PARAMS, TOKENS, MASK, out, 2, 0.7)
    np.testing.assert_allclose(out.logp, ref, atol=1e-4)
    assert float(jnp.std(out.logp)) > 0.1  # not a degenerate uniform model


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
@pytest.mark.parametrize("k,p", [(4, 1.0), (0, 0.8)])
def test_logp_under_truncation_matches_rescore(k, p):
    out = sample(PARAMS, TOKENS, MASK, jax.random.key(1), CFG, max_new_tokens=8,
                 temperature=1.0, top_k=k, top_p=p, decode_segments=1)
    ref, logits = _rescore(PARAMS, TOKENS, MASK, out, 1, 1.0, k, p)
    np.testing.assert_allclose(out.logp, ref, atol=1e-4)
    untruncated = token_logprobs(logits, out.tokens, 1.0)
    assert bool(jnp.all(out.logp >= untruncated - 1e-6))  # renormalized: never less likely
    assert bool(jnp.any(out.logp > untruncated + 1e-3))
    if k:  # every sampled token is among the k largest of its step
        kth = jax.lax.top_k(logits, k)[0][..., -1]
        assert bool(jnp.all(jnp.take_along_axis(logits, out.tokens[..., None], -1)[..., 0]
                            >= kth))


def test_greedy_is_argmax_and_logp_at_temperature_one():
    out = sample(PARAMS, TOKENS, MASK, jax.random.key(0), CFG, max_new_tokens=6,
                 temperature=0.0, decode_segments=1)
    ref, logits = _rescore(PARAMS, TOKENS, MASK, out, 1, 1.0)
    np.testing.assert_array_equal(out.tokens, jnp.argmax(logits, -1))
    np.testing.assert_allclose(out.logp, ref, atol=1e-4)


@pytest.mark.slow  # ~6 s in the full suite on 2 busy cores
@pytest.mark.parametrize("T", [1e-20, 1e-30, distributions.MIN_TEMPERATURE])
def test_tiny_temperature_keeps_tokens_in_vocab_and_logp_finite(T):
    # logits / T overflows float32 here; the row-max shift keeps it exact.
    kw = {"max_new_tokens": 6, "decode_segments": 1, "num_samples": 2}
    out = sample(PARAMS, TOKENS, MASK, jax.random.key(0), CFG, temperature=T, **kw)
    tok, logp = np.asarray(out.tokens), np.asarray(out.logp)
    assert tok.min() >= 0 and tok.max() < CFG.vocab_size
    assert np.isfinite(logp).all() and (logp <= 0).all()
    np.testing.assert_allclose(logp, 0.0, atol=1e-6)  # the limit T -> 0: probability 1
    greedy = sample(PARAMS, TOKENS, MASK, jax.random.key(0), CFG, temperature=0.0, **kw)
    np.testing.assert_array_equal(tok, greedy.tokens)
    # The trainer's scorer uses the same formula: finite (0) for its own argmax, never NaN.
    ref, logits = _rescore(PARAMS, TOKENS, MASK, out, 2, T)
    assert not np.isnan(np.asarray(ref)).any()
    is_max = np.asarray(out.tokens) == np.asarray(jnp.argmax(logits, -1))
    np.testing.assert_allclose(np.asarray(ref)[is_max], 0.0, atol=1e-6)


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
def test_tiny_temperature_sampler_and_scorer_agree_and_floor_is_enforced():
    logits = jax.random.normal(jax.random.key(5), (64, 50)) * 30.0
    for T in (1e-3, 1e-20, 1e-30):
        tok, logp = sample_logits(jax.random.key(1), logits, T)
        np.testing.assert_array_equal(tok, jnp.argmax(logits, -1))
        assert bool(jnp.all(jnp.isfinite(logp)))
        np.testing.assert_array_equal(token_logprobs(logits, tok, T), logp)
        other = token_logprobs(logits, (tok + 1) % 50, T)  # never NaN: -inf or very negative
        assert not bool(jnp.any(jnp.isnan(other))) and bool(jnp.all(other < -1.0))
    for bad in (1e-39, 5e-324, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            token_logprobs(logits, tok, bad)
        with pytest.raises(ValueError, match="temperature"):
            sample_logits(jax.random.key(1), logits, bad)
    with pytest.raises(ValueError, match="MIN_TEMPERATURE"):
        sample(PARAMS, TOKENS, MASK, jax.random.key(0), CFG, max_new_tokens=2,
               temperature=1e-39)


def test_first_token_frequencies_match_model_softmax():
    """End to end: 20,000 samples of one prompt, first token vs softmax(forward / T)."""
    n, T = 20_000, 1.3
    prompt, pmask = pad_prompts([[3, 1, 4, 1, 5]], bucket=False)
    out = sample(PARAMS, prompt, pmask, jax.random.key(5), CFG, max_new_tokens=1,
                 temperature=T, num_samples=n)
    logits = np.asarray(_forward(PARAMS, jnp.asarray(prompt), CFG)[0, -1], np.float64)
    probs = np.exp(logits / T - np.max(logits / T))
    probs /= probs.sum()
    counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=CFG.vocab_size)
    big = probs * n >= 5  # pool the rare cells, as the chi-square test needs
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(n * probs[big], n * probs[~big].sum())
    assert stats.chisquare(obs, exp / exp.sum() * obs.sum()).pvalue > 1e-3


def test_eos_masks_and_pads_after_the_first_eos():
    eos = (3, 17, 20, 25)
    out = sample(PARAMS, TOKENS, MASK, jax.random.key(2), CFG, max_new_tokens=16,
                 eos_id=eos, num_samples=4, pad_id=0, decode_segments=1)
    toks, mask, logp = (np.asarray(x) for x in out)
    hit_any = False
    for row in range(toks.shape[0]):
        is_eos = np.isin(toks[row], eos) & (mask[row] > 0)
        if is_eos.any():
            first = int(np.argmax(is_eos))
            hit_any = True
            assert mask[row, :first + 1].all() and not mask[row, first + 1:].any()
            assert (toks[row, first + 1:] == 0).all() and (logp[row, first + 1:] == 0).all()
        else:  # never emitted EOS: valid to the budget
            assert mask[row].all()
    assert hit_any
    assert mask.sum() < mask.size


def test_eos_tuple_default_pad_and_never_hit_rows():
    greedy = sample(PARAMS, TOKENS, MASK, jax.random.key(0), CFG, max_new_tokens=6,
                    temperature=0.0, decode_segments=1)
    stop = int(greedy.tokens[0, 2])  # row 0 emits this at step 2 (or earlier)
    out = sample(PARAMS, TOKENS, MASK, jax.random.key(0), CFG, max_new_tokens=6,
                 temperature=0.0, eos_id=stop, decode_segments=1)
    first = int(np.argmax(np.asarray(greedy.tokens[0]) == stop))
    assert first <= 2
    np.testing.assert_array_equal(out.mask[0], np.arange(6) <= first)
    assert (np.asarray(out.tokens[0, first + 1:]) == stop).all()  # pad defaults to the EOS id
    for row in range(1, 4):  # rows that never produce it run to the budget
        if stop not in np.asarray(greedy.tokens[row]):
            assert float(out.mask[row].min()) == 1.0


def test_loop_exits_early_once_every_row_is_done(monkeypatch):
    greedy = np.asarray(sample(PARAMS, TOKENS, MASK, jax.random.key(0), CFG, max_new_tokens=6,
                               temperature=0.0, decode_segments=1).tokens)
    eos = tuple(sorted({int(t) for t in greedy[:, 3]}))  # every row is done by column 3
    last = max(int(np.argmax(np.isin(row, eos))) for row in greedy)  # column the last row ends
    steps = []
    real_extend = decode_lib.extend

    def counting_extend(params, tokens, mask, cache, cfg, **kw):  # one call per decode step
        jax.debug.callback(lambda t: steps.append(t.shape[1]), tokens)
        return real_extend(params, tokens, mask, cache, cfg, **kw)

    monkeypatch.setattr(decode_lib, "extend", counting_extend)
    out = sample(PARAMS, TOKENS, MASK, jax.random.key(0), CFG, max_new_tokens=13,
                 temperature=0.0, eos_id=eos, decode_segments=1)
    jax.block_until_ready(out)
    assert len(steps) == last < 12  # decode steps for columns 1..last only, not the budget
    mask = np.asarray(out.mask)
    assert mask[:, last + 1:].sum() == 0 and mask[:, :last + 1].any(0).all()
    np.testing.assert_array_equal(out.tokens[:, :last + 1], greedy[:, :last + 1])


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
def test_group_sampling_shares_the_prefill_and_equals_repeated_prompts():
    G = BASE["num_samples"]
    key = jax.random.key(11)
    grouped = sample(PARAMS, TOKENS, MASK, key, CFG, **BASE)
    again = sample(PARAMS, TOKENS, MASK, key, CFG, **BASE)
    for a, b in zip(grouped, again, strict=True):
        np.testing.assert_array_equal(a, b)  # same key, same rollout
    rep = sample(PARAMS, np.repeat(TOKENS, G, 0), np.repeat(MASK, G, 0), key, CFG,
                 **{**BASE, "num_samples": 1})
    np.testing.assert_array_equal(grouped.tokens, rep.tokens)
    np.testing.assert_allclose(grouped.logp, rep.logp, atol=1e-5)
    # A flatter model (same shapes: no recompilation) makes repeats very unlikely.
    flat = sample(_params(sharpness=10.0), TOKENS, MASK, key, CFG, **BASE)
    toks = np.asarray(flat.tokens).reshape(len(PROMPTS), G, -1)
    for p in range(len(PROMPTS)):
        assert len({tuple(t) for t in toks[p]}) == G  # G distinct samples
    # The prompt is prefilled once per prompt, not once per sample.
    jaxpr = str(jax.make_jaxpr(lambda p: sampler._sample_impl(
        p, jnp.asarray(TOKENS), jnp.asarray(MASK, bool), key, cfg=CFG, max_new_tokens=12,
        temperature=0.7, top_k=0, top_p=1.0, eos_ids=(), pad_id=0, num_samples=G,
        kv_fp8=False, segments=1, transpose=False, scan_layers=False))(PARAMS))
    B0, P, D = len(PROMPTS), TOKENS.shape[1], CFG.hidden_size
    assert f"f32[{B0},{P},{D}]" in jaxpr and f"f32[{B0 * G},{P},{D}]" not in jaxpr
    different_key = sample(PARAMS, TOKENS, MASK, jax.random.key(12), CFG, **BASE)
    assert not np.array_equal(different_key.tokens, grouped.tokens)


def test_no_recompilation_for_the_same_shapes():
    kw = BASE
    sample(PARAMS, TOKENS, MASK, jax.random.key(0), CFG, **kw)
    before = sampler._sample_jit._cache_size()
    other_tokens = (TOKENS + 1) % CFG.vocab_size
    for i in range(3):
        out = sample(PARAMS, other_tokens, MASK, jax.random.key(i + 1), CFG, **kw)
    out = sample(jax.tree_util.tree_map(lambda x: x * 1.01, PARAMS), TOKENS, MASK,
                 jax.random.key(9), CFG, **kw)
    jax.block_until_ready(out)
    assert sampler._sample_jit._cache_size() == before


@pytest.mark.slow  # ~13 s in the full suite on 2 busy cores
def test_fp8_rollout_params_and_kv_cache():
    """FP8 weights with per-token activation scales: sampler and forward see the same FP8 math."""
    rollout = fp8.to_rollout_params(PARAMS, act_scaling="token", quantize_lm_head=True)
    out = sample(rollout, TOKENS, MASK, jax.random.key(4), CFG, max_new_tokens=8,
                 temperature=1.0, decode_segments=1)
    ref, _ = _rescore(rollout, TOKENS, MASK, out, 1, 1.0)
    np.testing.assert_allclose(out.logp, ref, atol=2e-3)
    per_tensor = fp8.to_rollout_params(PARAMS)
    out_t = sample(per_tensor, TOKENS, MASK, jax.random.key(4), CFG, max_new_tokens=8,
                   kv_fp8=True, decode_segments=1)
    assert bool(jnp.all(jnp.isfinite(out_t.logp)))
    ref_bf, _ = _rescore(PARAMS, TOKENS, MASK, out_t, 1, 1.0)
    d = float(jnp.mean(jnp.abs(out_t.logp - ref_bf)))
    assert 0 < d < 0.5  # quantized sampler vs full-precision scorer: close, not equal


@pytest.mark.parametrize("scan_layers", [False, True])
def test_norm_weights_in_float32_before_the_loop_change_no_bit(monkeypatch, scan_layers):
    """`decode_params.norms_f32` converts the RMSNorm weights once, outside the decode loop; the
    tokens and log-probs are bit-for-bit those of converting them inside it (rms_norm
    multiplies in float32 either way)."""
    import dataclasses

    cfg = dataclasses.replace(CFG, qk_norm=True)
    p16 = model_lib.init_params(jax.random.key(0), cfg)
    p16["embed"], p16["lm_head"] = p16["embed"] * 40.0, p16["lm_head"] * 40.0
    p16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), p16)
    keys = jax.random.split(jax.random.key(7), 4)
    for i, name in enumerate(("attn_norm", "mlp_norm", "q_norm", "k_norm")):  # rounded in bf16
        w = p16["layers"][name]
        p16["layers"][name] = (1 + 0.3 * jax.random.normal(keys[i], w.shape)).astype(w.dtype)
    prepared = decode_params.prepare_params(p16, cfg, transpose=False, scan_layers=scan_layers)
    layers = prepared["layers"] if scan_layers else prepared["layers"][0]
    assert layers["attn_norm"].dtype == jnp.float32 and layers["wq"].dtype == jnp.bfloat16
    assert prepared["final_norm"].dtype == jnp.float32

    def run():
        return sample(p16, TOKENS, MASK, jax.random.key(3), cfg, max_new_tokens=6,
                      decode_segments=1, scan_layers=scan_layers)

    new = run()
    monkeypatch.setattr(decode_params, "norms_f32", lambda params: params)
    jax.clear_caches()
    old = run()
    np.testing.assert_array_equal(new.tokens, old.tokens)
    np.testing.assert_array_equal(new.logp, old.logp)


@pytest.mark.slow  # ~6 s in the full suite on 2 busy cores
def test_bf16_params():
    p16 = _params(jnp.bfloat16)
    out = sample(p16, TOKENS, MASK, jax.random.key(0), CFG, max_new_tokens=6,
                 decode_segments=1)
    ref, _ = _rescore(p16, TOKENS, MASK, out, 1, 1.0)
    assert float(jnp.mean(jnp.abs(out.logp - ref))) < 0.05  # bf16 cache vs bf16 re-forward


def test_default_segment_plan_bounds_count_and_slack():
    assert [default_segments(n) for n in (1, 2, 64, 65, 66, 200, 1024, 8192)] == [
        1, 1, 1, 1, 2, 4, 16, 16]
    for n in (66, 1024, 8192):  # equal segments of >= 64 steps covering steps 1 .. n-1
        ends = sampler._segment_ends(n, default_segments(n))
        lengths = np.diff([1, *ends])
        assert ends[-1] == n and lengths.min() >= 64 // 2 and lengths.max() - lengths.min() <= 1
    # 1024 new tokens: the attended cache exceeds the filled prefix by < 1/16 on average.
    ends = sampler._segment_ends(1024, default_segments(1024))
    attended = sum((e - s) * (16 + e - 1) for s, e in zip([1, *ends], ends, strict=False))
    filled = sum(16 + t for t in range(1, 1024))
    assert attended / filled < 1 + 1 / 16


@pytest.mark.slow  # ~28 s in the full suite on 2 busy cores
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_scanned_layers_match_unrolled_and_the_full_forward(dtype):
    """The layer scan changes no token; its log-probs equal the trainer's re-score."""
    params = _params(dtype)
    kw = {"max_new_tokens": 12, "temperature": 1.0, "decode_segments": 3}
    scanned = sample(params, TOKENS, MASK, jax.random.key(7), CFG, scan_layers=True, **kw)
    unrolled = sample(params, TOKENS, MASK, jax.random.key(7), CFG, scan_layers=False, **kw)
    ref, _ = _rescore(params, TOKENS, MASK, scanned, 1, 1.0)
    if dtype == jnp.float32:
        np.testing.assert_array_equal(scanned.tokens, unrolled.tokens)
        np.testing.assert_allclose(scanned.logp, unrolled.logp, atol=1e-5)
        np.testing.assert_allclose(scanned.logp, ref, atol=1e-5)
    else:  # bf16: the scan rounds the residual stream per layer exactly as `forward` does
        np.testing.assert_array_equal(scanned.logp, ref)
    fp8_params = fp8.to_rollout_params(PARAMS, act_scaling="token")
    for kv_fp8 in (False, True):
        a, b = (sample(fp8_params, TOKENS, MASK, jax.random.key(3), CFG, kv_fp8=kv_fp8,
                       scan_layers=s, **kw) for s in (True, False))
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logp, b.logp, atol=1e-5)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs,tokens,mask,match", [
    ({"max_new_tokens": 60}, TOKENS, MASK, "max_position_embeddings"),
    ({}, np.zeros((1, 70), np.int32), np.ones((1, 70), bool), "max_position_embeddings"),
    ({}, np.zeros((0, 4), np.int32), np.zeros((0, 4), bool), "empty batch"),
    ({"temperature": -0.5}, TOKENS, MASK, "temperature"),
    ({"top_p": 0.0}, TOKENS, MASK, "top_p"),
    ({"top_p": 1.5}, TOKENS, MASK, "top_p"),
    ({"top_k": -1}, TOKENS, MASK, "top_k"),
    ({"max_new_tokens": 0}, TOKENS, MASK, "max_new_tokens"),
    ({"num_samples": 0}, TOKENS, MASK, "num_samples"),
    ({"eos_id": 99}, TOKENS, MASK, "eos_id"),
    ({}, TOKENS, MASK[:, ::-1], "left-padded"),
    ({}, TOKENS, np.zeros_like(MASK), "has no tokens"),
    ({}, TOKENS + 100, MASK, r"token ids must be in \[0, 32\)"),
    ({}, TOKENS[0], MASK[0], r"must be \[B, P\]"),
])
def test_bad_input_raises_one_clear_value_error(kwargs, tokens, mask, match):
    kw = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        sample(PARAMS, tokens, mask, jax.random.key(0), CFG, **kw)


@pytest.mark.slow  # ~15 s on 2 busy cores
@pytest.mark.parametrize("kv_fp8", [False, True])
def test_prefill_scaled_fp8_logp_is_exactly_that_of_the_replayed_decode(kv_fp8):
    """act_scaling="prefill" (fixed FP8 scales from the prefill): the recorded log-probs are
    those of the distributions the decode steps sampled from, replayed step by step outside
    the sampler (prefill, then one `extend` per sampled token with the same fixed scales)."""
    rollout = fp8.to_rollout_params(PARAMS, act_scaling="prefill")
    G, N, T = 2, 8, 0.9
    out = sample(rollout, TOKENS, MASK, jax.random.key(6), CFG, max_new_tokens=N,
                 temperature=T, num_samples=G, kv_fp8=kv_fp8, decode_segments=1)
    P = TOKENS.shape[1]
    logits, cache = decode_lib.prefill(rollout, jnp.asarray(TOKENS), jnp.asarray(MASK, bool),
                                       CFG, P, dtype=jnp.float32, fp8=kv_fp8, last_only=True)
    assert cache.act_scales.shape == (CFG.num_layers, 4)
    cache = kv_cache.resize_cache(cache, G, P + N - 1)
    steps = [jnp.repeat(logits[:, -1], G, axis=0)]
    for t in range(N - 1):
        logits, cache = decode_lib.extend(rollout, out.tokens[:, t:t + 1],
                                          jnp.ones((len(out.tokens), 1), bool), cache, CFG)
        steps.append(logits[:, 0])
    replay = token_logprobs(jnp.stack(steps, 1), out.tokens, T)
    np.testing.assert_allclose(out.logp, replay, atol=1e-5)
    # close to the per-tensor-dynamic sampler, but not the same numbers
    dyn = sample(fp8.to_rollout_params(PARAMS), TOKENS, MASK, jax.random.key(6), CFG,
                 max_new_tokens=N, temperature=T, num_samples=G, kv_fp8=kv_fp8,
                 decode_segments=1)
    ref, _ = _rescore(PARAMS, TOKENS, MASK, out, G, T)
    assert 0 < float(jnp.mean(jnp.abs(out.logp - ref))) < 0.5
    assert not np.array_equal(np.asarray(out.logp), np.asarray(dyn.logp))


def test_mesh_reaches_the_prefill_attention(monkeypatch):
    """``sample(mesh=...)`` hands the mesh to the prefill's full-pass attention (the TPU
    kernel's ``jax.shard_map`` on several devices; `ais_jax.models.decode.prefill`)."""
    seen, real = [], model_lib.attend

    def spy(q, k, v, mask, impl, chunk, mesh=None):
        seen.append((q.shape[1], mesh))
        return real(q, k, v, mask, impl, chunk)

    monkeypatch.setattr(model_lib, "attend", spy)
    mesh = object()  # hashable (a static jit argument, as a jax Mesh is); identity checked
    params = model_lib.init_params(jax.random.key(0), CFG)
    prompts = jax.random.randint(jax.random.key(1), (2, 5), 0, 32)
    sample(params, prompts, jnp.ones((2, 5), bool), jax.random.key(2), CFG, max_new_tokens=2,
           mesh=mesh)
    assert (5, mesh) in seen  # the prefill's pass over the 5 prompt tokens
