"""GRPO with FP8 rollouts and AIS: ``python -m ais_jax.train --config PATH [a.b=value ...]``.

The only module that does I/O: it reads the config, builds the model, the
task and the mesh, runs the optional supervised warm start, then the GRPO
loop (rollout -> rewards -> update), logs every step to
``out_dir/metrics.jsonl`` (and TensorBoard), checkpoints every
``checkpoint.every`` steps and resumes from the latest checkpoint in
``out_dir`` when rerun with the same command.  Bad input exits with status 2
and one line on stderr.

Multi-host (TPU pod, GPU cluster): every host runs the same command with
``--distributed`` (``jax.distributed.initialize()`` auto-detects the cluster),
or sets ``AIS_JAX_COORDINATOR=host:port``, ``AIS_JAX_NUM_PROCESSES`` and
``AIS_JAX_PROCESS_ID``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ais_jax.errors import UsageError


@dataclasses.dataclass
class RunResult:
    """What `run` returns (also written to ``out_dir/summary.json``)."""

    metrics: list[dict[str, Any]]
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None
    compiles: dict[str, int]
    resumed_from: int | None


def _init_distributed(flag: bool) -> None:
    import jax

    coord = os.environ.get("AIS_JAX_COORDINATOR")
    if coord:
        if os.environ.get("JAX_PLATFORMS", "").startswith("cpu") or not flag:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=coord,
            num_processes=int(os.environ["AIS_JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["AIS_JAX_PROCESS_ID"]),
        )
    elif flag:
        jax.distributed.initialize()


# ----------------------------------------------------------------- text <-> ids


@dataclasses.dataclass
class Codec:
    """Prompt encoding and completion decoding for one tokenizer / prompt style."""

    tokenizer: Any
    style: str  # compact | chat
    task: Any
    pad_id: int
    eos_ids: tuple[int, ...]

    def encode_prompt(self, problem: Any) -> list[int]:
        if self.style == "compact":
            return self.tokenizer.encode(self.task.compact_prompt(problem), add_bos=True)
        text = self.tokenizer.apply_chat_template(self.task.chat_messages(problem),
                                                  tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: np.ndarray, mask: np.ndarray) -> str:
        keep = [int(t) for t, m in zip(ids, mask, strict=True) if m > 0 and int(t) not in
                self.eos_ids]
        if self.style == "compact":
            return self.tokenizer.decode(keep)
        return self.tokenizer.decode(keep, skip_special_tokens=True)

    def encode_answer(self, problem: Any, answer: str | None = None) -> list[int]:
        """Target ids of the supervised warm start (compact style): answer + EOS.

        ``answer`` replaces ``problem.answer`` (a flawed demonstration).
        """
        return self.tokenizer.encode(problem.answer if answer is None else answer, add_eos=True)


def sft_batch(problems: Sequence[Any], flawed: Sequence[bool], codec: Codec, length: int,
              max_answer: int) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forcing batch of the supervised warm start.

    Args:
      problems: ``B`` problems.
      flawed: ``[B]``; True shows the task's typical mistake (``task.mistake``)
        instead of the correct answer (``sft.mistake_rate``).
      codec: prompt / answer encoding.
      length: sequence length ``T`` (prompt bucket + new tokens).
      max_answer: answer + EOS tokens kept (``rollout.max_new_tokens``).

    Returns:
      ``(tokens [B, T] int32, loss_mask [B, T] float32)``: prompt then answer
      + EOS, right-padded; the mask is 1 on the answer and EOS tokens.
    """
    toks = np.full((len(problems), length), codec.pad_id, np.int32)
    lm = np.zeros((len(problems), length), np.float32)
    for j, (p, bad) in enumerate(zip(problems, flawed, strict=True)):
        pr = codec.encode_prompt(p)
        ans = codec.encode_answer(p, codec.task.mistake(p) if bad else None)[:max_answer]
        if len(pr) + len(ans) > length:
            raise UsageError(f"a warm-start sequence has {len(pr) + len(ans)} tokens, more than "
                             f"{length}")
        toks[j, :len(pr) + len(ans)] = pr + ans
        lm[j, len(pr):len(pr) + len(ans)] = 1.0
    return toks, lm


