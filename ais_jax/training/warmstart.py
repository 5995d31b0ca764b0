"""Supervised warm start of scratch models: teacher forcing on the task's worked answers.

A model trained from scratch knows nothing of the task, so GRPO would see only
zero rewards.  `warm_start` trains it for ``sft.steps`` steps on generated
problems (answer + EOS after the compact prompt; a share ``sft.mistake_rate``
of them show the task's typical mistake instead) with a warmup + cosine
schedule, before the first RL step.

With ``sft.target_accuracy > 0`` the warm start stops on a criterion instead:
every ``sft.check_every`` steps it measures the greedy accuracy of the current
params on ``sft.check_size`` validation problems (`validation_problems`: the
*training* split, a seed stream of their own, never the held-out evaluation
problems) and stops at the first check that reaches the target, after at most
``sft.max_steps`` steps (0: ``sft.steps``).  The learning-rate schedule is the
fixed-step one (warmup, cosine over ``sft.steps`` to 10%, then held at 10%), so
it does not depend on where the warm start stops, and a seed that learns slowly
continues at the low final rate instead of stretching the high-rate phase.
Every seed and device count thus starts GRPO from a policy of comparable
accuracy.  The checks are recorded in a `WarmStartLog`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ais_jax.core.errors import UsageError
from ais_jax.rollout.codec import PromptCodec
from ais_jax.training.build import Run
from ais_jax.training.placement import place
from ais_jax.training.steps import model_shardings

VALIDATION_STREAM = 2  # `Run.train_problems` stream of the check (0: RL, 1: warm-start batches)


@dataclasses.dataclass
class WarmStartLog:
    """What a warm start did: its checks and where it stopped (filled in by `warm_start`).

    Attributes:
      target: ``sft.target_accuracy`` (0: no criterion, no checks).
      steps_run: warm-start steps taken.
      reached: whether a check reached the target.
      checks: ``{"step", "accuracy"}`` per check: greedy accuracy on the
        validation problems after that many steps.
    """

    target: float = 0.0
    steps_run: int = 0
    reached: bool = False
    checks: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (``summary.json``'s ``warm_start``)."""
        return dataclasses.asdict(self)


def validation_problems(run: Run) -> list[Any]:
    """The ``sft.check_size`` validation problems of the warm-start criterion.

    Drawn from the task's *training* split (the distribution the warm start
    learns) with their own seed stream (`VALIDATION_STREAM`), so they are neither
    the held-out evaluation problems nor a warm-start batch's draw.
    """
    return run.train_problems(VALIDATION_STREAM, 0, run.cfg.sft.check_size)


def make_accuracy_check(run: Run) -> Callable[[Any], float]:
    """``check(params) -> greedy accuracy`` on `validation_problems`, for any model kind.

    Built on `ais_jax.training.evaluation.make_evaluator` (greedy only), so it samples as
    the held-out evaluation does.
    """
    from ais_jax.training.evaluation import make_evaluator

    evaluate, _ = make_evaluator(run, problems=validation_problems(run), num_samples=1)
    return lambda params: float(evaluate(params)["accuracy"])


def sft_batch(problems: Sequence[Any], flawed: Sequence[bool], codec: PromptCodec, length: int,
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


def _scalars_on_mesh(state: Any, params: Any) -> Any:
    """``state`` with its scalars (the optimizer's step counts) placed replicated on the mesh
    of ``params``, as the warm-start step returns them: made eagerly they had no mesh, so the
    second step's arguments differed from the first's in type and the step compiled a second
    time (the same computation).  Unchanged when ``params`` are not on a mesh."""
    sharding = jax.tree.leaves(params)[0].sharding
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return state
    replicated = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return jax.tree.map(lambda x: place(x, replicated) if jnp.ndim(x) == 0 else x, state)


def warm_start(run: Run, params: Any, progress: Any = None, log: WarmStartLog | None = None,
               check: Callable[[Any], float] | None = None,
               stop: Callable[[], Any] | None = None) -> Any:
    """Teacher-forcing steps from ``params``; returns the trained params, placed.

    ``sft.steps`` steps, or with ``sft.target_accuracy > 0`` up to the first
    check (every ``sft.check_every`` steps) whose accuracy reaches the target,
    at most ``sft.max_steps`` (0: ``sft.steps``).

    Args:
      run: the built run (its ``fns.sft`` program and optimizer).
      params: initial params.
      progress: optional ``tqdm``-like wrapper ``progress(iterable) -> iterable``
        (its ``set_postfix`` shows the loss every 20 steps, and the last check).
      log: optional `WarmStartLog`, filled in place with the checks and the stop.
      check: ``params -> accuracy`` of the criterion; None: `make_accuracy_check`
        (built only when ``sft.target_accuracy > 0``).
      stop: called after every step; a truthy result ends the warm start there (a signal:
        the caller reports it; ``log.steps_run`` says where it stopped).
    """
    cfg = run.cfg
    target, every = cfg.sft.target_accuracy, cfg.sft.check_every
    log = log if log is not None else WarmStartLog()
    log.target = target
    if target > 0 and check is None:
        check = make_accuracy_check(run)
    sft_params, sft_state = params, _scalars_on_mesh(run.sft_optimizer.init(params), params)
    length = run.prompt_bucket + cfg.rollout.max_new_tokens
    steps = range(max(cfg.sft.steps, cfg.sft.max_steps) if target > 0 else cfg.sft.steps)
    bar = progress(steps) if progress is not None else steps
    coins = np.random.default_rng([cfg.seed, 4242])  # flawed-demonstration coins
    sft_key = jax.random.fold_in(jax.random.key(cfg.seed), 4242)
    if run.is_llada:  # masked-diffusion objective (ais_jax.training.llada.sft)
        from ais_jax.training.llada.sft import sft_batch as llada_batch

        eos = run.codec.eos_ids[0]

        def make_batch(probs: Sequence[Any], flawed: Any) -> tuple[np.ndarray, np.ndarray]:
            return llada_batch(probs, flawed, run.codec, run.prompt_bucket,
                               cfg.rollout.max_new_tokens, eos)
    else:
        def make_batch(probs: Sequence[Any], flawed: Any) -> tuple[np.ndarray, np.ndarray]:
            return sft_batch(probs, flawed, run.codec, length, cfg.rollout.max_new_tokens)
    post: dict[str, str] = {}
    for i in bar:
        probs = run.train_problems(1, i, cfg.sft.batch_size)
        flawed = coins.random(len(probs)) < cfg.sft.mistake_rate
        toks, lm = make_batch(probs, flawed)
        extra = (jax.random.fold_in(sft_key, i),) if run.is_llada else ()  # mask draws
        sft_params, sft_state, sm = run.fns.sft(sft_params, sft_state, jnp.asarray(toks),
                                                jnp.asarray(lm), *extra)
        log.steps_run = i + 1
        if stop is not None and stop():
            break
        if hasattr(bar, "set_postfix") and i % 20 == 0:
            post["loss"] = f"{float(sm['loss']):.3f}"
            bar.set_postfix(**post)
        if target > 0 and check is not None and (i + 1) % every == 0:
            acc = check(place(sft_params, model_shardings(run.fns)))
            log.checks.append({"step": i + 1, "accuracy": acc})
            post["val_acc"] = f"{acc:.3f}"
            if acc >= target:
                log.reached = True
                break
    if hasattr(bar, "close"):
        bar.close()
    return place(sft_params, model_shardings(run.fns))
