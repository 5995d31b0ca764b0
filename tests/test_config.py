"""Tests of ais_jax.config.schema and ais_jax.config.yaml_io.

Defaults, YAML + overrides, one-line errors, round trips, the shipped configs.
"""

import dataclasses
import glob
import importlib.util
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ais_jax.config import load as config_load
from ais_jax.config import schema as config
from ais_jax.config import yaml_io as config_yaml
from ais_jax.config.load import load_config
from ais_jax.config.schema import Config
from ais_jax.core.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent


def _yaml(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _error(path=None, overrides=()):
    with pytest.raises(UsageError) as info:
        load_config(path, overrides)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_defaults_load_and_are_hashable():
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.rollout.precision == "fp8" and cfg.ais.mode == "ais" and cfg.rollout.group_size == 8
    assert cfg.model.source == "scratch" and cfg.task.difficulty == ()
    assert hash(cfg) == hash(Config())
    assert {cfg: 1}[load_config(None)] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3  # type: ignore[misc]


def test_yaml_then_overrides(tmp_path):
    path = _yaml(
        tmp_path,
        "seed: 4\nout_dir: runs/x\ntrain:\n  steps: 10\n  learning_rate: 1e-4\n"
        "task:\n  difficulty: {num_operands: 3, digits: 2}\nrollout:\n  group_size: 4\n",
    )
    cfg = load_config(
        path,
        [
            "train.steps=3",
            "rollout.precision=bf16",
            "ais.C=2",
            "task.difficulty.digits=4",
            "log.tensorboard=false",
        ],
    )
    assert cfg.seed == 4 and cfg.out_dir == "runs/x"
    assert cfg.train.steps == 3
    assert cfg.train.learning_rate == 1e-4 and isinstance(cfg.train.learning_rate, float)
    assert cfg.rollout.precision == "bf16" and cfg.rollout.group_size == 4
    assert cfg.ais.C == 2.0 and isinstance(cfg.ais.C, float)
    assert cfg.task.difficulty == (("digits", 4), ("num_operands", 3))
    assert cfg.log.tensorboard is False
    # Overrides apply in order; a mapping replaces the difficulty or sets keys of a section.
    cfg = load_config(
        path, ["task.difficulty={ops: '+-'}", "train={epochs: 2}", "seed=9", "seed=10"]
    )
    assert cfg.task.difficulty == (("ops", "+-"),)
    assert cfg.train.epochs == 2 and cfg.train.steps == 10
    assert cfg.seed == 10
    assert load_config(None, ["task.train_file="]).task.train_file == ""


def test_load_config_accepts_pathlike_and_empty_file(tmp_path):
    assert load_config(Path(_yaml(tmp_path, ""))) == Config()
    assert load_config(_yaml(tmp_path, "train:\n")) == Config()


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["train.stpes=3"], "unknown config key 'train.stpes'; did you mean 'train.steps'?"),
        (["trian.steps=3"], "unknown config key 'trian.steps'; did you mean 'train.steps'?"),
        (["train.temperature=0.5"], "did you mean 'rollout.temperature'?"),
        (["train.lr=1"], "unknown config key 'train.lr'; valid keys: train.steps, train.learning"),
        (["seed.x=1"], "config key 'seed' is a value, not a section; write seed=VALUE"),
        (["train.steps=abc"], "train.steps must be an int, got 'abc' (str)"),
        (["train.steps=2.5"], "train.steps must be an int, got 2.5 (float)"),
        (["train.steps=true"], "train.steps must be an int, got True (bool)"),
        (["ais.C=true"], "ais.C must be a float, got True (bool)"),
        (["ais.C=abc"], "ais.C must be a float, got 'abc' (str)"),
        (["ais.C=.nan"], "ais.C must be a finite number, got nan"),
        (["log.progress=1"], "log.progress must be a bool (true or false), got 1 (int)"),
        (["out_dir=123"], "out_dir must be a str, got 123 (int); quote it"),
        (["train=3"], "train must be a mapping of its keys, got 3 (int)"),
        (["task.difficulty=[1, 2]"], "task.difficulty must be a mapping such as {digits: 2}"),
        (["task.difficulty={digits: [1]}"], "task.difficulty entries must map a name to"),
        (["train.steps"], "override 'train.steps' has no '='; write it as key=value"),
        (["=3"], "has an empty key"),
        (["train.steps=[1"], "cannot parse the value of override 'train.steps=[1' as YAML"),
        (["train.steps=0"], "train.steps must be >= 1, got 0"),
        (["train.steps=-5"], "train.steps must be >= 1, got -5"),
        (["sft.steps=-1"], "sft.steps must be >= 0 (0 skips SFT), got -1"),
        (["train.learning_rate=0"], "train.learning_rate must be > 0, got 0.0"),
        (["rollout.precision=fp16"],
         "rollout.precision must be one of 'fp8', 'bf16', 'int8', 'auto', got 'fp16'"),
        (["ais.mode=AIS"], "ais.mode must be one of 'ais', 'tis', 'none', 'token_mask'"),
        (["ais.geo_threshold=-0.1"], "ais.geo_threshold must be >= 0"),
        (["ais.C=1"], "ais.C must be > 1"),
        (["train.loss_aggregation=sum"], "'token_mean', 'seq_mean_token_mean', 'constant'"),
        (["model.param_dtype=float16"], "model.param_dtype must be one of 'float32', 'bfloat16'"),
        (["rollout.fp8_format=e3m4"], "rollout.fp8_format must be one of 'e4m3', 'e5m2'"),
        (["rollout.act_scaling=row"],
         "rollout.act_scaling must be one of 'tensor', 'token', 'prefill'"),
        (["rollout.weight_scaling=row"], "must be one of 'tensor', 'channel'"),
        (["task.prompt_style=plain"], "task.prompt_style must be one of 'compact', 'chat'"),
        (["rollout.group_size=1"], "rollout.group_size must be >= 2 (GRPO needs >= 2 samples"),
        (
            ["train.minibatches=3"],
            "train.minibatches=3 must divide rollout.prompts_per_step * rollout.group_size = 128",
        ),
        (["rollout.temperature=0"], "rollout.temperature must be >= 1.18e-38"),
        (["rollout.temperature=-1"], "rollout.temperature must be >= 1.18e-38"),
        (["rollout.temperature=1e-40"], "rollout.temperature must be >= 1.18e-38"),
        (["rollout.top_p=0"], "rollout.top_p must be in (0, 1], got 0.0"),
        (["rollout.top_p=1.5"], "rollout.top_p must be in (0, 1], got 1.5"),
        (["rollout.top_k=-1"], "rollout.top_k must be >= 0"),
        (["mesh.data=0"], "mesh.data must be >= 1, got 0"),
        (["mesh.fsdp=-2"], "mesh.fsdp must be >= 1, got -2"),
        (["mesh.tensor=0"], "mesh.tensor must be >= 1, got 0"),
        (["ais.C=1"], "ais.C must be > 1"),
        (["ais.delta=0"], "ais.delta must be > 0"),
        (["ais.beta_var=-1"], "ais.beta_var must be >= 0"),
        (["model.num_kv_heads=3"], "model.num_kv_heads=3 must divide model.num_heads=4"),
        (["checkpoint.keep=0"], "checkpoint.keep must be >= 1"),
        (["checkpoint.every=-1"], "checkpoint.every must be >= 0"),
        (["eval.num_samples=0"], "eval.num_samples must be >= 1"),
        (["sft.warmup_steps=-1"], "sft.warmup_steps must be >= 0, got -1"),
        (["sft.mistake_rate=1"], "sft.mistake_rate must be in [0, 1), got 1.0"),
        (["sft.mistake_rate=-0.1"], "sft.mistake_rate must be in [0, 1), got -0.1"),
        (["ais.use_ess=1"], "ais.use_ess must be a bool (true or false), got 1 (int)"),
        (["out_dir=''"], "out_dir is empty"),
        (["task.name="], "task.name is empty"),
    ],
)
def test_override_errors(overrides, expected):
    assert expected in _error(None, overrides)


