"""One RL step on the host side: rollout -> decode -> rewards -> update, as one plain function.

`make_rl_step(run, ref_params)` returns ``rl_step(state, problems, key) ->
(state, record)``::

    prompts  = codec.encode_batch(problems, P)                     # [Pn, P] left-padded (P grows)
    batch    = fns.rollout(state.params, prompts, rollout_key)     # G samples per prompt
    logp_old = fns.score(state.params, batch)                      # dispatched, overlaps host
                                                                   # (when needed, see below)
    texts    = codec.decode(batch.tokens, batch.mask)              # host
    rewards  = task verifier (once per completion) + user rewards  # host, [Pn, G]
    state, m = fns.update(state, batch, rewards, update_key, ref, logp_old)  # AIS, GRPO

When the update takes ``logp_old`` from its own forward (``fns.score_for_update``
False), ``fns.score`` runs only on steps given ``on_samples`` (the completions
table, `ais_jax.run.trackers`), which receives the step's per-row samples.

``record`` holds the training accuracy (share of verified completions) and
every metric of the update (docs/spec.md section 5: reward, d_bar, ESS ratio,
alpha and its parts, loss, ...), and with ``log.timing`` where the step's time
went (`ais_jax.training.flops.perf_record`, docs/performance.md).  The CLI loop
(`ais_jax.run.cli`) adds the step number, the step's wall time and evaluations,
and logs it.

Timing adds no device sync: the marks are taken where the host already waits.
``timing_s/rollout`` runs from the rollout's dispatch to its tokens and mask on
the host (the weight sync / FP8 quantization inside the rollout program, the
transfer, and on the first step or a new prompt bucket the compilation of the
rollout and score programs); ``timing_s/host`` is the prompt encoding before it
plus everything from the tokens on the host to the update's dispatch (decode to
text, verification, user rewards, the completions table's logp_old transfer);
``timing_s/update`` runs from the update's dispatch to its metrics on the host
(with what remains of the logp_old forward, dispatched before the host work and
overlapping it, and the update's compilation on its first call).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ais_jax.core.errors import UsageError
from ais_jax.method.ais import ais_coefficient
from ais_jax.method.corrections import ratio_stats
from ais_jax.rollout.sampler import bucket_length
from ais_jax.tasks import RewardConfig, score_batch
from ais_jax.tasks.user_rewards import score_rewards
from ais_jax.training.build import Run
from ais_jax.training.flops import StepTimes, grpo_step_flops, perf_record
from ais_jax.training.optim import TrainState
from ais_jax.training.placement import combine_rows, owned_rows, rows_to_host, to_global


def grow_prompt_bucket(run: Run, longest: int) -> int:
    """Grow ``run.prompt_bucket`` to fit a prompt of ``longest`` tokens; return the bucket.

    Buckets only grow, through a bounded set (`ais_jax.rollout.sampler.bucket_length`:
    powers of two up to 512, then multiples of 16), and each new bucket
    compiles the rollout and update programs once.  The bucket is saved with
    every checkpoint, so a resumed run starts from it.

    Raises:
      UsageError: the prompt plus ``rollout.max_new_tokens`` exceeds the
        model's positions.
    """
    if longest <= run.prompt_bucket:
        return run.prompt_bucket
    n_new, max_pos = run.cfg.rollout.max_new_tokens, run.model_cfg.max_position_embeddings
    if longest + n_new > max_pos:
        raise UsageError(f"a training prompt has {longest} tokens; with rollout.max_new_tokens="
                         f"{n_new} that exceeds the model's {max_pos} positions; lower "
                         "rollout.max_new_tokens or shorten the prompts")
    run.prompt_bucket = min(bucket_length(longest), max_pos - n_new)
    return run.prompt_bucket


class Pending(NamedTuple):
    """A dispatched rollout, not yet learned from (`RLStep.sample`)."""

    problems: list[Any]  # the Pn problems of the step it is for
    batch: Any  # trainer.RolloutBatch (LLaDA: its own batch) of device arrays, maybe in flight
    t_start: float  # clock at the prompt encoding (0 without log.timing)
    t_rollout: float  # clock at the rollout's dispatch
    ahead: bool  # sampled for a later step (rollout.staleness >= 1)
    params: Any = None  # a copy of the sampler's params (log.split_mismatch), else None


class RLStep:
    """The run's RL step, and its two halves for pipelined sampling (``rollout.staleness``).

    ``rl_step(state, problems, key, on_samples)`` samples with ``state.params`` and learns
    from that batch at once (the synchronous step).  ``sample(params, problems, key)``
    dispatches a rollout and returns a `Pending` batch; ``learn(state, pending, key,
    on_samples)`` scores it and updates.  With staleness ``k`` the loop samples step
    ``t + k``'s batch with the params of step ``t`` and then learns step ``t``'s.
    """

    def __init__(self, sample: Callable[..., Pending],
                 learn: Callable[..., tuple[TrainState, dict[str, float]]]) -> None:
        self.sample, self.learn = sample, learn

    def __call__(self, state: TrainState, problems: Sequence[Any], key: jax.Array,
                 on_samples: OnSamples | None = None) -> tuple[TrainState, dict[str, float]]:
        """Sample G completions for each of ``problems`` with ``state.params``, score them,
        update ``state``; see ``learn`` for the arguments and the record."""
        return self.learn(state, self.sample(state.params, problems, key), key, on_samples)


# on_samples(prompts, completions, rewards [n], ratio_stats, rows [n]): the step's rows this
# process scored (all B with one process; `ais_jax.training.placement.owned_rows`), on the host
OnSamples = Callable[[list[str], list[str], np.ndarray, dict[str, np.ndarray], np.ndarray],
                     None]


def make_rl_step(run: Run, ref_params: Any = None) -> RLStep:
    """The run's RL step; ``ref_params`` is the KL reference policy (None: no KL term)."""
    parts = _StepParts(run, ref_params)
    return RLStep(parts.sample, parts.learn)


