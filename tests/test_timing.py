"""Tests of ais_jax.training.flops (known answers by hand) and of the per-step timing metrics
(``log.timing``) a tiny CLI run writes to metrics.jsonl."""

from __future__ import annotations

import json
import math
import os

import jax
import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.models.layout import ModelConfig
from ais_jax.models.llada.model import LLaDAConfig
from ais_jax.run import cli
from ais_jax.training import flops as fl

# V=10, D=4, F=6, L=2, Q=2, K=1, H=2. Per layer: wq 4x4 + wk 2x4 + wv 2x4 + wo 4x4
# + gate/up/down 3 x 6x4 = 16 + 8 + 8 + 16 + 72 = 120; two layers 240; head 10x4 = 40.
CFG = ModelConfig(vocab_size=10, hidden_size=4, intermediate_size=6, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=2)
LCFG = LLaDAConfig(vocab_size=10, hidden_size=4, intermediate_size=6, num_layers=2, num_heads=2,
                   num_kv_heads=1, mask_token_id=9)  # head_dim = 4 / 2 = 2: the same shapes
# Attention per query: 4 L ctx Q H = 32 ctx.


def test_matmul_params_known_answer():
    assert fl.block_matmul_params(CFG) == 240 and fl.head_params(CFG) == 40
    assert fl.matmul_params(CFG) == 280
    # biases and norms are not matmuls; a tied head is counted once, as the head
    assert fl.matmul_params(ModelConfig(**{**vars(CFG), "qkv_bias": True, "qk_norm": True,
                                           "tie_embeddings": True})) == 280
    assert fl.matmul_params(LCFG) == 280
    assert fl.attention_flops_per_token(CFG, 3) == 96


def test_forward_flops_known_answer():
    # [3, 5], causal: mean context 3 -> attention 96 per token; trunk 15 * (480 + 96) = 8640,
    # head 15 positions * 2 * 40 = 1200
    assert fl.forward_flops(CFG, 3, 5) == 9840
    assert fl.forward_flops(CFG, 3, 5) == 15 * (2 * 280 + 96)  # the plain 2N + attention rule
    assert fl.forward_flops(CFG, 3, 5, head_positions=2) == 8640 + 3 * 2 * 80
    # bidirectional: every query sees 5 keys -> 160; 15 * (480 + 160) + 1200
    assert fl.forward_flops(CFG, 3, 5, causal=False) == 10800


def test_update_flops_known_answer():
    f = 9840
    assert fl.update_flops(CFG, 3, 5) == 3 * f
    assert fl.update_flops(CFG, 3, 5, remat_recompute=True) == 4 * f
    assert fl.update_flops(CFG, 3, 5, extra_forwards=2) == 5 * f
    assert fl.update_flops(CFG, 3, 5, passes=2, remat_recompute=True, extra_forwards=1) == 9 * f
    assert fl.update_flops(CFG, 3, 5, head_positions=2) == 3 * 9120


def test_rollout_flops_known_answer():
    # generic: 4 rows prefilled over 3 positions, head everywhere (context 2 -> 64):
    # 12 * (560 + 64) = 7488; then 5 decode tokens attending to 4..8 keys (mean 6 -> 192):
    # 20 * (560 + 192) = 15040
    assert fl.rollout_flops(CFG, 4, 3, 5) == 7488 + 15040
    # the sampler: prefill of 2 prompts x 3 positions, head on the last: context 2 -> 64;
    # 6 * (480 + 64) + 2 * 80 = 3424.  Decode: 5 tokens, the first from the prefill, then
    # 4 steps of 4 rows attending to 4, 5, 6, 7 keys (mean 5.5 -> 176): 16 * (560 + 176).
    assert fl.sampler_flops(CFG, 4, 3, 5, prompts=2) == 3424 + 11776
    brute = 3424 + sum(4 * (2 * 280 + 32 * (3 + s)) for s in range(1, 5))
    assert fl.sampler_flops(CFG, 4, 3, 5, prompts=2) == brute
    assert fl.sampler_flops(CFG, 4, 3, 1, prompts=2) == 3424  # one token: the prefill only
    # LLaDA: T = 5 bidirectional (160), head on the 2 response positions:
    # 10 * (480 + 160) + 2 * 2 * 80 = 6720 per forward; 2 denoising steps + 1 estimate
    assert fl.diffusion_rollout_flops(LCFG, 2, 3, 2, steps=2, estimates=1) == 3 * 6720


