"""Everything a run needs, built from its config: task, mesh, model, tokenizer, optimizers.

`build_run(cfg)` returns a `Run`; `ais_jax.run.cli` (the CLI loop),
`ais_jax.training.warmstart`, `ais_jax.training.evaluation` and `ais_jax.training.rl` take it from
there.
Bad input found here raises `ais_jax.core.errors.UsageError` (one line).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import optax
from jax.sharding import Mesh

from ais_jax.config.schema import Config
from ais_jax.core import storage
from ais_jax.core.errors import UsageError
from ais_jax.models import weight_files
from ais_jax.models.model import ModelConfig, init_params
from ais_jax.rollout.codec import PromptCodec, problem_location, problem_where
from ais_jax.rollout.sampler import bucket_length
from ais_jax.training import optim, split_rollout, startup
from ais_jax.training import sharding as shd
from ais_jax.training import steps as st


@dataclasses.dataclass
class Run:
    """A run's built pieces (no mutable training state: that is the `optim.TrainState`)."""

    cfg: Config
    task: Any  # ais_jax.tasks.Task
    mesh: Mesh
    model_cfg: ModelConfig
    codec: PromptCodec
    optimizer: optax.GradientTransformation
    sft_optimizer: optax.GradientTransformation | None
    fns: st.StepFns
    state: optim.TrainState  # the initial state, laid out with fns.state_shardings
    eval_problems: list[Any]
    prompt_bucket: int  # P: prompt length every batch is left-padded to
    rewards: tuple[Any, ...] = ()  # ais_jax.tasks.user_rewards.UserReward: reward functions
    # LoRA on (lora.rank > 0): the frozen base and settings; state.params are the adapters
    lora: Any = None  # ais_jax.training.lora_policy.LoraPolicy

    @property
    def is_llada(self) -> bool:
        """Whether the policy is a LLaDA masked-diffusion model (`ais_jax.models.llada`)."""
        from ais_jax.models.llada.model import LLaDAConfig

        return isinstance(self.model_cfg, LLaDAConfig)

    def train_problems(self, stream: int, step: int, n: int) -> list[Any]:
        """``n`` training problems of ``stream`` (0: RL, 1: warm start) at ``step``; seeded."""
        return problems_at(self.cfg, self.task, stream, step, n)


def problems_at(cfg: Config, task: Any, stream: int, step: int, n: int) -> list[Any]:
    """The deterministic training problems of (seed, stream, step)."""
    seed = (cfg.seed * 1_000_003 + stream * 7_777_777 + step) % 2**31
    return task.generate(seed=seed, n=n, split="train", **dict(cfg.task.difficulty))


def build_task(cfg: Config, dataset: Any = None) -> Any:
    """The config's task; ``gsm8k`` / ``math`` read ``task.train_file`` / ``task.eval_file``.

    ``task.name=dataset`` (or ``dataset`` given: dict rows or a ``datasets.Dataset``,
    used as the training rows) builds `ais_jax.tasks.user_dataset.task_from_config`.
    """
    from ais_jax.tasks import TASKS, dataset_task, get_task, load_jsonl

    name = cfg.task.name
    if dataset is not None or name == "dataset":
        from ais_jax.tasks.user_dataset import task_from_config

        task = task_from_config(cfg.task, dataset)
    elif name in TASKS:
        task = get_task(name)
    elif name in ("gsm8k", "math"):
        if not cfg.task.train_file:
            raise UsageError(f"task.name={name} needs task.train_file (a local JSONL file)")
        train = load_jsonl(cfg.task.train_file)
        ev = load_jsonl(cfg.task.eval_file) if cfg.task.eval_file else None
        task = dataset_task(name, train, ev)
    else:
        try:
            task = get_task(name)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if cfg.sft.mistake_rate > 0 and getattr(task, "mistake", None) is None:
        raise UsageError(f"sft.mistake_rate={cfg.sft.mistake_rate} needs a task with a typical "
                         f"mistake, and task {cfg.task.name!r} defines none; set "
                         "sft.mistake_rate=0")
    return task


PROBE_PROBLEMS = 64  # extra training problems of a generated task checked by `build_run`


