"""The jitted programs of diffu-GRPO with FP8 rollouts and every correction mode (LLaDA).

The diffusion counterpart of `ais_jax.training.steps` / `ais_jax.training.trainer`, with the same
`ais_jax.training.steps.StepFns` interface, so `ais_jax.training.rl`, `ais_jax.run.cli` and the
checkpoints drive both families.  One RL step (docs/llada.md)::

    params --rollout_params--> FP8 copy --generate--> responses [B, N]     (rollout)
        and, per inner iteration i (M = diffusion.inner_iterations), a prompt
        mask from key_i: FP8 estimate logp_roll[i] = estimator(FP8 copy, key_i)
    logp_old[i] = estimator(trainer params, key_i)   (same masks)           (score)
    for i in 0..M-1:                                                        (update)
        correction(logp_old[i], logp_roll[i], A)  ->  kept tokens, A_tilde
        one guarded clipped-GRPO step on estimator(params, key_i)

The estimator is `ais_jax.training.llada.estimator.completion_logprobs` (d1's one-step
estimate, model distribution at temperature 1).  Sharing ``key_i`` between the
FP8 copy and the trainer makes their ratio measure precision only; a fresh key
per inner iteration regularizes as in d1.  ``logp_old[i]`` is scored under the
params of the batch's rollout (before any update), as d1 does.

``diffusion.ratio: trajectory`` changes only the correction's pair: the sampler's
complete record of each revealed token (its log-prob at its reveal step plus its share
of the step's selection term, ``batch.traj_logp``) against the trainer's replay of the
same trajectory (`score`,
`ais_jax.training.llada.trajectory`), for every inner iteration; the surrogate keeps
the estimator's ``logp_old[i]`` (docs/llada.md "Two ratios") unless ``diffusion.surrogate:
trajectory``, which differentiates the replay itself (docs/llada.md "The trajectory
surrogate").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ais_jax.config.schema import Config
from ais_jax.method import grpo
from ais_jax.method.ais import ais_coefficient
from ais_jax.method.corrections import correction_weights
from ais_jax.models.llada.model import LLaDAConfig
from ais_jax.rollout.llada_sampler import completion_mask, generate
from ais_jax.training import optim
from ais_jax.training import sharding as shd
from ais_jax.training.llada.diagnostics import iteration_metrics, ratio_metrics, step_metrics
from ais_jax.training.llada.estimator import (
    completion_logprobs,
    logprobs_given_input,
    mask_prompt,
)
from ais_jax.training.llada.sft import sft_loss
from ais_jax.training.llada.trajectory import ReplayBatch, trajectory_logprobs
from ais_jax.training.optim import TrainState
from ais_jax.training.policy import cast_params


class DiffusionBatch(NamedTuple):
    """A sampled group batch of a LLaDA policy, ``B = prompts * G`` rows.

    Attributes:
      prompt_tokens: ``[B, P]`` left-padded prompts.
      prompt_mask: ``[B, P]`` 1 for real prompt tokens.
      tokens: ``[B, N]`` responses.
      mask: ``[B, N]`` float32, 1 up to and including the first EOS.
      logp: ``[M, B, N]`` float32 estimator log-probs under the rollout copy,
        one per inner iteration's prompt mask.
      mask_keys: ``[M, 2]`` uint32 raw keys of those prompt masks.
      traj_logp: ``[B, N]`` float32 the sampler's complete record of each response token:
        its log-prob at its reveal step plus its share of that step's selection term
        (`DiffusionSample.logprobs + DiffusionSample.select_logprobs`; a row sums to the
        trajectory's log-probability; the rollout side of ``diffusion.ratio: trajectory``).
      reveal_step: ``[B, N]`` int32 the global denoising step that revealed each token.
      traj_select: ``[B, N]`` float32 the selection part of ``traj_logp``
        (`DiffusionSample.select_logprobs`; for the ``traj/select_*`` diagnostics).
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    mask: jax.Array
    logp: jax.Array
    mask_keys: jax.Array
    traj_logp: jax.Array
    reveal_step: jax.Array
    traj_select: jax.Array


def _estimates(params: Any, lcfg: LLaDAConfig, batch: DiffusionBatch, keys: jax.Array,
               p_mask: float, mesh: Mesh | None = None) -> jax.Array:
    """``[M, B, N]`` estimator log-probs of ``batch.tokens``, one per raw key in ``keys``
    (``mesh``: for the TPU attention kernel on several devices)."""
    def one(k: jax.Array) -> jax.Array:
        return completion_logprobs(params, lcfg, batch.prompt_tokens, batch.tokens,
                                   jax.random.wrap_key_data(k), p_mask, batch.prompt_mask,
                                   mesh=mesh)
    return jax.lax.map(one, keys)


def rollout(params: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array, key: jax.Array,
            lcfg: LLaDAConfig, cfg: Config, eos_ids: tuple[int, ...],
            mesh: Mesh | None = None) -> DiffusionBatch:
    """Quantize (weight sync), denoise ``G`` responses per prompt, estimate their log-probs.

    Args:
      params: trainer params.
      prompt_tokens: ``[Pn, P]`` left-padded prompts.
      prompt_mask: ``[Pn, P]``.
      key: PRNG key of this step (sampling noise and the inner iterations' masks).
      lcfg: model config.
      cfg: the run config (rollout and diffusion sections).
      eos_ids: ids ending a response.
      mesh: the program's device mesh, for the TPU attention kernel on several devices
        (`ais_jax.models.llada.model.forward`); None: one device.

    Returns:
      `DiffusionBatch` with ``Pn * G`` rows.
    """
    from ais_jax.training.steps import rollout_params

    r, d = cfg.rollout, cfg.diffusion
    G, P = r.group_size, prompt_tokens.shape[1]
    rp = rollout_params(params, r)
    gkey, mkey = jax.random.split(key)
    out = generate(rp, lcfg, prompt_tokens, gkey, gen_length=r.max_new_tokens,
                   block_length=d.block_length, steps=d.steps, temperature=r.temperature,
                   remasking=d.remasking, num_samples=G, prompt_mask=prompt_mask, mesh=mesh)
    tokens = out.tokens[:, P:]
    keys = jax.random.key_data(jax.random.split(mkey, d.inner_iterations))  # [M, 2]
    batch = DiffusionBatch(jnp.repeat(prompt_tokens, G, axis=0),
                           jnp.repeat(prompt_mask, G, axis=0), tokens,
                           completion_mask(tokens, eos_ids).astype(jnp.float32),
                           jnp.zeros((0,), jnp.float32), keys, out.logprobs + out.select_logprobs,
                           out.reveal_step, out.select_logprobs)
    return batch._replace(logp=_estimates(rp, lcfg, batch, keys, d.p_mask, mesh))


def _model(params: Any, cfg: Config, view: Any = None, key: jax.Array | None = None) -> Any:
    """The model params of the state's ``params`` (LoRA: ``view(params, key)``, the adapters
    onto the frozen base, dropout masks with a ``key``) in the compute dtype."""
    from ais_jax.training.trainer import DTYPES

    if view is not None:
        params = view(params) if key is None else view(params, key)
    return cast_params(params, DTYPES[cfg.model.compute_dtype])


def _trainer_estimates(params: Any, batch: DiffusionBatch, lcfg: LLaDAConfig,
                       cfg: Config, view: Any = None, mesh: Mesh | None = None) -> jax.Array:
    """Detached estimates ``[M, B, N]`` of params in the compute dtype (batch's prompt masks)."""
    p = _model(params, cfg, view)
    est = _estimates(p, lcfg, batch, batch.mask_keys, cfg.diffusion.p_mask, mesh)
    return jax.lax.stop_gradient(est)


def score(params: Any, batch: DiffusionBatch, lcfg: LLaDAConfig, cfg: Config,
          view: Any = None,
          mesh: Mesh | None = None) -> jax.Array | tuple[jax.Array, jax.Array, jax.Array]:
    """Detached trainer log-probs of the batch (``logp_old``).

    ``diffusion.ratio: estimator``: the estimates ``[M, B, N]`` under the batch's prompt
    masks.  ``trajectory``: the triple ``(estimates [M, B, N], trajectory [B, N], selection
    [B, N])``, the second the replay of the sampler's trajectory (complete: token and
    selection parts), the third its selection part alone, under the params in the compute
    dtype (`ais_jax.training.llada.trajectory.trajectory_logprobs`, ``diffusion.steps``
    forwards); only this mode runs the replay.  ``view``: ``params -> model params``
    (LoRA, `ais_jax.training.lora_policy.view`; never with dropout), or None.  ``mesh``: the
    program's device mesh, for the TPU attention kernel on several devices, or None.
    """
    est = _trainer_estimates(params, batch, lcfg, cfg, view, mesh)
    if cfg.diffusion.ratio != "trajectory":
        return est
    p = _model(params, cfg, view)
    tok, sel = trajectory_logprobs(p, lcfg, batch.prompt_tokens, batch.tokens,
                                   batch.reveal_step, steps=cfg.diffusion.steps,
                                   temperature=cfg.rollout.temperature,
                                   block_length=cfg.diffusion.block_length,
                                   remasking=cfg.diffusion.remasking,
                                   prompt_mask=batch.prompt_mask, parts=True, mesh=mesh)
    return est, jax.lax.stop_gradient(tok + sel), jax.lax.stop_gradient(sel)


def scale_knobs(cfg: Config, lcfg: LLaDAConfig, mesh: Mesh | None) -> dict[str, Any]:
    """The estimator's scale keywords of the update (`logprobs_given_input`): the head chunk
    (``train.logprob_chunk``), the remat policy (``train.remat``, ``auto``: ``full`` for a
    pretrained source) and, with a mesh, batch-sharded activations and a vocab-parallel head."""
    from ais_jax.training.trainer import remat_policy

    return {"chunk": cfg.train.logprob_chunk, "remat": remat_policy(cfg),
            "constrain": None if mesh is None else shd.batch_constraint(mesh),
            "head_constrain": None if mesh is None
            else shd.head_constraint(mesh, lcfg.vocab_size)}


def update(state: TrainState, batch: DiffusionBatch, rewards: jax.Array, key: jax.Array,
           ref_params: Any, logp_old: jax.Array | None, optimizer: optax.GradientTransformation,
           lcfg: LLaDAConfig, cfg: Config, mesh: Mesh | None = None, *, view: Any = None,
           dropout_key: jax.Array | None = None) -> tuple[TrainState, dict[str, jax.Array]]:
    """Advantages -> per inner iteration: correction, one guarded clipped-GRPO step.

    The step's gradient runs the estimator at scale (`scale_knobs`: remat per
    block, the head in ``train.logprob_chunk`` chunks, batch-sharded activations
    with ``mesh``) and is accumulated over ``train.micro_batch_size``-row
    micro-batches when set (`ais_jax.training.optim.apply_update`; the prompt
    mask is drawn for the whole batch first, so the split changes nothing but
    summation order).

    Args:
      state: current `TrainState`.
      batch: the rollout (``B = Pn * G`` rows).
      rewards: ``[Pn, G]`` float32 rewards.
      key: unused (no minibatch shuffling; kept for the `StepFns` interface).
      ref_params: KL reference params, or None (no KL term).
      logp_old: `score`'s output (``[M, B, N]``; with ``diffusion.ratio: trajectory``
        the triple ``(estimates, trajectory [B, N], selection [B, N])``), or None (scored
        here).  The
        surrogate (`ais_jax.method.grpo.grpo_loss`) takes the estimates by default: the
        correction weights estimate the sampling mismatch (the trajectory pair when
        ``trajectory``: trainer replay over ``batch.traj_logp``, the same at every
        inner iteration), the surrogate estimates the gradient.  With
        ``diffusion.surrogate: trajectory`` the surrogate is the replay itself under
        gradient (``diffusion.steps`` forwards a pass; one step at a time under remat)
        against the score's replay, on the unmasked prompt; a KL term compares replays.
      optimizer: optax transformation.
      lcfg: model config.
      cfg: the run config (rollout, ais, train, diffusion).
      mesh: the trainer's mesh (activation constraints, row shards), or None.
      view: ``state.params -> model params`` (LoRA: the adapters onto the frozen base;
        ``ref_params`` are model params), or None (full fine-tuning).
      dropout_key: LoRA dropout: each optimizer step's loss forward runs ``view(params,
        key)`` with a fresh key (`ais_jax.training.optim.apply_update`); the score and the
        KL reference stay deterministic.  None: no dropout.

    Returns:
      ``(new_state, metrics)``: the AR family's metric names (means over the
      inner iterations; ``skipped`` summed), correction statistics included.
    """
    from ais_jax.training.trainer import loss_config

    del key
    B, N = batch.tokens.shape
    a, d = cfg.ais, cfg.diffusion
    adv_seq = grpo.group_advantages(rewards).reshape(B)
    adv_tok = jnp.broadcast_to(adv_seq[:, None], (B, N))
    valid = batch.mask > 0
    logp_old, traj_old, sel_old = _old_logprobs(state, batch, logp_old, lcfg, cfg, view)
    use_ref = ref_params is not None and cfg.train.beta_kl > 0
    traj_sur = d.surrogate == "trajectory"  # the config requires ratio=trajectory with it
    logp_ref = (_trainer_estimates(ref_params, batch, lcfg, cfg, mesh=mesh)
                if use_ref and not traj_sur else jnp.zeros_like(logp_old))
    loss_cfg = loss_config(cfg.train)
    scale = scale_knobs(cfg, lcfg, mesh)
    replay = _replay_fn(lcfg, cfg, scale["remat"] != "none", mesh)
    traj_ref = (jax.lax.stop_gradient(replay(_model(ref_params, cfg), batch))
                if use_ref and traj_sur else None)
    shards = 1 if mesh is None else shd.batch_divisor(mesh)
    micro = B // cfg.train.micro_batch_size if cfg.train.micro_batch_size else 1

    def inner(st: TrainState, xs: tuple[jax.Array, ...]) -> tuple[TrainState, dict]:
        lo, lr, lref, k = xs
        # The correction's pair: d1's estimates, or the trajectory's (trainer replay, sampler).
        c_old, c_roll = (lo, lr) if traj_old is None else (traj_old, batch.traj_logp)
        est = (None if traj_old is None
               else ais_coefficient(lo, lr, adv_tok, valid, C=a.C, mode="none"))
        res = correction_weights(c_old, c_roll, adv_tok, valid, mode=a.mode, cap=a.C,
                                 threshold=a.geo_threshold, delta=a.delta, gamma=a.gamma,
                                 beta_var=a.beta_var, eps=a.eps, use_ess=a.use_ess,
                                 use_mis=a.use_mis, use_var=a.use_var)
        gb = _loss_batch(res, batch, lo, lref if use_ref else None, k, traj_old, traj_ref,
                         lcfg, cfg)

        def loss_fn(params: Any, b: Any, totals: grpo.LossTotals | None = None,
                    key: jax.Array | None = None) -> tuple[jax.Array, dict]:
            model = _model(params, cfg, view, key)
            new = (replay(model, b) if traj_sur else logprobs_given_input(
                model, lcfg, b.prompt_tokens, b.tokens, b.prompt_mask, **scale))
            return grpo.grpo_loss(new, b.logp_old, b.advantages, b.mask, b.logp_ref, loss_cfg,
                                  totals)

        st, mets = optim.apply_update(st, gb, loss_fn, optimizer, micro_batches=micro,
                                      shards=shards, key=dropout_key)
        return st, {**mets, **iteration_metrics(res, valid, c_roll), **ratio_metrics(res, est)}

    state, mets = jax.lax.scan(inner, state, (logp_old, batch.logp, logp_ref, batch.mask_keys))
    return state, step_metrics(mets, rewards, adv_seq, valid, batch, traj_old, sel_old)


def _old_logprobs(state: TrainState, batch: DiffusionBatch, logp_old: Any, lcfg: LLaDAConfig,
                  cfg: Config, view: Any) -> tuple[jax.Array, Any, Any]:
    """`update`'s ``logp_old`` (scored here when None) as ``(estimates [M, B, N],
    trajectory [B, N] or None, selection [B, N] or None)``.

    Raises:
      ValueError: ``logp_old`` is not `score`'s output for ``diffusion.ratio``.
    """
    d = cfg.diffusion
    if logp_old is None:
        logp_old = score(state.params, batch, lcfg, cfg, view)
    if (isinstance(logp_old, tuple) and len(logp_old) == 3) != (d.ratio == "trajectory"):
        raise ValueError(f"logp_old must be score's output for diffusion.ratio={d.ratio} (the "
                         "triple (estimates, trajectory, selection) exactly when it is trajectory)")
    return logp_old if isinstance(logp_old, tuple) else (logp_old, None, None)


def _replay_fn(lcfg: LLaDAConfig, cfg: Config, remat: bool,
               mesh: Mesh | None = None) -> Callable[[Any, Any], jax.Array]:
    """``replay(model, batch) -> [rows, N]``: the trajectory surrogate's trainer replay of the
    batch's reveal order (`trajectory_logprobs`; one step at a time under remat)."""
    d = cfg.diffusion

    def replay(model: Any, b: Any) -> jax.Array:
        return trajectory_logprobs(model, lcfg, b.prompt_tokens, b.tokens, b.reveal_step,
                                   steps=d.steps, temperature=cfg.rollout.temperature,
                                   block_length=d.block_length, remasking=d.remasking,
                                   prompt_mask=b.prompt_mask, chunk=int(remat), remat=remat,
                                   mesh=mesh)

    return replay


def _loss_batch(res: Any, batch: DiffusionBatch, lo: jax.Array, lref: jax.Array | None,
                k: jax.Array, traj_old: jax.Array | None, traj_ref: jax.Array | None,
                lcfg: LLaDAConfig, cfg: Config) -> Any:
    """One inner iteration's loss batch: the correction ``res``'s keep mask and advantages
    with the surrogate's old log-probs (``lo``: the estimates; the score's replay with
    ``diffusion.surrogate: trajectory``) and the KL reference's (``lref`` / ``traj_ref``)."""
    keep = res.keep.astype(jnp.float32)
    if cfg.diffusion.surrogate == "trajectory":  # the replayed trajectory under gradient,
        # against the score's replay; a selection term of probability 0 under the trainer
        # (or the KL reference) is -inf: its tokens' importance ratio is 0, left out
        # (exp(-inf - -inf) is NaN)
        ok = jnp.isfinite(traj_old) & (True if traj_ref is None else jnp.isfinite(traj_ref))
        return ReplayBatch(batch.prompt_tokens, batch.prompt_mask, batch.tokens,
                           keep * ok.astype(keep.dtype), traj_old, res.advantages, traj_ref,
                           batch.reveal_step)
    # the iteration's prompt mask over the whole batch (the score's), before a split
    masked, _ = mask_prompt(jax.random.wrap_key_data(k), batch.prompt_tokens, lcfg,
                            cfg.diffusion.p_mask, batch.prompt_mask)
    return grpo.GRPOBatch(masked, batch.prompt_mask, batch.tokens, keep, lo, res.advantages,
                          lref)


def shardings(mesh: Mesh, cfg: Config) -> tuple[Any, Any, NamedSharding, NamedSharding]:
    """``(DiffusionBatch shardings, logp_old's, rows [B, ...], replicated)`` over ``mesh``."""
    rep = shd.replicated(mesh)
    b2 = shd.batch_sharding(mesh, 2)
    b_it = NamedSharding(mesh, PartitionSpec(None, shd.BATCH_AXES, None))  # [M, B, N]
    batch_sh = DiffusionBatch(b2, b2, b2, b2, b_it, rep, b2, b2, b2)
    # score's logp_old: [M, B, N], or (estimates, trajectory [B, N], selection [B, N]) with
    # diffusion.ratio=trajectory
    old_sh = (b_it, b2, b2) if cfg.diffusion.ratio == "trajectory" else b_it
    return batch_sh, old_sh, b2, rep


def build_step_fns(state: TrainState, mesh: Mesh, optimizer: optax.GradientTransformation,
                   sft_optimizer: optax.GradientTransformation | None, lcfg: LLaDAConfig,
                   cfg: Config, eos_ids: tuple[int, ...], pad_id: int | None,
                   lora_cfg: Any = None) -> Any:
    """Jitted rollout / score / update / SFT programs of a LLaDA policy
    (`ais_jax.training.steps.StepFns`).

    The SFT program is ``(params, opt_state, tokens, loss_mask, key)``
    (`ais_jax.training.llada.sft.sft_loss`); the others have the AR family's signatures,
    with a `DiffusionBatch` in place of the `ais_jax.training.steps.RolloutBatch`.
    ``lora_cfg``: the state's params are adapters (shardings only; LoRA's programs are
    `ais_jax.training.llada.lora_steps.build_lora_step_fns`).
    """
    from ais_jax.training.steps import StepFns, state_shardings

    st_sh = state_shardings(state, mesh, lora_cfg)
    batch_sh, old_sh, b2, rep = shardings(mesh, cfg)

    rollout_jit = jax.jit(
        lambda params, pt, pm, key: rollout(params, pt, pm, key, lcfg, cfg, eos_ids, mesh),
        in_shardings=(st_sh.params, b2, b2, rep), out_shardings=batch_sh)
    score_jit = jax.jit(lambda params, batch: score(params, batch, lcfg, cfg, mesh=mesh),
                        in_shardings=(st_sh.params, batch_sh), out_shardings=old_sh)
    ref_sh = st_sh.params if cfg.train.beta_kl > 0 else None

    def update_fn(state, batch, rewards, key, ref_params, logp_old):
        return update(state, batch, rewards, key, ref_params, logp_old, optimizer, lcfg, cfg,
                      mesh)

    update_jit = jax.jit(update_fn, in_shardings=(st_sh, batch_sh, b2, rep, ref_sh, old_sh),
                         out_shardings=(st_sh, rep), donate_argnums=(0,))
    sft_jit = None
    if sft_optimizer is not None:
        from ais_jax.training.trainer import DTYPES

        cdt = DTYPES[cfg.model.compute_dtype]

        def sft_fn(params, opt_state, tokens, loss_mask, key):
            (loss, aux), g = jax.value_and_grad(sft_loss, has_aux=True)(
                params, tokens, loss_mask, key, lcfg, pad_id, cdt, mesh)
            updates, opt_state = sft_optimizer.update(g, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, {"loss": loss, **aux}

        sft_jit = jax.jit(sft_fn, donate_argnums=(0, 1))
    return StepFns(rollout_jit, score_jit, update_jit, sft_jit, st_sh, b2, True)