def test_grpo_step_flops_autoregressive_known_answer():
    cfg = load_config(None, ["rollout.prompts_per_step=2", "rollout.group_size=2",
                             "rollout.max_new_tokens=3", "train.epochs=2"])
    # B = 4 rows over P + N - 1 = 6 positions (context 3.5 -> 112), head on N = 3:
    # 24 * (480 + 112) + 4 * 3 * 80 = 15168
    fwd = 15168
    got = fl.grpo_step_flops(cfg, CFG, 4, 2, kl=True, score_separately=True)
    assert got.update == (3 * 2 + 1) * fwd and got.score == fwd
    # sampler_flops: prefill 2 prompts x 4 (context 2.5 -> 80): 8 * 560 + 160 = 4640;
    # 1 decode step of 4 rows at 5 keys: 4 * (560 + 160) = 2880
    assert got.rollout == 4640 + 2880
    got = fl.grpo_step_flops(cfg, CFG, 4, 2, kl=False, score_separately=False)
    assert got.update == 6 * fwd and got.score == 0


def test_grpo_step_flops_llada_known_answer():
    cfg = load_config(None, ["model.kind=llada", "rollout.prompts_per_step=2",
                             "rollout.group_size=2", "rollout.max_new_tokens=4",
                             "diffusion.block_length=4", "diffusion.steps=2",
                             "diffusion.inner_iterations=2"])
    # B = 4 rows over P + N = 7 positions, bidirectional (224), head on N = 4:
    # 28 * (480 + 224) + 4 * 4 * 80 = 20992
    fwd = 20992
    got = fl.grpo_step_flops(cfg, LCFG, 3, 1, kl=False, score_separately=True)
    assert got == fl.StepFlops(update=3 * 2 * fwd, score=2 * fwd, rollout=(2 + 2) * fwd)
    assert fl.grpo_step_flops(cfg, LCFG, 3, 1, kl=True, score_separately=True).update == 8 * fwd


@pytest.mark.parametrize("kind,peak", [
    ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H200", 989e12),
    ("NVIDIA L40S", 362e12), ("NVIDIA L40", 181e12), ("NVIDIA L4", 121e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("TPU v5 lite", 197e12), ("TPU v5", 459e12),
    ("TPU v6 lite", 918e12), ("cpu", None), ("Some Future Chip", None),
])
def test_peak_flops_lookup(kind, peak):
    assert fl.peak_flops(kind) == peak


def test_mfu():
    assert fl.peak_flops(jax.devices()[0]) is None  # the tests run on CPU
    assert fl.mfu(1e12, 1.0, jax.devices()[0], jax.device_count()) is None
    assert fl.mfu(989e12 * 8 * 0.4 * 2, 2.0, "NVIDIA H200", num_devices=8) == pytest.approx(0.4)
    assert fl.mfu(1e12, 0.0, "NVIDIA H200") is None


def test_perf_record_known_answer():
    # rollout 1 -> 3, host 0 -> 1 and 3 -> 4, update 4 -> 10
    t = fl.StepTimes(0.0, 1.0, 3.0, 4.0, 10.0)
    rec = fl.perf_record(t, 100.0, fl.StepFlops(600.0, 0.0, 20.0), "NVIDIA H200", 2)
    assert rec == pytest.approx({
        "timing_s/rollout": 2.0, "timing_s/host": 2.0, "timing_s/update": 6.0,
        "perf/tokens_per_s": 50.0, "perf/rollout_flops_per_s": 10.0,
        "perf/update_flops_per_s": 100.0, "perf/mfu": 100.0 / (2 * 989e12)})
    assert set(rec) == set(fl.TIMING_KEYS)
    # A separate logp_old forward of 300 FLOPs, host 1 s after the rollout: scaled, the
    # update interval would be 6 * 900 / 600 = 9 s > 6 + 1, so the device ran both back to
    # back over host + update: 900 / 7.
    rec = fl.perf_record(t, 100.0, fl.StepFlops(600.0, 300.0, 20.0), "cpu", 1)
    assert rec["perf/update_flops_per_s"] == pytest.approx(900 / 7)
    assert "perf/mfu" not in rec  # unknown peak: left out
    # A long host interval (10 s) hides the score: the update interval holds the update only.
    t = fl.StepTimes(0.0, 1.0, 3.0, 13.0, 19.0)
    rec = fl.perf_record(t, 100.0, fl.StepFlops(600.0, 300.0, 20.0), "cpu", 1)
    assert rec["perf/update_flops_per_s"] == pytest.approx(100.0)
    assert rec["timing_s/host"] == pytest.approx(11.0)


def _metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]  # every line must parse


