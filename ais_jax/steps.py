"""The jitted programs of one GRPO-with-AIS step: rollout, update and the supervised warm start.

One training step (docs/spec.md section 5)::

    params --to_rollout_params--> FP8 copy --sample--> RolloutBatch      (rollout program)
    RolloutBatch --task verifier--> rewards                              (host, ais_jax.rl)
    (params, RolloutBatch, rewards) --advantages, logp_old, AIS, GRPO--> params'  (update)

`build_step_fns` compiles them with explicit shardings over a `Mesh`.  The
settings are the frozen config sections themselves (`ais_jax.config.Config`),
closed over as static values.  The host side of the step is `ais_jax.rl`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from ais_jax import fp8, grpo, optim, sampler
from ais_jax import sharding as shd
from ais_jax.ais import ais_coefficient
from ais_jax.config import Config, RolloutSection, TrainSection
from ais_jax.distributions import token_logprobs
from ais_jax.grpo import cast_params
from ais_jax.logprobs import head_map, hidden_states
from ais_jax.model import ModelConfig
from ais_jax.optim import TrainState

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class RolloutBatch(NamedTuple):
    """A sampled group batch, ``B = prompts * G`` rows (rows p*G .. p*G+G-1: prompt p)."""

    prompt_tokens: jax.Array  # [B, P] left-padded
    prompt_mask: jax.Array  # [B, P]
    tokens: jax.Array  # [B, N]
    mask: jax.Array  # [B, N] float32, 1 up to and including EOS
    logp: jax.Array  # [B, N] float32, sampler log-probs


class TokenIds(NamedTuple):
    """The tokenizer's ids the programs need: EOS ids ending a row, and the padding id."""

    eos_ids: tuple[int, ...]
    pad_id: int | None


def rollout_params(params: Any, r: RolloutSection) -> Any:
    """The rollout copy: BF16 params, FP8-quantized when ``r.precision == "fp8"``."""
    p = cast_params(params, jnp.bfloat16)
    if r.precision == "fp8":
        p = fp8.to_rollout_params(p, dtype=r.fp8_format, quantize_lm_head=r.lm_head_fp8,
                                  weight_scaling=r.weight_scaling, act_scaling=r.act_scaling)
    return p


def rollout(params: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array, key: jax.Array,
            model_cfg: ModelConfig, r: RolloutSection, ids: TokenIds,
            mesh: Mesh | None = None) -> RolloutBatch:
    """Quantize (weight sync) and sample ``G`` completions per prompt.

    Args:
      params: trainer params.
      prompt_tokens: ``[Pn, P]`` left-padded prompts.
      prompt_mask: ``[Pn, P]``.
      key: PRNG key of this step.
      model_cfg: model config.
      r: the rollout section (precision, sampling settings, ``group_size`` G).
      ids: EOS and padding ids.
      mesh: when given, the rollout copy is re-laid out once (here, at the weight
        sync) to the rollout sharding: no FSDP axis, so the decode loop never
        all-gathers weights.

    Returns:
      `RolloutBatch` with ``Pn * G`` rows.
    """
    rp = rollout_params(params, r)
    if mesh is not None:
        rp = jax.lax.with_sharding_constraint(rp, shd.param_shardings(rp, mesh, rollout=True))
    out = sampler.sample(
        rp, prompt_tokens, prompt_mask, key, model_cfg, max_new_tokens=r.max_new_tokens,
        temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
        eos_id=ids.eos_ids or None, num_samples=r.group_size, kv_fp8=r.kv_cache_fp8,
        pad_id=ids.pad_id,
    )
    G = r.group_size
    return RolloutBatch(
        prompt_tokens=jnp.repeat(prompt_tokens, G, axis=0),
        prompt_mask=jnp.repeat(prompt_mask, G, axis=0),
        tokens=out.tokens,
        mask=out.mask.astype(jnp.float32),
        logp=out.logp.astype(jnp.float32),
    )


def remat_policy(cfg: Config) -> str:
    """``train.remat`` resolved: ``auto`` is ``full`` for pretrained models, else ``none``."""
    if cfg.train.remat != "auto":
        return cfg.train.remat
    return "none" if cfg.model.source == "scratch" else "full"


