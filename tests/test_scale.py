"""The update at scale: chunked log-probs, remat, gradient accumulation, sharded minibatches,
f32 master weights and growing prompt buckets equal (or guard) the plain path.

Exactness tests run in float32 so that a real difference is not hidden by bf16
rounding: the plain path is a full `model.forward` over prompt + completion,
logits sliced to the completion, log-softmax (what the library did before).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ais_jax.core.errors import UsageError
from ais_jax.method import grpo
from ais_jax.method.distributions import token_logprobs
from ais_jax.models import model as model_lib
from ais_jax.training import optim, policy, steps
from ais_jax.training.logprobs import completion_logprobs, hidden_states
from ais_jax.training.rl import grow_prompt_bucket

CFG = model_lib.ModelConfig(vocab_size=53, hidden_size=32, intermediate_size=48, num_layers=2,
                            num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64)
B, P, N = 6, 5, 7


def _batch(seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    prompt = jax.random.randint(k1, (B, P), 0, CFG.vocab_size)
    pmask = jnp.arange(P)[None, :] >= jnp.array([0, 1, 2, 0, 3, 1])[:, None]  # left pads
    toks = jax.random.randint(k2, (B, N), 0, CFG.vocab_size)
    params = model_lib.init_params(k3, CFG)
    params["embed"] = params["embed"] * 20.0  # sharper distributions: larger gradients
    return params, prompt, pmask, toks


def _plain_logprobs(params, prompt, pmask, toks, temperature=1.0, top_k=0, top_p=1.0):
    seq = jnp.concatenate([prompt, toks], 1)
    smask = jnp.concatenate([pmask, jnp.ones(toks.shape, bool)], 1)
    logits = model_lib.forward(params, seq[:, :-1], CFG, smask[:, :-1])[:, P - 1:]
    return token_logprobs(logits, toks, temperature, top_k, top_p)


@pytest.mark.slow  # ~9 s in the full suite on 2 busy cores
@pytest.mark.parametrize("chunk", [0, 1, 3, 7, 64])
@pytest.mark.parametrize("remat", ["none", "full", "dots"])
def test_chunked_logprobs_equal_plain_path(chunk, remat):
    params, prompt, pmask, toks = _batch()
    want = _plain_logprobs(params, prompt, pmask, toks, 0.7)
    got = completion_logprobs(params, prompt, pmask, toks, CFG, 0.7, chunk=chunk, remat=remat)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_chunked_logprobs_with_truncation_equal_plain_path():
    params, prompt, pmask, toks = _batch(1)
    want = _plain_logprobs(params, prompt, pmask, toks, 1.0, 5, 0.9)
    got = completion_logprobs(params, prompt, pmask, toks, CFG, 1.0, 5, 0.9, chunk=3)
    w, g = np.asarray(want), np.asarray(got)
    assert np.array_equal(np.isfinite(w), np.isfinite(g)) and (~np.isfinite(w)).any()
    np.testing.assert_allclose(g[np.isfinite(g)], w[np.isfinite(w)], rtol=1e-5, atol=1e-6)


def _gb(params, prompt, pmask, toks, seed=2):
    k1, k2 = jax.random.split(jax.random.key(seed))
    mask = (jax.random.uniform(k1, (B, N)) < 0.8).astype(jnp.float32).at[0].set(0.0)
    logp_old = _plain_logprobs(params, prompt, pmask, toks) + 0.05 * jax.random.normal(k1, (B, N))
    adv = jax.random.normal(k2, (B, N))
    ref = logp_old - 0.1
    return grpo.GRPOBatch(prompt, pmask, toks, mask, logp_old, adv, ref)


def _plain_loss(params, gb, loss_cfg):
    ln = _plain_logprobs(params, gb.prompt_tokens, gb.prompt_mask, gb.tokens)
    return grpo.grpo_loss(ln, gb.logp_old, gb.advantages, gb.mask, gb.logp_ref, loss_cfg)


@pytest.mark.slow  # ~18 s in the full suite on 2 busy cores
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "constant"])
@pytest.mark.parametrize("micro", [1, 2, 3, 6])
def test_loss_and_grads_with_remat_chunks_and_accumulation_equal_plain(aggregation, micro):
    params, prompt, pmask, toks = _batch(3)
    gb = _gb(params, prompt, pmask, toks)
    loss_cfg = grpo.LossConfig(beta_kl=0.05, aggregation=aggregation)
    scoring = policy.Scoring(compute_dtype=jnp.float32, chunk=3, remat="full")
    (want, wm), wg = jax.value_and_grad(_plain_loss, has_aux=True)(params, gb, loss_cfg)

    def loss_fn(p, mb, totals=None):
        return policy.policy_loss(p, mb, CFG, loss_cfg, scoring, totals)

    if micro == 1:
        (got, gm), gg = jax.value_and_grad(loss_fn, has_aux=True)(params, gb)
    else:
        (got, gm), gg = jax.jit(lambda p, b: optim.accumulated_grads(loss_fn, p, b, micro))(
            params, gb)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    for k in ("clip_frac", "kl", "ratio_mean"):
        np.testing.assert_allclose(float(gm[k]), float(wm[k]), rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(gg), jax.tree.leaves(wg), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                                   atol=1e-5 * float(jnp.max(jnp.abs(b))) + 1e-9)


@pytest.mark.slow  # ~8 s in the full suite on 2 busy cores
def test_sft_loss_chunked_and_rematerialized_equals_plain():
    params, prompt, _, toks = _batch(4)
    seq = jnp.concatenate([prompt, toks], 1)
    lmask = jnp.zeros(seq.shape).at[:, P:].set(1.0)
    f = jax.value_and_grad(steps.sft_loss, has_aux=True)
    (want, wa), wg = f(params, seq, lmask, CFG, jnp.float32)
    (got, ga), gg = f(params, seq, lmask, CFG, jnp.float32, chunk=4, remat="dots")
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    assert float(ga["accuracy"]) == float(wa["accuracy"])
    for a, b in zip(jax.tree.leaves(gg), jax.tree.leaves(wg), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_hidden_states_rejects_unknown_remat():
    params, prompt, _, _ = _batch()
    with pytest.raises(ValueError, match="remat must be one of"):
        hidden_states(params, prompt, CFG, remat="sometimes")


def test_split_rows_takes_an_equal_share_of_every_shard():
    x = jnp.arange(16)
    np.testing.assert_array_equal(optim.split_rows(x, 2), x.reshape(2, 8))
    # 4 row shards of 4 rows; each of 2 parts takes 2 rows from every shard
    got = np.asarray(optim.split_rows(x, 2, shards=4))
    np.testing.assert_array_equal(got, [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]])
    assert sorted(got.ravel().tolist()) == list(range(16))


def test_f32_master_moves_under_small_lr_where_bf16_would_not():
    lr = 5e-7
    w = {"w": jnp.full((4,), 0.02, jnp.float32)}
    g = {"w": jnp.full((4,), 0.3, jnp.float32)}
    opt = optax.adam(lr)
    upd, _ = opt.update(g, opt.init(w), w)
    f32 = optax.apply_updates(w, upd)["w"]
    assert np.all(np.asarray(f32) != 0.02) and np.allclose(0.02 - np.asarray(f32), lr, rtol=1e-3)
    wb = jax.tree.map(lambda x: x.astype(jnp.bfloat16), w)
    updb, _ = opt.update(jax.tree.map(lambda x: x.astype(jnp.bfloat16), g), opt.init(wb), wb)
    bf16 = optax.apply_updates(wb, updb)["w"]
    assert np.all(np.asarray(bf16, np.float32) == np.float32(jnp.bfloat16(0.02)))  # rounded away
    assert optim.bf16_half_ulp(0.02) > lr  # the rule the CLI applies
    assert optim.bf16_half_ulp(0.02) == 2.0 ** -14  # 0.02 in [2^-6, 2^-5): ulp 2^-13


def test_cli_refuses_bf16_master_at_a_learning_rate_it_cannot_represent(tmp_path, capsys):
    from ais_jax.run import cli as train

    base = [f"out_dir={tmp_path}", "model.hidden_size=32", "model.num_layers=1",
            "model.num_heads=2", "model.num_kv_heads=1", "model.head_dim=16",
            "model.intermediate_size=64", "rollout.prompts_per_step=8", "rollout.group_size=2",
            "sft.steps=0", "task.eval_size=4", "log.progress=false", "log.tensorboard=false"]
    code = train.main([*base, "model.param_dtype=bfloat16", "train.learning_rate=5e-7"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "model.param_dtype=float32" in err and "5e-07" in err


@pytest.mark.parametrize("override,needle", [
    ("train.micro_batch_size=5", "must divide the minibatch of 32 rows"),
    ("train.remat=sometimes", "train.remat"),
])
def test_bad_scale_settings_exit_2(override, needle, tmp_path, capsys):
    from ais_jax.run import cli as train

    code = train.main([f"out_dir={tmp_path}", "rollout.prompts_per_step=8",
                       "rollout.group_size=4", "log.progress=false", override])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and needle in err, err


def test_prompt_bucket_grows_through_a_bounded_set():
    run = SimpleNamespace(prompt_bucket=32, cfg=SimpleNamespace(
        rollout=SimpleNamespace(max_new_tokens=8)), model_cfg=CFG)
    assert grow_prompt_bucket(run, 20) == 32  # fits: unchanged
    assert grow_prompt_bucket(run, 33) == 56  # next bucket (64) capped at 64 - 8 positions
    assert run.prompt_bucket == 56
    with pytest.raises(UsageError, match="exceeds the model's 64 positions"):
        grow_prompt_bucket(run, 60)


_HLO_SCRIPT = r"""
import json, re, sys
import jax, jax.numpy as jnp
from ais_jax.training import optim, steps
from ais_jax.training import sharding as shd
from ais_jax.config.load import load_config
from ais_jax.models.model import ModelConfig, init_params
V = 173
mc = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=8)
cfg = load_config(None, ["rollout.prompts_per_step=4", "rollout.group_size=4",
                         "rollout.max_new_tokens=6", "train.minibatches=2",
                         "train.micro_batch_size=4", "train.remat=full", "train.logprob_chunk=3",
                         "mesh.fsdp=4"])