def test_valid_edge_values_pass():
    cfg = load_config(
        None,
        [
            "rollout.group_size=2",
            "rollout.top_p=1",
            "train.minibatches=4",
            "sft.steps=0",
            "checkpoint.every=0",
            "eval.every=0",
            "train.clip_norm=0",
            "mesh.fsdp=8",
            "rollout.top_k=5",
        ],
    )
    assert cfg.rollout.top_p == 1.0 and cfg.mesh.fsdp == 8


def test_yaml_file_errors(tmp_path):
    assert _error(str(tmp_path / "missing.yaml")).startswith(
        f"config file '{tmp_path / 'missing.yaml'}' not found"
    )
    assert "is a directory" in _error(str(tmp_path))
    bad = _yaml(tmp_path, "train:\n  steps: 3\n  lr: [1, 2\n")
    msg = _error(bad)
    assert f"YAML syntax error in {bad} line " in msg and "fix the file" in msg
    msg = _error(_yaml(tmp_path, "train:\n  steps: 3\n bad: 1\n"))
    assert "line 3" in msg
    assert "must hold a mapping of config keys, got list" in _error(_yaml(tmp_path, "- 1\n"))
    path = _yaml(tmp_path, "train:\n  stpes: 3\n")
    assert (
        _error(path) == f"unknown config key 'train.stpes' in {path}; did you mean 'train.steps'?"
    )
    path = _yaml(tmp_path, "train:\n  steps: abc\n")
    assert _error(path) == f"train.steps must be an int in {path}, got 'abc' (str)"


