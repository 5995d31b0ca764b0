"""Asynchronous rollouts (``rollout.staleness = k``, issue 40 items 1, 4 and 7).

A run with staleness ``k`` must equal a sequential reference that samples step ``t`` with the
params of step ``max(t - k, 0)`` and never overlaps anything: the reference is written out
here from the run's programs (rollout, score, update), the codec and the verifier, not by
calling the pipelined code. A reward by token content (the share of digits) gives the tiny
untrained model rewards that vary within groups, so every step moves the params and a stale
sampler makes a difference (checked: staleness 1 and 0 differ).
"""

from __future__ import annotations

import json
import os
import signal
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.config.schema import DEFAULT_CONFIG_PATH
from ais_jax.core.errors import UsageError
from ais_jax.run import cli
from ais_jax.tasks import RewardConfig, score_batch
from ais_jax.tasks.user_rewards import score_rewards
from ais_jax.training.flops import TIMING_KEYS

REWARD = os.path.join(os.path.dirname(__file__), "_token_reward.py") + ":digit_share"
ARGS = [*TINY_RUN, "train.learning_rate=0.01", "train.steps=4", "checkpoint.every=1",
        f"reward.functions.d={REWARD}"]
TIMING = {"step", "step_time_s", *TIMING_KEYS}
LLADA_CONFIG = os.path.join(os.path.dirname(DEFAULT_CONFIG_PATH), "tiny_llada_countdown.yaml")


def _sequential(cfg, k: int) -> list[dict[str, float]]:
    """The reference: step t samples with the params of step max(t - k, 0), then updates."""
    from ais_jax.training.build import build_run
    from ais_jax.training.rl import grow_prompt_bucket

    r = build_run(cfg)
    codec, fns, P, G = r.codec, r.fns, cfg.rollout.prompts_per_step, cfg.rollout.group_size
    reward_cfg = RewardConfig(correct_weight=cfg.reward.task_weight,
                              format_weight=cfg.train.reward_format_weight)
    weights = np.asarray([f.weight for f in r.rewards], np.float32)
    state, root = r.state, jax.random.key(cfg.seed)
    params_at = [jax.tree.map(jnp.copy, state.params)]  # params_at[t]: the params of step t
    records = []
    for t in range(cfg.train.steps):
        rkey, ukey = jax.random.split(jax.random.fold_in(root, t))
        problems = r.train_problems(0, t, P)
        seqs = [codec.encode_prompt(p) for p in problems]
        grow_prompt_bucket(r, max(len(s) for s in seqs))
        pt, pm = codec.pad(seqs, r.prompt_bucket)
        batch = fns.rollout(params_at[max(t - k, 0)], jnp.asarray(pt), jnp.asarray(pm), rkey)
        logp_old = fns.score(state.params, batch) if fns.score_for_update else None
        toks, msk = np.asarray(batch.tokens), np.asarray(batch.mask)
        texts = [codec.decode(toks[i], msk[i]) for i in range(len(toks))]
        flat = [p for p in problems for _ in range(G)]
        rewards, correct = score_batch(r.task, texts, flat, reward_cfg)
        user = score_rewards(r.rewards, texts, flat)
        rewards = rewards + user @ weights
        state, met = fns.update(state, batch, jnp.asarray(rewards.reshape(P, G)), ukey, None,
                                logp_old)
        params_at.append(jax.tree.map(jnp.copy, state.params))
        records.append({"accuracy": float(np.mean(correct)),
                        **{name: float(v) for name, v in jax.device_get(met).items()},
                        "reward/d": float(user[:, 0].mean())})
    return records


def _metrics(out_dir) -> list[dict[str, float]]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
                for line in f if line.strip()]


def _assert_equal(run, ref) -> None:
    assert len(run) == len(ref)
    for t, (a, b) in enumerate(zip(run, ref, strict=True)):
        assert set(a) == set(b), (t, set(a) ^ set(b))
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"step {t + 1} {key}")


@pytest.mark.slow  # two 4-step runs and their references in one process (~60 s on 2 cores)
@pytest.mark.parametrize("k", [1, 2])
def test_staleness_equals_the_sequential_reference(k, tmp_path, capsys):
    cfg = load_config(DEFAULT_CONFIG_PATH, [f"out_dir={tmp_path / 'run'}", *ARGS,
                                            f"rollout.staleness={k}"])
    cli.run(cfg)
    assert f"rollout.staleness={k}: steps 1-{k} learn from batches sampled by the initial " \
        "policy" in capsys.readouterr().out
    run = _metrics(tmp_path / "run")
    assert all(r["grad_norm"] > 0.01 and r["reward_std"] > 0.01 for r in run), run
    _assert_equal(run, _sequential(cfg, k))
    # The stale sampler matters: step 1 samples the same params either way, step 2 not.
    sync = _sequential(cfg, 0)
    assert run[0] == sync[0]
    assert run[1]["loss"] != sync[1]["loss"] and run[1]["d_bar"] != sync[1]["d_bar"]