def _truncated(logp: Any) -> Any:
    """The log-probs the correction compares: the truncated one of a ``(truncated, full)``
    pair (`ais_jax.training.trainer.score` with top-k / top-p), else ``logp`` itself."""
    return logp[0] if isinstance(logp, tuple) else logp


@functools.partial(jax.jit, static_argnames="C")
def split_stats(logp_cur: Any, logp_stale: Any, logp_rollout: jax.Array, mask: jax.Array,
                C: float) -> dict[str, jax.Array]:
    """d_bar and ESS of the two parts of the mismatch (``log.split_mismatch``, docs/spec.md
    section 9), with `ais_coefficient`'s ``mode="none"`` statistics at cap ``C``.

    The quantization part compares the sampler's params in BF16 with its FP8 copy, the
    staleness part the current params with the sampler's, both BF16.  With top-k / top-p
    the trainer's log-probs come as ``(truncated, full)`` pairs and the truncated ones are
    compared, as by the correction.  A valid token outside the stale params' truncated set
    (``logp_stale = -inf``) enters the quantization part with ratio 0 and is left out of
    the staleness part (``-inf - -inf`` has no ratio); both parts stay finite.

    Args:
      logp_cur: ``[B, N]`` trainer log-probs under the current params, or the pair.
      logp_stale: ``[B, N]`` trainer log-probs under the sampler's params, or the pair.
      logp_rollout: ``[B, N]`` the sampler's recorded log-probs.
      mask: ``[B, N]`` 1 on valid completion tokens.
      C: the ratio cap (``ais.C``).

    Returns:
      ``mismatch/{quant,stale}_{d_bar,ess}``: float32 scalars.
    """
    cur, stale = _truncated(logp_cur), _truncated(logp_stale)
    valid = mask > 0
    zero = jnp.zeros_like(logp_rollout)
    q = ais_coefficient(stale, logp_rollout, zero, valid, C=C, mode="none")
    s = ais_coefficient(cur, stale, zero, valid & ~jnp.isneginf(stale), C=C, mode="none")
    return {"mismatch/quant_d_bar": q.d_bar, "mismatch/quant_ess": q.ess_ratio,
            "mismatch/stale_d_bar": s.d_bar, "mismatch/stale_ess": s.ess_ratio}