def test_model_source_paths(tmp_path, monkeypatch):
    monkeypatch.delenv(config.SKIP_PATH_CHECK_ENV, raising=False)
    assert _error(None, ["model.source=x"]) == (
        "model.source path 'x' does not exist; point it at an HF directory or a .gguf file, "
        "or use 'scratch' or 'smollm2'"
    )
    (tmp_path / "weights.bin").write_bytes(b"")
    assert "neither a directory nor a .gguf file" in _error(
        None, [f"model.source={tmp_path / 'weights.bin'}"]
    )
    (tmp_path / "m.gguf").write_bytes(b"")
    assert load_config(None, [f"model.source={tmp_path / 'm.gguf'}"]).model.source.endswith(
        "m.gguf"
    )
    assert load_config(None, [f"model.source={tmp_path}"]).model.source == str(tmp_path)
    assert load_config(None, ["model.source=smollm2"]).model.source == "smollm2"
    assert "task.train_file '/no/such.jsonl' is not a file" in _error(
        None, ["task.train_file=/no/such.jsonl"]
    )
    monkeypatch.setenv(config.SKIP_PATH_CHECK_ENV, "1")
    cfg = load_config(None, ["model.source=/no/such/dir", "task.eval_file=/no/such.jsonl"])
    assert cfg.model.source == "/no/such/dir"


def test_does_not_check_mesh_against_devices():
    assert load_config(None, ["mesh.data=64", "mesh.tensor=8"]).mesh.data == 64


def _non_default() -> Config:
    return load_config(
        None,
        [
            "seed=3",
            "out_dir=runs/a b",
            "rollout.precision=bf16",
            "ais.mode=tis",
            "ais.eps=1e-8",
            "train.learning_rate=3e-6",
            "task.difficulty={digits: 3, ops: '+', use_all: true}",
            "task.name='123'",
            "log.progress=false",
            "rollout.temperature=0.7",
        ],
    )


def test_yaml_round_trips(tmp_path):
    cfg = _non_default()
    assert cfg.task.name == "123"
    for text in (config_yaml.config_to_yaml(cfg), config_yaml.format_config(cfg)):
        assert load_config(_yaml(tmp_path, text)) == cfg
    assert load_config(_yaml(tmp_path, config_yaml.config_to_yaml(Config()))) == Config()
    d = config_yaml.config_to_dict(cfg)
    assert d["task"]["difficulty"] == {"digits": 3, "ops": "+", "use_all": True}
    assert d["train"]["learning_rate"] == 3e-6
    assert set(d) == {f.name for f in dataclasses.fields(Config)}


def test_format_config_shows_every_key_with_its_comment():
    assert config_load.format_config is config_yaml.format_config  # re-exported for the trainer
    text = config_yaml.format_config(Config())
    for key in config_yaml.all_keys(Config):
        name = key.rpartition(".")[2]
        assert any(line.strip().startswith(f"{name}:") for line in text.splitlines()), key
    assert "  steps: 100  # RL steps" in text
    assert "  C: 5.0  # ratio cap" in text


