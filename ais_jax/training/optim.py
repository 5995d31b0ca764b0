"""The guarded optimizer step: train state, AdamW, gradient accumulation, non-finite skips.

`apply_update` differentiates any ``loss_fn(params, batch)`` (the trainer's is
`ais_jax.training.policy.policy_loss`), optionally over micro-batches
(`accumulated_grads`), and skips (and counts) a step whose loss or gradient is
not finite, leaving params and optimizer state bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ais_jax.method.grpo import loss_totals


class TrainState(NamedTuple):
    """Everything that changes across updates (checkpointed).

    Attributes:
      params: master params (float32, or bfloat16 when asked for).
      opt_state: optax state.
      step: int32 scalar, optimizer updates done (applied + skipped).
      skipped: int32 scalar, updates skipped for a non-finite loss / gradient.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    skipped: jax.Array


def init_train_state(params: Any, optimizer: optax.GradientTransformation) -> TrainState:
    """Fresh `TrainState` for ``params``."""
    # Two distinct buffers: the state is donated, and a buffer cannot be donated twice.
    return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32),
                      jnp.zeros((), jnp.int32))


def make_optimizer(
    learning_rate: float | optax.Schedule,
    *,
    clip_norm: float | None = 1.0,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
) -> optax.GradientTransformation:
    """AdamW with optional global-norm gradient clipping (``clip_norm=None`` disables it)."""
    parts = []
    if clip_norm is not None:
        parts.append(optax.clip_by_global_norm(clip_norm))
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay))
    return optax.chain(*parts)