def sample_logps(logp_old: Any, batch: Any, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This process's ``rows`` of the trainer's and the sampler's log-probs, as the correction
    compares them (for `ais_jax.method.corrections.ratio_stats`), on the host.

    Args:
      logp_old: the trainer's score of ``batch``: ``[B, N]``, the ``(truncated, full)`` pair
        (top-k / top-p), LLaDA's ``[M, B, N]`` estimates (the first is taken) or, with
        ``diffusion.ratio=trajectory``, its ``(estimates, trajectory)`` pair.
      batch: the rollout (``logp``; LLaDA's ``traj_logp``).
      rows: the rows this process owns.

    Returns:
      ``(logp_old, logp_rollout)``, each ``[len(rows), N]``.
    """
    if isinstance(logp_old, tuple) and hasattr(batch, "traj_logp"):  # LLaDA, trajectory
        return rows_to_host(logp_old[1], rows), rows_to_host(batch.traj_logp, rows)
    if batch.logp.ndim == 3:  # LLaDA: [M, B, N], one estimate per inner iteration
        return (rows_to_host(logp_old, rows, axis=1)[0],
                rows_to_host(batch.logp, rows, axis=1)[0])
    return rows_to_host(_truncated(logp_old), rows), rows_to_host(batch.logp, rows)


class _StepParts:
    """`make_rl_step`'s two halves (`RLStep.sample`, `RLStep.learn`) and the run's settings
    they share."""

    def __init__(self, run: Run, ref_params: Any) -> None:
        cfg = run.cfg
        self.run, self.ref_params, self.cfg, self.fns = run, ref_params, cfg, run.fns
        self.G = cfg.rollout.group_size
        self.reward_cfg = RewardConfig(correct_weight=cfg.reward.task_weight,
                                       format_weight=cfg.train.reward_format_weight)
        self.weights = np.asarray([r.weight for r in run.rewards], np.float32)
        self.timing = cfg.log.timing
        self.clock = time.perf_counter if self.timing else _no_clock
        self.kl = ref_params is not None and cfg.train.beta_kl > 0
        self.device, self.num_devices = ((jax.devices()[0], jax.device_count())
                                         if self.timing else (None, 0))
        self.split = cfg.log.split_mismatch

    def sample(self, params: Any, problems: Sequence[Any], key: jax.Array,
               ahead: bool = False) -> Pending:
        """Dispatch the rollout of ``problems`` with ``params`` (returns before it runs).

        Args:
          params: the policy to sample from (a stale copy with ``rollout.staleness``).
          problems: ``Pn`` task problems of the step the batch is for.
          key: that step's PRNG key (its rollout half is used).
          ahead: sampled for a later step (``rollout.staleness``): that step's timing then
            starts when it is learned from.
        """
        run, sh = self.run, self.fns.batch_sharding
        t_start = self.clock()
        rkey, _ = jax.random.split(key)
        seqs = [run.codec.encode_prompt(p) for p in problems]
        grow_prompt_bucket(run, max(len(s) for s in seqs))
        pt, pm = run.codec.pad(seqs, run.prompt_bucket)
        t_rollout = self.clock()
        batch = self.fns.rollout(params, to_global(pt, sh), to_global(pm, sh), rkey)
        kept = jax.tree.map(jnp.copy, params) if self.split and ahead else None  # donated
        return Pending(list(problems), batch, t_start, t_rollout, ahead, kept)

    def learn(self, state: TrainState, pending: Pending, key: jax.Array,
              on_samples: OnSamples | None = None) -> tuple[TrainState, dict[str, float]]:
        """Score ``pending``'s completions and update ``state`` with them.

        Args:
          state: the train state (donated to the update); its params are the proximal
            policy (``logp_old``), whatever policy sampled the batch.
          pending: the step's dispatched rollout (`sample`).
          key: this step's PRNG key (its update half is used).
          on_samples: called with this step's prompts, completions, rewards,
            `ais_jax.method.corrections.ratio_stats` and row numbers (an extra logp_old
            forward when the update does not need one); None: nothing extra.

        Returns:
          ``(new_state, record)``: ``record`` maps metric names to floats (with
          ``log.timing``, `ais_jax.training.flops.TIMING_KEYS` too: see the module
          docstring for what each interval holds).
        """
        fns, batch = self.fns, pending.batch
        t_start, t_rollout = pending.t_start, pending.t_rollout
        if pending.ahead:
            t_start = t_rollout = self.clock()
        _, ukey = jax.random.split(key)
        # Dispatched now, so the trainer's logp_old forward runs while the host
        # decodes and verifies (unless the update takes it from its own forward).
        split_now = pending.params is not None
        need = fns.score_for_update or on_samples is not None or split_now
        logp_old = fns.score(state.params, batch) if need else None
        # log.split_mismatch: the trainer's forward with the sampler's own (stale) params
        split_met = split_stats(logp_old, fns.score(pending.params, batch), batch.logp,
                                batch.mask, C=self.cfg.ais.C) if split_now else {}
        rows = owned_rows(batch.tokens)  # this process's rows (all of them with one process)
        toks, msk = rows_to_host(batch.tokens, rows), rows_to_host(batch.mask, rows)
        t_tokens = self.clock()
        texts = [self.run.codec.decode(toks[i], msk[i]) for i in range(toks.shape[0])]
        every = [p for p in pending.problems for _ in range(self.G)]
        flat = [every[i] for i in rows]
        scores = self._score_rows(texts, flat, msk.sum(1), rows, len(every))
        rewards, user = scores[:, 0], scores[:, 3:]
        rewards = rewards + user @ self.weights if self.run.rewards else rewards
        rewards_g = to_global(rewards.reshape(len(pending.problems), self.G),
                              fns.batch_sharding)
        if on_samples is not None:  # before the update: state is donated to it
            stats = ratio_stats(*sample_logps(logp_old, batch, rows), msk)
            on_samples([self.run.codec.prompt_text(p) for p in flat], texts, rewards[rows],
                       stats, rows)
        t_update = self.clock()
        state, met = fns.update(state, batch, rewards_g, ukey, self.ref_params,
                                logp_old if fns.score_for_update else None)
        record = {"accuracy": float(np.mean(scores[:, 1] > 0))}
        record.update({k: float(v) for k, v in jax.device_get({**met, **split_met}).items()})
        if self.timing:
            times = StepTimes(t_start, t_rollout, t_tokens, t_update, time.perf_counter())
            record.update(self._timing_record(times, scores, batch.prompt_tokens.shape[1]))
        record.update({f"reward/{r.name}": float(user[:, j].mean())
                       for j, r in enumerate(self.run.rewards)})
        return state, record

    def _score_rows(self, texts: list[str], flat: list[Any], lengths: np.ndarray,
                    rows: np.ndarray, total: int) -> np.ndarray:
        """``[total, 3 + F]`` float32 of the whole batch: task reward, verdict (0 / 1),
        completion tokens and the unweighted user rewards.  This process scores only its
        own ``rows`` (whose completions are ``texts``, problems ``flat``, token counts
        ``lengths``); `combine_rows` brings every process's rows together, and an error on
        one process stops all of them with its line."""
        run = self.run
        try:
            task_r, ok = score_batch(run.task, texts, flat, self.reward_cfg)
            user = score_rewards(run.rewards, texts, flat,  # [n, F] unweighted, checked
                                 timeout_s=self.cfg.reward.timeout_s)
            mine = np.column_stack([task_r, ok.astype(np.float32), lengths, user])
            error = ""
        except Exception as e:  # a peer must not wait for a process that failed alone
            if jax.process_count() == 1:
                raise
            mine, error = None, " ".join(str(e).split()) or type(e).__name__
        return combine_rows(mine, rows, total, 3 + len(run.rewards), error)

    def _timing_record(self, times: StepTimes, scores: np.ndarray,
                       prompt_len: int) -> dict[str, float]:
        """``log.timing``'s metrics of one step (`ais_jax.training.flops.perf_record`)."""
        flops = grpo_step_flops(self.cfg, self.run.model_cfg, prompt_len,
                                int(scores[:, 2].max()), kl=self.kl,
                                score_separately=self.fns.score_for_update)
        return perf_record(times, float(scores[:, 2].sum(dtype=np.float64)), flops,
                           self.device, self.num_devices)


def _no_clock() -> float:
    """The clock of ``log.timing=false``: no time is read."""
    return 0.0