def test_every_field_has_a_comment():
    sections = [tp for tp in config_yaml._hints(Config).values() if dataclasses.is_dataclass(tp)]
    assert len(sections) == 14  # ... diffusion (LLaDA policies) and lora (adapters)
    for cls in [Config, *sections]:
        comments = config_yaml.field_comments(cls)
        assert set(comments) == {f.name for f in dataclasses.fields(cls)}
        for name, text in comments.items():
            assert len(text) > 5, f"{cls.__name__}.{name} has no comment"
    difficulty = config_yaml.field_comments(config.TaskSection)["difficulty"]
    assert difficulty.startswith("keyword arguments")
    leaves = [k for k in config_yaml.all_keys(Config) if "." in k]
    assert len(config_yaml.reference_rows(Config)) == len(leaves) + 2


SHIPPED = sorted(glob.glob(str(ROOT / "configs" / "*.yaml")))


def test_shipped_configs_are_the_expected_set():
    names = {os.path.basename(p) for p in SHIPPED}
    assert {
        "tiny_arithmetic.yaml",
        "smollm2_arithmetic.yaml",
        "qwen3_0p6b_gsm8k.yaml",
        "qwen3_1p7b_gsm8k.yaml",
        "qwen3_8b_gsm8k.yaml",
    } <= names
    assert config.DEFAULT_CONFIG_PATH.is_file()


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_shipped_configs_load(path, monkeypatch):
    if "qwen3" in path or "llada_8b" in path:  # weights expected under /data
        monkeypatch.delenv(config.SKIP_PATH_CHECK_ENV, raising=False)
        assert "model.source path '/data/" in _error(path)
        monkeypatch.setenv(config.SKIP_PATH_CHECK_ENV, "1")
    cfg = load_config(path)
    assert cfg.out_dir == "runs/" + os.path.basename(path).removesuffix(".yaml")
    assert load_config(path, ["rollout.precision=bf16"]).rollout.precision == "bf16"


def test_tiny_default_lists_every_key():
    raw = yaml.safe_load(config.DEFAULT_CONFIG_PATH.read_text())
    keys = set()
    for k, v in raw.items():
        keys.add(k)
        if isinstance(v, dict) and k != "difficulty":
            keys.update(f"{k}.{sub}" for sub in v)
    assert keys == set(config_yaml.all_keys(Config))
    cfg = load_config(config.DEFAULT_CONFIG_PATH)
    assert cfg.model.source == "scratch" and cfg.task.prompt_style == "compact"
    assert cfg.rollout.precision == "fp8" and cfg.ais.mode == "ais" and cfg.sft.steps > 0


def test_docs_are_up_to_date():
    spec = importlib.util.spec_from_file_location(
        "gen_config_docs", ROOT / "scripts" / "gen_config_docs.py"
    )
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.render()
    for key in config_yaml.all_keys(Config):
        if "." in key:
            assert f"| `{key}` |" in text
    assert (ROOT / "docs" / "configuration.md").read_text() == text, (
        "docs/configuration.md is out of date; run python scripts/gen_config_docs.py"
    )


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    out_dir=st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s),
    lr=st.floats(1e-9, 10.0, allow_nan=False),
    difficulty=st.dictionaries(
        _names, st.integers(-5, 99) | st.booleans() | st.text(max_size=5), max_size=3
    ),
    tensorboard=st.booleans(),
)
def test_yaml_round_trip_property(seed, out_dir, lr, difficulty, tensorboard):
    cfg = dataclasses.replace(
        Config(),
        seed=seed,
        out_dir=out_dir,
        train=dataclasses.replace(Config().train, learning_rate=lr),
        task=dataclasses.replace(
            Config().task, train_file=out_dir, difficulty=tuple(sorted(difficulty.items()))
        ),
        log=dataclasses.replace(Config().log, tensorboard=tensorboard),
    )
    for text in (config_yaml.config_to_yaml(cfg), config_yaml.format_config(cfg)):
        data = yaml.safe_load(text)
        assert config_yaml.build(Config, data) == cfg, text


def test_correction_modes_and_defaults_match_the_library():
    from ais_jax.method.corrections import CORRECTION_MODES, DEFAULT_GEO_THRESHOLD

    assert set(config.CHOICES["ais.mode"]) == set(CORRECTION_MODES)
    assert Config().ais.geo_threshold == DEFAULT_GEO_THRESHOLD


def test_temperature_floor_matches_the_library():
    from ais_jax.method.distributions import MIN_TEMPERATURE

    load_config(None, [f"rollout.temperature={MIN_TEMPERATURE!r}"])
    with pytest.raises(UsageError, match=r"rollout\.temperature"):
        load_config(None, [f"rollout.temperature={MIN_TEMPERATURE * 0.999!r}"])