mesh = shd.make_mesh(1, 4, 1)
opt = optim.make_optimizer(1e-3)
state = optim.init_train_state(init_params(jax.random.key(0), mc), opt)
fns = steps.build_step_fns(state, mesh, opt, None, mc, cfg, steps.TokenIds((), None))
S = jax.ShapeDtypeStruct
Bn, Pn, Nn = 16, 8, 6
batch = steps.RolloutBatch(S((Bn, Pn), jnp.int32), S((Bn, Pn), jnp.bool_), S((Bn, Nn), jnp.int32),
                           S((Bn, Nn), jnp.float32), S((Bn, Nn), jnp.float32))
state_abs = jax.tree.map(lambda x: S(x.shape, x.dtype), state)
hlo = fns.update.lower(state_abs, batch, S((4, 4), jnp.float32), jax.random.key(1),
                       None, S((Bn, Nn), jnp.float32)).compile().as_text()
shapes = re.findall(r"= (\w+\[[\d,]*\])[^=]* all-reduce\(", hlo)
print(json.dumps(shapes))
"""


@pytest.mark.slow  # ~19 s in the full suite on 2 busy cores
def test_update_never_all_reduces_logits_on_an_fsdp_mesh():
    # Rows pinned to the batch axes: each device scores its own rows against
    # gathered weights, so no [rows, time, vocab] partial sums are all-reduced.
    out = subprocess.run([sys.executable, "-c", _HLO_SCRIPT], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, JAX_NUM_CPU_DEVICES="4"))
    assert out.returncode == 0, out.stderr[-3000:]
    shapes = json.loads(out.stdout.strip().splitlines()[-1])
    assert shapes, "expected gradient all-reduces in the compiled update"
    dims = [[int(d) for d in s.split("[")[1].rstrip("]").split(",") if d] for s in shapes]
    logits_like = [s for s, d in zip(shapes, dims, strict=True) if len(d) >= 3 and d[-1] == 173]
    assert not logits_like, logits_like


def test_merge_rows_inverts_split_rows():
    x = jnp.arange(48).reshape(24, 2)
    for parts, shards in ((1, 1), (3, 1), (2, 4), (3, 8)):
        np.testing.assert_array_equal(
            optim.merge_rows(optim.split_rows(x, parts, shards), shards), x)


_HEAD_SCRIPT = r"""
import json, re
import jax, jax.numpy as jnp
from ais_jax.training import policy
from ais_jax.training import sharding as shd
from ais_jax.models.model import ModelConfig, init_params
V = 176  # divisible by fsdp=4: the untied head runs vocab-parallel
mc = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=8, tie_embeddings=False)
mesh = shd.make_mesh(1, 4, 1)
k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
params = init_params(k1, mc)
params["lm_head"] = params["lm_head"] * 20.0
prompt = jax.random.randint(k2, (8, 5), 0, V)
pmask = jnp.arange(5)[None, :] >= (jnp.arange(8) % 3)[:, None]
toks = jax.random.randint(k3, (8, 6), 0, V)
head = shd.head_constraint(mesh, V)
assert head is not None
def loss(p, sc):
    return jnp.sum(policy.trainer_logprobs(p, prompt, pmask, toks, mc, sc) ** 2)
