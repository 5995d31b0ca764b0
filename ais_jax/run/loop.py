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

import dataclasses
import json
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from ais_jax.core import storage
from ais_jax.run import agree, final, multihost, results, runguard
from ais_jax.run.signals import Interrupted, StopFlag


@dataclasses.dataclass
class RunResult:
    """What `run` returns (also written to ``out_dir/summary.json``)."""

    metrics: list[dict[str, Any]]
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None
    compiles: dict[str, int]
    resumed_from: int | None


def run(cfg: Any, reward_fns: Any = None, dataset: Any = None, *,
        overwrite: bool = False) -> RunResult:
    """Run (or resume) the training job described by ``cfg`` (an `ais_jax.config.schema.Config`).

    Args:
      cfg: the config.
      reward_fns: extra reward functions ``fn(completion, prompt, row) -> float``
        besides ``reward.functions``: a mapping name -> fn or a list (named by
        ``__name__``); ``reward.weights`` applies (`ais_jax.tasks.user_rewards`).
      dataset: training rows (a list of dicts or a ``datasets.Dataset``) for the
        dataset task, replacing ``task.train_file`` (`ais_jax.tasks.user_dataset`).
      overwrite: start over in an ``out_dir`` that holds an earlier run's results but no
        checkpoint (otherwise refused; `ais_jax.run.results.check_fresh_out_dir`).

    Raises:
      UsageError: bad input, ``out_dir`` in use by another run (`ais_jax.run.runguard`),
        a resume under a changed config, or the disk refusing a write (`StorageError`).
      Interrupted: SIGTERM / SIGINT (`ais_jax.run.signals`): during the GRPO loop the step
        in flight was finished and checkpointed; during the warm start nothing was written.
    """
    import jax

    from ais_jax.run import runtime, trackers

    trackers.parse_backends(cfg.log)  # bad log.backends: fail before any work
    agree.check_one_run(cfg, dataset)  # every process runs process 0's run (no collective)
    runtime.setup(cfg.runtime)  # the compilation cache, before the first compilation
    is_main = jax.process_index() == 0
    results.make_out_dir(cfg.out_dir)
    stop = StopFlag()
    with stop.installed():
        multihost.check_shared_dir(cfg.out_dir)  # process 0's lock outcome is everyone's:
        lock = runguard.RunLock(cfg.out_dir) if is_main else None
        try:
            held = multihost.decide(lambda: (lock.acquire(), lock.info)[1] if lock else None)
            multihost.share_lock(storage.join(cfg.out_dir, runguard.LOCK_NAME), held)
            result = _run_locked(cfg, is_main, reward_fns, dataset, overwrite, stop)
            multihost.share_lock("", None)  # kept on an error: the CLI may release it
            return result
        finally:
            if lock is not None:
                lock.release()


