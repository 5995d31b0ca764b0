"""GRPO with LoRA adapters (issue 27): frozen base, adapter-only optimizer, step-0 identity,
PEFT + merged export, resume of a warm-started base, and one-line refusals of bad settings."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import TINY_RUN, child_env, first_prompts, params_digest

from ais_jax.config.load import load_config
from ais_jax.models import lora
from ais_jax.models.layout import ModelConfig
from ais_jax.models.peft_io import load_peft_adapter, save_peft_adapter
from ais_jax.run import cli as train
from ais_jax.training.build import build_run
from ais_jax.training.placement import to_global

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

LORA = ["lora.rank=4", "lora.alpha=8"]


@pytest.mark.slow  # compiles two rollouts, two scores and the LoRA update: ~30-65 s on 2 cores
def test_lora_grpo_frozen_base_and_step0_identity(tmp_path):
    over = [*TINY_RUN, "rollout.group_size=2", f"out_dir={tmp_path}"]
    full = build_run(load_config(None, over))
    r = build_run(load_config(None, [*over, *LORA]))
    assert r.lora is not None and full.lora is None
    # (c) B = 0: the rollout (merged, FP8) and the trainer's scores equal full fine-tuning's
    pt, pm = first_prompts(r)
    key = jax.random.key(3)
    b_full = full.fns.rollout(full.state.params, pt, pm, key)
    b_lora = r.fns.rollout(r.state.params, pt, pm, key)
    for a, b in zip(b_full, b_lora, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(full.fns.score(full.state.params, b_full)),
                                  np.asarray(r.fns.score(r.state.params, b_lora)))
    # (a) N updates move the adapters only; the base stays bit-identical (random rewards:
    # the untrained tiny model earns none, and equal rewards have no advantage)
    base0, adapters0 = params_digest(r.lora.base), jax.tree.map(np.asarray, r.state.params)
    rng, state, sh = np.random.default_rng(0), r.state, r.fns.batch_sharding
    for step in range(2):
        rewards = to_global(rng.normal(size=(8, 2)).astype(np.float32), sh)
        state, met = r.fns.update(state, b_lora, rewards, jax.random.key(step), None, None)
        assert np.isfinite(float(met["loss"])) and float(met["skipped"]) == 0
    assert params_digest(r.lora.base) == base0
    assert jax.tree.leaves(r.lora.base)[0].dtype == jnp.bfloat16  # compute dtype
    b_after = np.asarray(state.params["layers"]["wq"]["b"])
    assert not np.array_equal(b_after, adapters0["layers"]["wq"]["b"])  # B left 0
    # (b) the optimizer state holds adapter-shaped leaves (and scalars) only
    shapes = {tuple(x.shape) for x in jax.tree.leaves(state.params)}
    opt = [tuple(x.shape) for x in jax.tree.leaves(state.opt_state) if np.ndim(x)]
    assert opt and set(opt) <= shapes
    n = sum(int(np.prod(s)) for s in opt)
    assert n == 2 * lora.num_adapter_params(r.model_cfg, r.lora.cfg)  # Adam mu, nu
    base_shapes = {tuple(x.shape) for x in jax.tree.leaves(r.lora.base)}
    assert not (set(opt) & base_shapes)


@pytest.mark.slow  # ~13 s in the full suite on 2 busy cores
def test_lora_cli_exports_peft_adapter_and_merged_model(tmp_path, capsys):
    from ais_jax import load_pretrained

    out, rw = tmp_path / "run", tmp_path / "rw.py"
    rw.write_text("def fn(c, p, row):\n    return float(sum(map(ord, c)) % 7)\n")
    over = [f"out_dir={out}", *TINY_RUN, "rollout.group_size=2", "train.steps=2",
            "train.learning_rate=0.01", f"reward.functions={{r: {rw}:fn}}", *LORA]
    assert train.main(over) == 0, capsys.readouterr().err
    final = out / "final"
    cfg_json = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert cfg_json["r"] == 4 and cfg_json["lora_alpha"] == 8
    params, mcfg = load_pretrained(final, dtype=jnp.float32)
    adapters, lcfg = load_peft_adapter(final / "adapter", mcfg)
    assert lcfg.rank == 4 and lcfg.scale == 2.0
    assert np.abs(np.asarray(adapters["layers"]["w_up"]["b"])).max() > 0  # trained
    # the merged export is the (rebuilt) frozen base with these adapters folded in
    r = build_run(load_config(None, over))
    want = lora.merge(r.lora.base, adapters, lcfg)
    for name in lcfg.targets:
        np.testing.assert_array_equal(np.asarray(params["layers"][name]),
                                      np.asarray(want["layers"][name], np.float32))
    np.testing.assert_array_equal(np.asarray(params["embed"]),
                                  np.asarray(r.lora.base["embed"], np.float32))


def _error(over, capsys) -> str:
    code = train.main(over)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize("extra, words", [
    (["lora.rank=-1"], "lora.rank must be >= 0"),
    (["lora.rank=4", "lora.targets=wq,qkv"], "unknown target(s) 'qkv'"),
    (["lora.rank=4", "lora.targets=wq,wq"], "names a target twice"),
    (["lora.rank=4", "lora.alpha=0"], "lora.alpha"),
    (["lora.rank=4", "lora.dropout=1.0"], "lora.dropout must be in [0, 1)"),
    (["lora.rank=4", "lora.dropout=-0.1"], "lora.dropout must be in [0, 1)"),
    (["lora.rank=40"], "exceeds"),  # the tiny model's wq is 32 x 32
    (["model.adapter=/nonexistent"], "needs LoRA on"),
])
def test_bad_lora_settings_exit_2_with_one_line(tmp_path, capsys, extra, words):
    assert words in _error([f"out_dir={tmp_path}", *TINY_RUN, *extra], capsys)


def test_config_layer_lists_the_models_lora_targets():
    from ais_jax.config.checks import LORA_TARGETS, lora_targets

    assert LORA_TARGETS == lora.TARGETS  # the config layer keeps its own copy of the names
    assert lora_targets("all") == lora.TARGETS
    assert lora_targets(" wq , w_up") == ("wq", "w_up")


def test_adapter_of_other_shapes_is_refused(tmp_path, capsys):
    other = ModelConfig(vocab_size=64, hidden_size=48, intermediate_size=64, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=16)
    lcfg = lora.LoraConfig(rank=4, alpha=8.0)
    save_peft_adapter(lora.init_adapters(jax.random.key(0), other, lcfg), lcfg, other,
                      tmp_path / "adapter")
    line = _error([f"out_dir={tmp_path / 'run'}", *TINY_RUN, *LORA,
                   f"model.adapter={tmp_path / 'adapter'}"], capsys)
    assert "shape" in line and "adapter" in line
    # the right shapes but another rank: named with the fix
    tiny = build_run(load_config(None, [*TINY_RUN, f"out_dir={tmp_path / 'b'}"])).model_cfg
    l8 = lora.LoraConfig(rank=8, alpha=8.0)
    save_peft_adapter(lora.init_adapters(jax.random.key(0), tiny, l8), l8, tiny,
                      tmp_path / "a8")
    line = _error([f"out_dir={tmp_path / 'run2'}", *TINY_RUN, *LORA,
                   f"model.adapter={tmp_path / 'a8'}"], capsys)
    assert "lora.rank=8" in line


def _rslora_adapter(tmp_path):
    """A PEFT rsLoRA adapter (rank 4, alpha 8: scale 8 / sqrt(4) = 4, not 8 / 4 = 2) for the
    tiny model, with random non-zero A and B; returns its directory and its adapters."""
    tiny = build_run(load_config(None, [*TINY_RUN, f"out_dir={tmp_path / 'b'}"])).model_cfg
    rs = lora.LoraConfig(rank=4, alpha=8.0, rslora=True)
    a = lora.init_adapters(jax.random.key(1), tiny, rs)
    a = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(2), x.shape), a)
    save_peft_adapter(a, rs, tiny, tmp_path / "rs")
    assert json.loads((tmp_path / "rs" / "adapter_config.json").read_text())["use_rslora"]
    return tmp_path / "rs", a


@pytest.mark.slow  # ~6 s in the full suite on 2 busy cores
def test_rslora_adapter_needs_lora_rslora_and_the_line_names_it(tmp_path, capsys):
    path, _ = _rslora_adapter(tmp_path)
    line = _error([f"out_dir={tmp_path / 'run'}", *TINY_RUN, *LORA, f"model.adapter={path}"],
                  capsys)
    assert "lora.rslora: adapter true, config false" in line and "set lora.rslora=true" in line
    assert "lora.rank" not in line and "lora.alpha" not in line  # those agree
    # rank and rslora both differ: both named, both fixed
    line = _error([f"out_dir={tmp_path / 'run2'}", *TINY_RUN, "lora.rank=2", "lora.alpha=8",
                   f"model.adapter={path}"], capsys)
    assert "lora.rank: adapter 4, config 2" in line and "lora.rslora=true" in line


@pytest.mark.slow  # one build and one short CLI run: ~65 s on 2 shared cores
def test_rslora_adapter_round_trips_through_model_adapter_and_final(tmp_path, capsys):
    """An rsLoRA adapter starts a run exactly (``model.adapter`` + ``lora.rslora=true``) and
    comes back out of ``final/adapter/`` as rsLoRA, merged at alpha / sqrt(r)."""
    from ais_jax import load_pretrained

    path, a = _rslora_adapter(tmp_path)
    out, rw = tmp_path / "run", tmp_path / "rw.py"
    rw.write_text("def fn(c, p, row):\n    return float(sum(map(ord, c)) % 7)\n")
    over = [f"out_dir={out}", *TINY_RUN, "rollout.group_size=2", "train.steps=1",
            "train.learning_rate=0.01", f"reward.functions={{r: {rw}:fn}}", *LORA,
            "lora.rslora=true", f"model.adapter={path}"]
    r = build_run(load_config(None, over))
    assert r.lora.cfg.rslora and r.lora.cfg.scale == 4.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(r.state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # started exactly there
    assert train.main(over) == 0, capsys.readouterr().err
    final = out / "final"
    conf = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert conf["use_rslora"] is True and conf["r"] == 4 and conf["lora_alpha"] == 8
    params, mcfg = load_pretrained(final, dtype=jnp.float32)
    adapters, lcfg = load_peft_adapter(final / "adapter", mcfg)
    assert lcfg.rslora and lcfg.scale == 4.0
    want = lora.merge(r.lora.base, adapters, lcfg)  # merged at scale 4
    plain = lora.merge(r.lora.base, adapters, lora.LoraConfig(rank=4, alpha=8.0))  # scale 2
    for name in lcfg.targets:
        got = np.asarray(params["layers"][name])
        np.testing.assert_array_equal(got, np.asarray(want["layers"][name], np.float32))
        assert not np.array_equal(got, np.asarray(plain["layers"][name], np.float32))


@pytest.mark.slow  # three short CLI runs with a warm start: ~20-45 s on 2 cores
def test_lora_resume_restores_the_warm_started_base(tmp_path):
    """A scratch model's warm-started base is saved with the checkpoints: a run stopped after
    step 1 and resumed exports the same merged model and adapters as one run of 2 steps (and
    the KL reference, the base itself, is used on both sides)."""
    from ais_jax.run.loop import run

    rw = tmp_path / "rw.py"
    rw.write_text("def fn(c, p, row):\n    return float(sum(map(ord, c)) % 7)\n")
    base = [*TINY_RUN, "rollout.group_size=2", "sft.steps=3", "train.beta_kl=0.1",
            "checkpoint.every=1", "train.learning_rate=0.01", f"reward.functions={{r: {rw}:fn}}",
            *LORA]
    one = tmp_path / "one"
    run(load_config(None, [*base, f"out_dir={one}", "train.steps=2"]))
    two = tmp_path / "two"
    run(load_config(None, [*base, f"out_dir={two}", "train.steps=1"]))
    res = run(load_config(None, [*base, f"out_dir={two}", "train.steps=2"]))
    assert res.resumed_from == 1
    for f in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = (one / "final" / f).read_bytes(), (two / "final" / f).read_bytes()
        assert a == b, f
    assert np.isfinite(res.metrics[-1]["kl"])


@pytest.mark.slow  # two plans compile update and rollout on 2 simulated devices: ~30-60 s
def test_plan_understands_lora():
    """``python -m ais_jax.plan`` with lora.rank > 0: adapters sharded over fsdp=2, the update's
    arguments and optimizer state smaller than full fine-tuning's on the same model."""
    import subprocess
    import sys

    tiny = [*TINY_RUN[:6], "rollout.prompts_per_step=4", "rollout.group_size=2",
            "rollout.max_new_tokens=4", "sft.steps=0", "mesh.fsdp=2"]
    env = child_env(2)
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "ais_jax.plan", "--json", "--prompt-len", "8", *tiny, *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, extra in (("full", []), ("lora", LORA))}
    plans = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        plans[name] = json.loads(out)
    full, lo = plans["full"], plans["lora"]
    assert lo["model"]["lora_rank"] == 4 and "LoRA r=4" in lo["model"]["param_dtype"]
    assert lo["update"]["argument_bytes"] < full["update"]["argument_bytes"] / 2
    # rank 4 on a 32-wide model: the adapters are a quarter of the targeted weights
    assert lo["analytic"]["opt_state_bytes"] < full["analytic"]["opt_state_bytes"] / 3
    assert lo["analytic"]["params_bytes"] == full["analytic"]["params_bytes"] // 2  # bf16 base


