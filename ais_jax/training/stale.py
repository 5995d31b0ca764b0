"""Asynchronous rollouts (``rollout.staleness = k``): the batch of step t is sampled by the
params of step t - k, while the trainer works on earlier batches.

`StaleRollouts` keeps the ``k`` dispatched, not yet learned-from batches in order.  At step
``t`` it first dispatches the rollout of step ``t + k`` with the current params (before the
update donates them), then learns from step ``t``'s batch, which was sampled ``k`` updates
ago::

    fill:   batch[s] = sample(params_0, problems(s), key(s))           s = 0 .. k-1
    step t: batch[t+k] = sample(params_t, problems(t+k), key(t+k))     (dispatched, async)
            params_{t+1} = learn(params_t, batch[t])                    (host work overlaps)

The first ``k`` steps therefore sample from the initial policy.  Each batch keeps its own
step's problems and PRNG key, so a run with staleness ``k`` equals a sequential run that
samples step ``t`` with the params of step ``max(t - k, 0)`` (tests/test_stale.py).  The
correction sees the stale sampler's log-probs as the behaviour policy and the trainer's
current params as the proximal policy (`ais_jax.training.trainer.update`'s ``logp_old``),
as decoupled PPO does: staleness and quantization are one mismatch (docs/spec.md
section 9).

The in-flight batches travel with every checkpoint (`payload`, `target`), so a resumed run
learns from the same batches as an uninterrupted one.  The last ``k`` steps of a run also
sample the batches of the ``k`` steps after its end (they overlap the last updates; the
final checkpoint holds them): a finished run resumed with a larger ``train.steps`` learns
from exactly the batches a run started with that many steps does.  Only a checkpoint
written without them (before this rule) finds fewer than ``k``; the missing ones are then
sampled from the restored params, and the run says so.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ais_jax.training.rl import OnSamples, Pending, RLStep
from ais_jax.training.trainer import RolloutBatch

# checkpoint metadata: each in-flight batch's padded prompt length and leaf dtypes
META_KEY = "inflight_batches"


class StaleRollouts:
    """The in-flight rollouts of a run with ``rollout.staleness = k >= 1``.

    Args:
      rl_step: the run's `ais_jax.training.rl.RLStep`.
      problems: ``problems(step) -> list`` of the step's problems.
      key: ``key(step) -> PRNG key`` of the step.
      steps: ``train.steps`` (the last ``k`` steps sample the ``k`` steps past it, kept for
        a resume that raises it).
      k: the staleness.
    """

    def __init__(self, rl_step: RLStep, problems: Callable[[int], Sequence[Any]],
                 key: Callable[[int], jax.Array], steps: int, k: int) -> None:
        self.rl_step, self.problems, self.key, self.steps, self.k = rl_step, problems, key, \
            steps, k
        self.queue: collections.deque[Pending] = collections.deque()

    def _sample(self, params: Any, step: int) -> Pending:
        return self.rl_step.sample(params, self.problems(step), self.key(step), ahead=True)

    def fill(self, params: Any, start: int, restored: Sequence[RolloutBatch] = ()) -> str:
        """Put the batches of steps ``start .. start + k - 1`` in flight.

        Args:
          params: the current params (used for batches not in ``restored``).
          start: the first step to learn.
          restored: the in-flight batches of the checkpoint resumed from, in order.

        Returns:
          The line to print: which steps learn from the initial policy (a fresh start), or
          how many batches a resume sampled from the restored policy; ``""`` when none.
        """
        self.queue.clear()
        for i, batch in enumerate(restored):
            self.queue.append(Pending(list(self.problems(start + i)), batch, 0.0, 0.0, True))
        new = range(start + len(self.queue), start + self.k)
        for step in new:
            self.queue.append(self._sample(params, step))
        if start == 0:
            return (f"rollout.staleness={self.k}: steps 1-{min(self.k, self.steps)} learn from "
                    "batches sampled by the initial policy")
        if len(new):
            return (f"rollout.staleness={self.k}: the checkpoint held {len(restored)} batch(es) "
                    f"in flight; {len(new)} more sampled from the restored policy (train.steps "
                    "was raised)")
        return ""

    def step(self, state: Any, step: int,
             on_samples: OnSamples | None = None) -> tuple[Any, dict[str, float]]:
        """RL step ``step``: dispatch step ``step + k``'s rollout with ``state.params``, then
        learn from step ``step``'s batch; ``(new_state, record)`` as `RLStep.learn`.  Near the
        end the batch dispatched is for a step past ``train.steps``: the final checkpoint
        keeps it for a resume that raises ``train.steps``."""
        self.queue.append(self._sample(state.params, step + self.k))
        return self.rl_step.learn(state, self.queue.popleft(), self.key(step), on_samples)

    def payload(self) -> tuple[RolloutBatch, ...]:
        """The in-flight batches, oldest first (saved with the train state)."""
        return tuple(p.batch for p in self.queue)

    def metadata(self) -> list[dict[str, Any]]:
        """Each in-flight batch's padded prompt length and leaf dtypes (`META_KEY`)."""
        return [{"prompt_len": int(p.batch.prompt_tokens.shape[1]),
                 "dtypes": [str(x.dtype) for x in p.batch]} for p in self.queue]


def target(meta: dict[str, Any], rows: int, new_tokens: int,
           sharding: Any) -> tuple[RolloutBatch, ...]:
    """Abstract in-flight batches of a checkpoint (its `META_KEY`), to restore into.

    Args:
      meta: the checkpoint's metadata.
      rows: ``B`` (prompts_per_step * group_size).
      new_tokens: ``N`` (rollout.max_new_tokens).
      sharding: the batch sharding (rows over the mesh).

    Returns:
      One `RolloutBatch` of ``jax.ShapeDtypeStruct`` per stored batch.
    """
    import numpy as np

    out = []
    for b in meta.get(META_KEY, []):
        cols = (b["prompt_len"], b["prompt_len"], new_tokens, new_tokens, new_tokens)
        out.append(RolloutBatch(*(jax.ShapeDtypeStruct((rows, c), np.dtype(d), sharding=sharding)
                                  for c, d in zip(cols, b["dtypes"], strict=True))))
    return tuple(out)


def restore_target(base: Any, meta: dict[str, Any], cfg: Any, sharding: Any) -> Any:
    """The restore target of a checkpoint: ``base`` (the train state's payload), with the
    in-flight batches its metadata lists (`target`) when it holds any.

    The structure follows the checkpoint, not ``cfg``: a resume that changes
    ``rollout.staleness`` restores, and is then refused by the config check with one line.
    """
    r = cfg.rollout
    batches = target(meta, r.prompts_per_step * r.group_size, r.max_new_tokens, sharding)
    return {"train": base, "inflight": batches} if batches else base
