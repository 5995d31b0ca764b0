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
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ais_jax.config.schema import Config
from ais_jax.method import grpo
from ais_jax.method.corrections import correction_weights
from ais_jax.models.llada.model import LLaDAConfig
from ais_jax.rollout.llada_sampler import completion_mask, generate
from ais_jax.training import optim
from ais_jax.training import sharding as shd
from ais_jax.training.llada.estimator import completion_logprobs
from ais_jax.training.llada.sft import sft_loss
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
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    mask: jax.Array
    logp: jax.Array
    mask_keys: jax.Array


def _estimates(params: Any, lcfg: LLaDAConfig, batch: DiffusionBatch, keys: jax.Array,
               p_mask: float) -> jax.Array:
    """``[M, B, N]`` estimator log-probs of ``batch.tokens``, one per raw key in ``keys``."""
    def one(k: jax.Array) -> jax.Array:
        return completion_logprobs(params, lcfg, batch.prompt_tokens, batch.tokens,
                                   jax.random.wrap_key_data(k), p_mask, batch.prompt_mask)
    return jax.lax.map(one, keys)


def rollout(params: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array, key: jax.Array,
            lcfg: LLaDAConfig, cfg: Config, eos_ids: tuple[int, ...]) -> DiffusionBatch:
    """Quantize (weight sync), denoise ``G`` responses per prompt, estimate their log-probs.

    Args:
      params: trainer params.
      prompt_tokens: ``[Pn, P]`` left-padded prompts.
      prompt_mask: ``[Pn, P]``.
      key: PRNG key of this step (sampling noise and the inner iterations' masks).
      lcfg: model config.
      cfg: the run config (rollout and diffusion sections).
      eos_ids: ids ending a response.

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
                   remasking=d.remasking, num_samples=G, prompt_mask=prompt_mask)
    tokens = out.tokens[:, P:]
    keys = jax.random.key_data(jax.random.split(mkey, d.inner_iterations))  # [M, 2]
    batch = DiffusionBatch(jnp.repeat(prompt_tokens, G, axis=0),
                           jnp.repeat(prompt_mask, G, axis=0), tokens,
                           completion_mask(tokens, eos_ids).astype(jnp.float32),
                           jnp.zeros((0,), jnp.float32), keys)
    return batch._replace(logp=_estimates(rp, lcfg, batch, keys, d.p_mask))


def score(params: Any, batch: DiffusionBatch, lcfg: LLaDAConfig, cfg: Config) -> jax.Array:
    """Detached trainer estimates ``[M, B, N]`` under the batch's prompt masks."""
    from ais_jax.training.trainer import DTYPES

    p = cast_params(params, DTYPES[cfg.model.compute_dtype])
    return jax.lax.stop_gradient(_estimates(p, lcfg, batch, batch.mask_keys, cfg.diffusion.p_mask))


def _iteration_metrics(res: Any, valid: jax.Array, logp_roll: jax.Array) -> dict[str, jax.Array]:
    keep = res.keep
    return {
        "loss_tokens": jnp.sum(keep).astype(jnp.float32),
        "dropped_tokens": jnp.sum(valid & ~keep).astype(jnp.float32),
        "logp_rollout_mean": jnp.sum(jnp.where(valid, logp_roll, 0.0))
        / jnp.maximum(jnp.sum(valid), 1),
        **res.stats(),
    }