def check_problems(cfg: Config, codec: PromptCodec, model_cfg: Any, problems: list[Any], *,
                   answers: bool = False) -> None:
    """Refuse, before anything compiles, problems the model cannot take.

    Every prompt must encode (a scratch model's character tokenizer has no id
    for a character outside its alphabet) and, with ``rollout.max_new_tokens``
    after it, fit the model's ``max_position_embeddings``; with ``answers``
    (a warm start will teach them) every answer must encode too.  `build_run`
    passes a dataset task's whole pool (`ais_jax.tasks.base.Task.pool`), so a
    bad row is found at build time and never mid-run; a generated task's eval
    problems, first batch and `PROBE_PROBLEMS` more training problems.

    Raises:
      UsageError: one line naming the problem (``file:line`` of a dataset row,
        `ais_jax.rollout.codec.problem_where`), the character or the length and
        the limit, and the fix.
    """
    n_new = cfg.rollout.max_new_tokens
    max_pos = model_cfg.max_position_embeddings
    limit = max_pos - n_new
    if limit < 1:
        raise UsageError(f"rollout.max_new_tokens={n_new} leaves no room for a prompt in the "
                         f"model's {max_pos} positions; lower rollout.max_new_tokens")
    too_long = []
    for p in problems:
        n = len(codec.encode_prompt(p))  # UsageError: a character outside the alphabet
        if answers:
            codec.encode_answer(p)
        if n > limit:
            too_long.append((p, n))
    if too_long:
        p, n = too_long[0]
        where = problem_where(p, cfg.task.name)
        more = f" ({len(too_long)} prompts are too long)" if len(too_long) > 1 else ""
        fix = "shorten or drop the row" if problem_location(p) else "ease the task"
        raise UsageError(f"{where}: the prompt has {n} tokens, more than the {limit} that fit "
                         f"the model's {max_pos} positions with rollout.max_new_tokens={n_new}"
                         f"{more}; {fix}, or lower rollout.max_new_tokens")


def build_mesh(cfg: Config) -> Mesh:
    """The ``(data, fsdp, tensor)`` mesh; checks it against the devices and the batch."""
    n_dev = len(jax.devices())
    m = cfg.mesh
    if m.data * m.fsdp * m.tensor > n_dev:
        raise UsageError(
            f"mesh data={m.data} x fsdp={m.fsdp} x tensor={m.tensor} needs "
            f"{m.data * m.fsdp * m.tensor} devices but only {n_dev} are visible; lower the mesh "
            "sizes (on CPU, JAX_NUM_CPU_DEVICES=N simulates N devices)")
    if m.rollout_devices:
        split_rollout.check_devices(cfg)
    n_mesh, n_proc = m.data * m.fsdp * m.tensor, jax.process_count()
    if n_proc > 1 and n_mesh != n_dev:
        # a process without a device in the mesh holds no shard of anything: it cannot take
        # part in placing or gathering arrays (make_array_from_callback, process_allgather)
        rest = m.data * m.tensor
        fix = (f"mesh.fsdp={n_dev // rest}" if n_dev % rest == 0
               else f"mesh.data=1 mesh.fsdp={n_dev} mesh.tensor=1")
        raise UsageError(
            f"mesh data={m.data} x fsdp={m.fsdp} x tensor={m.tensor} uses {n_mesh} of the "
            f"{n_dev} devices of this {n_proc}-process run; a multi-process run's mesh must use "
            f"every device (each process holds a part): set mesh.data * mesh.fsdp * "
            f"mesh.tensor = {n_dev}, e.g. {fix}")
    mesh = shd.make_mesh(m.data, m.fsdp, m.tensor)
    div = shd.batch_divisor(mesh)
    if cfg.rollout.prompts_per_step % div:
        raise UsageError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must be a "
                         f"multiple of mesh.data * mesh.fsdp = {div}")
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size // cfg.train.minibatches
    if rows % div:
        raise UsageError(f"a minibatch of {rows} rows (prompts_per_step * group_size / "
                         f"train.minibatches) does not split over mesh.data * mesh.fsdp = {div} "
                         "batch shards; use fewer minibatches or more prompts")
    micro = cfg.train.micro_batch_size
    if micro and micro % div:
        raise UsageError(f"train.micro_batch_size={micro} must be a multiple of mesh.data * "
                         f"mesh.fsdp = {div} (each micro-batch is split over the batch shards)")
    return mesh


def scratch_model_config(tok: Any, *, hidden_size: int, intermediate_size: int,
                         num_layers: int, num_heads: int, num_kv_heads: int, head_dim: int,
                         max_positions: int = 4096, tie_embeddings: bool = True) -> ModelConfig:
    """The `ModelConfig` of a from-scratch decoder over the character tokenizer ``tok``."""
    return ModelConfig(
        vocab_size=tok.vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, max_position_embeddings=max_positions, bos_token_id=tok.bos_id,
        eos_token_id=tok.eos_id, eos_token_ids=(tok.eos_id,), pad_token_id=tok.pad_id,
        tie_embeddings=tie_embeddings)


