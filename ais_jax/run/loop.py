"""A training run from its config: resume or warm start, the GRPO loop, evaluation, export.

`run` is what ``python -m ais_jax.train`` runs (`ais_jax.run.cli` parses the command
line): it builds the run (`ais_jax.training.build`), runs the optional supervised
warm start (`ais_jax.training.warmstart`), then the GRPO loop, one
`ais_jax.training.rl` step at a time; logs every step to ``out_dir/metrics.jsonl``
(and the ``log.backends`` trackers: TensorBoard, wandb, trackio;
`ais_jax.run.trackers`), and every ``log.completions_every`` steps sampled
completions to ``out_dir/completions.jsonl``; evaluates
(`ais_jax.training.evaluation`), checkpoints every ``checkpoint.every`` steps and
resumes from the latest checkpoint in ``out_dir`` when rerun with the same config
(`ais_jax.run.runguard`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from ais_jax.run import runguard


@dataclasses.dataclass
class RunResult:
    """What `run` returns (also written to ``out_dir/summary.json``)."""

    metrics: list[dict[str, Any]]
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None
    compiles: dict[str, int]
    resumed_from: int | None


def run(cfg: Any, reward_fns: Any = None, dataset: Any = None) -> RunResult:
    """Run (or resume) the training job described by ``cfg`` (an `ais_jax.config.schema.Config`).

    Args:
      cfg: the config.
      reward_fns: extra reward functions ``fn(completion, prompt, row) -> float``
        besides ``reward.functions``: a mapping name -> fn or a list (named by
        ``__name__``); ``reward.weights`` applies (`ais_jax.tasks.user_rewards`).
      dataset: training rows (a list of dicts or a ``datasets.Dataset``) for the
        dataset task, replacing ``task.train_file`` (`ais_jax.tasks.user_dataset`).

    Raises:
      UsageError: bad input, ``out_dir`` in use by another run (`ais_jax.run.runguard`),
        or a resume under a changed config.
      runguard.Interrupted: SIGTERM / SIGINT during the GRPO loop; the step in
        flight was finished and checkpointed.
    """
    import jax

    from ais_jax.run import runtime, trackers

    trackers.parse_backends(cfg.log)  # bad log.backends: fail before any work
    runtime.setup(cfg.runtime)  # the compilation cache, before the first compilation
    is_main = jax.process_index() == 0
    os.makedirs(cfg.out_dir, exist_ok=True)
    with runguard.RunLock(cfg.out_dir) if is_main else contextlib.nullcontext():
        return _run_locked(cfg, is_main, reward_fns, dataset)


@dataclasses.dataclass
class _Job:
    """A run between its phases: what `_run_locked` built and the state the phases advance."""

    cfg: Any
    r: Any  # ais_jax.training.build.Run
    manager: Any  # the orbax CheckpointManager of out_dir/checkpoints
    is_main: bool  # process 0: writes metrics, trackers and the export
    use_ref: bool  # train.beta_kl > 0: the KL reference travels with every checkpoint
    config: dict[str, Any]  # the flat config stored with each checkpoint
    state: Any = None
    ref_params: Any = None
    eval_before: dict[str, Any] | None = None

    def payload(self, state: Any, ref: Any) -> Any:
        """What a checkpoint holds: the train state, and the KL reference when used."""
        return (state, ref) if self.use_ref else state

    def save(self, step: int) -> bool:
        from ais_jax.run import checkpoint as ckpt

        return ckpt.save(self.manager, step, self.payload(self.state, self.ref_params),
                         {"eval_before": self.eval_before, "prompt_bucket": self.r.prompt_bucket,
                          "config": self.config})


def _run_locked(cfg: Any, is_main: bool, reward_fns: Any = None,
                dataset: Any = None) -> RunResult:
    import jax

    from ais_jax.run import checkpoint as ckpt
    from ais_jax.run.trackers import truncate_rows
    from ais_jax.training.build import build_run
    from ais_jax.training.evaluation import make_evaluator
    from ais_jax.training.placement import to_host

    out_dir, steps = cfg.out_dir, cfg.train.steps
    manager = ckpt.open_manager(out_dir, keep=cfg.checkpoint.keep)
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    last, meta = runguard.latest_readable_meta(ckpt, manager)
    if last is not None:
        runguard.check_resume_config(meta, cfg, last, out_dir)
        summary = os.path.join(out_dir, "summary.json")
        if last > steps or (last == steps and os.path.exists(summary)):
            ckpt.close(manager)
            return _already_done(cfg, last, meta, summary, metrics_path)
    r = build_run(cfg, reward_fns, dataset)
    evaluate, eval_fn = make_evaluator(r)
    job = _Job(cfg, r, manager, is_main, cfg.train.beta_kl > 0, runguard.flat_config(cfg))
    start = _start(job, last is not None, evaluate)
    # Complete lines of steps <= start only: a torn line or later steps are dropped.
    history = runguard.truncate_metrics(metrics_path, start or 0, rewrite=is_main)
    if is_main:
        truncate_rows(out_dir, start or 0)
    if start is None:
        job.save(0)
    _grpo_loop(job, start or 0, evaluate, history, metrics_path)
    eval_after = evaluate(job.state.params)
    if cfg.checkpoint.every and steps % cfg.checkpoint.every:
        job.save(steps)
    ckpt.close(manager)
    compiles = {"rollout": r.fns.rollout._cache_size(), "update": r.fns.update._cache_size(),
                "score": r.fns.score._cache_size(),  # 0 when never called
                "eval": eval_fn._cache_size()}
    # Params sharded across processes are gathered by every process (a collective).
    params = job.state.params
    final_params = to_host(params) if jax.process_count() > 1 else params
    if is_main:
        _finish(cfg, r, final_params, job.eval_before, eval_after, compiles)
    return RunResult(history, job.eval_before, eval_after, compiles,
                     start if start else None)


def _start(job: _Job, resume: bool, evaluate: Any) -> int | None:
    """Restore the latest good checkpoint (its step), or warm-start and evaluate (None)."""
    import jax
    import jax.numpy as jnp

    from ais_jax.run import checkpoint as ckpt

    r, cfg = job.r, job.cfg
    if resume:
        start, restored, meta = runguard.restore_latest(
            ckpt, job.manager, cfg.out_dir, job.payload(r.state, r.state.params), job.is_main)
        runguard.check_resume_config(meta, cfg, start, cfg.out_dir)
        job.state, job.ref_params = restored if job.use_ref else (restored, None)
        job.eval_before = meta.get("eval_before")
        r.prompt_bucket = int(meta.get("prompt_bucket", r.prompt_bucket))
        print(f"resumed from step {start} in {cfg.out_dir}", flush=True)
        return start
    job.state, job.eval_before = _before_grpo(r, r.state, evaluate, job.is_main)
    job.ref_params = jax.tree.map(jnp.copy, job.state.params) if job.use_ref else None
    return None


def _grpo_loop(job: _Job, start: int, evaluate: Any, history: list[dict[str, Any]],
               metrics_path: str) -> None:
    """GRPO steps ``start .. train.steps - 1``: step, log, evaluate, checkpoint; a SIGTERM /
    SIGINT finishes the step in flight, checkpoints it and raises `runguard.Interrupted`."""
    import jax

    from ais_jax.run import checkpoint as ckpt
    from ais_jax.run import runtime
    from ais_jax.run.trackers import Trackers, samples_hook, write_rows
    from ais_jax.training.rl import make_rl_step

    cfg, r, steps = job.cfg, job.r, job.cfg.train.steps
    writer = Trackers(cfg, job.config, enabled=job.is_main)
    rl_step = make_rl_step(r, job.ref_params)
    root = jax.random.key(cfg.seed)
    if cfg.train.rng_stream:  # another key stream: same problems, warm start and evaluation
        root = jax.random.fold_in(root, 1_000_000 + cfg.train.rng_stream)
    bar = _progress_fn("grpo", cfg.log.progress and job.is_main, initial=start, total=steps)
    loop = bar(range(start, steps)) if bar else range(start, steps)
    profiler = runtime.StepProfiler(cfg.runtime, start, job.is_main, jax.process_index(),
                                    jax.process_count())
    stop = runguard.StopFlag()
    with profiler, stop.installed():  # the trace is stopped even if a step fails
        for step in profiler.steps(loop):
            t0 = time.perf_counter()
            problems = r.train_problems(0, step, cfg.rollout.prompts_per_step)
            rows: list[dict[str, Any]] = []
            on_samples = samples_hook(cfg.log, step + 1, rows)
            job.state, rec = rl_step(job.state, problems, jax.random.fold_in(root, step),
                                     on_samples)
            record = {"step": step + 1, **rec, "step_time_s": time.perf_counter() - t0}
            if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < steps:
                ev = evaluate(job.state.params)
                record["eval_accuracy"] = ev["accuracy"]
                if "sampled_accuracy" in ev:
                    record["eval_sampled_accuracy"] = ev["sampled_accuracy"]
            history.append(record)
            if job.is_main:
                if rows:
                    write_rows(cfg.out_dir, rows)
                _log(record, metrics_path, writer, loop, rows)
            if cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
                job.save(step + 1)
            signum = stop.agreed()
            if signum:  # finish the step, checkpoint it, stop with status 128 + signum
                job.save(step + 1)
                ckpt.close(job.manager)
                writer.close()
                raise runguard.Interrupted(signum, (
                    f"stopped by {signal.Signals(signum).name} after step {step + 1}; checkpoint "
                    f"saved in {job.manager.directory}/{step + 1}; rerun the same command to "
                    "resume"))
    writer.close()


def _already_done(cfg: Any, last: int, meta: dict[str, Any], summary: str,
                  metrics_path: str) -> RunResult:
    """The result of a run whose checkpoints reached ``train.steps``; nothing is rewritten."""
    print(f"{cfg.out_dir} already holds step {last} (train.steps={cfg.train.steps}); nothing to "
          "do, its results are kept (raise train.steps to train further)", flush=True)
    after = None
    with contextlib.suppress(OSError, ValueError), open(summary) as f:
        after = json.load(f).get("eval_after")
    history = runguard.truncate_metrics(metrics_path, last, rewrite=False)
    return RunResult(history, meta.get("eval_before"), after, {}, last)


def _before_grpo(r: Any, state: Any, evaluate: Any, is_main: bool) -> tuple[Any, dict]:
    """A fresh run: the warm start (scratch models), then the held-out evaluation before GRPO.

    The warm start's checks and stopping step go to ``out_dir/warm_start.json``
    (and ``summary.json``'s ``warm_start`` at the end).
    """
    from ais_jax.training.warmstart import WarmStartLog, warm_start

    if r.fns.sft is not None:
        bar = _progress_fn("sft", r.cfg.log.progress and is_main)
        log = WarmStartLog()
        state = state._replace(params=warm_start(r, state.params, bar, log=log))
        if is_main:
            _report_warm_start(r.cfg, log)
    eval_before = evaluate(state.params)
    if is_main:
        print(f"held-out accuracy before GRPO: {_fmt_eval(eval_before)} "
              f"(n={eval_before['n']})", flush=True)
    return state, eval_before


def _report_warm_start(cfg: Any, log: Any) -> None:
    """Print where the warm start stopped; write its `WarmStartLog` to out_dir/warm_start.json."""
    s = cfg.sft
    if log.target > 0:
        last = log.checks[-1]["accuracy"] if log.checks else float("nan")
        how = (f"stopped at step {log.steps_run}" if log.reached else
               f"did not reach it; ran all {log.steps_run} steps")
        print(f"warm start: target greedy accuracy {log.target:g} on {s.check_size} "
              f"training-split problems, {how} of at most {max(s.steps, s.max_steps)} (last "
              f"check {last:.3f}, "
              f"{len(log.checks)} checks)", flush=True)
    else:
        print(f"warm start: {log.steps_run} steps (no criterion: sft.target_accuracy=0)",
              flush=True)
    with open(os.path.join(cfg.out_dir, "warm_start.json"), "w") as f:
        json.dump(log.as_dict(), f, indent=1)


def _log(record: dict[str, Any], metrics_path: str, writer: Any, bar: Any,
         rows: Sequence[dict[str, Any]] = ()) -> None:
    runguard.append_record(metrics_path, record)  # whole lines, flushed and fsynced
    writer.log(record, rows)  # the same record to every tracker backend
    if hasattr(bar, "set_postfix"):
        bar.set_postfix(reward=f"{record['reward_mean']:.2f}", alpha=f"{record['alpha']:.2f}",
                        d=f"{record['d_bar']:.3f}")


def _finish(cfg: Any, r: Any, params: Any, eval_before: Any, eval_after: Any,
            compiles: dict[str, int]) -> None:
    """Export the final policy (HF directory + tokenizer), write summary.json, print the result."""
    from ais_jax.models.pretrained import save_pretrained
    from ais_jax.training.placement import to_host as to_host_tree

    final = os.path.join(cfg.out_dir, "final")
    if r.is_llada:
        from ais_jax.models.llada.checkpoint import save as save_llada

        save_llada(final, to_host_tree(params), r.model_cfg)
    else:
        save_pretrained(params, r.model_cfg, final)
    tok = r.codec.tokenizer
    if hasattr(tok, "save"):
        tok.save(final)
    elif hasattr(tok, "save_pretrained"):
        tok.save_pretrained(final)
    summary = {"eval_before": eval_before, "eval_after": eval_after, "compiles": compiles,
               "steps": cfg.train.steps}
    with contextlib.suppress(OSError, ValueError), open(
            os.path.join(cfg.out_dir, "warm_start.json")) as f:
        summary["warm_start"] = json.load(f)  # written by _before_grpo, kept across resumes
    with open(os.path.join(cfg.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"held-out accuracy after GRPO: {_fmt_eval(eval_after)} (before: "
          f"{_fmt_eval(eval_before)}); policy exported to {final}", flush=True)


def _fmt_eval(ev: dict[str, Any]) -> str:
    """``"greedy 0.715"`` or ``"greedy 0.715, sampled 0.642"``."""
    out = f"greedy {ev['accuracy']:.3f}"
    if "sampled_accuracy" in ev:
        out += f", sampled {ev['sampled_accuracy']:.3f}"
    return out


def _progress_fn(desc: str, enabled: bool, **kw: Any) -> Any:
    """A ``tqdm`` wrapper ``iterable -> bar`` on stdout, or None when disabled."""
    if not enabled:
        return None
    from tqdm import tqdm

    return lambda it: tqdm(it, desc=desc, dynamic_ncols=True, file=sys.stdout, **kw)


