"""One GRPO step: ais_jax (BF16 / FP8 rollouts) against TRL's GRPOTrainer, same model and workload.

Both run side by side in one process on the same random ~3M-parameter Qwen3
(`benchmarks/_hf_tiny.py`: hidden 128, 4 layers, 4 heads / 2 KV heads, head
dim 32, MLP 384, untied head over an 8192-token word-level tokenizer with a
chat template), built offline and saved as one Hugging Face directory that
ais_jax loads with ``model.source=<dir> task.prompt_style=chat`` and TRL with
``AutoModelForCausalLM`` / ``AutoTokenizer``.

Workload (both sides): the ``arithmetic`` task of `ais_jax.tasks`, the same
problems in the same order (chat prompts from ``task.chat_messages``), 8
prompts x 8 samples, up to 64 new tokens, temperature 1, no top-k / top-p,
one optimizer update per step (1 epoch, 1 minibatch), no KL (beta 0), reward
= ``task.verify`` of the decoded completion, AdamW lr 1e-6, grad-norm clip 1,
no rematerialization / gradient checkpointing on either side.

Arms, run alternately (the order rotates every round); every number is a
median over ``rounds x steps`` timed steps:

* ``ais_jax BF16``: ``rollout.precision=bf16 ais.mode=none`` (BF16 rollout,
  BF16 trainer compute, float32 master weights).
* ``ais_jax FP8``: ``rollout.precision=fp8 ais.mode=ais`` (FP8 E4M3 rollout
  weights; on CPU the float8 matmuls are software-emulated, so this arm is
  *not* representative of FP8 hardware).
* ``ais_jax BF16, fp32 trainer`` (``--ais-fp32-compute``): the BF16 arm with
  ``model.compute_dtype=float32``.
* ``TRL fp32``: ``GRPOTrainer`` in float32, HF ``generate`` (no vLLM),
  ``loss_type=dapo`` (token mean, as ais_jax's ``token_mean``).
* ``TRL bf16`` (``--trl-bf16``): the same with ``bf16=True``: float32 weights,
  accelerate wraps ``model.forward`` in a CPU bf16 autocast, so generation and
  the loss forward / backward both run autocast; slow on CPU.

Modes:

* ``eos``: generation stops at EOS (a row is done at its EOS; a batch stops
  when all rows are).  A random 8k-vocabulary model almost never samples EOS,
  so the model is tilted to emit it with probability ~``--eos-prob`` per
  token (default 0.05: mean completion ~20 tokens, the longest of 64 rows
  usually still 64).
* ``fixed``: every completion is exactly 64 tokens, all in the loss.  ais_jax
  has no config switch for it: the benchmark rebuilds the run's step
  programs with no EOS id (`ais_jax.training.steps.build_step_fns` with
  ``TokenIds(eos_ids=())``; the sampler's ``eos_id=None``: EOS is an ordinary
  token).  TRL: ``generation_kwargs={"min_new_tokens": 64}`` (EOS logit
  masked until 64 tokens).  Same shapes, same 4096 completion tokens per step.

ais_jax timing: ``rl_step(state, problems, key)`` of `ais_jax.training.rl.make_rl_step`,
with ``run.fns.rollout`` / ``run.fns.update`` wrapped in
``jax.block_until_ready`` timers; host = step - rollout - update (prompt
encoding, transfers, decoding, verification).  The first step (compilation)
is timed apart and the prompt bucket is fixed up front (no recompilation;
the compile counts are printed).  TRL timing: a callback,
``on_step_begin`` -> ``on_step_end`` (generation, rewards, loss, backward,
optimizer step); the trainer is built once, ``--warmup`` untimed steps run
first, then one ``trainer.train()`` of ``--steps`` steps per round (each
starts from the first timed problem again).  ``_generate_single_turn`` is
timed for TRL's breakdown (generate / rest).

    python benchmarks/grpo_step.py [--steps 2 --rounds 2 --modes eos,fixed]
        [--trl-bf16] [--ais-fp32-compute]

Needs the ``bench`` extra (``pip install -e .[bench]``: trl, datasets, torch
CPU).  Works offline.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _hf_tiny

PROMPTS, GROUP, NEW_TOKENS, LR = 8, 8, 64, 1e-6


# ----------------------------------------------------------------------------- helpers


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


@dataclasses.dataclass
class StepRecord:
    seconds: float
    tokens: float  # completion tokens produced (up to and including EOS), whole batch
    rollout: float = float("nan")
    update: float = float("nan")

    @property
    def host(self) -> float:
        return self.seconds - self.rollout - self.update


# ----------------------------------------------------------------------------- ais_jax


class AisArm:
    """One ais_jax configuration: built and compiled once, then stepped round after round."""

    def __init__(self, name: str, model_dir: str, out_dir: str, precision: str, ais_mode: str,
                 compute_dtype: str, fixed: bool, seed: int) -> None:
        self.name = name
        self.model_dir, self.out_dir = model_dir, out_dir
        self.precision, self.ais_mode, self.compute_dtype = precision, ais_mode, compute_dtype
        self.fixed, self.seed = fixed, seed
        self.records: list[StepRecord] = []
        self.compile_s = float("nan")

    def setup(self, first_step: int, longest_step: int) -> None:
        import jax

        from ais_jax.config.load import load_config
        from ais_jax.training import steps as st
        from ais_jax.training.build import build_run
        from ais_jax.training.rl import grow_prompt_bucket, make_rl_step

        overrides = [
            f"seed={self.seed}", f"out_dir={self.out_dir}",
            f"model.source={self.model_dir}", "model.param_dtype=float32",
            f"model.compute_dtype={self.compute_dtype}",
            "task.name=arithmetic", "task.prompt_style=chat", "task.eval_size=8",
            f"rollout.precision={self.precision}", "rollout.temperature=1.0", "rollout.top_k=0",
            "rollout.top_p=1.0", f"rollout.max_new_tokens={NEW_TOKENS}",
            f"rollout.prompts_per_step={PROMPTS}", f"rollout.group_size={GROUP}",
            f"ais.mode={self.ais_mode}",
            f"train.learning_rate={LR}", "train.warmup_steps=0", "train.clip_norm=1.0",
            "train.weight_decay=0.0", "train.epochs=1", "train.minibatches=1",
            "train.micro_batch_size=0", "train.beta_kl=0.0", "train.remat=none",
            "train.loss_aggregation=token_mean", "train.clip_eps=0.2",
            "sft.steps=0", "mesh.data=1", "mesh.fsdp=1", "mesh.tensor=1",
            "checkpoint.every=0", "log.tensorboard=false", "log.progress=false",
        ]
        cfg = load_config(None, overrides)
        run = build_run(cfg)
        if self.fixed:  # no EOS id: every row decodes the full budget (sampler eos_id=None)
            ids = st.TokenIds((), run.codec.pad_id)
            run.fns = st.build_step_fns(run.state, run.mesh, run.optimizer, run.sft_optimizer,
                                        run.model_cfg, cfg, ids)
            run.codec = dataclasses.replace(run.codec, eos_ids=())
        # One prompt bucket for every step we will time: no recompilation mid-benchmark.
        longest = max(len(run.codec.encode_prompt(p))
                      for s in range(longest_step) for p in run.train_problems(0, s, PROMPTS))
        grow_prompt_bucket(run, longest)
        self._compiled = (run.fns.rollout, run.fns.update)
        self._t = {"rollout": 0.0, "update": 0.0}

        def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*a: Any) -> Any:
                t0 = time.perf_counter()
                out = jax.block_until_ready(fn(*a))
                self._t[name] += time.perf_counter() - t0
                return out
            return wrapper

        run.fns = run.fns._replace(rollout=timed("rollout", run.fns.rollout),
                                   update=timed("update", run.fns.update))
        self.run, self.cfg = run, cfg
        self.rl_step = make_rl_step(run)
        self.state = run.state
        self.root = jax.random.key(self.seed)
        t0 = time.perf_counter()
        self._step(first_step)
        self.compile_s = time.perf_counter() - t0
        self.bucket = run.prompt_bucket

    def _step(self, s: int) -> StepRecord:
        import jax

        problems = self.run.train_problems(0, s, PROMPTS)
        self._t.update(rollout=0.0, update=0.0)
        t0 = time.perf_counter()
        self.state, rec = self.rl_step(self.state, problems, jax.random.fold_in(self.root, s))
        dt = time.perf_counter() - t0
        return StepRecord(dt, rec["response_len"] * PROMPTS * GROUP, self._t["rollout"],
                          self._t["update"])

    def run_round(self, step_ids: list[int]) -> None:
        self.records += [self._step(s) for s in step_ids]

    def compiles(self) -> str:
        ro, up = self._compiled
        return f"rollout {ro._cache_size()}, update {up._cache_size()}"


# ----------------------------------------------------------------------------- TRL


class TrlArm:
    """TRL's GRPOTrainer: built and warmed up once, then one ``trainer.train()`` per round.

    Each ``train()`` call starts from the first row of the (unshuffled) timed
    dataset, so every round steps through the same problems as ais_jax.
    ``trainer._generate_single_turn`` (HF ``generate`` + EOS masking) is
    wrapped with a timer for the breakdown.
    """

    def __init__(self, name: str, model_dir: str, out_dir: str, warm_problems: list[Any],
                 timed_problems: list[Any], bf16: bool, fixed: bool, warmup: int,
                 seed: int) -> None:
        self.name, self.model_dir, self.out_dir = name, model_dir, out_dir
        self.warm_problems, self.timed_problems = warm_problems, timed_problems
        self.bf16, self.fixed, self.warmup, self.seed = bf16, fixed, warmup, seed
        self.records: list[StepRecord] = []
        self.compile_s = float("nan")

    def _dataset(self, problems: list[Any]) -> Any:
        from datasets import Dataset

        return Dataset.from_list([{"prompt": self.task.chat_messages(p), "pid": i}
                                  for i, p in enumerate(problems)])

    def setup(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        from ais_jax.tasks import get_task

        self.task = task = get_task("arithmetic")
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        self._problems = self.warm_problems
        self._tokens: list[int] = []
        self._times: list[float] = []
        self._gen: list[float] = []
        arm = self

        def arithmetic_reward(prompts: list, completions: list, completion_ids: list,
                              pid: list, **_: Any) -> list[float]:
            arm._tokens.append(sum(len(c) for c in completion_ids))
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return [float(task.verify(t, arm._problems[i]))
                    for t, i in zip(texts, pid, strict=True)]

        class StepTimer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                self.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                arm._times.append(time.perf_counter() - self.t0)

        args = GRPOConfig(
            output_dir=self.out_dir, seed=self.seed, use_cpu=True, bf16=self.bf16, fp16=False,
            per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
            gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
            max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0,
            generation_kwargs={"min_new_tokens": NEW_TOKENS} if self.fixed else None,
            beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group", learning_rate=LR,
            lr_scheduler_type="constant", max_grad_norm=1.0, weight_decay=0.0, warmup_steps=0,
            max_steps=max(1, self.warmup), gradient_checkpointing=False, shuffle_dataset=False,
            use_vllm=False, logging_steps=10**6, save_strategy="no", report_to="none",
            disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
        )
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32,
                                                     local_files_only=True)
        self.trainer = GRPOTrainer(model=model, reward_funcs=arithmetic_reward, args=args,
                                   train_dataset=self._dataset(self.warm_problems),
                                   processing_class=tokenizer, callbacks=[StepTimer()])
        generate = self.trainer._generate_single_turn

        def timed_generate(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = generate(*a, **kw)
            arm._gen.append(time.perf_counter() - t0)
            return out

        self.trainer._generate_single_turn = timed_generate
        if self.warmup:
            self._train()
            self.compile_s = self._times[0]
        self._problems = self.timed_problems
        self.trainer.train_dataset = self._dataset(self.timed_problems)

    def _train(self) -> None:
        self._tokens, self._times, self._gen = [], [], []
        with contextlib.redirect_stdout(io.StringIO()):
            self.trainer.train()
        n = self.trainer.args.max_steps
        if not len(self._times) == len(self._tokens) == len(self._gen) == n:
            raise RuntimeError(f"{self.name}: {len(self._times)} timed steps, "
                               f"{len(self._tokens)} reward calls, {len(self._gen)} generate "
                               f"calls; expected {n} each")

    def run_round(self, n_steps: int) -> None:
        self.trainer.args.max_steps = n_steps
        self._train()
        self.records += [StepRecord(t, k, rollout=g, update=float("nan"))
                         for t, k, g in zip(self._times, self._tokens, self._gen, strict=True)]


# ----------------------------------------------------------------------------- report


def _table(arms: list[Any]) -> str:
    trl = {a.name: _median([r.seconds for r in a.records]) for a in arms
           if isinstance(a, TrlArm)}
    cols = "".join(f"{n.replace('TRL ', 'TRL_') + '/ais':>15}" for n in trl)
    head = f"{'arm':<26}{'s/step':>8}{'tok/step':>10}{'tok/s':>8}{cols}{'first step s':>14}"
    lines = [head, "-" * len(head)]
    for a in arms:
        s = _median([r.seconds for r in a.records])
        tok = _median([r.tokens for r in a.records])
        tps = _median([r.tokens / r.seconds for r in a.records])
        ratios = "".join(f"{t / s:>15.2f}" if isinstance(a, AisArm) else f"{'':>15}"
                         for t in trl.values())
        lines.append(f"{a.name:<26}{s:>8.3f}{tok:>10.0f}{tps:>8.0f}{ratios}{a.compile_s:>14.2f}")
    lines += ["", "breakdown (median s/step; shares of their sum):"]
    for a in arms:
        if isinstance(a, AisArm):
            ro = _median([r.rollout for r in a.records])
            ho = _median([r.host for r in a.records])
            up = _median([r.update for r in a.records])
            tot = ro + ho + up
            lines.append(f"  {a.name:<24} rollout {ro:.3f} | host {ho:.3f} | update {up:.3f}"
                         f"   ({ro / tot:.0%} / {ho / tot:.0%} / {up / tot:.0%}; prompt bucket "
                         f"{a.bucket}; compiles: {a.compiles()})")
        else:
            ge = _median([r.rollout for r in a.records])
            rest = _median([r.seconds - r.rollout for r in a.records])
            tot = ge + rest
            lines.append(f"  {a.name:<24} generate {ge:.3f} | rest {rest:.3f}   "
                         f"({ge / tot:.0%} / {rest / tot:.0%}; rest = prompt tokenization, "
                         "rewards, loss forward/backward, optimizer)")
    return "\n".join(lines)


def _versions() -> str:
    import datasets
    import jax
    import torch
    import transformers
    import trl

    return (f"python {platform.python_version()}, jax {jax.__version__} "
            f"({jax.default_backend()}, {len(jax.devices())} device), torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), transformers {transformers.__version__}, "
            f"trl {trl.__version__}, datasets {datasets.__version__}; "
            f"{os.cpu_count()} CPUs ({platform.machine()})")


MODE_TEXT = {
    "eos": "EOS mode: generation stops at EOS (ais_jax: EOS ends a row and the decode loop "
           "exits when every row is done; TRL / HF generate: the same). Tokens are counted up "
           "to and including EOS.",
    "fixed": "fixed-length mode: every completion is exactly {n} tokens, all in the loss. "
             "ais_jax has no config override for it: the benchmark rebuilds the run's step "
             "programs with no EOS id (steps.build_step_fns with TokenIds(eos_ids=()), i.e. "
             "sampler eos_id=None: EOS is an ordinary token). TRL: generation_kwargs "
             "min_new_tokens={n} (EOS logit masked until {n} tokens). Same shapes and work.",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2, help="timed steps per arm per round")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed TRL steps before the first round (ais_jax: the compile step)")
    ap.add_argument("--modes", default="eos,fixed", help="comma list of eos, fixed")
    ap.add_argument("--trl-bf16", action="store_true",
                    help="add the TRL bf16 autocast arm (slow on CPU)")
    ap.add_argument("--ais-fp32-compute", action="store_true",
                    help="add an ais_jax arm with BF16 rollout and float32 trainer compute")
    ap.add_argument("--eos-prob", type=float, default=0.05,
                    help="per-token EOS probability the random model is tilted to (0: no tilt)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODE_TEXT:
            ap.error(f"unknown mode {m!r}; use eos and/or fixed")
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        ap.error("--steps and --rounds must be >= 1, --warmup >= 0")

    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.manual_seed(args.seed)
    from ais_jax.config.load import load_config
    from ais_jax.tasks import get_task
    from ais_jax.training.build import problems_at

    task = get_task("arithmetic")
    tmp = tempfile.mkdtemp(prefix="grpo_step_")
    model_dir = os.path.join(tmp, "model")
    sample = task.generate(seed=12345, n=64)
    with contextlib.redirect_stderr(io.StringIO()):
        info = _hf_tiny.build_dir(model_dir, [task.chat_messages(p) for p in sample],
                                  vocab_size=args.vocab, eos_prob=args.eos_prob, seed=args.seed)

    # ais_jax's problems of steps 0 .. warmup+steps-1 (seeded by (seed, step)): the warm-up /
    # compile steps use the first `warmup`, every round times the remaining `steps` on both sides.
    base_cfg = load_config(None, [f"seed={args.seed}", "model.source=scratch"])
    n_steps = max(1, args.warmup) + args.steps
    by_step = [problems_at(base_cfg, task, 0, s, PROMPTS) for s in range(n_steps)]
    timed_ids = list(range(n_steps - args.steps, n_steps))
    warm = [p for s in range(n_steps - args.steps) for p in by_step[s]]
    timed = [p for s in timed_ids for p in by_step[s]]

    print("GRPO step: ais_jax vs TRL GRPOTrainer (one process, alternating arms, medians)")
    print(f"versions: {_versions()}")
    print(f"model: random Qwen3, {info['params'] / 1e6:.2f}M params (hidden 128, 4 layers, 4 "
          f"heads / 2 kv, head_dim 32, MLP 384, untied head), word-level vocab {info['vocab']} "
          f"with chat template; EOS tilted to p~{args.eos_prob}/token")
    print(f"workload: arithmetic task (reward = task.verify), {PROMPTS} prompts x {GROUP} "
          f"samples, <= {NEW_TOKENS} new tokens, temperature 1, 1 epoch x 1 minibatch, beta 0, "
          f"AdamW lr {LR}, no remat / gradient checkpointing; {args.rounds} rounds x "
          f"{args.steps} timed steps per arm, {args.warmup} warm-up step(s)")
    print("ais_jax: BF16 = rollout.precision=bf16 ais.mode=none; FP8 = rollout.precision=fp8 "
          "ais.mode=ais, float8 E4M3 weights software-emulated on CPU (not representative of "
          "FP8 hardware); trainer compute bfloat16, float32 master weights")
    print("TRL: GRPOTrainer, HF generate (no vLLM), loss_type dapo (token mean, as ais_jax), "
          "fp32" + (" and bf16=True (accelerate's CPU bf16 autocast of model.forward: generation "
                    "and loss)"
                    if args.trl_bf16 else ""))
    print(f"load before: {_load()}")
    print(f"command: python {' '.join(sys.argv)}")
    print(flush=True)

    try:
        for mode in modes:
            _run_mode(mode, args, model_dir, tmp, warm, timed, timed_ids, n_steps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_mode(mode: str, args: argparse.Namespace, model_dir: str, tmp: str, warm: list[Any],
              timed: list[Any], timed_ids: list[int], n_steps: int) -> None:
    """Build, warm up and time every arm of one mode; print its tables."""
    import jax

    fixed = mode == "fixed"
    arms: list[Any] = [
        AisArm("ais_jax BF16", model_dir, os.path.join(tmp, f"ais_bf16_{mode}"), "bf16",
               "none", "bfloat16", fixed, args.seed),
        AisArm("ais_jax FP8 (emulated)", model_dir, os.path.join(tmp, f"ais_fp8_{mode}"),
               "fp8", "ais", "bfloat16", fixed, args.seed),
    ]
    if args.ais_fp32_compute:
        arms.append(AisArm("ais_jax BF16, fp32 trainer", model_dir,
                           os.path.join(tmp, f"ais_f32_{mode}"), "bf16", "none", "float32",
                           fixed, args.seed))
    arms.append(TrlArm("TRL fp32", model_dir, os.path.join(tmp, f"trl_fp32_{mode}"), warm,
                       timed, False, fixed, args.warmup, args.seed))
    if args.trl_bf16:
        arms.append(TrlArm("TRL bf16", model_dir, os.path.join(tmp, f"trl_bf16_{mode}"),
                           warm, timed, True, fixed, args.warmup, args.seed))
    for a in arms:
        if isinstance(a, AisArm):
            a.setup(first_step=0, longest_step=n_steps)
        else:
            a.setup()
    print(f"  [{mode}] built and warmed up, load {_load()}", flush=True)
    for r in range(args.rounds):
        for a in arms[r % len(arms):] + arms[:r % len(arms)]:
            a.run_round(timed_ids if isinstance(a, AisArm) else args.steps)
        print(f"  [{mode}] round {r + 1}/{args.rounds} done, load {_load()}", flush=True)
    print()
    print(f"== {MODE_TEXT[mode].format(n=NEW_TOKENS)}")
    print(f"   tok/step: completion tokens produced per step (of {PROMPTS * GROUP} x "
          f"{NEW_TOKENS}); TRL_x/ais = TRL_x s/step / ais_jax s/step (>1: ais_jax faster); "
          "first step s: ais_jax compile + first step, TRL first warm-up step")
    print(_table(arms))
    print(f"load after {mode}: {_load()}")
    print(flush=True)
    del arms
    jax.clear_caches()


if __name__ == "__main__":
    main()
