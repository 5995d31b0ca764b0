"""LoRA for LLaDA policies (issue 27): step-0 identity with the full fine-tune, a frozen base
under updates, the CLI's PEFT export with LLaDA's module names and its reload
(``model.adapter=``), and a resume (warm-started base, KL to the base, dropout) that continues
as an uninterrupted run."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import TINY_RUN, child_env, first_prompts, params_digest

from ais_jax.config.load import load_config
from ais_jax.models import lora
from ais_jax.models.llada import model as llada
from ais_jax.models.peft_io import load_peft_adapter, peft_key, save_peft_adapter, target_modules
from ais_jax.training.build import build_run
from ais_jax.training.placement import to_global

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

LORA = ["lora.rank=4", "lora.alpha=8"]
# The tiny LLaDA run of tests/test_llada_train.py (responses of 8 tokens in 2 blocks).
LLADA_RUN = [*TINY_RUN, "model.kind=llada", "rollout.max_new_tokens=8",
             "diffusion.block_length=4", "diffusion.steps=4", "checkpoint.every=0",
             "rollout.group_size=2"]


@pytest.mark.slow  # compiles two LLaDA rollouts, two scores and the LoRA update: ~30-60 s
def test_llada_lora_starts_as_the_base_and_trains_only_the_adapters(tmp_path):
    over = [*LLADA_RUN, f"out_dir={tmp_path}", "diffusion.ratio=trajectory"]
    full = build_run(load_config(None, over))
    r = build_run(load_config(None, [*over, *LORA]))
    assert r.is_llada and r.lora is not None and full.lora is None
    # B = 0: LLaDA's forward on with_adapters(base, adapters) is the base's, bit for bit
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 20, size=(2, 6)), jnp.int32)
    f = jax.jit(llada.forward, static_argnums=2)
    np.testing.assert_array_equal(
        np.asarray(f(lora.with_adapters(r.lora.base, r.state.params, r.lora.cfg), tokens,
                     r.model_cfg)), np.asarray(f(r.lora.base, tokens, r.model_cfg)))
    # ... so the rollout (merged, FP8), its estimates and the trainer's scores (estimates and
    # trajectory replay) equal full fine-tuning's
    pt, pm = first_prompts(r)
    key = jax.random.key(3)
    b_full = full.fns.rollout(full.state.params, pt, pm, key)
    b_lora = r.fns.rollout(r.state.params, pt, pm, key)
    for a, b in zip(b_full, b_lora, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    s_full, s_lora = full.fns.score(full.state.params, b_full), r.fns.score(r.state.params, b_lora)
    for a, b in zip(s_full, s_lora, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # updates move the adapters only; the base stays bit-identical
    base0, adapters0 = params_digest(r.lora.base), jax.tree.map(np.asarray, r.state.params)
    rng, state, sh = np.random.default_rng(0), r.state, r.fns.batch_sharding
    for step in range(2):
        rewards = to_global(rng.normal(size=(8, 2)).astype(np.float32), sh)
        lo = r.fns.score(state.params, b_lora)
        state, met = r.fns.update(state, b_lora, rewards, jax.random.key(step), None, lo)
        assert np.isfinite(float(met["loss"])) and float(met["skipped"]) == 0
    assert params_digest(r.lora.base) == base0
    assert jax.tree.leaves(r.lora.base)[0].dtype == jnp.bfloat16  # compute dtype
    assert not np.array_equal(np.asarray(state.params["layers"]["wq"]["b"]),
                              adapters0["layers"]["wq"]["b"])  # B left 0
    # the optimizer state holds adapter-shaped leaves (and scalars) only
    opt = [tuple(x.shape) for x in jax.tree.leaves(state.opt_state) if np.ndim(x)]
    assert set(opt) <= {tuple(x.shape) for x in jax.tree.leaves(state.params)}
    assert sum(int(np.prod(s)) for s in opt) == 2 * lora.num_adapter_params(r.model_cfg,
                                                                            r.lora.cfg)


@pytest.mark.slow  # ~6 s in the full suite on 2 busy cores
def test_llada_peft_round_trip_uses_llada_module_names(tmp_path):
    cfg = llada.LLaDAConfig(vocab_size=24, hidden_size=32, intermediate_size=64, num_layers=2,
                            num_heads=2, num_kv_heads=1, mask_token_id=23, text_vocab_size=23,
                            tie_embeddings=False)
    lcfg = lora.LoraConfig(rank=4, alpha=8.0)
    a = lora.init_adapters(jax.random.key(0), cfg, lcfg)
    a = jax.tree.map(lambda x: x + 0.01 * jnp.arange(x.size, dtype=x.dtype).reshape(x.shape), a)
    save_peft_adapter(a, lcfg, cfg, tmp_path / "ad")
    from safetensors.numpy import load_file

    keys = set(load_file(str(tmp_path / "ad" / "adapter_model.safetensors")))
    assert "base_model.model.model.transformer.blocks.1.attn_out.lora_B.weight" in keys
    assert "base_model.model.model.transformer.blocks.0.ff_proj.lora_A.weight" in keys
    assert peft_key("w_down", 1, "A", cfg) in keys and len(keys) == 7 * 2 * 2
    assert all(k.startswith("base_model.model.model.transformer.blocks.") for k in keys)
    assert all(llada.hf_name(n, i).removesuffix(".weight") + ".lora_A.weight"
               in {k.removeprefix("base_model.model.") for k in keys}
               for n in lcfg.targets for i in range(2))
    conf = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    # untied: ff_out is also the output head's name, so the targets are a regex over the blocks
    import re

    assert conf["target_modules"] == target_modules(lcfg, cfg)
    assert re.fullmatch(conf["target_modules"], "model.transformer.blocks.1.ff_out")
    assert not re.fullmatch(conf["target_modules"], "model.transformer.ff_out")
    back, got = load_peft_adapter(tmp_path / "ad", cfg)
    assert (got.rank, got.alpha, got.targets) == (4, 8.0, lcfg.targets)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # tied, two targets: the plain list of LLaDA module names
    tied = dataclasses.replace(cfg, tie_embeddings=True)
    l2 = lora.LoraConfig(rank=4, alpha=8.0, targets=("wo", "w_down"))
    save_peft_adapter(lora.init_adapters(jax.random.key(0), tied, l2), l2, tied, tmp_path / "t")
    conf = json.loads((tmp_path / "t" / "adapter_config.json").read_text())
    assert conf["target_modules"] == ["attn_out", "ff_out"]
    assert load_peft_adapter(tmp_path / "t", tied)[1].targets == ("wo", "w_down")


@pytest.mark.slow  # one short CLI run and two builds: ~30-100 s on 2 cores
def test_llada_lora_cli_exports_peft_and_reloads_it(tmp_path, capsys):
    from ais_jax.models.llada.checkpoint import load as load_llada
    from ais_jax.run import cli

    out, rw = tmp_path / "run", tmp_path / "rw.py"
    rw.write_text("def fn(c, p, row):\n    return float(sum(map(ord, c)) % 7)\n")
    over = [f"out_dir={out}", *LLADA_RUN, "train.steps=2", "train.learning_rate=0.01",
            f"reward.functions={{r: {rw}:fn}}", *LORA]
    assert cli.main(over) == 0, capsys.readouterr().err
    final = out / "final"
    conf = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert conf["r"] == 4 and conf["lora_alpha"] == 8
    assert conf["target_modules"] == ["q_proj", "k_proj", "v_proj", "attn_out", "ff_proj",
                                      "up_proj", "ff_out"]  # tied scratch model
    params, mcfg = load_llada(str(final), jnp.float32)
    adapters, lcfg = load_peft_adapter(final / "adapter", mcfg)
    assert np.abs(np.asarray(adapters["layers"]["w_up"]["b"])).max() > 0  # trained
    # the merged export is the (rebuilt, untouched) frozen base with these adapters folded in
    r = build_run(load_config(None, over))
    want = lora.merge(r.lora.base, adapters, lcfg)
    for name in lcfg.targets:
        np.testing.assert_array_equal(np.asarray(params["layers"][name]),
                                      np.asarray(want["layers"][name], np.float32))
    np.testing.assert_array_equal(np.asarray(params["embed"]),
                                  np.asarray(r.lora.base["embed"], np.float32))
    # model.adapter= starts from the exported adapters, exactly
    r2 = build_run(load_config(None, [*over, f"model.adapter={final / 'adapter'}",
                                      f"out_dir={tmp_path / 'run2'}"]))
    for x, y in zip(jax.tree.leaves(adapters), jax.tree.leaves(r2.state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow  # three short CLI runs with a warm start: ~140 s on 2 shared cores
def test_llada_lora_resume_with_warm_base_kl_and_dropout(tmp_path):
    """A scratch LLaDA's warm-started base is saved with the checkpoints: a run stopped after
    step 1 and resumed exports the same merged model and adapters as one run of 2 steps, with
    the KL reference (the base) and LoRA dropout (masks keyed by seed and step) on."""
    from ais_jax.run.loop import run

    rw = tmp_path / "rw.py"
    rw.write_text("def fn(c, p, row):\n    return float(sum(map(ord, c)) % 7)\n")
    base = [*LLADA_RUN, "sft.steps=3", "sft.warmup_steps=1", "train.beta_kl=0.1",
            "checkpoint.every=1", "train.learning_rate=0.01", f"reward.functions={{r: {rw}:fn}}",
            "lora.dropout=0.2", "train.micro_batch_size=8", *LORA]
    one = tmp_path / "one"
    res1 = run(load_config(None, [*base, f"out_dir={one}", "train.steps=2"]))
    two = tmp_path / "two"
    run(load_config(None, [*base, f"out_dir={two}", "train.steps=1"]))
    res = run(load_config(None, [*base, f"out_dir={two}", "train.steps=2"]))
    assert res.resumed_from == 1
    for f in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = (one / "final" / f).read_bytes(), (two / "final" / f).read_bytes()
        assert a == b, f
    assert np.isfinite(res.metrics[-1]["kl"])
    assert res.metrics[-1]["loss"] == res1.metrics[-1]["loss"]


@pytest.mark.slow  # compiles LLaDA's update, rollout and score on abstract shapes: ~30-90 s
def test_plan_counts_llada_lora():
    """``python -m ais_jax.plan`` for a LLaDA policy with LoRA: the params are the bfloat16
    base, the optimizer state the adapters' Adam moments (8 bytes per adapter parameter)."""
    import subprocess
    import sys

    over = [*TINY_RUN[:6], "rollout.prompts_per_step=4", "rollout.group_size=2",
            "rollout.max_new_tokens=8", "sft.steps=0", "model.kind=llada",
            "diffusion.block_length=4", "diffusion.steps=4", *LORA]
    env = child_env()
    proc = subprocess.run([sys.executable, "-m", "ais_jax.plan", "--json", "--prompt-len", "8",
                           *over], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    cfg = load_config(None, over)
    from ais_jax.training.build import scratch_llada_config

    lcfg = scratch_llada_config(cfg)
    n_adapter = lora.num_adapter_params(lcfg, lora.LoraConfig(rank=4, alpha=8.0))
    assert plan["model"]["kind"] == "llada" and plan["model"]["lora_rank"] == 4
    assert "LoRA r=4" in plan["model"]["param_dtype"]
    assert plan["analytic"]["params_bytes"] == 2 * plan["model"]["params"]  # bf16 base
    assert 8 * n_adapter <= plan["analytic"]["opt_state_bytes"] <= 8 * n_adapter + 64
