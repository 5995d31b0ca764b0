"""Validation of a run configuration: value ranges, choices, paths and cross-field rules.

`ais_jax.config.load.validate` calls `validate_config`; every problem is a one-line
`UsageError` that names the key and the fix (the CLI prints it and exits 2).
User values in messages are clipped (`ais_jax.core.safe_yaml.clip`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ais_jax.config.bounds import check_numeric_bounds
from ais_jax.config.schema import CHOICES, SKIP_PATH_CHECK_ENV, SPECIAL_SOURCES
from ais_jax.core import storage
from ais_jax.core.errors import UsageError
from ais_jax.core.safe_yaml import PATH_CHARS, clip

if TYPE_CHECKING:
    from ais_jax.config.schema import (
        AISSection,
        Config,
        ModelSection,
        RolloutSection,
        RuntimeSection,
        SFTSection,
        TaskSection,
        TrainSection,
    )


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


def _at_least(section: str, values: object, names: tuple[str, ...], low: int) -> None:
    for name in names:
        value = getattr(values, name)
        _require(value >= low, f"{section}.{name} must be >= {low}, got {value}")


def _check_path(key: str, path: str, allow_dir: bool = False) -> None:
    if os.environ.get(SKIP_PATH_CHECK_ENV) == "1":
        return
    if key == "model.source":
        _require(
            os.path.exists(path),
            f"model.source path {clip(path, PATH_CHARS)} does not exist; point it at an HF "
            "directory or a .gguf file, or use 'scratch' or 'smollm2'",
        )
        _require(
            os.path.isdir(path) or path.endswith(".gguf"),
            f"model.source {clip(path, PATH_CHARS)} is neither a directory nor a .gguf file; "
            "point it at an HF directory or a .gguf file",
        )
    elif key == "out_dir":
        _require(not os.path.exists(path) or os.path.isdir(path),
                 f"out_dir {clip(path, PATH_CHARS)} is an existing file, not a directory; "
                 "pick another out_dir")
        _check_no_dangling_link(path)
    else:
        _require(
            os.path.isfile(path) or (allow_dir and os.path.isdir(path)),
            f"{key} {clip(path, PATH_CHARS)} is not a file; point it at a local JSONL file or set "
            "it to ''",
        )


def _check_no_dangling_link(path: str) -> None:
    """Refuse an ``out_dir`` that is, or lies under, a symbolic link to nothing."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        prefix = os.sep.join(parts[:i])
        if os.path.islink(prefix) and not os.path.exists(prefix):
            target = os.path.join(os.path.dirname(prefix), os.readlink(prefix))
            _require(False, f"out_dir {clip(path, PATH_CHARS)}: {prefix} is a symbolic link to "
                     f"{target}, which does not exist; create {target} or use another out_dir")
        if not os.path.lexists(prefix):
            return


def _validate_choices(cfg: Config) -> None:
    for key, choices in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        _require(
            value in choices,
            f"{key} must be one of {', '.join(map(repr, choices))}, got {clip(value)}",
        )
    _require(bool(cfg.out_dir), "out_dir is empty; set it to a run directory, e.g. runs/my_run")
    _require("\x00" not in cfg.out_dir, "out_dir contains a NUL byte; set it to a directory path")
    if storage.is_remote(cfg.out_dir):
        storage.check_served(cfg.out_dir)  # a bucket: orbax and fsspec write it directly
    else:
        _check_path("out_dir", cfg.out_dir)
    _require(0 <= cfg.seed < 2**32, f"seed must be in [0, 2**32), got {clip(cfg.seed)}")


