"""The update program: trainer log-probs, AIS, and the GRPO minibatch updates.

``update(state, batch, rewards, key, ref_params, ..., logp_old=None)``::

    advantages  = group_advantages(rewards)                      # [Pn, G] -> [B, N]
    logp_old    = trainer log-probs of the batch (detached)      # [B, N]
    AIS         = ais_coefficient(logp_old, batch.logp, A, mask)
    epochs x minibatches guarded GRPO steps on A_tilde

One forward when it is exact (`single_forward`): with one epoch, one minibatch
and no gradient accumulation, the params of the only gradient step are those
that ``logp_old`` is defined under, so ``logp_old`` is the stop-gradient of the
differentiated forward itself and the separate no-grad pass is skipped (AIS
runs inside the loss on it).  Otherwise ``logp_old`` is scored once before the
updates: by `score` in its own program (the host loop dispatches it before it
computes rewards, so it overlaps the host's work; `ais_jax.training.rl`), or inside
`update` when not given.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from ais_jax.config.schema import Config, TrainSection
from ais_jax.method import grpo
from ais_jax.method.corrections import correction_weights
from ais_jax.method.distributions import truncates as truncates_dist
from ais_jax.models.model import ModelConfig
from ais_jax.training import optim, policy
from ais_jax.training import sharding as shd
from ais_jax.training.optim import TrainState

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class RolloutBatch(NamedTuple):
    """A sampled group batch, ``B = prompts * G`` rows (rows p*G .. p*G+G-1: prompt p)."""

    prompt_tokens: jax.Array  # [B, P] left-padded
    prompt_mask: jax.Array  # [B, P]
    tokens: jax.Array  # [B, N]
    mask: jax.Array  # [B, N] float32, 1 up to and including EOS
    logp: jax.Array  # [B, N] float32, sampler log-probs


def single_forward(cfg: Config) -> bool:
    """Whether `update` takes ``logp_old`` from the differentiated forward (one pass).

    True with ``train.epochs == 1``, ``train.minibatches == 1`` and no
    gradient accumulation over micro-batches (AIS needs the statistics of the
    whole batch before the first gradient), and without LoRA dropout (the
    differentiated forward then draws masks; ``logp_old`` comes from the
    deterministic score).
    """
    t = cfg.train
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    dropout = cfg.lora.rank > 0 and cfg.lora.dropout > 0
    return t.epochs == 1 and t.minibatches == 1 and not dropout and (
        not t.micro_batch_size or t.micro_batch_size >= rows)


def remat_policy(cfg: Config) -> str:
    """``train.remat`` resolved: ``auto`` is ``full`` for pretrained models, else ``none``."""
    if cfg.train.remat != "auto":
        return cfg.train.remat
    return "none" if cfg.model.source == "scratch" else "full"


def scoring(cfg: Config, mesh: Mesh | None = None, vocab_size: int = 0,
            view: Any = None) -> policy.Scoring:
    """How the trainer scores completions: the rollout's distribution, the model's compute
    dtype, the head chunk, the remat policy and (with a mesh) batch-sharded activations and a
    vocab-parallel untied head (``vocab_size``: the head's rows); ``view`` maps the state's
    params to the model's (LoRA, `ais_jax.training.lora_policy.view`; None: identity)."""
    r = cfg.rollout
    return policy.Scoring(r.temperature, r.top_k, r.top_p, DTYPES[cfg.model.compute_dtype],
                        chunk=cfg.train.logprob_chunk, remat=remat_policy(cfg),
                        constrain=None if mesh is None else shd.batch_constraint(mesh),
                        head_constrain=None if mesh is None
                        else shd.head_constraint(mesh, vocab_size), view=view)


def loss_config(t: TrainSection) -> grpo.LossConfig:
    """The `grpo.LossConfig` of the train section."""
    return grpo.LossConfig(clip_eps=t.clip_eps, clip_eps_high=t.clip_eps_high or None,
                           beta_kl=t.beta_kl, aggregation=t.loss_aggregation)


def gradient_rows(cfg: Config) -> int:
    """Rows of one gradient evaluation: the micro-batch, else the minibatch."""
    r, t = cfg.rollout, cfg.train
    return t.micro_batch_size or r.prompts_per_step * r.group_size // t.minibatches


def truncates(cfg: Config) -> bool:
    """Whether the rollout samples from a truncated (top-k / top-p) distribution."""
    r = cfg.rollout
    return truncates_dist(r.temperature, r.top_k, r.top_p)


def score(params: Any, batch: RolloutBatch, model_cfg: ModelConfig, cfg: Config,
          mesh: Mesh | None, *, full: bool = False, view: Any = None) -> Any:
    """Detached trainer log-probs ``[B, N]`` of the whole batch, scored ``gradient_rows`` rows at
    a time (so the no-grad pass never holds more activations than one gradient does).

    Args:
      params: trainer params (``logp_old``) or the reference policy's (``logp_ref``).
      batch: the rollout, ``B`` rows.
      model_cfg: model config.
      cfg: the run config.
      mesh: the trainer's mesh, or None.
      full: score under the full (untruncated) tempered distribution only
        (the KL reference).
      view: ``params -> model params`` (LoRA), or None.

    Returns:
      ``[B, N]`` float32 under the sampler's distribution; when it truncates
      (and not ``full``), the pair ``(truncated, full)`` (see
      `ais_jax.training.policy.trainer_logprobs`).
    """
    B = batch.tokens.shape[0]
    parts = max(1, B // gradient_rows(cfg))
    shards = 1 if mesh is None else shd.batch_divisor(mesh)
    sc = scoring(cfg, mesh, model_cfg.vocab_size, view)
    both = truncates(cfg) and not full
    if full:
        sc = sc._replace(top_k=0, top_p=1.0)
    xs = (batch.prompt_tokens, batch.prompt_mask, batch.tokens)

    def score(x: tuple[jax.Array, jax.Array, jax.Array]) -> Any:
        return policy.trainer_logprobs(params, *x, model_cfg, sc, both=both)

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
                       cfg: Config, mesh: Mesh | None, view: Any = None,
                       dropout_key: jax.Array | None = None,
                       ) -> tuple[TrainState, dict[str, jax.Array]]:
    """``epochs x minibatches`` guarded updates over ``gb`` (rows reshuffled each epoch),
    each accumulated over ``train.micro_batch_size``-row micro-batches when set; with
    ``dropout_key`` the loss forward runs ``view(params, key)`` (LoRA dropout, a fresh key
    per update and micro-batch, `ais_jax.training.optim.apply_update`)."""
    B = gb.tokens.shape[0]
    t = cfg.train
    M = t.minibatches
    shards = 1 if mesh is None else shd.batch_divisor(mesh)
    micro = (B // M) // t.micro_batch_size if t.micro_batch_size else 1
    loss_cfg, sc = loss_config(t), scoring(cfg, mesh, model_cfg.vocab_size, view)

    def loss_fn(params: Any, mb: grpo.GRPOBatch, totals: grpo.LossTotals | None = None,
                key: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
        s = sc if key is None else sc._replace(view=lambda p: view(p, key))
        return policy.policy_loss(params, mb, model_cfg, loss_cfg, s, totals)

    def one(st: TrainState, mb: grpo.GRPOBatch) -> tuple[TrainState, dict[str, jax.Array]]:
        return optim.apply_update(st, mb, loss_fn, optimizer, micro_batches=micro, shards=shards,
                                  key=dropout_key)

    def epoch(st: TrainState, ekey: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
        return jax.lax.scan(one, st, _minibatches(gb, ekey, M, shards, mesh))

    state, mets = jax.lax.scan(epoch, state, jax.random.split(key, cfg.train.epochs))
    return state, jax.tree.map(jnp.mean, mets)


def _correct(logp_old: Any, batch: RolloutBatch, adv_tok: jax.Array,
             cfg: Config) -> tuple[grpo.GRPOBatch, dict[str, jax.Array]]:
    """The correction mode (``ais.mode``) on the trainer's ``logp_old``: the `grpo.GRPOBatch`
    of the update (loss mask = the mode's keep mask, ``A_tilde``) and the batch metrics.
    The batch's proximal log-probs are ``logp_old``, or the sampler's ``batch.logp`` with
    ``train.proximal=behaviour`` (the mismatch metrics stay the trainer's).

    ``logp_old``: ``[B, N]``, or ``(truncated, full)`` when the rollout truncates.  A
    valid token outside the trainer's truncated set (``logp_old = -inf``) has
    importance ratio 0 in every mode and stays in the batch (``zero_prob_tokens``).
    """
    lo, lo_full = logp_old if isinstance(logp_old, tuple) else (logp_old, None)
    lo = jax.lax.stop_gradient(lo)
    lo_full = None if lo_full is None else jax.lax.stop_gradient(lo_full)
    a = cfg.ais
    valid = batch.mask > 0
    res = correction_weights(lo, batch.logp, adv_tok, valid, mode=a.mode, cap=a.C,
                             threshold=a.geo_threshold, delta=a.delta, gamma=a.gamma,
                             beta_var=a.beta_var, eps=a.eps, use_ess=a.use_ess,
                             use_mis=a.use_mis, use_var=a.use_var)
    keep = res.keep
    # train.proximal=behaviour (naive PPO): the ratio and clip against the sampler's log-probs
    prox = batch.logp if cfg.train.proximal == "behaviour" else lo
    gb = grpo.GRPOBatch(batch.prompt_tokens, batch.prompt_mask, batch.tokens,
                        keep.astype(jnp.float32), prox, res.advantages, None, lo_full)
    extra = {
        "response_len": jnp.mean(jnp.sum(valid, axis=1).astype(jnp.float32)),
        "loss_tokens": jnp.sum(keep).astype(jnp.float32),
        "dropped_tokens": jnp.sum(valid & ~keep).astype(jnp.float32),
        "zero_prob_tokens": jnp.sum(valid & jnp.isneginf(lo)).astype(jnp.float32),
        "logp_rollout_mean": jnp.sum(jnp.where(valid, batch.logp, 0.0))
        / jnp.maximum(jnp.sum(valid), 1),
        **res.stats(),
    }
    return gb, extra


def _single_forward_update(state: TrainState, batch: RolloutBatch, adv_tok: jax.Array,
                           logp_ref: jax.Array | None, optimizer: optax.GradientTransformation,
                           model_cfg: ModelConfig, cfg: Config,
                           mesh: Mesh | None,
                           view: Any = None) -> tuple[TrainState, dict[str, jax.Array]]:
    """One guarded step whose ``logp_old`` is the stop-gradient of its own forward."""
    loss_cfg, sc = loss_config(cfg.train), scoring(cfg, mesh, model_cfg.vocab_size, view)
    both = truncates(cfg)

    def loss_fn(params: Any, b: RolloutBatch) -> tuple[jax.Array, dict[str, jax.Array]]:
        new = policy.trainer_logprobs(params, b.prompt_tokens, b.prompt_mask, b.tokens,
                                    model_cfg, sc, both=both)  # differentiated
        ln, ln_full = new if both else (new, None)
        gb, extra = _correct(new, b, adv_tok, cfg)
        loss, mets = grpo.grpo_loss(ln, gb.logp_old, gb.advantages, gb.mask, logp_ref,
                                    loss_cfg, None, ln_full, gb.logp_old_full)
        return loss, {**mets, **extra}

    return optim.apply_update(state, batch, loss_fn, optimizer)


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
    logp_old: jax.Array | None = None,
    *,
    one_pass: bool | None = None,
    view: Any = None,
    dropout_key: jax.Array | None = None,
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
      logp_old: ``[B, N]`` the trainer's log-probs of the batch under
        ``state.params``, from `score` (None: scored here, or taken from the
        differentiated forward when ``one_pass``).
      one_pass: take ``logp_old`` from the differentiated forward (only valid
        when `single_forward` holds); None: ``single_forward(cfg)`` and no
        ``logp_old`` given.
      view: ``state.params -> model params`` (LoRA: the adapters onto the frozen base,
        `ais_jax.training.lora_policy.view`; gradients are taken w.r.t. ``state.params``
        only), or None (full fine-tuning).  ``ref_params`` are model params either way.
      dropout_key: LoRA dropout (`ais_jax.training.lora_policy.dropout_key`): the loss
        forward of each update runs ``view(params, key)`` with a fresh key; the score
        (``logp_old``) and the KL reference stay deterministic.  None: no dropout.

    Returns:
      ``(new_state, metrics)`` (scalars).

    Raises:
      ValueError: ``one_pass=True`` where `single_forward` does not hold.
    """
    B, N = batch.tokens.shape
    adv_seq = grpo.group_advantages(rewards).reshape(B)  # [B]
    adv_tok = jnp.broadcast_to(adv_seq[:, None], (B, N))  # [B, N]
    if one_pass is None:
        one_pass = logp_old is None and single_forward(cfg) and dropout_key is None
    elif one_pass and (not single_forward(cfg) or dropout_key is not None):
        raise ValueError("one_pass needs train.epochs = train.minibatches = 1, no "
                         "micro-batching and no LoRA dropout")
    logp_ref = None
    if ref_params is not None and cfg.train.beta_kl > 0:
        logp_ref = score(ref_params, batch, model_cfg, cfg, mesh, full=True)
    if one_pass:
        if mesh is not None:
            batch = jax.tree.map(shd.batch_constraint(mesh), batch)
        state, mets = _single_forward_update(state, batch, adv_tok, logp_ref, optimizer,
                                             model_cfg, cfg, mesh, view)
        extra = {k: mets.pop(k) for k in list(mets) if k not in _UPDATE_METRICS}
    else:
        if logp_old is None:
            logp_old = score(state.params, batch, model_cfg, cfg, mesh, view=view)  # [B, N]
        gb, extra = _correct(logp_old, batch, adv_tok, cfg)
        gb = gb._replace(logp_ref=logp_ref)
        state, mets = _minibatch_updates(state, gb, key, optimizer, model_cfg, cfg, mesh, view,
                                         dropout_key)
    metrics = {
        "loss": mets["loss"],
        "grad_norm": mets["grad_norm"],
        "clip_frac": mets["clip_frac"],
        "kl": mets["kl"],
        "skipped": mets["skipped"] * cfg.train.epochs * cfg.train.minibatches,
        "reward_mean": jnp.mean(rewards),
        "reward_std": jnp.std(rewards),
        "adv_abs_mean": jnp.mean(jnp.abs(adv_seq)),
        **extra,
    }
    return state, metrics


_UPDATE_METRICS = ("loss", "grad_norm", "clip_frac", "kl", "skipped", "ratio_mean")