def _left_pad(seqs: list[list[int]], length: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    toks = np.full((len(seqs), length), pad, np.int32)
    mask = np.zeros((len(seqs), length), np.bool_)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise UsageError(f"a prompt has {len(s)} tokens, more than the prompt bucket {length}")
        toks[i, length - len(s):] = s
        mask[i, length - len(s):] = True
    return toks, mask


def _round_up(n: int, m: int) -> int:
    return max(m, -(-n // m) * m)


# ------------------------------------------------------------------ the run


def run(cfg: Any) -> RunResult:
    """Run (or resume) the training job described by ``cfg`` (an `ais_jax.config.Config`)."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.experimental import multihost_utils

    from ais_jax import checkpoint as ckpt
    from ais_jax import grpo, sampler
    from ais_jax import sharding as shd
    from ais_jax import trainer as tr
    from ais_jax.model import ModelConfig, init_params
    from ais_jax.tasks import CharTokenizer, RewardConfig, batch_rewards, pass_at_k

    out_dir = cfg.out_dir
    is_main = jax.process_index() == 0
    os.makedirs(out_dir, exist_ok=True)
    task = _make_task(cfg)
    difficulty = dict(cfg.task.difficulty)

    # -- mesh
    n_dev = len(jax.devices())
    m = cfg.mesh
    if m.data * m.fsdp * m.tensor > n_dev:
        raise UsageError(
            f"mesh data={m.data} x fsdp={m.fsdp} x tensor={m.tensor} needs "
            f"{m.data * m.fsdp * m.tensor} devices but only {n_dev} are visible; lower the mesh "
            "sizes (on CPU, JAX_NUM_CPU_DEVICES=N simulates N devices)")
    if cfg.sft.mistake_rate > 0 and getattr(task, "mistake", None) is None:
        raise UsageError(f"sft.mistake_rate={cfg.sft.mistake_rate} needs a task with a typical "
                         f"mistake, and task {cfg.task.name!r} defines none; set "
                         "sft.mistake_rate=0")
    mesh = shd.make_mesh(m.data, m.fsdp, m.tensor)
    div = shd.batch_divisor(mesh)
    R = cfg.rollout
    if R.prompts_per_step % div:
        raise UsageError(f"rollout.prompts_per_step={R.prompts_per_step} must be a multiple of "
                         f"mesh.data * mesh.fsdp = {div}")

    # -- model and tokenizer
    param_dtype = tr.DTYPES[cfg.model.param_dtype]
    key = jax.random.key(cfg.seed)
    if cfg.model.source == "scratch":
        tok = CharTokenizer()
        mc = cfg.model
        model_cfg = ModelConfig(
            vocab_size=tok.vocab_size, hidden_size=mc.hidden_size,
            intermediate_size=mc.intermediate_size, num_layers=mc.num_layers,
            num_heads=mc.num_heads, num_kv_heads=mc.num_kv_heads, head_dim=mc.head_dim,
            max_position_embeddings=4096, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id,
            eos_token_ids=(tok.eos_id,), pad_token_id=tok.pad_id, tie_embeddings=True)
        params = init_params(jax.random.fold_in(key, 1), model_cfg, param_dtype)
        codec = Codec(tok, cfg.task.prompt_style, task, tok.pad_id, (tok.eos_id,))
        if cfg.task.prompt_style != "compact":
            raise UsageError("a scratch model uses the character tokenizer; set "
                             "task.prompt_style=compact")
    else:
        from ais_jax.pretrained import load_pretrained, load_tokenizer, smollm2_gguf_path

        source = smollm2_gguf_path() if cfg.model.source == "smollm2" else cfg.model.source
        params, model_cfg = load_pretrained(source, dtype=param_dtype)
        char_vocab = os.path.join(str(source), "char_tokenizer.json")
        if os.path.isfile(char_vocab):  # a policy exported by a scratch run of this CLI
            tok = CharTokenizer.load(str(source))
            codec = Codec(tok, cfg.task.prompt_style, task, tok.pad_id, (tok.eos_id,))
        else:
            tok = load_tokenizer(source)
            eos = tuple(model_cfg.eos_token_ids) or ((tok.eos_token_id,) if tok.eos_token_id
                                                      is not None else ())
            pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
            codec = Codec(tok, cfg.task.prompt_style, task, int(pad),
                          tuple(int(e) for e in eos))

    loss_cfg = grpo.LossConfig(
        clip_eps=cfg.train.clip_eps, clip_eps_high=cfg.train.clip_eps_high or None,
        beta_kl=cfg.train.beta_kl, aggregation=cfg.train.loss_aggregation)
    s = tr.StepSettings(
        model=model_cfg, group_size=R.group_size, max_new_tokens=R.max_new_tokens,
        precision=R.precision, temperature=R.temperature, top_k=R.top_k, top_p=R.top_p,
        eos_ids=codec.eos_ids, pad_id=codec.pad_id, fp8_format=R.fp8_format,
        act_scaling=R.act_scaling, weight_scaling=R.weight_scaling, lm_head_fp8=R.lm_head_fp8,
        kv_cache_fp8=R.kv_cache_fp8, compute_dtype=cfg.model.compute_dtype,
        ais_mode=cfg.ais.mode, ais_cap=cfg.ais.C, ais_delta=cfg.ais.delta,
        ais_gamma=cfg.ais.gamma, ais_beta_var=cfg.ais.beta_var, ais_eps=cfg.ais.eps,
        ais_terms=(cfg.ais.use_ess, cfg.ais.use_mis, cfg.ais.use_var),
        loss=loss_cfg, epochs=cfg.train.epochs, minibatches=cfg.train.minibatches)

    T = cfg.train
    lr: Any = T.learning_rate
    if T.warmup_steps:
        lr = optax.linear_schedule(0.0, T.learning_rate, T.warmup_steps)
    optimizer = grpo.make_optimizer(lr, clip_norm=T.clip_norm or None,
                                    weight_decay=T.weight_decay)
    sft_opt = None
    if cfg.sft.steps > 0 and cfg.model.source == "scratch":
        sft_lr = optax.warmup_cosine_decay_schedule(
            0.0, cfg.sft.learning_rate, min(cfg.sft.warmup_steps, cfg.sft.steps - 1), cfg.sft.steps,
            0.1 * cfg.sft.learning_rate)
        sft_opt = grpo.make_optimizer(sft_lr, clip_norm=1.0)

    # -- data
    eval_problems = task.generate(seed=cfg.seed + 7919, n=cfg.task.eval_size, split="eval",
                                  **difficulty)

    def train_problems(stream: int, step: int, n: int) -> list[Any]:
        return task.generate(seed=(cfg.seed * 1_000_003 + stream * 7_777_777 + step) % 2**31,
                             n=n, split="train", **difficulty)

    first = train_problems(0, 0, R.prompts_per_step)
    longest = max(len(codec.encode_prompt(p)) for p in eval_problems + first)
    P = _round_up(longest + 4, 16)

    # -- state, shardings, compiled functions
    state = tr.TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32),
                          jnp.zeros((), jnp.int32))
    fns = tr.build_step_fns(state, mesh, optimizer, sft_opt, s)
    state = _place(state, fns.state_shardings)
    rep = shd.replicated(mesh)

    def to_global(x: np.ndarray, sharding: Any) -> jax.Array:
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    def to_host(x: jax.Array) -> np.ndarray:
        if jax.process_count() > 1:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    eval_sample = jax.jit(
        lambda p, pt, pm, k: sampler.sample(
            tr.cast_params(p, jnp.bfloat16), pt, pm, k, model_cfg,
            max_new_tokens=R.max_new_tokens, temperature=0.0, eos_id=codec.eos_ids or None),
        in_shardings=(fns.state_shardings.params, fns.batch_sharding, fns.batch_sharding, rep),
        out_shardings=fns.batch_sharding)
    eval_bs = _round_up(min(64, max(1, len(eval_problems))), div)
    eval_k = cfg.eval.num_samples
    eval_sample_k = jax.jit(
        lambda p, pt, pm, key: sampler.sample(
            tr.cast_params(p, jnp.bfloat16), pt, pm, key, model_cfg,
            max_new_tokens=R.max_new_tokens, temperature=R.temperature, top_k=R.top_k,
            top_p=R.top_p, eos_id=codec.eos_ids or None, num_samples=eval_k),
        in_shardings=(fns.state_shardings.params, fns.batch_sharding, fns.batch_sharding, rep),
        out_shardings=fns.batch_sharding) if eval_k > 1 else None

    def evaluate(params: Any) -> dict[str, float]:
        """Greedy pass@1 on the held-out split; with eval.num_samples = k > 1 also the
        sampled accuracy (mean over k samples at the rollout temperature) and pass@k."""
        correct, lengths, passk, mean_k = [], [], [], []
        for i in range(0, len(eval_problems), eval_bs):
            chunk = eval_problems[i:i + eval_bs]
            padded = chunk + [chunk[-1]] * (eval_bs - len(chunk))
            pt, pm = _left_pad([codec.encode_prompt(p) for p in padded], P, codec.pad_id)
            out = eval_sample(params, to_global(pt, fns.batch_sharding),
                              to_global(pm, fns.batch_sharding), jax.random.key(0))
            toks, msk = to_host(out.tokens), to_host(out.mask)
            for j, prob in enumerate(chunk):
                text = codec.decode(toks[j], msk[j])
                correct.append(bool(task.verify(text, prob)))
                lengths.append(float(np.sum(msk[j] > 0)))
            if eval_sample_k is not None:
                out = eval_sample_k(params, to_global(pt, fns.batch_sharding),
                                    to_global(pm, fns.batch_sharding),
                                    jax.random.fold_in(jax.random.key(cfg.seed), i))
                toks, msk = to_host(out.tokens), to_host(out.mask)
                for j, prob in enumerate(chunk):
                    c = sum(bool(task.verify(codec.decode(toks[j * eval_k + g],
                                                          msk[j * eval_k + g]), prob))
                            for g in range(eval_k))
                    passk.append(pass_at_k(eval_k, c, eval_k))
                    mean_k.append(c / eval_k)
        res = {"accuracy": float(np.mean(correct)), "n": len(correct),
               "response_len": float(np.mean(lengths))}
        if passk:
            res["sampled_accuracy"] = float(np.mean(mean_k))
            res[f"pass@{eval_k}"] = float(np.mean(passk))
        return res

    # -- resume
    manager = ckpt.open_manager(out_dir, keep=cfg.checkpoint.keep)
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    summary_path = os.path.join(out_dir, "summary.json")
    start = ckpt.latest_step(manager)
    eval_before = None
    history: list[dict[str, Any]] = []
    use_ref = loss_cfg.beta_kl > 0
    ref_params = None

    def payload(state: Any, ref: Any) -> Any:
        # The KL reference (the policy at GRPO step 0) travels with every
        # checkpoint, so a resumed run keeps the same reference.
        return (state, ref) if use_ref else state

    if start is not None:
        restored = ckpt.restore(manager, start, payload(state, state.params))
        state, ref_params = restored if use_ref else (restored, None)
        meta = ckpt.read_metadata(manager, start)
        eval_before = meta.get("eval_before")
        P = int(meta.get("prompt_bucket", P))
        if os.path.exists(metrics_path):
            with open(metrics_path) as f:
                history = [r for r in (json.loads(line) for line in f if line.strip())
                           if r["step"] <= start]
        print(f"resumed from step {start} in {out_dir}", flush=True)
    else:
        history = []
        # -- supervised warm start (scratch models)
        if fns.sft is not None:
            sft_params, sft_state = state.params, sft_opt.init(state.params)
            Ts = P + R.max_new_tokens
            it = range(cfg.sft.steps)
            bar = _progress(it, "sft", cfg.log.progress and is_main)
            coins = np.random.default_rng([cfg.seed, 4242])  # flawed-demonstration coins
            for i in bar:
                probs = train_problems(1, i, cfg.sft.batch_size)
                flawed = coins.random(len(probs)) < cfg.sft.mistake_rate
                toks, lm = sft_batch(probs, flawed, codec, Ts, R.max_new_tokens)
                sft_params, sft_state, sm = fns.sft(sft_params, sft_state,
                                                    jnp.asarray(toks), jnp.asarray(lm))
                if hasattr(bar, "set_postfix") and i % 20 == 0:
                    bar.set_postfix(loss=f"{float(sm['loss']):.3f}")
            state = state._replace(params=_place(sft_params,
                                                         fns.state_shardings.params))
        eval_before = evaluate(state.params)
        if is_main:
            print(f"held-out accuracy before GRPO: {_fmt_eval(eval_before)} "
                  f"(n={eval_before['n']})", flush=True)
        if use_ref:
            ref_params = jax.tree.map(jnp.copy, state.params)
        ckpt.save(manager, 0, payload(state, ref_params),
                  {"eval_before": eval_before, "prompt_bucket": P})
    if is_main:
        with open(metrics_path, "w") as f:
            for r in history:
                f.write(json.dumps(r) + "\n")

    writer = _tb_writer(out_dir) if (cfg.log.tensorboard and is_main) else None
    reward_cfg = RewardConfig(format_weight=T.reward_format_weight)
    start = start or 0
    root = jax.random.key(cfg.seed)
    bar = _progress(range(start, T.steps), "grpo", cfg.log.progress and is_main,
                    initial=start, total=T.steps)
    eval_after = None
    for step in bar:
        t0 = time.perf_counter()
        skey = jax.random.fold_in(root, step)
        rkey, ukey = jax.random.split(skey)
        probs = train_problems(0, step, R.prompts_per_step)
        pt, pm = _left_pad([codec.encode_prompt(p) for p in probs], P, codec.pad_id)
        batch = fns.rollout(state.params, to_global(pt, fns.batch_sharding),
                            to_global(pm, fns.batch_sharding), rkey)
        toks, msk = to_host(batch.tokens), to_host(batch.mask)
        texts = [codec.decode(toks[i], msk[i]) for i in range(toks.shape[0])]
        rep_probs = [p for p in probs for _ in range(R.group_size)]
        rewards = batch_rewards(task, texts, rep_probs, reward_cfg)
        accuracy = float(np.mean([task.verify(t, p) for t, p in zip(texts, rep_probs,
                                                                     strict=True)]))
        rewards_g = to_global(np.asarray(rewards, np.float32).reshape(R.prompts_per_step,
                                                                      R.group_size),
                              fns.batch_sharding)
        state, met = fns.update(state, batch, rewards_g, ukey, ref_params)
        met = {k: float(v) for k, v in jax.device_get(met).items()}
        record = {"step": step + 1, "accuracy": accuracy, **met,
                  "step_time_s": time.perf_counter() - t0}
        if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < T.steps:
            ev = evaluate(state.params)
            record["eval_accuracy"] = ev["accuracy"]
            if "sampled_accuracy" in ev:
                record["eval_sampled_accuracy"] = ev["sampled_accuracy"]
        history.append(record)
        if is_main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")
            if writer is not None:
                for name, v in record.items():
                    if name != "step" and isinstance(v, float) and math.isfinite(v):
                        writer.add_scalar(name, v, step + 1)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(reward=f"{record['reward_mean']:.2f}",
                                alpha=f"{record['alpha']:.2f}", d=f"{record['d_bar']:.3f}")
        if cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
            ckpt.save(manager, step + 1, payload(state, ref_params),
                      {"eval_before": eval_before, "prompt_bucket": P})
    if T.steps > start or eval_after is None:
        eval_after = evaluate(state.params)
    if cfg.checkpoint.every and T.steps % cfg.checkpoint.every:
        ckpt.save(manager, T.steps, payload(state, ref_params),
                  {"eval_before": eval_before, "prompt_bucket": P})
    ckpt.close(manager)
    if writer is not None:
        writer.close()
    compiles = {"rollout": fns.rollout._cache_size(), "update": fns.update._cache_size(),
                "eval": eval_sample._cache_size()}
    result = RunResult(history, eval_before, eval_after, compiles,
                       None if start == 0 else start)
    # Params sharded across processes (FSDP over hosts) are gathered by every
    # process (a collective), then written by the main one.
    final_params = (multihost_utils.process_allgather(state.params, tiled=True)
                    if jax.process_count() > 1 else state.params)
    if is_main:
        _export(final_params, model_cfg, codec, cfg, out_dir)
        with open(summary_path, "w") as f:
            json.dump({"eval_before": eval_before, "eval_after": eval_after,
                       "compiles": compiles, "steps": T.steps}, f, indent=1)
        print(f"held-out accuracy after GRPO: {_fmt_eval(eval_after)} (before: "
              f"{_fmt_eval(eval_before)}); policy exported to {os.path.join(out_dir, 'final')}",
              flush=True)
    return result


def _place(tree: Any, shardings: Any) -> Any:
    """Lay ``tree`` out with ``shardings`` (a matching pytree of shardings).

    One process: `jax.device_put`.  Several processes: every process holds the
    same values (same seed, same computation), so each leaf is rebuilt as a
    global array from its host copy; `jax.device_put` onto a mesh that spans
    processes with one device each gave arrays whose shards could not be read
    back (orbax failed on them at the first checkpoint, jax 0.10.2).
    """
    import jax

    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    from jax.experimental import multihost_utils

    def one(x: Any, sharding: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            x = multihost_utils.process_allgather(x, tiled=True)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(one, tree, shardings)


def _fmt_eval(ev: dict[str, Any]) -> str:
    """``"greedy 0.715"`` or ``"greedy 0.715, sampled 0.642"``."""
    out = f"greedy {ev['accuracy']:.3f}"
    if "sampled_accuracy" in ev:
        out += f", sampled {ev['sampled_accuracy']:.3f}"
    return out


def _make_task(cfg: Any) -> Any:
    """The config's task; ``gsm8k`` / ``math`` read ``task.train_file`` / ``task.eval_file``."""
    from ais_jax.tasks import TASKS, dataset_task, get_task, load_jsonl

    name = cfg.task.name
    if name in TASKS:
        return get_task(name)
    if name in ("gsm8k", "math"):
        if not cfg.task.train_file:
            raise UsageError(f"task.name={name} needs task.train_file (a local JSONL file)")
        train = load_jsonl(cfg.task.train_file)
        ev = load_jsonl(cfg.task.eval_file) if cfg.task.eval_file else None
        return dataset_task(name, train, ev)
    try:
        return get_task(name)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _export(params: Any, model_cfg: Any, codec: Codec, cfg: Any, out_dir: str) -> None:
    from ais_jax.pretrained import save_pretrained

    final = os.path.join(out_dir, "final")
    save_pretrained(params, model_cfg, final)
    if hasattr(codec.tokenizer, "save"):
        codec.tokenizer.save(final)
    elif hasattr(codec.tokenizer, "save_pretrained"):
        codec.tokenizer.save_pretrained(final)


def _progress(it: Any, desc: str, enabled: bool, **kw: Any) -> Any:
    if not enabled:
        return it
    from tqdm import tqdm

    return tqdm(it, desc=desc, dynamic_ncols=True, file=sys.stdout, **kw)


def _tb_writer(out_dir: str) -> Any:
    from tensorboardX import SummaryWriter

    return SummaryWriter(os.path.join(out_dir, "tb"))


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    ap = argparse.ArgumentParser(
        prog="python -m ais_jax.train",
        description="GRPO with FP8 rollouts and AIS. Overrides: a.b=value (e.g. train.steps=5).")
    ap.add_argument("--config", help="YAML config file (default: configs/tiny_arithmetic.yaml)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.precision=bf16")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config")
    ap.add_argument("--distributed", action="store_true",
                    help="call jax.distributed.initialize() (multi-host)")
    args = ap.parse_args(argv)

    from ais_jax.config import DEFAULT_CONFIG_PATH, format_config, load_config

    try:
        cfg = load_config(args.config or DEFAULT_CONFIG_PATH, args.overrides)
        if args.print_config:
            print(format_config(cfg))
            return 0
        _init_distributed(args.distributed)
        run(cfg)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume from the latest checkpoint",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