def _validate_model_task(m: ModelSection, t: TaskSection) -> None:
    if storage.is_remote(m.source):  # a bucket: read in ranges (models/weight_files.py)
        storage.check_served(m.source, "model.source")
        _require(
            not m.source.rstrip("/").lower().endswith(".gguf"),
            f"model.source {clip(m.source, PATH_CHARS)}: GGUF files are not read from a "
            "bucket; copy it to local disk (gcloud storage cp) and set model.source to the copy",
        )
    elif m.source not in SPECIAL_SOURCES:
        _check_path("model.source", m.source)
    sizes = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")
    _at_least("model", m, (*sizes, "intermediate_size", "attention_chunk"), 1)
    _require(
        m.num_heads % m.num_kv_heads == 0,
        f"model.num_kv_heads={m.num_kv_heads} must divide model.num_heads={m.num_heads}",
    )
    _require(bool(t.name), "task.name is empty; set it to a task such as arithmetic")
    _require(t.eval_size >= 1, f"task.eval_size must be >= 1, got {t.eval_size}")
    for key, path in (("task.train_file", t.train_file), ("task.eval_file", t.eval_file)):
        if path:
            _check_path(key, path, allow_dir=t.name == "dataset")


def _validate_rollout_ais(r: RolloutSection, a: AISSection) -> None:
    _require(
        r.temperature >= 1.1754943508222875e-38,  # distributions.MIN_TEMPERATURE
        f"rollout.temperature must be >= 1.18e-38 (float32's smallest normal number) for RL, "
        f"got {r.temperature}; tiny temperatures are exact, 0 (greedy) has no log-probs",
    )
    _require(0 < r.top_p <= 1, f"rollout.top_p must be in (0, 1], got {r.top_p}; 1 disables it")
    _require(r.top_k >= 0, f"rollout.top_k must be >= 0 (0 disables it), got {r.top_k}")
    _at_least("rollout", r, ("max_new_tokens", "prompts_per_step"), 1)
    for name in ("weight_scaling", "act_scaling"):  # FP4: fixed block scales, BF16 activations
        _require(
            r.precision != "fp8" or r.fp8_format not in ("nvfp4", "mxfp4")
            or getattr(r, name) == "tensor",
            f"rollout.{name}={clip(getattr(r, name))} does not apply to rollout.fp8_format="
            f"{r.fp8_format} (block-scaled FP4 weights, BF16 activations); leave it at 'tensor'",
        )
    _require(not (r.kv_cache_fp8 and r.kv_cache_int8), "rollout.kv_cache_fp8 and "
             "rollout.kv_cache_int8 are both true; pick one KV cache format")
    _require(
        r.group_size >= 2,
        f"rollout.group_size must be >= 2 (GRPO needs >= 2 samples per prompt), got {r.group_size}",
    )
    _require(a.C > 1, f"ais.C must be > 1 (the ratio truncation cap), got {a.C}")
    for name in ("delta", "gamma", "eps"):
        value = getattr(a, name)
        _require(value > 0, f"ais.{name} must be > 0, got {value}")
    _require(a.beta_var >= 0, f"ais.beta_var must be >= 0, got {a.beta_var}")
    _require(a.geo_threshold >= 0,
             f"ais.geo_threshold must be >= 0 (a bound on |mean log-ratio|), got "
             f"{a.geo_threshold}")


def _validate_train(tr: TrainSection, r: RolloutSection) -> None:
    _require(tr.steps >= 1, f"train.steps must be >= 1, got {tr.steps}")
    _require(tr.learning_rate > 0, f"train.learning_rate must be > 0, got {tr.learning_rate}")
    _at_least("train", tr, ("epochs", "minibatches"), 1)
    _require(tr.clip_eps > 0, f"train.clip_eps must be > 0, got {tr.clip_eps}")
    nonnegative = ("warmup_steps", "clip_norm", "weight_decay", "clip_eps_high", "beta_kl",
                   "micro_batch_size", "logprob_chunk", "rng_stream")
    _at_least("train", tr, (*nonnegative, "reward_format_weight"), 0)
    _require(not isinstance(r.staleness, bool) and 0 <= r.staleness < tr.steps,
             f"rollout.staleness must be in [0, train.steps) = [0, {tr.steps}), got "
             f"{clip(r.staleness)}; 0 samples each batch with the current policy")
    batch = r.prompts_per_step * r.group_size
    _require(
        batch % tr.minibatches == 0,
        f"train.minibatches={tr.minibatches} must divide rollout.prompts_per_step * "
        f"rollout.group_size = {batch}; pick a divisor of {batch}",
    )
    mb = batch // tr.minibatches
    _require(
        tr.micro_batch_size == 0 or mb % tr.micro_batch_size == 0,
        f"train.micro_batch_size={tr.micro_batch_size} must divide the minibatch of "
        f"{mb} rows (prompts_per_step * group_size / minibatches); pick a divisor of {mb}",
    )