@dataclasses.dataclass
class _Job:
    """A run between its phases: what `_run_locked` built and the state the phases advance."""

    cfg: Any
    r: Any  # ais_jax.training.build.Run
    manager: Any  # the orbax CheckpointManager of out_dir/checkpoints
    is_main: bool  # process 0: writes metrics, trackers and the export
    use_ref: bool  # train.beta_kl > 0: the KL reference travels with every checkpoint
    # LoRA: the warm-started frozen base travels with every checkpoint (lora_policy)
    keep_base: bool
    config: dict[str, Any]  # the flat config stored with each checkpoint
    stop: StopFlag
    state: Any = None
    ref_params: Any = None
    eval_before: dict[str, Any] | None = None
    protect: int | None = None  # the restored checkpoint: never pruned by checkpoint.keep
    stale: Any = None  # rollout.staleness >= 1: the StaleRollouts of the GRPO loop
    inflight: tuple = ()  # the in-flight batches a resume restored (rollout.staleness)

    def payload(self, state: Any, ref: Any) -> Any:
        """What a checkpoint holds: the train state, and the KL reference when used (full
        fine-tuning) or the warm-started frozen base (LoRA after a warm start); with
        ``rollout.staleness``, the in-flight batches too (`ais_jax.training.stale`)."""
        base = (state, self.r.lora.base) if self.keep_base else (
            (state, ref) if self.use_ref else state)
        if self.stale is None or not self.stale.queue:
            return base
        return {"train": base, "inflight": self.stale.payload()}

    def target(self, meta: dict[str, Any]) -> Any:
        """The restore target of a checkpoint with metadata ``meta``: the payload's structure,
        with the in-flight batches the checkpoint lists."""
        from ais_jax.training import stale

        base = self.payload(self.r.state, self.r.state.params)  # no batches in flight yet
        return stale.restore_target(base, meta, self.cfg, self.r.fns.batch_sharding)

    def model_params(self, params: Any) -> Any:
        """The model's params of the state's (LoRA: the adapters merged into the base)."""
        from ais_jax.training.lora_policy import model_params

        return model_params(self.r, params)

    def save(self, step: int) -> bool:
        from ais_jax.run import checkpoint as ckpt

        with self.stop.saving():  # a second signal waits for the save and its checksums
            if self.is_main:  # a bucket: metrics and completions up to this step, uploaded
                storage.flush_appends()
            meta = {"eval_before": self.eval_before, "prompt_bucket": self.r.prompt_bucket,
                    "config": self.config}
            if self.stale is not None:
                from ais_jax.training.stale import META_KEY

                meta[META_KEY] = self.stale.metadata()
            return ckpt.save(self.manager, step, self.payload(self.state, self.ref_params),
                             meta, keep=self.cfg.checkpoint.keep, protect=self.protect)


def _run_locked(cfg: Any, is_main: bool, reward_fns: Any, dataset: Any, overwrite: bool,
                stop: StopFlag) -> RunResult:
    import jax

    from ais_jax.run import checkpoint as ckpt
    from ais_jax.run.trackers import Trackers, truncate_rows
    from ais_jax.training.build import build_run
    from ais_jax.training.evaluation import make_evaluator
    from ais_jax.training.placement import to_host

    out_dir, steps = cfg.out_dir, cfg.train.steps
    manager = ckpt.open_manager(out_dir, keep=cfg.checkpoint.keep)
    with ckpt.closed_on_error(manager):  # no orbax thread left running after an error
        metrics_path = storage.join(out_dir, results.METRICS)
        last, done, eval_before = multihost.decide(
            lambda: runguard.resume_plan(ckpt, manager, cfg, overwrite))
        if done:
            ckpt.close(manager)
            return _already_done(cfg, last, {"eval_before": eval_before}, metrics_path)
        r = build_run(cfg, reward_fns, dataset)
        evaluate, eval_fn = make_evaluator(r)
        lora_on = r.lora is not None  # the KL reference is then the frozen base itself
        job = _Job(cfg, r, manager, is_main, cfg.train.beta_kl > 0 and not lora_on,
                   lora_on and r.fns.sft is not None, runguard.run_record(cfg), stop)
        writer = Trackers(cfg, job.config, enabled=is_main)  # opens (or fails) before any work
        try:
            start = _start(job, last is not None, evaluate)
            # Complete lines of steps <= start only: a torn line or later steps are dropped.
            history = runguard.truncate_metrics(metrics_path, start or 0, rewrite=is_main)
            if is_main:
                truncate_rows(out_dir, start or 0)
            if start is None:
                job.save(0)
            _grpo_loop(job, start or 0, evaluate, history, metrics_path, writer)
        finally:
            writer.close()
            if is_main:  # a bucket: the lines logged since the last checkpoint, uploaded
                storage.flush_appends(quiet=sys.exc_info()[1] is not None, forget=True)
        stop.phase = "finish"
        final_step = max(steps, start or 0)
        eval_after = evaluate(job.model_params(job.state.params))
        if cfg.checkpoint.every and final_step % cfg.checkpoint.every:
            job.save(final_step)
        ckpt.close(manager)
        compiles = {"rollout": r.fns.rollout._cache_size(), "update": r.fns.update._cache_size(),
                    "score": r.fns.score._cache_size(),  # 0 when never called
                    "eval": eval_fn._cache_size()}
        # Params sharded across processes are gathered by every process (a collective): the
        # export on process 0 alone then joins none; its outcome is every process's.
        params = job.model_params(job.state.params)
        final_params = to_host(params) if jax.process_count() > 1 or r.is_llada else params
        adapters = None if r.lora is None else to_host(job.state.params)
        multihost.decide(lambda: final.finish(cfg, r, final_params, job.eval_before, eval_after,
                                         compiles, final_step, adapters))
        if stop.signum:
            print(f"received {signal.Signals(stop.signum).name} after the last step: the results "
                  "are complete", file=sys.stderr, flush=True)
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
            ckpt, job.manager, cfg.out_dir, job.target, job.is_main,
            cfg.checkpoint.allow_unverified)
        if isinstance(restored, dict):  # rollout.staleness: the batches in flight at the save
            restored, job.inflight = restored["train"], tuple(restored["inflight"])
        runguard.check_resume_config(meta, cfg, start, cfg.out_dir)
        if job.keep_base:
            job.state, base = restored
            r.lora.set_base(base)
        else:
            job.state, job.ref_params = restored if job.use_ref else (restored, None)
        job.eval_before = meta.get("eval_before")
        job.protect = start
        r.prompt_bucket = int(meta.get("prompt_bucket", r.prompt_bucket))
        print(f"resumed from step {start} in {cfg.out_dir}", flush=True)
        job.stop.phase = "grpo"
        return start
    job.state, job.eval_before = _before_grpo(job, evaluate)
    job.ref_params = jax.tree.map(jnp.copy, job.state.params) if job.use_ref else None
    return None