def update(state: TrainState, batch: DiffusionBatch, rewards: jax.Array, key: jax.Array,
           ref_params: Any, logp_old: jax.Array | None, optimizer: optax.GradientTransformation,
           lcfg: LLaDAConfig, cfg: Config) -> tuple[TrainState, dict[str, jax.Array]]:
    """Advantages -> per inner iteration: correction, one guarded clipped-GRPO step.

    Args:
      state: current `TrainState`.
      batch: the rollout (``B = Pn * G`` rows).
      rewards: ``[Pn, G]`` float32 rewards.
      key: unused (no minibatch shuffling; kept for the `StepFns` interface).
      ref_params: KL reference params, or None (no KL term).
      logp_old: ``[M, B, N]`` from `score`, or None (scored here).
      optimizer: optax transformation.
      lcfg: model config.
      cfg: the run config (rollout, ais, train, diffusion).

    Returns:
      ``(new_state, metrics)``: the AR family's metric names (means over the
      inner iterations; ``skipped`` summed), correction statistics included.
    """
    from ais_jax.training.trainer import DTYPES, loss_config

    del key
    B, N = batch.tokens.shape
    a, d = cfg.ais, cfg.diffusion
    cdt = DTYPES[cfg.model.compute_dtype]
    adv_seq = grpo.group_advantages(rewards).reshape(B)
    adv_tok = jnp.broadcast_to(adv_seq[:, None], (B, N))
    valid = batch.mask > 0
    if logp_old is None:
        logp_old = score(state.params, batch, lcfg, cfg)
    use_ref = ref_params is not None and cfg.train.beta_kl > 0
    logp_ref = (score(ref_params, batch, lcfg, cfg) if use_ref
                else jnp.zeros_like(logp_old))
    loss_cfg = loss_config(cfg.train)

    def inner(st: TrainState, xs: tuple[jax.Array, ...]) -> tuple[TrainState, dict]:
        lo, lr, lref, k = xs
        res = correction_weights(lo, lr, adv_tok, valid, mode=a.mode, cap=a.C,
                                 threshold=a.geo_threshold, delta=a.delta, gamma=a.gamma,
                                 beta_var=a.beta_var, eps=a.eps, use_ess=a.use_ess,
                                 use_mis=a.use_mis, use_var=a.use_var)
        keep = res.keep.astype(jnp.float32)

        def loss_fn(params: Any, b: DiffusionBatch) -> tuple[jax.Array, dict]:
            new = completion_logprobs(cast_params(params, cdt), lcfg, b.prompt_tokens, b.tokens,
                                      jax.random.wrap_key_data(k), d.p_mask, b.prompt_mask)
            return grpo.grpo_loss(new, lo, res.advantages, keep, lref if use_ref else None,
                                  loss_cfg)

        st, mets = optim.apply_update(st, batch, loss_fn, optimizer)
        return st, {**mets, **_iteration_metrics(res, valid, lr)}

    state, mets = jax.lax.scan(inner, state, (logp_old, batch.logp, logp_ref, batch.mask_keys))
    skipped = jnp.sum(mets.pop("skipped"))
    mets = {k: jnp.mean(v) for k, v in mets.items()}
    mets.pop("ratio_mean", None)
    return state, {
        **mets, "skipped": skipped,
        "reward_mean": jnp.mean(rewards), "reward_std": jnp.std(rewards),
        "adv_abs_mean": jnp.mean(jnp.abs(adv_seq)),
        "response_len": jnp.mean(jnp.sum(valid, axis=1).astype(jnp.float32)),
        "zero_prob_tokens": jnp.zeros((), jnp.float32),
    }


def build_step_fns(state: TrainState, mesh: Mesh, optimizer: optax.GradientTransformation,
                   sft_optimizer: optax.GradientTransformation | None, lcfg: LLaDAConfig,
                   cfg: Config, eos_ids: tuple[int, ...], pad_id: int | None) -> Any:
    """Jitted rollout / score / update / SFT programs of a LLaDA policy
    (`ais_jax.training.steps.StepFns`).

    The SFT program is ``(params, opt_state, tokens, loss_mask, key)``
    (`ais_jax.training.llada.sft.sft_loss`); the others have the AR family's signatures,
    with a `DiffusionBatch` in place of the `ais_jax.training.steps.RolloutBatch`.
    """
    from ais_jax.training.steps import StepFns, state_shardings

    st_sh = state_shardings(state, mesh)
    rep = shd.replicated(mesh)
    b2 = shd.batch_sharding(mesh, 2)
    b_it = NamedSharding(mesh, PartitionSpec(None, shd.BATCH_AXES, None))  # [M, B, N]
    batch_sh = DiffusionBatch(b2, b2, b2, b2, b_it, rep)

    rollout_jit = jax.jit(
        lambda params, pt, pm, key: rollout(params, pt, pm, key, lcfg, cfg, eos_ids),
        in_shardings=(st_sh.params, b2, b2, rep), out_shardings=batch_sh)
    score_jit = jax.jit(lambda params, batch: score(params, batch, lcfg, cfg),
                        in_shardings=(st_sh.params, batch_sh), out_shardings=b_it)
    ref_sh = st_sh.params if cfg.train.beta_kl > 0 else None

    def update_fn(state, batch, rewards, key, ref_params, logp_old):
        return update(state, batch, rewards, key, ref_params, logp_old, optimizer, lcfg, cfg)

    update_jit = jax.jit(update_fn, in_shardings=(st_sh, batch_sh, b2, rep, ref_sh, b_it),
                         out_shardings=(st_sh, rep), donate_argnums=(0,))
    sft_jit = None
    if sft_optimizer is not None:
        from ais_jax.training.trainer import DTYPES

        cdt = DTYPES[cfg.model.compute_dtype]

        def sft_fn(params, opt_state, tokens, loss_mask, key):
            (loss, aux), g = jax.value_and_grad(sft_loss, has_aux=True)(
                params, tokens, loss_mask, key, lcfg, pad_id, cdt)
            updates, opt_state = sft_optimizer.update(g, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, {"loss": loss, **aux}

        sft_jit = jax.jit(sft_fn, donate_argnums=(0, 1))
    return StepFns(rollout_jit, score_jit, update_jit, sft_jit, st_sh, b2, True)