def _validate_proximal(cfg: Config) -> None:
    """``train.proximal=behaviour`` (naive PPO): the ratio against the sampler's log-probs."""
    if cfg.train.proximal != "behaviour":
        return
    _require(cfg.ais.mode == "none", "train.proximal=behaviour takes the PPO ratio against "
             "the sampler's log-probs, which is already the importance ratio; set ais.mode=none "
             f"(got {clip(cfg.ais.mode)}) or train.proximal=current")
    _require(cfg.rollout.top_k == 0 and cfg.rollout.top_p == 1.0, "train.proximal=behaviour "
             "compares the trainer's full distribution with the sampler's log-probs; set "
             "rollout.top_k=0 rollout.top_p=1 or train.proximal=current")


def _validate_rest(cfg: Config) -> None:
    s = cfg.sft
    _require(s.steps >= 0, f"sft.steps must be >= 0 (0 skips SFT), got {s.steps}")
    _require(s.learning_rate > 0, f"sft.learning_rate must be > 0, got {s.learning_rate}")
    _require(s.batch_size >= 1, f"sft.batch_size must be >= 1, got {s.batch_size}")
    _require(
        0.0 <= s.mistake_rate < 1.0, f"sft.mistake_rate must be in [0, 1), got {s.mistake_rate}"
    )
    _require(s.warmup_steps >= 0, f"sft.warmup_steps must be >= 0, got {s.warmup_steps}")
    ro = cfg.mesh.rollout_devices
    _require(not isinstance(ro, bool) and ro >= 0,
             f"mesh.rollout_devices must be >= 0 (0 = the trainer's devices), got {clip(ro)}")
    _require(not ro or cfg.rollout.prompts_per_step % ro == 0,
             f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must be a multiple of "
             f"mesh.rollout_devices={ro} (each rollout device samples its share of the prompts)")
    _require(not ro or (cfg.lora.rank == 0 and cfg.model.kind != "llada"),
             "mesh.rollout_devices > 0 does not support LoRA or a LLaDA policy yet; set "
             "mesh.rollout_devices=0")
    _require(not cfg.log.split_mismatch or cfg.rollout.staleness >= 1,
             "log.split_mismatch=true splits the mismatch into quantization and staleness; "
             "with rollout.staleness=0 there is no staleness: set rollout.staleness >= 1 or "
             "log.split_mismatch=false")
    _validate_sft_criterion(s)
    _require(
        cfg.eval.every >= 0,
        f"eval.every must be >= 0 (0 = only before and after training), got {cfg.eval.every}",
    )
    _require(
        cfg.eval.num_samples >= 1, f"eval.num_samples must be >= 1, got {cfg.eval.num_samples}"
    )
    _at_least("mesh", cfg.mesh, ("data", "fsdp", "tensor"), 1)
    _require(not (cfg.rollout.fused_linears and cfg.mesh.tensor > 1),
             f"rollout.fused_linears=true needs mesh.tensor=1 (got {cfg.mesh.tensor}): a fused "
             "q/k/v weight is not split over tensor-parallel devices; set one of them back")
    _require(
        cfg.checkpoint.every >= 0,
        f"checkpoint.every must be >= 0 (0 = never), got {cfg.checkpoint.every}",
    )
    _require(cfg.checkpoint.keep >= 1, f"checkpoint.keep must be >= 1, got {cfg.checkpoint.keep}")
    _validate_runtime(cfg.runtime)
    from ais_jax.tasks.user_rewards import check_names

    check_names(dict(cfg.reward.functions), dict(cfg.reward.weights))
    t = cfg.reward.timeout_s
    _require(t > 0 and t == t and t != float("inf"),
             f"reward.timeout_s must be a finite number of seconds > 0, got {t}")


