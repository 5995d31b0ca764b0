"""The jitted programs of one GRPO-with-AIS step: rollout, update and the supervised warm start.

One training step (docs/spec.md section 5)::

    params --to_rollout_params--> FP8 copy --sample--> RolloutBatch      (rollout program)
    RolloutBatch --task verifier--> rewards                              (host, ais_jax.training.rl)
    (params, RolloutBatch, rewards) --advantages, logp_old, AIS, GRPO--> params'  (update)

`build_step_fns` compiles them with explicit shardings over a `Mesh`.  The
settings are the frozen config sections themselves (`ais_jax.config.schema.Config`),
closed over as static values.  The host side of the step is `ais_jax.training.rl`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from ais_jax.config.schema import Config, RolloutSection
from ais_jax.core.errors import UsageError
from ais_jax.method.distributions import token_logprobs
from ais_jax.models import fp8, fused
from ais_jax.models.model import ModelConfig
from ais_jax.models.qarray import native_precision
from ais_jax.rollout import sampler
from ais_jax.training import sharding as shd
from ais_jax.training.logprobs import head_map, hidden_states
from ais_jax.training.optim import TrainState
from ais_jax.training.policy import cast_params
from ais_jax.training.trainer import (
    DTYPES,
    RolloutBatch,
    remat_policy,
    score,
    single_forward,
    update,
)

__all__ = ["DTYPES", "RolloutBatch", "StepFns", "TokenIds", "build_step_fns", "model_shardings",
           "remat_policy", "rollout", "rollout_params", "sft_loss", "state_shardings", "update"]


class TokenIds(NamedTuple):
    """The tokenizer's ids the programs need: EOS ids ending a row, and the padding id."""

    eos_ids: tuple[int, ...]
    pad_id: int | None


def interpret_note(attention: str, platform: str) -> str | None:
    """The start-up line for ``model.attention=pallas`` off TPU, else None.

    The Pallas kernels are TPU kernels: on CPU they run in Pallas's interpret mode (the
    same numbers, many times slower), which a user asking for ``pallas`` should be told;
    on any other platform (a GPU) they do not compile.

    Args:
      attention: ``model.attention`` (``auto``, ``reference``, ``chunked``, ``cudnn`` or
        ``pallas``).
      platform: the devices' platform, e.g. ``"cpu"``, ``"gpu"``, ``"tpu"``.

    Raises:
      UsageError: ``pallas`` on a platform other than TPU and CPU.
    """
    if attention != "pallas" or platform == "tpu":
        return None
    if platform != "cpu":
        raise UsageError(f"model.attention=pallas runs only on TPU (and on CPU, slowly, in "
                         f"interpret mode), not on {platform}: set model.attention=auto "
                         "(cuDNN where it fits) or reference")
    return (f"model.attention=pallas on {platform}: the TPU kernels run in Pallas's interpret "
            "mode here (the same attention, many times slower); model.attention=auto picks the "
            "fast one for this backend")


def resolve_precision(r: RolloutSection, device_kind: str | None = None) -> RolloutSection:
    """``r`` with ``precision="auto"`` replaced by the device's native format
    (`ais_jax.models.qarray.native_precision`; ``"fp8"`` means E4M3); other values unchanged.

    Args:
      r: the rollout section.
      device_kind: the device's ``device_kind`` (default: ``jax.devices()[0]``'s).
    """
    if r.precision != "auto":
        return r
    kind = jax.devices()[0].device_kind if device_kind is None else device_kind
    native = native_precision(kind)
    return dataclasses.replace(r, precision=native,
                               **({"fp8_format": "e4m3"} if native == "fp8" else {}))


def int8_act_scaling(act_scaling: str) -> str:
    """INT8's activation scheme for ``rollout.act_scaling``: ``"tensor"`` (the default) means
    per token (one int8 scale for a whole activation tensor lets one outlier feature flatten
    every other value: SmolLM2's sampled mismatch d_bar 0.51 per tensor vs 0.20 per token,
    docs/accelerators.md); ``"token"`` and ``"prefill"`` as given."""
    return "token" if act_scaling == "tensor" else act_scaling


def kv_format(r: RolloutSection) -> bool | str:
    """The sampler's ``kv_fp8`` argument: ``"int8"``, True (E4M3) or False (BF16 cache)."""
    return "int8" if r.kv_cache_int8 else bool(r.kv_cache_fp8)


