"""`python -m ais_jax.plan`: AOT memory plans over simulated devices, presets, bad input.

The plans run in subprocesses (the device count must be set before JAX starts)
on the tiny scratch config with a 1-layer model; the config and preset checks
run in-process without compiling anything.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import pytest
from _tiny import TINY_MODEL, child_env

from ais_jax.core.errors import UsageError
from ais_jax.models.hf_config import HF_PRESETS, hf_config_from_model_config
from ais_jax.models.model import ModelConfig
from ais_jax.run import plan

TINY = [*TINY_MODEL, "rollout.prompts_per_step=4", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "sft.steps=0"]


def _env(devices: int | None = None) -> dict[str, str]:
    # JAX_NUM_CPU_DEVICES as a user would set it; --devices defaults to the mesh product anyway
    return child_env(devices)


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ais_jax.plan", *args], env=_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def plans() -> dict[int, dict]:
    """JSON plans of the tiny model on 1 device and on 2 (``mesh.fsdp=2``), run concurrently."""
    runs = {n: subprocess.Popen(
        [sys.executable, "-m", "ais_jax.plan", "--json", "--prompt-len", "8", *TINY,
         f"mesh.fsdp={n}"], env=_env(n), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for n in (1, 2)}
    out = {}
    for n, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr
        out[n] = json.loads(stdout)  # exactly one JSON object
    return out


def _check_program(p: dict) -> None:
    for key in ("argument_bytes", "temp_bytes", "output_bytes", "peak_bytes"):
        assert key in p
    assert p["argument_bytes"] > 0 and p["output_bytes"] > 0 and p["temp_bytes"] >= 0
    assert p["peak_bytes"] == (p["argument_bytes"] + p["output_bytes"] + p["temp_bytes"]
                               - p["alias_bytes"])
    assert p["peak_bytes"] >= p["argument_bytes"]


@pytest.mark.slow  # compiles update and rollout for 1 and 2 devices: ~25-50 s on 2 cores
def test_plan_json_on_one_and_two_devices(plans):
    one, two = plans[1], plans[2]
    for out, n in ((one, 1), (two, 2)):
        assert out["devices"] == n and out["mesh"]["fsdp"] == n
        for name in ("init", "update", "rollout"):  # a key per program
            _check_program(out[name])
        assert out["backend"] == "cpu" and "target" not in out  # the CPU simulation
        assert isinstance(out["fits"], bool) and out["fits"]  # a tiny model in 80 GB
        assert out["device_memory_bytes"] == 80 * 10**9
        a = out["analytic"]
        assert all(a[k] > 0 for k in ("params_bytes", "opt_state_bytes", "rollout_copy_bytes",
                                      "kv_cache_bytes", "update_activation_bytes"))
        assert a["opt_state_bytes"] >= 2 * a["params_bytes"]  # Adam: mu and nu
        # the update's arguments hold at least the params and both moments
        assert out["update"]["argument_bytes"] >= a["params_bytes"] + a["opt_state_bytes"]
        assert out["rollout_resident_peak_bytes"] == (out["rollout"]["peak_bytes"]
                                                      + a["opt_state_bytes"])
        # the start-up program outputs the sharded state: params + moments + 2 int32 counts,
        # each buffer padded a little by the allocator (measured: +296 B of 149,776 on 1 device)
        state_bytes = a["params_bytes"] + a["opt_state_bytes"] + 8
        assert state_bytes <= out["init"]["output_bytes"] <= 1.01 * state_bytes
    # FSDP shards params and moments: fewer argument bytes per device
    assert two["update"]["argument_bytes"] < one["update"]["argument_bytes"]
    assert two["init"]["output_bytes"] < one["init"]["output_bytes"]
    assert two["analytic"]["params_bytes"] < one["analytic"]["params_bytes"]
    assert two["analytic"]["kv_cache_bytes"] * 2 == one["analytic"]["kv_cache_bytes"]
    assert one["model"]["from"] == "scratch"


@pytest.mark.slow  # shares the ~25-50 s compiles of the test above (module fixture)
def test_plan_text_table_and_verdict(plans):
    text = plan.format_plan(plans[1])
    for word in ("init", "update", "rollout", "argument", "temp", "peak", "KV cache",
                 "FP8 rollout copy", "CPU backend", "verdict: fits in 80.0 GB",
                 "CPU simulation (the default)"):
        assert word in text
    small = {**plans[1], "fits": False, "device_memory_bytes": 1000}
    assert "verdict: does not fit in 0.0 GB" in plan.format_plan(small)


def test_parse_bytes():
    assert plan.parse_bytes("80GB") == 80 * 10**9
    assert plan.parse_bytes("16GiB") == 16 * 2**30
    assert plan.parse_bytes("141 gb") == 141 * 10**9
    assert plan.parse_bytes("12345") == 12345
    assert plan.parse_bytes("1.5MiB") == 3 * 2**19
    for bad in ("", "GB", "-1GB", "80 parsecs", "0"):
        with pytest.raises(UsageError):
            plan.parse_bytes(bad)


def test_preset_resolves_without_weights():
    cfg = plan.load_plan_config(None, ["model.source=/nonexistent/Qwen3-0.6B"])
    mc, origin = plan.resolve_model_config(cfg)
    assert origin == "preset Qwen3-0.6B"
    assert (mc.hidden_size, mc.intermediate_size, mc.num_layers) == (1024, 3072, 28)
    assert (mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.vocab_size) == (16, 8, 128, 151936)
    assert mc.tie_embeddings and mc.qk_norm and mc.arch == "qwen3"
    assert mc.rope_theta == 1e6 and mc.rms_norm_eps == 1e-6
    assert mc.max_position_embeddings == 40960
    cfg = plan.load_plan_config(None, ["model.source=/data/qwen3-8b/"])  # case, trailing slash
    mc, origin = plan.resolve_model_config(cfg)
    assert origin == "preset Qwen3-8B" and not mc.tie_embeddings and mc.num_layers == 36
    assert 8.1e9 < mc.num_params < 8.3e9
    assert set(HF_PRESETS) >= {"Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-8B", "SmolLM2-135M"}
    for source in ("smollm2", "/models/smollm2-135m.gguf"):
        mc, origin = plan.resolve_model_config(plan.load_plan_config(
            None, [f"model.source={source}", "task.prompt_style=chat"]))
        assert origin == "preset SmolLM2-135M" and (mc.hidden_size, mc.num_layers) == (576, 30)


def test_config_json_wins_over_preset_and_scratch_matches_build(tmp_path):
    small = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2,
                        num_heads=2, num_kv_heads=1, head_dim=8, arch="qwen3", qk_norm=True)
    d = tmp_path / "Qwen3-0.6B"  # a preset's name, but the directory has a config.json
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf_config_from_model_config(small)))
    mc, origin = plan.resolve_model_config(plan.load_plan_config(None, [f"model.source={d}"]))
    assert origin.endswith("config.json") and mc.hidden_size == 16 and mc.num_layers == 2

    from ais_jax.tasks import CharTokenizer
    from ais_jax.training.build import scratch_model_config

    cfg = plan.load_plan_config(None, TINY)
    m = cfg.model
    want = scratch_model_config(CharTokenizer(), hidden_size=m.hidden_size,
                                intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                                num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                                head_dim=m.head_dim)
    assert plan.resolve_model_config(cfg) == (want, "scratch")


def test_unknown_source_names_the_presets():
    cfg = plan.load_plan_config(None, ["model.source=/nowhere/MyModel-3B"])
    with pytest.raises(UsageError, match=r"Qwen3-0\.6B.*Qwen3-8B"):
        plan.resolve_model_config(cfg)


def test_micro_batch_must_divide_minibatch_rows():
    cfg = plan.load_plan_config(None, [*TINY, "train.minibatches=2"])  # 8 rows, 4 a minibatch
    plan._check_batch(cfg, 1)

    class Train:  # a config with micro_batch_size, whatever its schema does
        minibatches, micro_batch_size = 2, 3

    with pytest.raises(UsageError, match="micro_batch_size=3 must divide the 4 rows"):
        plan._check_batch(type("Cfg", (), {"rollout": cfg.rollout, "train": Train})(), 1)
    with pytest.raises(UsageError, match=r"prompts_per_step=4 must be a multiple of .* 8"):
        plan._check_batch(cfg, 8)


def test_already_initialized_jax_with_another_device_count():
    n = jax.device_count()  # starts this process's backend
    plan.configure_devices(n)  # same count: fine
    with pytest.raises(UsageError, match=f"already initialized with {n} devices"):
        plan.configure_devices(n + 1)


@pytest.mark.parametrize("args, message", [
    (["--config", "/nonexistent/run.yaml"], "/nonexistent/run.yaml"),
    (["train.no_such_key=1"], "no_such_key"),
    (["--device-memory", "lots"], "--device-memory"),
    (["--devices", "2", "mesh.fsdp=4"], "needs 4 devices but only 2"),
    (["--devices", "2", "mesh.fsdp=2", "rollout.prompts_per_step=3"],
     "prompts_per_step=3 must be a multiple of mesh.data * mesh.fsdp = 2"),
    (["model.source=/nowhere/MyModel-3B", "task.prompt_style=chat"], "matches no preset"),
    (["--bogus-flag"], "--bogus-flag"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    res = _plan(*TINY, *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert message in lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""