def _validate_sft_criterion(s: SFTSection) -> None:
    _require(0.0 <= s.target_accuracy <= 1.0,
             f"sft.target_accuracy must be in [0, 1] (0 = off: run all sft.steps), got "
             f"{s.target_accuracy}")
    _require(s.check_every >= 1, "sft.check_every must be >= 1 (warm-start steps between "
             f"checks), got {s.check_every}")
    _require(s.check_size >= 1, f"sft.check_size must be >= 1 (validation problems), got "
             f"{s.check_size}")
    _require(s.max_steps == 0 or s.max_steps >= s.steps,
             f"sft.max_steps={s.max_steps} must be 0 (= sft.steps) or >= sft.steps={s.steps}")
    if s.target_accuracy > 0:
        most = max(s.steps, s.max_steps)
        _require(s.check_every <= most,
                 f"sft.check_every={s.check_every} exceeds the {most} warm-start steps "
                 "(sft.steps, sft.max_steps), so sft.target_accuracy would never be checked; "
                 "lower sft.check_every or set sft.target_accuracy=0")


def _validate_runtime(rt: RuntimeSection) -> None:
    _require(
        rt.profile_steps >= 1,
        f"runtime.profile_steps must be >= 1 (RL steps traced), got {rt.profile_steps}; "
        "set runtime.profile_dir='' to turn profiling off",
    )
    _require(1.0 <= rt.init_timeout_s <= 86400.0,
             f"runtime.init_timeout_s must be in [1, 86400] seconds (multi-process start-up), "
             f"got {rt.init_timeout_s}")
    for key, value in (("runtime.compile_cache", rt.compile_cache),
                       ("runtime.profile_dir", rt.profile_dir)):
        _require("\x00" not in value, f"{key} contains a NUL byte; set it to a directory path")


def check_diffusion(cfg: Config) -> None:
    """The diffusion section and the settings a LLaDA policy (model.kind=llada) cannot take.

    Called by `validate_config` when ``model.kind=llada`` and by the trainer once
    ``auto`` has resolved to ``llada``.

    Raises:
      UsageError: one line naming the key and the fix.
    """
    d, r, tr = cfg.diffusion, cfg.rollout, cfg.train
    n = r.max_new_tokens
    _at_least("diffusion", d, ("block_length", "steps", "inner_iterations"), 1)
    _require(n % d.block_length == 0,
             f"diffusion.block_length={d.block_length} must divide rollout.max_new_tokens={n} "
             "(the response is a whole number of blocks)")
    blocks = n // d.block_length
    _require(d.steps % blocks == 0,
             f"diffusion.steps={d.steps} must be a multiple of the number of blocks {blocks} "
             "(rollout.max_new_tokens / diffusion.block_length)")
    _require(d.steps <= n, f"diffusion.steps={d.steps} must be <= rollout.max_new_tokens={n} "
             "(each step reveals at least one token)")
    _require(0.0 <= d.p_mask <= 1.0, f"diffusion.p_mask must be in [0, 1], got {d.p_mask}")
    _require(d.surrogate != "trajectory" or d.ratio == "trajectory",
             "diffusion.surrogate=trajectory needs the trainer's replay of the reveal order; "
             "set diffusion.ratio=trajectory")
    _require(tr.epochs == 1 and tr.minibatches == 1,
             "a LLaDA policy takes diffusion.inner_iterations gradient steps per batch; set "
             "train.epochs=1 train.minibatches=1")
    _require(r.top_k == 0 and r.top_p == 1.0,
             "the LLaDA sampler has no top-k / top-p; set rollout.top_k=0 rollout.top_p=1")
    _require(not r.kv_cache_fp8, "a LLaDA policy has no KV cache; set rollout.kv_cache_fp8=false")
    _require(not r.kv_cache_int8, "a LLaDA policy has no KV cache; set rollout.kv_cache_int8=false")
    _require(r.act_scaling != "prefill", "a LLaDA policy has no prefill / decode steps to fix "
             "FP8 scales in; set rollout.act_scaling=tensor or token")
    _require(not r.fused_linears, "the LLaDA model has no fused rollout layout; set "
             "rollout.fused_linears=false")
    _require(tr.proximal == "current", "train.proximal=behaviour needs token log-probs of "
             "one policy; a LLaDA sampler's reveal-time log-probs do not compare with the "
             "trainer's estimates (docs/llada.md); set train.proximal=current")
    _require(r.staleness == 0, "asynchronous rollouts (rollout.staleness > 0) do not support "
             "a LLaDA policy yet; set rollout.staleness=0")
    _require(cfg.mesh.rollout_devices == 0, "mesh.rollout_devices > 0 does not support a LLaDA "
             "policy yet; set mesh.rollout_devices=0")


