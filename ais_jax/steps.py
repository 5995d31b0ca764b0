"""The jitted pieces of one GRPO-with-AIS step: rollout, SFT warm start, and the update.

One training step is (DESIGN.md section 1)::

    params --to_rollout_params--> FP8 copy --sample--> Rollout        (rollout_fn, jitted)
    Rollout --task verifier--> rewards                                 (host, in train.py)
    (params, Rollout, rewards) --advantages, logp_old, AIS, GRPO--> params'   (update_fn, jitted)

`build_step_fns` compiles both with explicit shardings over a `Mesh`; the
Python loop, I/O and logging live in `ais_jax.train`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from ais_jax import fp8, grpo, sampler
from ais_jax import sharding as shd
from ais_jax.ais import ais_coefficient
from ais_jax.model import ModelConfig, forward

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class TrainState(NamedTuple):
    """Everything that changes across steps (checkpointed)."""

    params: Any  # master params (float32 or bfloat16)
    opt_state: Any  # optax state
    step: jax.Array  # int32 scalar: optimizer updates done (applied + skipped)
    skipped: jax.Array  # int32 scalar: updates skipped for a non-finite loss / gradient


class RolloutBatch(NamedTuple):
    """A sampled group batch, ``B = prompts * G`` rows (rows p*G .. p*G+G-1: prompt p)."""

    prompt_tokens: jax.Array  # [B, P] left-padded
    prompt_mask: jax.Array  # [B, P]
    tokens: jax.Array  # [B, N]
    mask: jax.Array  # [B, N] float32, 1 up to and including EOS
    logp: jax.Array  # [B, N] float32, sampler log-probs


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """Static (hashable) settings of the jitted step functions."""

    model: ModelConfig
    group_size: int
    max_new_tokens: int
    precision: str = "fp8"  # rollout precision: fp8 | bf16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    eos_ids: tuple[int, ...] = ()
    pad_id: int | None = None
    fp8_format: str = "e4m3"
    act_scaling: str = "tensor"
    weight_scaling: str = "tensor"
    lm_head_fp8: bool = False
    kv_cache_fp8: bool = False
    compute_dtype: str = "bfloat16"
    ais_mode: str = "ais"
    ais_cap: float = 5.0
    ais_delta: float = 0.02
    ais_gamma: float = 1.2
    ais_beta_var: float = 1.0
    ais_eps: float = 1e-6
    ais_terms: tuple[bool, bool, bool] = (True, True, True)  # use_ess, use_mis, use_var
    loss: grpo.LossConfig = grpo.DEFAULT_LOSS
    epochs: int = 1
    minibatches: int = 1


def cast_params(params: Any, dtype: Any) -> Any:
    """Cast float leaves to ``dtype`` (QuantArray leaves untouched)."""
    def cast(x):
        if isinstance(x, fp8.QuantArray) or not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x.astype(dtype)
    return jax.tree.map(cast, params, is_leaf=shd.is_quant)


def rollout_params(params: Any, s: StepSettings) -> Any:
    """The rollout copy: BF16 params, FP8-quantized when ``s.precision == "fp8"``."""
    p = cast_params(params, jnp.bfloat16)
    if s.precision == "fp8":
        p = fp8.to_rollout_params(p, dtype=s.fp8_format, quantize_lm_head=s.lm_head_fp8,
                                  weight_scaling=s.weight_scaling, act_scaling=s.act_scaling)
    return p


def rollout(params: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array, key: jax.Array,
            s: StepSettings, mesh: Mesh | None = None) -> RolloutBatch:
    """Quantize (weight sync) and sample ``G`` completions per prompt.

    Args:
      params: trainer params.
      prompt_tokens: ``[Pn, P]`` left-padded prompts.
      prompt_mask: ``[Pn, P]``.
      key: PRNG key of this step.
      s: settings.
      mesh: when given, the rollout copy is re-laid out once (here, at the weight
        sync) to the rollout sharding: no FSDP axis, so the decode loop never
        all-gathers weights.

    Returns:
      `RolloutBatch` with ``Pn * G`` rows.
    """
    rp = rollout_params(params, s)
    if mesh is not None:
        rp = jax.lax.with_sharding_constraint(rp, shd.param_shardings(rp, mesh, rollout=True))
    out = sampler.sample(
        rp, prompt_tokens, prompt_mask, key, s.model, max_new_tokens=s.max_new_tokens,
        temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
        eos_id=s.eos_ids or None, num_samples=s.group_size, kv_fp8=s.kv_cache_fp8,
        pad_id=s.pad_id,
    )
    G = s.group_size
    return RolloutBatch(
        prompt_tokens=jnp.repeat(prompt_tokens, G, axis=0),
        prompt_mask=jnp.repeat(prompt_mask, G, axis=0),
        tokens=out.tokens,
        mask=out.mask.astype(jnp.float32),
        logp=out.logp.astype(jnp.float32),
    )


def trainer_logprobs(params: Any, batch: RolloutBatch, s: StepSettings) -> jax.Array:
    """BF16 trainer log-probs of the rollout tokens under the sampler's distribution ``[B, N]``.

    Uses the sampler's temperature and, when top-k / top-p truncation is on,
    the same truncated, renormalized distribution (SPEC.md section 4).
    """
    p = cast_params(params, DTYPES[s.compute_dtype])
    if s.top_k == 0 and s.top_p >= 1.0:
        return grpo.sequence_logprobs(p, batch.prompt_tokens, batch.prompt_mask, batch.tokens,
                                      s.model, s.temperature)
    logits = grpo.completion_logits(p, batch.prompt_tokens, batch.prompt_mask, batch.tokens,
                                    s.model)  # [B, N, V]
    return sampler.token_logprobs_from_logits(logits, batch.tokens, s.temperature, s.top_k,
                                              s.top_p)


def _loss_fn(s: StepSettings):
    def loss_fn(params, mb):
        batch, adv, logp_old, logp_ref = mb
        logp_new = trainer_logprobs(params, batch, s)
        return grpo.grpo_loss(logp_new, logp_old, adv, batch.mask, logp_ref, s.loss)
    return loss_fn


def update(
    state: TrainState,
    batch: RolloutBatch,
    rewards: jax.Array,
    key: jax.Array,
    ref_params: Any,
    optimizer: optax.GradientTransformation,
    s: StepSettings,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """Advantages -> logp_old -> AIS -> ``epochs x minibatches`` guarded GRPO updates.

    Args:
      state: current `TrainState`.
      batch: the rollout (``B = Pn * G`` rows).
      rewards: ``[Pn, G]`` float32 rewards.
      key: PRNG key (minibatch shuffling).
      ref_params: reference policy for the KL term, or None (then no KL cost at all).
      optimizer: optax transformation.
      s: settings.

    Returns:
      ``(new_state, metrics)`` (scalars).
    """
    B, N = batch.tokens.shape
    adv_seq = grpo.group_advantages(rewards).reshape(B)  # [B]
    adv_tok = jnp.broadcast_to(adv_seq[:, None], (B, N))  # [B, N]
    logp_old = jax.lax.stop_gradient(trainer_logprobs(state.params, batch, s))  # [B, N]
    # With top-k / top-p the trainer recomputes the truncated set from its own
    # logits; a sampled token outside it has logp_old = -inf (probability 0
    # under the trainer's sampling distribution).  Such tokens carry no usable
    # ratio: drop them from AIS and the loss (counted in `dropped_tokens`).
    finite = jnp.isfinite(logp_old)
    dropped = jnp.sum((batch.mask > 0) & ~finite)
    batch = batch._replace(mask=jnp.where(finite, batch.mask, 0.0))
    logp_old = jnp.where(finite, logp_old, 0.0)
    res = ais_coefficient(logp_old, batch.logp, adv_tok, batch.mask, C=s.ais_cap,
                          delta=s.ais_delta, gamma=s.ais_gamma, beta_var=s.ais_beta_var,
                          eps=s.ais_eps, mode=s.ais_mode, use_ess=s.ais_terms[0],
                          use_mis=s.ais_terms[1], use_var=s.ais_terms[2])
    logp_ref = None
    if ref_params is not None and s.loss.beta_kl > 0:
        logp_ref = jax.lax.stop_gradient(trainer_logprobs(ref_params, batch, s))

    M = s.minibatches
    loss_fn = _loss_fn(s)
    upd = grpo.UpdateState(state.params, state.opt_state, state.step, state.skipped)

    def epoch(upd, ekey):
        perm = jax.random.permutation(ekey, B) if M > 1 else jnp.arange(B)
        def take(x):
            return None if x is None else x[perm].reshape(M, B // M, *x.shape[1:])
        mbs = (jax.tree.map(take, batch), take(res.advantages), take(logp_old), take(logp_ref))

        def one(upd, mb):
            return grpo.apply_update(upd, mb, loss_fn, optimizer)
        return jax.lax.scan(one, upd, mbs)

    upd, mets = jax.lax.scan(epoch, upd, jax.random.split(key, s.epochs))
    mets = jax.tree.map(jnp.mean, mets)
    stats = res.stats()
    valid = batch.mask > 0
    metrics = {
        "loss": mets["loss"],
        "grad_norm": mets["grad_norm"],
        "clip_frac": mets["clip_frac"],
        "kl": mets["kl"],
        "skipped": mets["skipped"] * s.epochs * M,
        "reward_mean": jnp.mean(rewards),
        "reward_std": jnp.std(rewards),
        "response_len": jnp.mean(jnp.sum(valid, axis=1).astype(jnp.float32)),
        "adv_abs_mean": jnp.mean(jnp.abs(adv_seq)),
        "dropped_tokens": dropped.astype(jnp.float32),
        "logp_rollout_mean": jnp.sum(jnp.where(valid, batch.logp, 0.0))
        / jnp.maximum(jnp.sum(valid), 1),
        **stats,
    }
    new_state = TrainState(upd.params, upd.opt_state, upd.step, upd.skipped)
    return new_state, metrics


def sft_loss(params: Any, tokens: jax.Array, loss_mask: jax.Array, cfg: ModelConfig,
             compute_dtype: Any = jnp.bfloat16) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Teacher-forced cross-entropy on ``loss_mask`` positions.

    Args:
      params: master params.
      tokens: ``[B, T]`` full sequences (prompt + answer + EOS, right-padded).
      loss_mask: ``[B, T]`` 1 where ``tokens[:, t]`` is a target (answer / EOS).
      cfg: model config.
      compute_dtype: forward dtype.

    Returns:
      ``(mean token NLL, {"accuracy": token accuracy})``.
    """
    p = cast_params(params, compute_dtype)
    logits = forward(p, tokens[:, :-1], cfg)  # [B, T-1, V]
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
    tgt = tokens[:, 1:]
    m = loss_mask[:, 1:].astype(jnp.float32)
    nll = -jnp.take_along_axis(lp, tgt[..., None], -1)[..., 0]
    n = jnp.maximum(jnp.sum(m), 1.0)
    acc = jnp.sum((jnp.argmax(lp, -1) == tgt) * m) / n
    return jnp.sum(nll * m) / n, {"accuracy": acc}