# SIGTERMs the run once step 2 is scored (tests/_token_reward.py)
STOP_AFTER_STEP_2 = os.path.join(os.path.dirname(__file__),
                                 "_token_reward.py") + ":stops_after_step_2"


@pytest.mark.slow  # a stopped and resumed 4-step run and its reference (~40 s on 2 cores)
def test_a_resume_learns_from_the_batches_that_were_in_flight(tmp_path, monkeypatch):
    monkeypatch.setenv("AIS_JAX_STOP_FLAG", str(tmp_path / "stopped"))
    out = tmp_path / "run"
    args = [f"out_dir={out}", *ARGS, "rollout.staleness=1",
            f"reward.functions.d={STOP_AFTER_STEP_2}"]
    assert cli.main(args) == 128 + signal.SIGTERM
    assert [r["step"] for r in _metrics_raw(out)] == [1, 2]
    meta = json.loads((out / "checkpoints" / "2" / "metadata" / "metadata").read_text())
    assert len(meta["inflight_batches"]) == 1  # step 3's batch, sampled by step 2's params
    assert cli.main(args) == 0
    ref = _sequential(load_config(DEFAULT_CONFIG_PATH, [f"out_dir={tmp_path / 'r'}", *ARGS,
                                                        "rollout.staleness=1"]), 1)
    _assert_equal(_metrics(out), ref)


def _metrics_raw(out_dir) -> list[dict]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("extra, message", [
    (["rollout.staleness=4"], "rollout.staleness must be in [0, train.steps) = [0, 4), got 4"),
    (["rollout.staleness=-1"], "rollout.staleness must be in [0, train.steps)"),
    (["rollout.staleness=1", "lora.rank=4"], "do not support LoRA yet"),
    (["rollout.staleness=1", "--llada"], "do not support a LLaDA policy yet"),
])
def test_impossible_staleness_is_refused_with_one_line(extra, message, tmp_path):
    path = DEFAULT_CONFIG_PATH
    if "--llada" in extra:
        path, extra = LLADA_CONFIG, [e for e in extra if e != "--llada"]
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        load_config(path, [f"out_dir={tmp_path}", "train.steps=4", *extra])


@pytest.mark.slow  # ~5 s each in the full suite on 2 busy cores
@pytest.mark.parametrize("sampling", [[], ["rollout.top_k=5"]])  # issue 55 row 9: truncated
def test_split_mismatch_separates_quantization_from_staleness(sampling, tmp_path):
    cfg = load_config(DEFAULT_CONFIG_PATH, [f"out_dir={tmp_path / 'run'}", *ARGS,
                                            "train.steps=3", "rollout.staleness=1",
                                            "log.split_mismatch=true", *sampling])
    cli.run(cfg)
    run = _metrics(tmp_path / "run")
    keys = ("mismatch/quant_d_bar", "mismatch/quant_ess", "mismatch/stale_d_bar",
            "mismatch/stale_ess")
    assert all(set(keys) <= set(r) for r in run), run[0].keys()
    # Step 1 learns from a batch the current params sampled: no staleness at all, and the
    # quantization part is the whole mismatch the update measured.
    assert run[0]["mismatch/stale_d_bar"] == 0.0 and run[0]["mismatch/stale_ess"] == 1.0
    np.testing.assert_allclose(run[0]["mismatch/quant_d_bar"], run[0]["d_bar"], rtol=1e-5)
    for r in run[1:]:  # the params moved: a stale part, and |a - c| <= |a - b| + |b - c|
        assert r["mismatch/stale_d_bar"] > 0 and r["mismatch/stale_ess"] < 1.0, r
        assert r["d_bar"] <= r["mismatch/quant_d_bar"] + r["mismatch/stale_d_bar"] + 1e-6, r
    with pytest.raises(UsageError, match=r"with rollout\.staleness=0 there is no staleness"):
        load_config(DEFAULT_CONFIG_PATH, [f"out_dir={tmp_path}", "log.split_mismatch=true"])


# ----------------------------------- issue 55 row 10: a resume that raises train.steps is exact


class _FakeStep:
    """An RL step whose state is the number of updates and whose batch records the params
    (update count) that sampled it."""

    def sample(self, params, problems, key, ahead=False):
        from ais_jax.training.rl import Pending

        return Pending(list(problems), ("batch", params, key), 0.0, 0.0, ahead)

    def learn(self, state, pending, key, on_samples=None):
        assert pending.batch[2] == key  # the step's own batch
        return SimpleNamespace(params=state.params + 1), {"sampled_by": pending.batch[1]}


def _fake_run(steps, k, start=0, params=0, restored=()):
    from ais_jax.training.stale import StaleRollouts

    stale = StaleRollouts(_FakeStep(), lambda s: [s], lambda s: s, steps, k)
    message = stale.fill(params, start, restored)
    state, records = SimpleNamespace(params=params), []
    for t in range(start, steps):
        state, rec = stale.step(state, t)
        records.append(rec["sampled_by"])
    return records, stale.payload(), message