@pytest.mark.slow  # ~10 s in the full suite on 2 busy cores
def test_cli_run_writes_timing_metrics_and_log_timing_false_omits_them(tmp_path):
    base = [*TINY_RUN, "train.steps=2", "checkpoint.every=0"]
    on, off = str(tmp_path / "on"), str(tmp_path / "off")
    assert cli.main([f"out_dir={on}", *base]) == 0
    rows = _metrics(on)
    assert len(rows) == 2
    rows_per_step = 8 * 4  # TINY_RUN: prompts_per_step x group_size
    for r in rows:
        for k in fl.TIMING_KEYS:
            if k == "perf/mfu":
                assert k not in r  # CPU: the peak is unknown
            else:
                assert isinstance(r[k], float) and math.isfinite(r[k]) and r[k] > 0, (k, r[k])
        # the three intervals are disjoint parts of the step
        parts = r["timing_s/rollout"] + r["timing_s/host"] + r["timing_s/update"]
        assert parts <= r["step_time_s"]
        # generated tokens = the mask sum = response_len (mean mask sum per row) x rows
        assert r["perf/tokens_per_s"] * r["timing_s/rollout"] == pytest.approx(
            r["response_len"] * rows_per_step, rel=1e-5)
    assert cli.main([f"out_dir={off}", *base, "log.timing=false"]) == 0
    rows_off = _metrics(off)
    assert len(rows_off) == 2 and "step_time_s" in rows_off[0]
    assert not {k for r in rows_off for k in r} & set(fl.TIMING_KEYS)
    assert set(rows[0]) - set(rows_off[0]) == set(fl.TIMING_KEYS) - {"perf/mfu"}


@pytest.mark.slow  # ~16 s in the full suite on 2 busy cores
def test_llada_run_writes_timing_metrics(tmp_path):
    # The diffusion family runs the same RL step with its own programs (the settings of
    # tests/test_llada_train.py's CLI run, so a warm compilation cache serves both).
    out = str(tmp_path / "llada")
    args = [*TINY_RUN, "model.kind=llada", "rollout.max_new_tokens=8", "diffusion.block_length=4",
            "diffusion.steps=4", "diffusion.inner_iterations=2", "checkpoint.every=0",
            "train.steps=1"]
    assert cli.main([f"out_dir={out}", *args]) == 0
    (r,) = _metrics(out)
    assert all(r[k] > 0 for k in fl.TIMING_KEYS if k != "perf/mfu") and "perf/mfu" not in r
    assert r["perf/tokens_per_s"] * r["timing_s/rollout"] == pytest.approx(
        r["response_len"] * 8 * 4, rel=1e-5)


def test_golden_run_leaves_out_every_timing_key():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "golden_run.py")
    spec = importlib.util.spec_from_file_location("golden_run", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert set(fl.TIMING_KEYS) <= set(mod.TIMING)  # wall-clock values never enter the golden file