class StepFns(NamedTuple):
    """Compiled step functions and the shardings they were built with."""

    rollout: Any  # (params, prompt_tokens, prompt_mask, key) -> RolloutBatch
    update: Any  # (state, batch, rewards, key, ref_params) -> (state, metrics)
    sft: Any  # (params, opt_state, tokens, loss_mask) -> (params, opt_state, metrics)
    state_shardings: Any
    batch_sharding: Any


def state_shardings(state: TrainState, mesh: Mesh) -> Any:
    """Shardings of a `TrainState`: params by the rules table, optimizer moments alike."""
    pspec = shd.param_shardings(state.params, mesh)
    rep = shd.replicated(mesh)
    flat_p, _ = jax.tree.flatten(state.params)

    # Optimizer leaves shaped like a param take that param's sharding (moments);
    # everything else (counts, scalars) is replicated.
    by_shape: dict[tuple, Any] = {}
    for leaf, sh in zip(flat_p, jax.tree.leaves(pspec), strict=True):
        by_shape.setdefault((leaf.shape, str(leaf.dtype)), sh)
        by_shape.setdefault((leaf.shape, None), sh)

    def opt_leaf(x):
        return by_shape.get((x.shape, str(x.dtype)), by_shape.get((x.shape, None), rep))

    return TrainState(pspec, jax.tree.map(opt_leaf, state.opt_state), rep, rep)