def model_kind(cfg: Config) -> str:
    """``model.kind`` resolved: ``auto`` is ``llada`` for a directory holding a LLaDA
    ``config.json`` (`ais_jax.models.llada.checkpoint.is_llada_dir`), else ``ar``."""
    if cfg.model.kind != "auto":
        return cfg.model.kind
    from ais_jax.models.llada.checkpoint import is_llada_dir

    src = cfg.model.source
    return "llada" if src not in ("scratch", "smollm2") and is_llada_dir(src) else "ar"


def scratch_llada_config(cfg: Config) -> Any:
    """The `ais_jax.models.llada.model.LLaDAConfig` of a scratch LLaDA policy: the ``model.*``
    sizes over the character tokenizer plus one id (the mask token), tied embeddings."""
    from ais_jax.models.llada.model import LLaDAConfig
    from ais_jax.tasks import CharTokenizer

    mc, tok = cfg.model, CharTokenizer()
    return LLaDAConfig(
        vocab_size=tok.vocab_size + 1, hidden_size=mc.hidden_size,
        intermediate_size=mc.intermediate_size, num_layers=mc.num_layers,
        num_heads=mc.num_heads, num_kv_heads=mc.num_kv_heads, mask_token_id=tok.vocab_size,
        text_vocab_size=tok.vocab_size, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
        tie_embeddings=True)