# The parameter table's block linears, the LoRA targets (`ais_jax.models.lora.TARGETS`; the
# config layer does not import the models, tests/test_lora_train.py keeps the two equal).
LORA_TARGETS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def lora_targets(targets: str) -> tuple[str, ...]:
    """``lora.targets`` as names: ``"all"`` is every target, else the comma list (stripped)."""
    if targets.strip() == "all":
        return LORA_TARGETS
    return tuple(t.strip() for t in targets.split(","))


def check_lora(cfg: Config) -> None:
    """The model-free checks of the lora section and of ``model.adapter``; the rank against
    the model's dims is checked at build time (`ais_jax.models.lora.validate_lora`)."""
    lo = cfg.lora
    _require(not isinstance(lo.rank, bool) and lo.rank >= 0,
             f"lora.rank must be >= 0 (0 = off), got {clip(lo.rank)}")
    _require(lo.rank == 0 or cfg.rollout.staleness == 0, "asynchronous rollouts "
             "(rollout.staleness > 0) do not support LoRA yet; set rollout.staleness=0 or "
             "lora.rank=0")
    if lo.rank == 0:
        _require(not cfg.model.adapter, f"model.adapter={clip(cfg.model.adapter)} needs LoRA "
                 "on; set lora.rank > 0 (the adapter's rank)")
        return
    _require(lo.alpha > 0, f"lora.alpha must be > 0 (the update is alpha / rank x B A), got "
             f"{clip(lo.alpha)}")
    names = lora_targets(lo.targets)
    unknown = [t for t in names if t not in LORA_TARGETS]
    _require(not unknown and names, f"lora.targets={clip(lo.targets)}: unknown target(s) "
             f"{clip(', '.join(unknown))}; use a comma list of {', '.join(LORA_TARGETS)}, or all")
    _require(len(set(names)) == len(names),
             f"lora.targets={clip(lo.targets)} names a target twice; list each once")
    _require(not isinstance(lo.dropout, bool) and 0 <= lo.dropout < 1,
             f"lora.dropout must be in [0, 1) (dropout on the LoRA branch's input in the "
             f"update's loss forward; 0 = off), got {clip(lo.dropout)}")
    if storage.is_remote(cfg.model.adapter):
        storage.check_served(cfg.model.adapter, "model.adapter")
    elif cfg.model.adapter and os.environ.get(SKIP_PATH_CHECK_ENV) != "1":
        _require(os.path.isdir(cfg.model.adapter), f"model.adapter {clip(cfg.model.adapter)} "
                 "is not a directory; point it at a PEFT adapter directory or set it to ''")


def validate_config(cfg: Config) -> None:
    """Check value ranges, choices and cross-field constraints of a config.

    The mesh is not checked against the device count (the trainer knows the
    devices).  Paths are checked unless ``AIS_JAX_SKIP_PATH_CHECK=1``.

    Args:
      cfg: the config to check, e.g. from `ais_jax.config.yaml_io.load_yaml`.

    Raises:
      UsageError: the first problem found, in one line with the fix.
    """
    _validate_choices(cfg)
    _validate_model_task(cfg.model, cfg.task)
    _validate_rollout_ais(cfg.rollout, cfg.ais)
    _validate_train(cfg.train, cfg.rollout)
    _validate_proximal(cfg)
    _validate_rest(cfg)
    check_lora(cfg)
    if cfg.model.kind == "llada":
        check_diffusion(cfg)
    check_numeric_bounds(cfg)  # int32 / float32 ranges (after the keys' own, clearer, rules)
    from ais_jax.tasks import check_task_settings  # light: imports no jax

    check_task_settings(cfg.task.name, dict(cfg.task.difficulty), cfg.sft.mistake_rate)