def test_checkpoints_from_before_the_lora_keys_still_resume():
    """A checkpoint's stored config without the lora keys (written before they existed) resumes
    under LoRA off, but not under LoRA on."""
    from ais_jax.core.errors import UsageError
    from ais_jax.run import runguard

    cfg = load_config(None, list(TINY_RUN))
    old = {k: v for k, v in runguard.flat_config(cfg).items()
           if not k.startswith("lora.") and k != "model.adapter"}
    runguard.check_resume_config({"config": old}, cfg, 1, "out")
    with pytest.raises(UsageError, match=r"lora\.rank"):
        runguard.check_resume_config({"config": old}, load_config(None, [*TINY_RUN, *LORA]),
                                     1, "out")


def test_lora_dropout_in_0_1_is_accepted():
    from ais_jax.training.trainer import single_forward

    for p in (0.0, 0.1, 0.5, 0.95):
        cfg = load_config(None, [*TINY_RUN, *LORA, f"lora.dropout={p}"])
        assert cfg.lora.dropout == p
        # dropout draws masks in the differentiated forward: logp_old comes from the score
        assert single_forward(cfg) == (p == 0)


@pytest.mark.slow  # ~10 s in the full suite on 2 busy cores
def test_dropout_keys_are_fresh_per_step_and_micro_batch():
    """Known answer of `apply_update`'s dropout keys: loss = sum(w * u(key) * x) with u the
    uniform draw of the key it is given; with SGD(1) the step is minus sum_i u(k_i) x_i over
    micro-batches i, k_i = fold_in(fold_in(key, state.step), i)."""
    from typing import NamedTuple

    import optax

    from ais_jax.training import optim

    class B(NamedTuple):
        x: jax.Array
        mask: jax.Array

    def loss_fn(p, b, totals=None, key=None):
        return jnp.sum(p["w"] * jax.random.uniform(key, b.x.shape) * b.x), {}

    x = jnp.arange(1.0, 9.0).reshape(4, 2)
    b, key = B(x, jnp.ones((4, 2))), jax.random.key(5)
    st = optim.init_train_state({"w": jnp.zeros((2,))}, optax.sgd(1.0))
    st = st._replace(step=st.step + 3)
    k = jax.random.fold_in(key, 3)
    for micro in (1, 2):
        new, _ = optim.apply_update(st, b, loss_fn, optax.sgd(1.0), micro_batches=micro,
                                    key=key)
        want = -sum(np.sum(np.asarray(jax.random.uniform(jax.random.fold_in(k, i), (4 // micro,
                    2))) * np.asarray(x[i * 4 // micro:(i + 1) * 4 // micro]), axis=0)
                    for i in range(micro))
        np.testing.assert_allclose(np.asarray(new.params["w"]), want, rtol=1e-6)
    # another optimizer step draws other masks
    other, _ = optim.apply_update(st._replace(step=st.step + 1), b, loss_fn, optax.sgd(1.0),
                                  key=key)
    assert not np.allclose(np.asarray(other.params["w"]), np.asarray(new.params["w"]))


@pytest.mark.slow  # two builds, the rollout, two scores and two updates: ~40-70 s on 2 cores
def test_lora_dropout_only_in_the_update_loss(tmp_path):
    """lora.dropout > 0: the score (logp_old, hence the AIS statistics) equals dropout 0's for
    the same adapters; the update's loss and gradient differ; the same key repeats the update
    bit for bit and another key draws other masks."""
    over = [*TINY_RUN, "rollout.group_size=2", f"out_dir={tmp_path}", *LORA]
    r0 = build_run(load_config(None, over))
    r1 = build_run(load_config(None, [*over, "lora.dropout=0.3"]))
    assert r1.fns.score_for_update and r1.lora.cfg.dropout == 0.3
    rng = np.random.default_rng(1)  # trained-looking adapters: B != 0
    adapters = jax.tree.map(lambda x: jnp.asarray(0.2 * rng.standard_normal(x.shape), x.dtype),
                            r0.state.params)
    pt, pm = first_prompts(r0)
    batch = r0.fns.rollout(adapters, pt, pm, jax.random.key(3))
    lo0, lo1 = r0.fns.score(adapters, batch), r1.fns.score(adapters, batch)
    np.testing.assert_array_equal(np.asarray(lo0), np.asarray(lo1))
    rewards = to_global(rng.normal(size=(8, 2)).astype(np.float32), r0.fns.batch_sharding)

    def update(r, key):  # a fresh copy each time: the update donates its state
        st = jax.tree.map(jnp.array, r.state._replace(params=adapters))
        st, met = r.fns.update(st, batch, rewards, jax.random.key(key), None, lo0)
        return jax.tree.map(np.asarray, st.params), {k: float(v) for k, v in met.items()}

    p0, m0 = update(r0, 0)
    p1, m1 = update(r1, 0)
    p1b, m1b = update(r1, 0)
    p1c, _ = update(r1, 1)
    assert params_digest(p1) == params_digest(p1b) and m1 == m1b  # deterministic given the key
    assert params_digest(p1) != params_digest(p1c)  # fresh masks from another step key
    assert m1["loss"] != m0["loss"] and m1["grad_norm"] != m0["grad_norm"]
    assert params_digest(p1) != params_digest(p0)
    for k in ("d_bar", "alpha", "ess_ratio"):  # measured from the deterministic score
        assert m1[k] == m0[k], k