def _grpo_loop(job: _Job, start: int, evaluate: Any, history: list[dict[str, Any]],
               metrics_path: str, writer: Any) -> None:
    """GRPO steps ``start .. train.steps - 1``: step, log, evaluate, checkpoint; a SIGTERM /
    SIGINT finishes the step in flight, checkpoints it and raises `Interrupted`."""
    import jax

    from ais_jax.run import checkpoint as ckpt
    from ais_jax.run import runtime
    from ais_jax.run.trackers import samples_hook, write_rows
    from ais_jax.training.rl import make_rl_step

    cfg, r, steps = job.cfg, job.r, job.cfg.train.steps
    job.stop.phase = "grpo"
    rl_step = make_rl_step(r, job.ref_params)
    root = jax.random.key(cfg.seed)
    if cfg.train.rng_stream:  # another key stream: same problems, warm start and evaluation
        root = jax.random.fold_in(root, 1_000_000 + cfg.train.rng_stream)
    if cfg.rollout.staleness:
        _start_stale(job, rl_step, root, start)
    bar = _progress_fn("grpo", cfg.log.progress and job.is_main, initial=start, total=steps)
    loop = bar(range(start, steps)) if bar else range(start, steps)
    profiler = runtime.StepProfiler(cfg.runtime, start, job.is_main, jax.process_index(),
                                    jax.process_count())
    with profiler:  # the trace is stopped even if a step fails
        for step in profiler.steps(loop):
            t0 = time.perf_counter()
            problems = r.train_problems(0, step, cfg.rollout.prompts_per_step)
            rows: list[dict[str, Any]] = []
            on_samples = samples_hook(cfg.log, step + 1, rows)
            if job.stale is not None:  # learn from the batch sampled k steps ago
                job.state, rec = job.stale.step(job.state, step, on_samples)
            else:
                job.state, rec = rl_step(job.state, problems, jax.random.fold_in(root, step),
                                         on_samples)
            record = {"step": step + 1, **rec, "step_time_s": time.perf_counter() - t0}
            if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < steps:
                ev = evaluate(job.model_params(job.state.params))
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
            signum = job.stop.agreed()
            if signum:  # finish the step, checkpoint it, stop with status 128 + signum
                job.save(step + 1)
                ckpt.close(job.manager)
                raise Interrupted(signum, (
                    f"stopped by {signal.Signals(signum).name} after step {step + 1}; checkpoint "
                    f"saved in {job.manager.directory}/{step + 1}; rerun the same command to "
                    "resume"))