plain = policy.Scoring(compute_dtype=jnp.float32, chunk=4)
sharded = plain._replace(constrain=shd.batch_constraint(mesh), head_constrain=head)
psh = shd.param_shardings(params, mesh)
assert psh["lm_head"].spec == jax.sharding.PartitionSpec(("fsdp",), None), psh["lm_head"].spec
f = jax.jit(jax.value_and_grad(lambda p: loss(p, sharded)), in_shardings=(psh,))
hlo = f.lower(params).compile().as_text()
gathers = re.findall(r"= (\w+\[[\d,]*\])[^=]* all-gather\(", hlo)
l1, g1 = f(jax.device_put(params, psh))
l0, g0 = jax.jit(jax.value_and_grad(lambda p: loss(p, plain)))(params)
err = max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
          for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)))
print(json.dumps({"gathers": gathers, "loss": [float(l0), float(l1)], "grad_err": err,
                  "grad_spec": str(g1["lm_head"].sharding.spec)}))
"""


@pytest.mark.slow  # ~18 s in the full suite on 2 busy cores
def test_untied_head_runs_vocab_parallel_on_an_fsdp_mesh():
    # The head's weight stays sharded on its vocabulary: rows are gathered, the
    # weight never is, its gradient stays on its shard, and the numbers equal
    # one device's.
    out = subprocess.run([sys.executable, "-c", _HEAD_SCRIPT], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, JAX_NUM_CPU_DEVICES="4"))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    dims = [[int(d) for d in s.split("[")[1].rstrip("]").split(",") if d] for s in res["gathers"]]
    assert not [s for s, d in zip(res["gathers"], dims, strict=True) if 176 in d], res["gathers"]
    l0, l1 = res["loss"]
    assert abs(l1 - l0) <= 1e-5 * abs(l0), res["loss"]
    assert res["grad_err"] < 1e-5, res["grad_err"]
    assert "fsdp" in res["grad_spec"], res["grad_spec"]