@pytest.mark.parametrize("k, steps, more", [(1, 3, 1), (2, 3, 2), (2, 12, 2), (2, 5, 1)])
def test_a_finished_run_resumed_with_more_steps_learns_the_same_batches(k, steps, more):
    first, inflight, _ = _fake_run(steps, k)
    assert len(inflight) == k  # the final checkpoint holds the next k steps' batches
    rest, _, message = _fake_run(steps + more, k, start=steps, params=steps, restored=inflight)
    assert message == ""  # nothing sampled from the restored params
    whole, _, _ = _fake_run(steps + more, k)
    assert first + rest == whole == [max(t - k, 0) for t in range(steps + more)]


@pytest.mark.slow  # a 3-step run resumed to 4 steps and the 4-step reference (~40 s on 2 cores)
def test_a_staleness_2_run_resumed_with_more_steps_equals_the_longer_run(tmp_path, capsys):
    out = tmp_path / "run"
    args = [f"out_dir={out}", *ARGS, "rollout.staleness=2"]
    assert cli.main([*args, "train.steps=3"]) == 0
    assert cli.main(args) == 0  # ARGS: train.steps=4
    assert "sampled from the restored policy" not in capsys.readouterr().out
    ref = _sequential(load_config(DEFAULT_CONFIG_PATH, [f"out_dir={tmp_path / 'r'}", *ARGS,
                                                        "rollout.staleness=2"]), 2)
    _assert_equal(_metrics(out), ref)


def test_split_stats_compares_the_truncated_logprobs():
    """Issue 55 row 9: with top-k / top-p `score` gives (truncated, full) pairs; the split
    compares the truncated ones, as the correction does (known answer)."""
    from ais_jax.training.rl import split_stats

    L, inf = 87.0, np.inf
    mask = np.array([[1.0, 1.0, 1.0, 0.0]], np.float32)
    rollout = np.array([[-1.0, -0.5, -2.0, 0.0]], np.float32)
    # token 2 is outside the stale params' truncated set, token 1 outside the current one's;
    # the full log-probs are finite (and must not be used); the padding holds garbage
    stale = (np.array([[-1.1, -0.5, -inf, np.nan]], np.float32),
             np.array([[-1.2, -0.6, -3.0, 0.0]], np.float32))
    cur = (np.array([[-0.9, -inf, -inf, inf]], np.float32),
           np.array([[-1.0, -4.0, -5.0, 0.0]], np.float32))
    m = {k: float(v) for k, v in split_stats(cur, stale, rollout, mask, C=5.0).items()}

    def ess(w):
        cv = np.std(w, ddof=1) / np.mean(w)
        return 1.0 / (1.0 + cv**2)

    # quantization: stale vs rollout on the 3 valid tokens: gaps -0.1, 0, -inf (ratio 0)
    np.testing.assert_allclose(m["mismatch/quant_d_bar"], (0.1 + 0.0 + L) / 3, rtol=1e-5)
    np.testing.assert_allclose(m["mismatch/quant_ess"], ess([np.exp(-0.1), 1.0, 0.0]),
                               rtol=1e-5)
    # staleness: current vs stale where the stale set holds the token: gaps 0.2, -inf
    np.testing.assert_allclose(m["mismatch/stale_d_bar"], (0.2 + L) / 2, rtol=1e-5)
    np.testing.assert_allclose(m["mismatch/stale_ess"], ess([np.exp(0.2), 0.0]), rtol=1e-5)
    # without truncation the arrays are compared as given
    plain = split_stats(cur[1], stale[1], rollout, mask, C=5.0)
    np.testing.assert_allclose(float(plain["mismatch/stale_d_bar"]), (0.2 + 3.4 + 2.0) / 3,
                               rtol=1e-5)


def test_completions_table_with_truncated_sampling_takes_the_truncated_logprobs():
    """The same pair reached the completions table (``log.completions_every``): with top-k
    the step raised AttributeError ('RolloutBatch' has no 'traj_logp')."""
    from ais_jax.training.rl import sample_logps
    from ais_jax.training.trainer import RolloutBatch

    trunc = jnp.asarray([[-1.0, -np.inf], [-0.5, -0.2]])
    full = jnp.asarray([[-1.5, -3.0], [-0.9, -0.7]])
    logp = jnp.asarray([[-1.1, -2.0], [-0.5, -0.3]])
    z = jnp.zeros((2, 2))
    batch = RolloutBatch(z, z, z.astype(jnp.int32), jnp.ones((2, 2)), logp)
    lo, lr = sample_logps((trunc, full), batch, np.array([1]))
    np.testing.assert_array_equal(lo, np.asarray(trunc)[1:])
    np.testing.assert_array_equal(lr, np.asarray(logp)[1:])
    lo, _ = sample_logps(full, batch, np.arange(2))  # no truncation: as given
    np.testing.assert_array_equal(lo, np.asarray(full))