def build_step_fns(
    state: TrainState,
    mesh: Mesh,
    optimizer: optax.GradientTransformation,
    sft_optimizer: optax.GradientTransformation | None,
    s: StepSettings,
) -> StepFns:
    """Compile-ready jitted rollout / update / SFT functions with explicit shardings."""
    st_sh = state_shardings(state, mesh)
    rep = shd.replicated(mesh)
    b2 = shd.batch_sharding(mesh, 2)
    rollout_sh = RolloutBatch(b2, b2, b2, b2, b2)

    def rollout_fn(params, prompt_tokens, prompt_mask, key):
        return rollout(params, prompt_tokens, prompt_mask, key, s, mesh)

    rollout_jit = jax.jit(rollout_fn, in_shardings=(st_sh.params, b2, b2, rep),
                          out_shardings=rollout_sh)

    def update_fn(state, batch, rewards, key, ref_params):
        return update(state, batch, rewards, key, ref_params, optimizer, s)

    ref_sh = st_sh.params if s.loss.beta_kl > 0 else None
    update_jit = jax.jit(update_fn,
                         in_shardings=(st_sh, rollout_sh, b2, rep, ref_sh),
                         out_shardings=(st_sh, rep), donate_argnums=(0,))
    sft_jit = None
    if sft_optimizer is not None:
        def sft_fn(params, opt_state, tokens, loss_mask):
            (loss, aux), g = jax.value_and_grad(sft_loss, has_aux=True)(
                params, tokens, loss_mask, s.model, DTYPES[s.compute_dtype])
            updates, opt_state = sft_optimizer.update(g, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, {"loss": loss, **aux}
        sft_jit = jax.jit(sft_fn, donate_argnums=(0, 1))
    return StepFns(rollout_jit, update_jit, sft_jit, st_sh, b2)