def split_rows(tree: Any, parts: int, shards: int = 1) -> Any:
    """Split the leading (row) axis of every leaf into ``parts`` equal parts: ``[B, ...] ->
    [parts, B / parts, ...]``, each part taking an equal slice of every one of ``shards``
    contiguous row shards, so rows sharded over the batch axes stay on their devices.

    With ``shards == 1`` this is ``x.reshape(parts, B // parts, ...)``.
    """
    def one(x: jax.Array) -> jax.Array:
        B = x.shape[0]
        y = x.reshape(shards, parts, B // (shards * parts), *x.shape[1:])
        return jnp.swapaxes(y, 0, 1).reshape(parts, B // parts, *x.shape[1:])
    return jax.tree.map(one, tree)


def merge_rows(tree: Any, shards: int = 1) -> Any:
    """Inverse of `split_rows`: ``[parts, B / parts, ...] -> [B, ...]`` in the original order."""
    def one(y: jax.Array) -> jax.Array:
        parts, rows = y.shape[:2]
        z = y.reshape(parts, shards, rows // shards, *y.shape[2:])
        return jnp.swapaxes(z, 0, 1).reshape(parts * rows, *y.shape[2:])
    return jax.tree.map(one, tree)


def accumulated_grads(
    loss_fn: Callable[..., tuple[jax.Array, dict[str, jax.Array]]],
    params: Any,
    batch: Any,
    micro_batches: int,
    shards: int = 1,
    key: jax.Array | None = None,
) -> tuple[tuple[jax.Array, dict[str, jax.Array]], Any]:
    """``((loss, metrics), grads)`` of ``batch`` summed over ``micro_batches`` micro-batches.

    ``loss_fn(params, micro_batch, totals)`` normalizes by the whole batch's
    `LossTotals` (from ``batch.mask``), so the sums equal one pass over the
    whole batch; only one micro-batch's activations are alive at a time.  With
    ``key`` (LoRA dropout) micro-batch ``i`` gets ``key=fold_in(key, i)`` too.
    """
    totals = loss_totals(batch.mask)

    def lf(p: Any, mb: Any, i: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        kw = {} if key is None else {"key": jax.random.fold_in(key, i)}
        return loss_fn(p, mb, totals, **kw)

    grad_fn = jax.value_and_grad(lf, has_aux=True)

    def one(acc: Any, xs: tuple[Any, jax.Array]) -> tuple[Any, None]:
        out = grad_fn(params, *xs)
        return jax.tree.map(jnp.add, acc, out), None

    zero = jax.tree.map(jnp.zeros_like, jax.eval_shape(
        grad_fn, params, jax.tree.map(lambda x: x[: x.shape[0] // micro_batches], batch),
        jnp.int32(0)))
    out, _ = jax.lax.scan(one, zero, (split_rows(batch, micro_batches, shards),
                                      jnp.arange(micro_batches, dtype=jnp.int32)))
    return out


def apply_update(
    state: TrainState,
    batch: Any,
    loss_fn: Callable[..., tuple[jax.Array, dict[str, jax.Array]]],
    optimizer: optax.GradientTransformation,
    *,
    micro_batches: int = 1,
    shards: int = 1,
    key: jax.Array | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One guarded optimizer step: ``loss_fn(params, batch[, totals]) -> (loss, metrics)``.

    If the loss or any gradient is not finite, params and optimizer state are
    returned bit-identical and ``skipped`` is incremented.  With
    ``micro_batches > 1`` the gradient is accumulated over micro-batches
    (`accumulated_grads`; ``loss_fn`` then takes the batch's `LossTotals`).
    With ``key`` (the LoRA dropout stream) ``loss_fn`` also gets ``key=``:
    ``fold_in(key, state.step)``, then ``fold_in(., i)`` for micro-batch ``i``, so every
    optimizer step and micro-batch draws fresh masks, deterministically.

    Returns:
      ``(new_state, metrics)``; metrics has ``loss``, ``grad_norm``, ``skipped``
      (1.0 if this step was skipped) and whatever ``loss_fn`` returned.
    """
    if key is not None:
        key = jax.random.fold_in(key, state.step)
    if micro_batches > 1:
        (loss, aux), grads = accumulated_grads(loss_fn, state.params, batch, micro_batches,
                                               shards, key)
    else:
        kw = {} if key is None else {"key": jax.random.fold_in(key, 0)}
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch,
                                                                       **kw)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    # Non-finite gradients would poison the optimizer moments even if discarded
    # afterwards; feed zeros through instead and select the old state below.
    safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
    updates, new_opt = optimizer.update(safe_grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    new_state = TrainState(
        params=keep(new_params, state.params),
        opt_state=keep(new_opt, state.opt_state),
        step=state.step + 1,
        skipped=state.skipped + jnp.where(finite, 0, 1).astype(jnp.int32),
    )
    metrics = dict(aux)
    metrics.update(loss=loss, grad_norm=grad_norm, skipped=1.0 - finite.astype(jnp.float32))
    return new_state, metrics


def bf16_half_ulp(magnitude: float) -> float:
    """Half a bfloat16 ulp at ``magnitude``: the smallest change a bf16 weight of that size keeps.

    bfloat16 has 8 significant bits, so the spacing at ``|w|`` in
    ``[2^e, 2^(e+1))`` is ``2^(e-7)``; an update smaller than half of it rounds
    away.
    """
    import math

    if magnitude <= 0 or not math.isfinite(magnitude):
        return 0.0
    return 2.0 ** (math.floor(math.log2(magnitude)) - 7) / 2


def check_bf16_master(params: Any, learning_rate: float) -> None:
    """Refuse bfloat16 master weights that an Adam step of ``learning_rate`` cannot move.

    An Adam(W) step moves a weight by about the learning rate; when that is
    below half a bf16 ulp at the median ``|w|`` of the first decoder layer's
    ``wq`` (of the first shard this process holds, when it is sharded), most
    updates round to nothing.

    Raises:
      UsageError: naming the numbers and the fix (``model.param_dtype=float32``).
    """
    import numpy as np

    from ais_jax.core.errors import UsageError

    w = params["layers"]["wq"]
    if isinstance(w, jax.Array):  # a shard this process holds (no gather of a sharded leaf)
        w = w.addressable_shards[0].data
    sample = np.abs(np.asarray(w[0] if w.ndim == 3 else w, np.float32)).ravel()[: 1 << 20]
    typical = float(np.median(sample))
    half_ulp = bf16_half_ulp(typical)
    if learning_rate < half_ulp:
        raise UsageError(
            f"bfloat16 master weights cannot learn at train.learning_rate={learning_rate:g}: "
            f"the median |w| {typical:.3g} has a bf16 half-ulp of {half_ulp:.3g}, so Adam "
            "steps round to nothing; set model.param_dtype=float32 (the default)")


def rl_warmup(learning_rate: float, warmup_steps: int,
              updates_per_step: int) -> Callable[[Any], Any]:
    """Linear warmup counted in RL steps: RL step ``s`` (from 0) runs at
    ``learning_rate * min(1, (s + 1) / warmup_steps)``.

    The schedule sees optimizer updates (``updates_per_step = epochs *
    minibatches`` of them per RL step), so every update of one RL step gets the
    same rate; the first update is nonzero and the full rate is reached at RL
    step ``warmup_steps - 1``.

    Args:
      learning_rate: peak rate.
      warmup_steps: RL steps of the warmup (>= 1).
      updates_per_step: optimizer updates per RL step (>= 1).

    Returns:
      An optax schedule ``count -> rate``.
    """
    def schedule(count: Any) -> Any:
        rl_step = count // updates_per_step
        return learning_rate * jnp.minimum(1.0, (rl_step + 1) / warmup_steps)
    return schedule