def _start_stale(job: _Job, rl_step: Any, root: Any, start: int) -> None:
    """Put the first ``rollout.staleness`` batches in flight (`ais_jax.training.stale`)."""
    import jax

    from ais_jax.training.stale import StaleRollouts

    cfg, k = job.cfg, job.cfg.rollout.staleness
    job.stale = StaleRollouts(
        rl_step, lambda s: job.r.train_problems(0, s, cfg.rollout.prompts_per_step),
        lambda s: jax.random.fold_in(root, s), cfg.train.steps, k)
    message = job.stale.fill(job.state.params, start, job.inflight)
    if job.is_main and message:
        print(message, flush=True)


def _already_done(cfg: Any, last: int, meta: dict[str, Any], metrics_path: str) -> RunResult:
    """The result of a run whose results are complete for its latest checkpoint; nothing is
    rewritten."""
    s = results.read_summary(cfg.out_dir) or {}
    print(f"{cfg.out_dir} already holds the results of step {s.get('step', last)} "
          f"(train.steps={cfg.train.steps}); nothing to do, they are kept (raise train.steps "
          "to train further)", flush=True)
    history = runguard.truncate_metrics(metrics_path, last, rewrite=False)
    return RunResult(history, meta.get("eval_before"), s.get("eval_after"), {}, last)


def _before_grpo(job: _Job, evaluate: Any) -> tuple[Any, dict]:
    """A fresh run: the warm start (scratch models), then the held-out evaluation before GRPO.

    The warm start's checks and stopping step go to ``out_dir/warm_start.json``
    (and ``summary.json``'s ``warm_start`` at the end). A signal stops the warm start after
    its current step; nothing is checkpointed then (`Interrupted`).
    """
    from ais_jax.training.warmstart import WarmStartLog, warm_start

    r, state, stop = job.r, job.r.state, job.stop
    if stop.agreed():
        _stopped_before_grpo(stop.signum or 0, "before the warm start")
    stop.phase = "warm start"
    if r.fns.sft is not None:
        bar = _progress_fn("sft", r.cfg.log.progress and job.is_main)
        log = WarmStartLog()
        if r.lora is not None:  # a full fine-tune whose result becomes the frozen base
            r.lora.set_base(warm_start(r, r.lora.start, bar, log=log, stop=stop.agreed))
        else:
            state = state._replace(params=warm_start(r, state.params, bar, log=log,
                                                     stop=stop.agreed))
        if stop.signum:
            _stopped_before_grpo(stop.signum, f"during the warm start, after its step "
                                 f"{log.steps_run}")
        if job.is_main:
            _report_warm_start(r.cfg, log)
    eval_before = evaluate(job.model_params(state.params))
    if stop.agreed():
        _stopped_before_grpo(stop.signum or 0, "during the evaluation before GRPO")
    if job.is_main:
        print(f"held-out accuracy before GRPO: {final.fmt_eval(eval_before)} "
              f"(n={eval_before['n']})", flush=True)
    return state, eval_before


def _stopped_before_grpo(signum: int, when: str) -> None:
    raise Interrupted(signum, (
        f"stopped by {signal.Signals(signum).name} {when}; nothing was checkpointed yet (the "
        "warm start is not): rerun the same command to start the run again"))


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
    storage.write_text(storage.join(cfg.out_dir, "warm_start.json"),
                       json.dumps(log.as_dict(), indent=1))


def _log(record: dict[str, Any], metrics_path: str, writer: Any, bar: Any,
         rows: Sequence[dict[str, Any]] = ()) -> None:
    runguard.append_record(metrics_path, record)  # whole lines, flushed and fsynced
    writer.log(record, rows)  # the same record to every tracker backend
    if hasattr(bar, "set_postfix"):
        bar.set_postfix(reward=f"{record['reward_mean']:.2f}", alpha=f"{record['alpha']:.2f}",
                        d=f"{record['d_bar']:.3f}")


def _progress_fn(desc: str, enabled: bool, **kw: Any) -> Any:
    """A ``tqdm`` wrapper ``iterable -> bar`` on stdout, or None when disabled."""
    if not enabled:
        return None
    from tqdm import tqdm

    return lambda it: tqdm(it, desc=desc, dynamic_ncols=True, file=sys.stdout, **kw)