def build_llada(cfg: Config, task: Any, mesh: Mesh | None = None) -> tuple[Any, Any, PromptCodec]:
    """``(params, LLaDAConfig, codec)`` of a LLaDA policy: from scratch over the character
    tokenizer (one extra id, the mask token) or a LLaDA checkpoint directory.  With ``mesh``
    the params are born in the trainer's shards (`ais_jax.training.startup`)."""
    from ais_jax.config.checks import check_diffusion
    from ais_jax.models.llada import checkpoint as llada_ckpt
    from ais_jax.models.llada import model as llada
    from ais_jax.tasks import CharTokenizer

    check_diffusion(cfg)
    param_dtype = st.DTYPES[cfg.model.param_dtype]
    mc = cfg.model
    if mc.source == "scratch":
        if cfg.task.prompt_style != "compact":
            raise UsageError("a scratch model uses the character tokenizer; set "
                             "task.prompt_style=compact")
        if mc.hidden_size % mc.num_heads or (mc.hidden_size // mc.num_heads) % 2:
            raise UsageError(f"a LLaDA model's heads are model.hidden_size / model.num_heads "
                             f"wide and that must be an even integer; got {mc.hidden_size} / "
                             f"{mc.num_heads}")
        tok = CharTokenizer()
        lcfg = scratch_llada_config(cfg)
        params = (llada.init_params(jax.random.fold_in(jax.random.key(cfg.seed), 1), lcfg,
                                    param_dtype) if mesh is None else
                  startup.init_on_mesh(llada.init_params, cfg.seed, 1, lcfg, param_dtype, mesh))
        return params, lcfg, PromptCodec(tok, "compact", task, tok.pad_id, (tok.eos_id,))
    if mc.source == "smollm2":
        raise UsageError("model.kind=llada needs model.source=scratch or a LLaDA checkpoint "
                         "directory; smollm2 is autoregressive (set model.kind=auto)")
    try:
        params, lcfg = llada_ckpt.load(mc.source, param_dtype, shardings=None if mesh is None
                                       else startup.load_shardings(llada.init_params,
                                                                   param_dtype, mesh))
    except (OSError, ValueError) as e:
        raise UsageError(f"model.source {mc.source}: {e}; point it at a LLaDA checkpoint "
                         "directory (config.json + model.safetensors)") from None
    if weight_files.isfile(storage.join(mc.source, "char_tokenizer.json")):  # a bucket too
        tok = CharTokenizer.load(mc.source)  # a LLaDA policy exported by a scratch run
        return params, lcfg, PromptCodec(tok, cfg.task.prompt_style, task, tok.pad_id,
                                         (tok.eos_id,))
    from ais_jax.models.pretrained import load_tokenizer

    tok = load_tokenizer(mc.source)
    eos = lcfg.eos_token_id if lcfg.eos_token_id is not None else tok.eos_token_id
    if eos is None:
        raise UsageError(f"model.source {mc.source}: neither config.json nor the tokenizer "
                         "names an EOS id; add eos_token_id to config.json")
    pad = lcfg.pad_token_id if lcfg.pad_token_id is not None else tok.pad_token_id
    return params, lcfg, PromptCodec(tok, cfg.task.prompt_style, task,
                                     int(eos if pad is None else pad), (int(eos),))


def with_attention(model_cfg: Any, cfg: Config) -> Any:
    """``model_cfg`` (a `ModelConfig` or LLaDA config) with the run's ``model.attention`` and
    ``model.attention_chunk`` (`ais_jax.models.attention`)."""
    return dataclasses.replace(model_cfg, attention=cfg.model.attention,
                               attention_chunk=cfg.model.attention_chunk)


def build_model(cfg: Config, task: Any,
                mesh: Mesh | None = None) -> tuple[Any, ModelConfig, PromptCodec]:
    """``(params, model_cfg, codec)``: a scratch model, an HF directory, a GGUF file, SmolLM2
    or (``model.kind`` resolving to ``llada``) a LLaDA policy (`build_llada`).  With ``mesh``
    the params are born in the trainer's shards (`ais_jax.training.startup`): a jitted init
    with ``out_shardings``, or each process reading only its shards' slices of the files.
    The model config carries the run's attention settings (`with_attention`)."""
    params, model_cfg, codec = _build_model(cfg, task, mesh)
    return params, with_attention(model_cfg, cfg), codec


def _build_model(cfg: Config, task: Any,
                 mesh: Mesh | None = None) -> tuple[Any, ModelConfig, PromptCodec]:
    from ais_jax.tasks import CharTokenizer

    if model_kind(cfg) == "llada":
        return build_llada(cfg, task, mesh)
    param_dtype = st.DTYPES[cfg.model.param_dtype]
    style = cfg.task.prompt_style
    if cfg.model.source == "scratch":
        if style != "compact":
            raise UsageError("a scratch model uses the character tokenizer; set "
                             "task.prompt_style=compact")
        tok = CharTokenizer()
        mc = cfg.model
        model_cfg = scratch_model_config(
            tok, hidden_size=mc.hidden_size, intermediate_size=mc.intermediate_size,
            num_layers=mc.num_layers, num_heads=mc.num_heads, num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim)
        params = (init_params(jax.random.fold_in(jax.random.key(cfg.seed), 1), model_cfg,
                              param_dtype) if mesh is None else
                  startup.init_on_mesh(init_params, cfg.seed, 1, model_cfg, param_dtype, mesh))
        return params, model_cfg, PromptCodec(tok, style, task, tok.pad_id, (tok.eos_id,))
    from ais_jax.models.pretrained import load_pretrained, load_tokenizer, smollm2_gguf_path

    source = smollm2_gguf_path() if cfg.model.source == "smollm2" else cfg.model.source
    params, model_cfg = load_pretrained(
        source, dtype=param_dtype,
        shardings=None if mesh is None else startup.load_shardings(init_params, param_dtype, mesh))
    if weight_files.isfile(storage.join(str(source), "char_tokenizer.json")):  # gs:// too
        tok = CharTokenizer.load(str(source))  # a policy exported by a scratch run of this CLI
        return params, model_cfg, PromptCodec(tok, style, task, tok.pad_id, (tok.eos_id,))
    tok = load_tokenizer(source)
    eos = tuple(model_cfg.eos_token_ids) or ((tok.eos_token_id,) if tok.eos_token_id
                                              is not None else ())
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    return params, model_cfg, PromptCodec(tok, style, task, int(pad), tuple(int(e) for e in eos))


def build_optimizers(cfg: Config) -> tuple[optax.GradientTransformation,
                                           optax.GradientTransformation | None]:
    """``(GRPO optimizer, warm-start optimizer or None)`` from the train and sft sections."""
    t = cfg.train
    lr: float | Callable[[Any], Any] = t.learning_rate
    if t.warmup_steps:
        lr = optim.rl_warmup(t.learning_rate, t.warmup_steps, t.epochs * t.minibatches)
    optimizer = optim.make_optimizer(lr, clip_norm=t.clip_norm or None,
                                    weight_decay=t.weight_decay)
    sft_opt = None
    if cfg.sft.steps > 0 and cfg.model.source == "scratch":
        s = cfg.sft
        sft_lr = optax.warmup_cosine_decay_schedule(
            0.0, s.learning_rate, min(s.warmup_steps, s.steps - 1), s.steps, 0.1 * s.learning_rate)
        sft_opt = optim.make_optimizer(sft_lr, clip_norm=1.0)
    return optimizer, sft_opt


def build_run(cfg: Config, reward_fns: Any = None, dataset: Any = None) -> Run:
    """Build every piece of the run ``cfg`` describes (programs compile on first call).

    Args:
      cfg: the config.
      reward_fns: extra reward callables (`ais_jax.tasks.user_rewards.build_rewards`).
      dataset: training rows replacing ``task.train_file`` (`build_task`).
    """
    from ais_jax.tasks.user_rewards import build_rewards
    from ais_jax.training import lora_policy as lp
    task = build_task(cfg, dataset)
    rewards = build_rewards(cfg.reward, reward_fns)
    mesh = build_mesh(cfg)
    optimizer, sft_opt = build_optimizers(cfg)
    lora_cfg, llada_run = lp.lora_config(cfg), model_kind(cfg) == "llada"
    model_src_cfg = cfg
    if lora_cfg is not None and cfg.model.source != "scratch":
        # the frozen base is kept in the compute dtype: load it so (no float32 copy)
        model_src_cfg = dataclasses.replace(cfg, model=dataclasses.replace(
            cfg.model, param_dtype=cfg.model.compute_dtype))
    params, model_cfg, codec = build_model(model_src_cfg, task, mesh)  # in their shards
    if cfg.model.param_dtype == "bfloat16" and lora_cfg is None:
        optim.check_bf16_master(params, cfg.train.learning_rate)
    eval_problems = task.generate(seed=cfg.seed + 7919, n=cfg.task.eval_size, split="eval",
                                  **dict(cfg.task.difficulty))
    first = problems_at(cfg, task, 0, 0, cfg.rollout.prompts_per_step)
    pool = getattr(task, "pool", None)
    if pool is not None:  # a dataset: every row, so none fails mid-run
        checked = pool()
    else:
        checked = eval_problems + first
        if codec.style == "compact":  # characters a generated task may hold now and then
            checked = checked + task.generate(seed=(cfg.seed + 104_729) % 2**31,
                                              n=PROBE_PROBLEMS, split="train",
                                              **dict(cfg.task.difficulty))
    check_problems(cfg, codec, model_cfg, checked, answers=sft_opt is not None)
    longest = max(len(codec.encode_prompt(p)) for p in eval_problems + first)
    # the bucket (P, prompt + slack) never passes the positions the prompts fit in
    bucket = min(bucket_length(longest + 4, pow2_max=0),
                 model_cfg.max_position_embeddings - cfg.rollout.max_new_tokens)
    ids = st.TokenIds(codec.eos_ids, codec.pad_id)
    pol = None  # LoRA on: the frozen base (lora_policy.LoraPolicy); the state holds adapters
    if lora_cfg is not None:
        adapters = lp.initial_adapters(cfg, model_cfg, lora_cfg)  # UsageError: rank, shapes
        pol = lp.make_policy(cfg, params, mesh)
        pol.start = params if sft_opt is not None else None  # the warm start's full params
        params = adapters
    abstract = startup.abstract_state(params, optimizer)  # shapes: the programs' layouts
    if llada_run:
        from ais_jax.training.llada.lora_steps import build_lora_step_fns
        from ais_jax.training.llada.steps import build_step_fns as build_llada_fns

        fns = (build_llada_fns(abstract, mesh, optimizer, sft_opt, model_cfg, cfg, ids.eos_ids,
                               ids.pad_id) if pol is None else
               build_lora_step_fns(abstract, mesh, optimizer, sft_opt, model_cfg, cfg,
                                   ids.eos_ids, ids.pad_id, pol))
    else:
        fns = st.build_step_fns(abstract, mesh, optimizer, sft_opt, model_cfg, cfg, ids, pol)
    if cfg.mesh.rollout_devices:  # the sampler on devices of its own
        fns = split_rollout.split_fns(fns, abstract.params, mesh, model_cfg, cfg, ids)
    # the optimizer state is created in its shards; the params are donated into the state
    state = startup.state_on_mesh(params, optimizer, fns.state_shardings)
    del params
    return Run(cfg, task, mesh, model_cfg, codec, optimizer, sft_opt, fns, state, eval_problems,
               bucket, rewards, pol)