def rollout_params(params: Any, r: RolloutSection) -> Any:
    """The rollout copy: BF16 params, FP8- or INT8-quantized for ``r.precision`` ``"fp8"`` /
    ``"int8"`` (``"auto"``: `resolve_precision`)."""
    r = resolve_precision(r)
    p = cast_params(params, jnp.bfloat16)
    if r.precision == "int8":  # per-channel int8 weights (weight_scaling is FP8's); per-token
        # activations unless prefill-fixed (`int8_act_scaling`)
        p = fp8.to_rollout_params(p, dtype="int8", quantize_lm_head=r.lm_head_fp8,
                                  act_scaling=int8_act_scaling(r.act_scaling))
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
        all-gathers weights; the prefill's TPU attention kernel runs under
        ``jax.shard_map`` over it.

    Returns:
      `RolloutBatch` with ``Pn * G`` rows.
    """
    rp = rollout_params(params, r)
    if r.fused_linears:
        rp = fused.fuse_linears(rp)
    if mesh is not None:
        rp = jax.lax.with_sharding_constraint(rp, shd.param_shardings(rp, mesh, rollout=True))
    out = sampler.sample(
        rp, prompt_tokens, prompt_mask, key, model_cfg, max_new_tokens=r.max_new_tokens,
        temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
        eos_id=ids.eos_ids or None, num_samples=r.group_size, kv_fp8=kv_format(r),
        pad_id=ids.pad_id, mesh=mesh,
    )
    G = r.group_size
    return RolloutBatch(
        prompt_tokens=jnp.repeat(prompt_tokens, G, axis=0),
        prompt_mask=jnp.repeat(prompt_mask, G, axis=0),
        tokens=out.tokens,
        mask=out.mask.astype(jnp.float32),
        logp=out.logp.astype(jnp.float32),
    )


def sft_loss(params: Any, tokens: jax.Array, loss_mask: jax.Array, cfg: ModelConfig,
             compute_dtype: Any = jnp.bfloat16, *, chunk: int = 0, remat: str = "none",
             constrain: Any = None, head_constrain: Any = None,
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Teacher-forced cross-entropy on ``loss_mask`` positions.

    The head runs ``chunk`` positions at a time (`ais_jax.training.logprobs.head_map`), so
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
    # (params, batch) -> logp_old [B, N]; always built (compiled on its first call)
    score: Any
    update: Any  # (state, batch, rewards, key, ref_params) -> (state, metrics)
    sft: Any  # (params, opt_state, tokens, loss_mask) -> (params, opt_state, metrics)
    state_shardings: Any
    batch_sharding: Any
    # whether the update needs ``score``'s logp_old (False: it takes it from its own forward)
    score_for_update: bool = True
    # shardings of the model's params (evaluation, warm start); None: state_shardings.params.
    # With LoRA the state's params are the adapters and these are the base's.
    model_shardings: Any = None


def model_shardings(fns: StepFns) -> Any:
    """The shardings of the model's params (of the state's params without LoRA)."""
    return fns.state_shardings.params if fns.model_shardings is None else fns.model_shardings


def state_shardings(state: TrainState, mesh: Mesh, lora_cfg: Any = None) -> TrainState:
    """Shardings of a `TrainState`: params by the rules table, optimizer leaves by path;
    with ``lora_cfg`` the params are adapters (`ais_jax.training.lora_policy.adapter_shardings`)."""
    if lora_cfg is None:
        pspec = shd.param_shardings(state.params, mesh)
    else:
        from ais_jax.training.lora_policy import adapter_shardings

        pspec = adapter_shardings(state.params, lora_cfg, mesh)
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
    lora_policy: Any = None,
) -> StepFns:
    """Jitted rollout / update / SFT functions with explicit shardings (compiled on first call).

    With ``lora_policy`` (`ais_jax.training.lora_policy.LoraPolicy`) the state's params are
    the adapters, and rollout / score / update are `_lora_step_fns`'s.
    ``rollout.precision=auto`` is resolved here for the mesh's device kind (and printed).
    """
    if cfg.rollout.precision == "auto":
        kind = mesh.devices.flat[0].device_kind
        cfg = dataclasses.replace(cfg, rollout=resolve_precision(cfg.rollout, kind))
        print(f"rollout.precision=auto: {cfg.rollout.precision} on {kind} "
              "(docs/accelerators.md, native formats)", flush=True)
    note = interpret_note(cfg.model.attention, mesh.devices.flat[0].platform)
    if note:
        print(note, flush=True)
    st_sh = state_shardings(state, mesh, None if lora_policy is None else lora_policy.cfg)
    rep = shd.replicated(mesh)
    b2 = shd.batch_sharding(mesh, 2)
    rollout_sh = RolloutBatch(b2, b2, b2, b2, b2)
    sft_jit = _sft_jit(sft_optimizer, model_cfg, cfg, mesh)
    if lora_policy is not None:
        return _lora_step_fns(lora_policy, st_sh, mesh, optimizer, model_cfg, cfg, ids, sft_jit)

    def rollout_fn(params, prompt_tokens, prompt_mask, key):
        return rollout(params, prompt_tokens, prompt_mask, key, model_cfg, cfg.rollout, ids, mesh)

    rollout_jit = jax.jit(rollout_fn, in_shardings=(st_sh.params, b2, b2, rep),
                          out_shardings=rollout_sh)

    def update_fn(state, batch, rewards, key, ref_params, logp_old):
        return update(state, batch, rewards, key, ref_params, optimizer, model_cfg, cfg, mesh,
                      logp_old)

    ref_sh = st_sh.params if cfg.train.beta_kl > 0 else None
    update_jit = jax.jit(update_fn, in_shardings=(st_sh, rollout_sh, b2, rep, ref_sh, b2),
                         out_shardings=(st_sh, rep), donate_argnums=(0,))
    # Built always (jit is lazy): the completions table scores logp_old even when the
    # update takes it from its own forward.
    score_jit = jax.jit(lambda params, batch: score(params, batch, model_cfg, cfg, mesh),
                        in_shardings=(st_sh.params, rollout_sh), out_shardings=b2)
    return StepFns(rollout_jit, score_jit, update_jit, sft_jit, st_sh, b2,
                   not single_forward(cfg))


def _lora_step_fns(pol: Any, st_sh: TrainState, mesh: Mesh,
                   optimizer: optax.GradientTransformation, model_cfg: ModelConfig, cfg: Config,
                   ids: TokenIds, sft_jit: Any) -> StepFns:
    """LoRA's programs: each takes the frozen base first (not donated, not differentiated)
    and is wrapped in `ais_jax.training.lora_policy.Bound`, so callers pass what they pass
    without LoRA.  The rollout copy is quantized from the merged weights; trainer forwards see
    ``with_adapters(base, adapters)`` (dropout masks only in the update's loss forward);
    the KL reference is the base."""
    from ais_jax.training import lora_policy as lp

    rep, b2, base_sh, lcfg = shd.replicated(mesh), shd.batch_sharding(mesh, 2), \
        pol.base_shardings, pol.cfg
    rollout_sh = RolloutBatch(b2, b2, b2, b2, b2)

    def rollout_fn(base, adapters, prompt_tokens, prompt_mask, key):
        return rollout(lp.merged(base, adapters, lcfg), prompt_tokens, prompt_mask, key,
                       model_cfg, cfg.rollout, ids, mesh)

    def update_fn(base, state, batch, rewards, key, ref_params, logp_old):
        del ref_params  # the KL reference is the base
        ref = base if cfg.train.beta_kl > 0 else None
        return update(state, batch, rewards, key, ref, optimizer, model_cfg, cfg, mesh,
                      logp_old, view=lp.view(base, lcfg), dropout_key=lp.dropout_key(key, lcfg))

    def score_fn(base, adapters, batch):
        return score(adapters, batch, model_cfg, cfg, mesh, view=lp.view(base, lcfg))

    rollout_jit = jax.jit(rollout_fn, in_shardings=(base_sh, st_sh.params, b2, b2, rep),
                          out_shardings=rollout_sh)
    update_jit = jax.jit(update_fn, in_shardings=(base_sh, st_sh, rollout_sh, b2, rep, None, b2),
                         out_shardings=(st_sh, rep), donate_argnums=(1,))
    score_jit = jax.jit(score_fn, in_shardings=(base_sh, st_sh.params, rollout_sh),
                        out_shardings=b2)
    return StepFns(lp.Bound(rollout_jit, pol), lp.Bound(score_jit, pol),
                   lp.Bound(update_jit, pol), sft_jit, st_sh, b2, not single_forward(cfg),
                   base_sh)


def _sft_jit(sft_optimizer: optax.GradientTransformation | None, model_cfg: ModelConfig,
             cfg: Config, mesh: Mesh) -> Any:
    """The warm start's jitted step (full fine-tuning, LoRA or not), or None."""
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
    return sft_jit