def scoring(cfg: Config, mesh: Mesh | None = None, vocab_size: int = 0) -> grpo.Scoring:
    """How the trainer scores completions: the rollout's distribution, the model's compute
    dtype, the head chunk, the remat policy and (with a mesh) batch-sharded activations and a
    vocab-parallel untied head (``vocab_size``: the head's rows)."""
    r = cfg.rollout
    return grpo.Scoring(r.temperature, r.top_k, r.top_p, DTYPES[cfg.model.compute_dtype],
                        chunk=cfg.train.logprob_chunk, remat=remat_policy(cfg),
                        constrain=None if mesh is None else shd.batch_constraint(mesh),
                        head_constrain=None if mesh is None
                        else shd.head_constraint(mesh, vocab_size))


def loss_config(t: TrainSection) -> grpo.LossConfig:
    """The `grpo.LossConfig` of the train section."""
    return grpo.LossConfig(clip_eps=t.clip_eps, clip_eps_high=t.clip_eps_high or None,
                           beta_kl=t.beta_kl, aggregation=t.loss_aggregation)


def gradient_rows(cfg: Config) -> int:
    """Rows of one gradient evaluation: the micro-batch, else the minibatch."""
    r, t = cfg.rollout, cfg.train
    return t.micro_batch_size or r.prompts_per_step * r.group_size // t.minibatches


def _trainer_logprobs(params: Any, batch: RolloutBatch, model_cfg: ModelConfig, cfg: Config,
                      mesh: Mesh | None) -> jax.Array:
    """Detached trainer log-probs ``[B, N]`` of the whole batch, scored ``gradient_rows`` rows at
    a time (so the no-grad pass never holds more activations than one gradient does)."""
    B = batch.tokens.shape[0]
    parts = max(1, B // gradient_rows(cfg))
    shards = 1 if mesh is None else shd.batch_divisor(mesh)
    sc = scoring(cfg, mesh, model_cfg.vocab_size)
    xs = (batch.prompt_tokens, batch.prompt_mask, batch.tokens)

    def score(x: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        return grpo.trainer_logprobs(params, *x, model_cfg, sc)

    if parts == 1:
        return jax.lax.stop_gradient(score(xs))
    parted = optim.split_rows(xs, parts, shards)
    if mesh is not None:
        parted = jax.tree.map(shd.batch_constraint(mesh, 1), parted)
    return jax.lax.stop_gradient(optim.merge_rows(jax.lax.map(score, parted), shards))


def _minibatches(gb: grpo.GRPOBatch, key: jax.Array, M: int, shards: int,
                 mesh: Mesh | None) -> grpo.GRPOBatch:
    """``[M, B / M, ...]`` minibatches, rows shuffled inside each of ``shards`` row shards.

    Every minibatch takes an equal share of every shard, so rows sharded over
    the batch axes stay on their devices (a global ``x[perm]`` would gather
    them).  With one shard this is ``x[perm].reshape(M, B / M, ...)``.
    """
    B = gb.tokens.shape[0]
    perm = jax.random.permutation(key, B // shards) if M > 1 else jnp.arange(B // shards)

    def shuffle(x: jax.Array) -> jax.Array:
        return x.reshape(shards, B // shards, *x.shape[1:])[:, perm].reshape(x.shape)

    mbs = optim.split_rows(jax.tree.map(shuffle, gb), M, shards)
    return mbs if mesh is None else jax.tree.map(shd.batch_constraint(mesh, 1), mbs)


def _minibatch_updates(state: TrainState, gb: grpo.GRPOBatch, key: jax.Array,
                       optimizer: optax.GradientTransformation, model_cfg: ModelConfig,
                       cfg: Config, mesh: Mesh | None) -> tuple[TrainState, dict[str, jax.Array]]:
    """``epochs x minibatches`` guarded updates over ``gb`` (rows reshuffled each epoch),
    each accumulated over ``train.micro_batch_size``-row micro-batches when set."""
    B = gb.tokens.shape[0]
    t = cfg.train
    M = t.minibatches
    shards = 1 if mesh is None else shd.batch_divisor(mesh)
    micro = (B // M) // t.micro_batch_size if t.micro_batch_size else 1
    loss_cfg, sc = loss_config(t), scoring(cfg, mesh, model_cfg.vocab_size)

    def loss_fn(params: Any, mb: grpo.GRPOBatch,
                totals: grpo.LossTotals | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
        return grpo.policy_loss(params, mb, model_cfg, loss_cfg, sc, totals)

    def one(st: TrainState, mb: grpo.GRPOBatch) -> tuple[TrainState, dict[str, jax.Array]]:
        return optim.apply_update(st, mb, loss_fn, optimizer, micro_batches=micro, shards=shards)

    def epoch(st: TrainState, ekey: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
        return jax.lax.scan(one, st, _minibatches(gb, ekey, M, shards, mesh))

    state, mets = jax.lax.scan(epoch, state, jax.random.split(key, cfg.train.epochs))
    return state, jax.tree.map(jnp.mean, mets)


def update(
    state: TrainState,
    batch: RolloutBatch,
    rewards: jax.Array,
    key: jax.Array,
    ref_params: Any,
    optimizer: optax.GradientTransformation,
    model_cfg: ModelConfig,
    cfg: Config,
    mesh: Mesh | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """Advantages -> logp_old -> AIS -> ``epochs x minibatches`` guarded GRPO updates.

    Args:
      state: current `TrainState`.
      batch: the rollout (``B = Pn * G`` rows).
      rewards: ``[Pn, G]`` float32 rewards.
      key: PRNG key (minibatch shuffling).
      ref_params: reference policy for the KL term, or None (then no KL cost at all).
      optimizer: optax transformation.
      model_cfg: model config.
      cfg: the run config (rollout, ais and train sections are read).
      mesh: the trainer's mesh: activations are then pinned to batch-sharded
        rows and minibatches keep rows on their devices (None: no constraint).

    Returns:
      ``(new_state, metrics)`` (scalars).
    """
    B, N = batch.tokens.shape
    adv_seq = grpo.group_advantages(rewards).reshape(B)  # [B]
    adv_tok = jnp.broadcast_to(adv_seq[:, None], (B, N))  # [B, N]
    logp_old = _trainer_logprobs(state.params, batch, model_cfg, cfg, mesh)  # [B, N]
    # With top-k / top-p the trainer recomputes the truncated set from its own
    # logits; a sampled token outside it has logp_old = -inf (probability 0
    # under the trainer's sampling distribution).  Such tokens carry no usable
    # ratio: drop them from AIS and the loss (counted in `dropped_tokens`).
    finite = jnp.isfinite(logp_old)
    dropped = jnp.sum((batch.mask > 0) & ~finite)
    batch = batch._replace(mask=jnp.where(finite, batch.mask, 0.0))
    logp_old = jnp.where(finite, logp_old, 0.0)
    a = cfg.ais
    res = ais_coefficient(logp_old, batch.logp, adv_tok, batch.mask, C=a.C, delta=a.delta,
                          gamma=a.gamma, beta_var=a.beta_var, eps=a.eps, mode=a.mode,
                          use_ess=a.use_ess, use_mis=a.use_mis, use_var=a.use_var)
    logp_ref = None
    if ref_params is not None and cfg.train.beta_kl > 0:
        logp_ref = _trainer_logprobs(ref_params, batch, model_cfg, cfg, mesh)
    gb = grpo.GRPOBatch(batch.prompt_tokens, batch.prompt_mask, batch.tokens, batch.mask,
                        logp_old, res.advantages, logp_ref)
    state, mets = _minibatch_updates(state, gb, key, optimizer, model_cfg, cfg, mesh)
    valid = batch.mask > 0
    metrics = {
        "loss": mets["loss"],
        "grad_norm": mets["grad_norm"],
        "clip_frac": mets["clip_frac"],
        "kl": mets["kl"],
        "skipped": mets["skipped"] * cfg.train.epochs * cfg.train.minibatches,
        "reward_mean": jnp.mean(rewards),
        "reward_std": jnp.std(rewards),
        "response_len": jnp.mean(jnp.sum(valid, axis=1).astype(jnp.float32)),
        "adv_abs_mean": jnp.mean(jnp.abs(adv_seq)),
        "dropped_tokens": dropped.astype(jnp.float32),
        "logp_rollout_mean": jnp.sum(jnp.where(valid, batch.logp, 0.0))
        / jnp.maximum(jnp.sum(valid), 1),
        **res.stats(),
    }
    return state, metrics


def sft_loss(params: Any, tokens: jax.Array, loss_mask: jax.Array, cfg: ModelConfig,
             compute_dtype: Any = jnp.bfloat16, *, chunk: int = 0, remat: str = "none",
             constrain: Any = None, head_constrain: Any = None,
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Teacher-forced cross-entropy on ``loss_mask`` positions.

    The head runs ``chunk`` positions at a time (`ais_jax.logprobs.head_map`), so
    ``[B, T, V]`` logits are never materialized.

    Args:
      params: master params.
      tokens: ``[B, T]`` full sequences (prompt + answer + EOS, right-padded).
      loss_mask: ``[B, T]`` 1 where ``tokens[:, t]`` is a target (answer / EOS).
      cfg: model config.
      compute_dtype: forward dtype.
      chunk: head chunk length (0: all positions at once).
      remat: per-layer rematerialization policy.
      constrain: batch-sharding constraint for activations, or None.
      head_constrain: rows constraint of a vocab-parallel head, or None.

    Returns:
      ``(mean token NLL, {"accuracy": token accuracy})``.
    """
    p = cast_params(params, compute_dtype)
    h = hidden_states(p, tokens[:, :-1], cfg, remat=remat, constrain=constrain)  # [B, T-1, D]
    tgt = tokens[:, 1:]

    def nll_hit(logits: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        nll = -token_logprobs(logits, t)  # masked sum: partitions over a sharded vocabulary
        return nll, (jnp.argmax(logits, -1) == t)

    nll, hit = head_map(p, h, tgt, cfg, nll_hit, chunk=chunk, constrain=constrain,
                        head_constrain=head_constrain)  # [B, T-1]
    m = loss_mask[:, 1:].astype(jnp.float32)
    n = jnp.maximum(jnp.sum(m), 1.0)
    return jnp.sum(nll * m) / n, {"accuracy": jnp.sum(hit * m) / n}


class StepFns(NamedTuple):
    """Compiled step functions and the shardings they were built with."""

    rollout: Any  # (params, prompt_tokens, prompt_mask, key) -> RolloutBatch
    update: Any  # (state, batch, rewards, key, ref_params) -> (state, metrics)
    sft: Any  # (params, opt_state, tokens, loss_mask) -> (params, opt_state, metrics)
    state_shardings: Any
    batch_sharding: Any


def state_shardings(state: TrainState, mesh: Mesh) -> TrainState:
    """Shardings of a `TrainState`: params by the rules table, optimizer leaves by path."""
    pspec = shd.param_shardings(state.params, mesh)
    rep = shd.replicated(mesh)
    return TrainState(pspec, shd.opt_state_shardings(state.opt_state, pspec, mesh), rep, rep)


def build_step_fns(
    state: TrainState,
    mesh: Mesh,
    optimizer: optax.GradientTransformation,
    sft_optimizer: optax.GradientTransformation | None,
    model_cfg: ModelConfig,
    cfg: Config,
    ids: TokenIds,
) -> StepFns:
    """Jitted rollout / update / SFT functions with explicit shardings (compiled on first call)."""
    st_sh = state_shardings(state, mesh)
    rep = shd.replicated(mesh)
    b2 = shd.batch_sharding(mesh, 2)
    rollout_sh = RolloutBatch(b2, b2, b2, b2, b2)

    def rollout_fn(params, prompt_tokens, prompt_mask, key):
        return rollout(params, prompt_tokens, prompt_mask, key, model_cfg, cfg.rollout, ids, mesh)

    rollout_jit = jax.jit(rollout_fn, in_shardings=(st_sh.params, b2, b2, rep),
                          out_shardings=rollout_sh)

    def update_fn(state, batch, rewards, key, ref_params):
        return update(state, batch, rewards, key, ref_params, optimizer, model_cfg, cfg, mesh)

    ref_sh = st_sh.params if cfg.train.beta_kl > 0 else None
    update_jit = jax.jit(update_fn, in_shardings=(st_sh, rollout_sh, b2, rep, ref_sh),
                         out_shardings=(st_sh, rep), donate_argnums=(0,))
    sft_jit = None
    if sft_optimizer is not None:
        def sft_fn(params, opt_state, tokens, loss_mask):
            (loss, aux), g = jax.value_and_grad(sft_loss, has_aux=True)(
                params, tokens, loss_mask, model_cfg, DTYPES[cfg.model.compute_dtype],
                chunk=cfg.train.logprob_chunk, remat=remat_policy(cfg),
                constrain=shd.batch_constraint(mesh),
                head_constrain=shd.head_constraint(mesh, model_cfg.vocab_size))
            updates, opt_state = sft_optimizer.update(g, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, {"loss": loss, **aux}
        sft_jit = jax.jit(sft_fn, donate_argnums=(0, 1))
    return StepFns(rollout_jit, update_jit, sft_jit, st_sh, b2)
