"""Off-policy correction modes for the rollout / trainer mismatch, with one result type.

`correction_weights` turns per-token trainer and rollout log-probs of a batch
of ``B`` sequences x ``N`` tokens into per-token advantage multipliers, a keep
mask and logging diagnostics, for every correction the peers ship (docs/corrections.md).
With ``rho = exp(logp_train - logp_rollout)`` per valid token, ``C = cap`` and
``S_b = sum_t log rho_bt`` the log-ratio of sequence ``b`` (its valid tokens):

=============  ===================================================  ==========================
mode           weight (token kept unless stated)                    peer name
=============  ===================================================  ==========================
``none``       ``1``                                                no correction
``tis``        ``min(rho, C)``                                      TRL ``token_truncate``,
                                                                    verl ``rollout_is=token``
``token_mask`` ``rho``; token dropped where ``rho > C``             TRL ``token_mask``
``seq_tis``    ``min(exp(S_b), C)`` on every token of ``b``         TRL ``sequence_truncate``,
                                                                    verl ``rollout_is=sequence``
``seq_mask``   ``exp(S_b)``; sequence dropped where ``> C``         TRL ``sequence_mask``
``geo_mask``   ``1``; sequence dropped where                        verl ``rollout_rs=geometric``
               ``|S_b / n_b| > threshold``
``ais``        ``1 + alpha (min(rho, C) - 1)`` (`ais_coefficient`)  the paper
=============  ===================================================  ==========================

Default ``cap`` (`DEFAULT_CAPS`): 5 for ``ais`` / ``tis`` (the paper's ``C``,
`ais_coefficient`'s default), 3 for ``token_mask`` / ``seq_tis`` / ``seq_mask`` (TRL's
``vllm_importance_sampling_cap``).  Default ``threshold``: ``log(1.001)``
(verl's geometric preset, upper 1.001, lower 1/1.001).  Masks compare in log
space (``log rho > log C``).  ``ais``, ``tis`` and ``none`` delegate to
`ais_jax.method.ais.ais_coefficient`, so both APIs give the same weights.

Zero trainer probability.  A valid token with ``logp_train = -inf`` (outside
the trainer's top-k / top-p set) has ``rho = 0`` and ``log rho = -inf``: weight
0 in ``tis`` / ``token_mask`` (kept, as TRL does) and in ``ais``'s ``w_bar``;
its sequence has ``S_b = -inf``, i.e. sequence ratio 0: weight 0 in
``seq_tis`` / ``seq_mask`` (kept) and dropped by ``geo_mask``.  A NaN
``logp_train`` in a valid position is guarded the same way: it is taken as
``-inf`` (ratio 0) in every mode.  ``logp_rollout`` of a sampled token must be
finite: a NaN there (or in an advantage) propagates into the weights (except
mode ``none``) and the statistics.

The sequence log-ratio.  ``S_b`` is the float32 sum of the valid tokens'
log-ratios, a ``jnp.sum`` reduction (float32 rounding, in the order XLA chooses:
it may differ from a sequential or float64 sum in the last bits); masked
positions are selected away, so NaN / Inf there never leak; no token is capped
before the sum, so a row ``[+100, -90]`` has
``S_b = 10``.  The masks compare this ``S_b`` (``seq_mask``: ``S_b > log C``,
``geo_mask``: ``|S_b / n_b|``); the weights take ``exp(min(S_b, 87))``
(`LOG_RATIO_BOUND`), which cannot overflow, so ``seq_mask`` keeps
``exp(S_b)`` exactly whenever ``C <= e^87``.  Only to keep the sum finite
above, a token log-ratio is bounded by ``float32 max / (2 N)`` (a ``+inf``,
from a ``logp_rollout = -inf`` outside the contract or a float32 overflow of
the difference, cannot meet a ``-inf``: the sequence ratio is then 0); no
finite log-prob difference of practical size is near that bound.

Diagnostics (float32 scalars over the whole batch, in every mode; token and
sequence log-ratios clipped to ``[-87, 87]``, a sequence's after its sum):
``kl_k1`` (mean of ``logp_rollout - logp_train``,
the k1 estimate of KL(rollout || train)), ``kl_k3`` (mean of ``rho - 1 - log
rho``, at most float32 max), ``log_ratio_p05`` / ``_p50`` / ``_p95`` (masked
quantiles of ``log rho``, linear interpolation as `numpy.quantile`),
``dropped_token_frac`` (valid tokens not kept / valid tokens),
``dropped_seq_frac`` (sequences with a valid token but none kept / such
sequences), ``seq_log_ratio_std`` (sample std of ``clip(S_b, -87, 87)``),
``weight_mean`` / ``weight_max`` (over kept tokens) and ``num_valid``; every mode adds
`AISResult.stats` (``alpha``, ``cv``, ``d_bar``, ...; ``alpha`` is 0 in the
modes that do not apply it).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ais_jax.method.ais import (
    LOG_RATIO_BOUND,
    AISResult,
    _masked_mean_std,
    ais_coefficient,
    as_arrays,
    check_flags,
    check_mask_values,
)

CORRECTION_MODES = ("none", "tis", "token_mask", "seq_tis", "seq_mask", "geo_mask", "ais")

#: ``cap`` used when none is given, per mode (``geo_mask`` uses no cap; ``none``
#: passes its cap to `ais_coefficient`, which only reports statistics with it).
DEFAULT_CAPS = {"none": 5.0, "tis": 5.0, "token_mask": 3.0, "seq_tis": 3.0, "seq_mask": 3.0,
                "geo_mask": 3.0, "ais": 5.0}

#: Default ``threshold`` of ``geo_mask`` on ``|mean log rho|``: verl's 1.001 geometric bound.
DEFAULT_GEO_THRESHOLD = math.log(1.001)

_AIS_MODES = ("ais", "tis", "none")
_AIS_KWARGS = ("delta", "gamma", "beta_var", "eps", "use_ess", "use_mis", "use_var")
_F32_MAX = float(jnp.finfo(jnp.float32).max)
_QUANTILES = (("log_ratio_p05", 0.05), ("log_ratio_p50", 0.5), ("log_ratio_p95", 0.95))


@struct.dataclass
class CorrectionResult:
    """Output of `correction_weights`; arrays ``[B, N]``, statistics float32 scalars.

    Attributes:
      weights: per-token multiplier of the advantage: the mode's weight where
        kept, 0 where a valid token is dropped, 1 where the mask is 0 (as in
        `AISResult.weights`).
      advantages: ``weights * A`` where kept, 0 elsewhere.
      keep: bool; the token stays in the loss.  False for padding and for
        dropped tokens / sequences (``keep`` implies valid).
      metrics: the scalar statistics (see `stats`).
      ais: the `AISResult` behind modes ``ais`` / ``tis`` / ``none``; None otherwise.
    """

    weights: jax.Array
    advantages: jax.Array
    keep: jax.Array
    metrics: dict[str, jax.Array]
    ais: AISResult | None = None

    def stats(self) -> dict[str, jax.Array]:
        """The scalar statistics as a dict (for logging), like `AISResult.stats`."""
        return dict(self.metrics)


def _is_num(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _validate(arrays: list[jax.Array], mode: str, cap: Any, threshold: Any,
              ais_kwargs: dict[str, Any]) -> None:
    fn = "correction_weights"
    if mode not in CORRECTION_MODES:
        raise ValueError(f"{fn}: unknown mode {mode!r}; mode must be one of {CORRECTION_MODES}")
    if cap is not None and (isinstance(cap, bool) or (
            _is_num(cap) and not (math.isfinite(cap) and cap > 1))):
        raise ValueError(f"{fn}: cap={cap!r} is invalid; cap must be a finite number > 1 "
                         f"(or None for the mode's default {DEFAULT_CAPS})")
    if isinstance(threshold, bool) or (
            _is_num(threshold) and not (math.isfinite(threshold) and threshold >= 0)):
        raise ValueError(f"{fn}: threshold={threshold!r} is invalid; threshold must be a "
                         f"finite number >= 0")
    unknown = sorted(set(ais_kwargs) - set(_AIS_KWARGS))
    if unknown:
        raise ValueError(f"{fn}: unknown argument(s) {unknown}; the AIS options are "
                         f"{_AIS_KWARGS} (the truncation cap is `cap`)")
    names = ("logp_train", "logp_rollout", "advantages", "mask")
    shapes = [a.shape for a in arrays]
    if len(set(shapes)) != 1 or len(shapes[0]) != 2:
        desc = ", ".join(f"{n}{tuple(s)}" for n, s in zip(names, shapes, strict=True))
        raise ValueError(f"{fn}: inputs must be [B, N] arrays of one shape, got {desc}")
    for n, a in zip(names[:3], arrays[:3], strict=True):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            raise ValueError(f"{fn}: {n} must be a float array, got dtype {a.dtype}")
    if not (jnp.issubdtype(arrays[3].dtype, jnp.bool_)
            or jnp.issubdtype(arrays[3].dtype, jnp.number)):
        raise ValueError(f"{fn}: mask must be bool or numeric, got dtype {arrays[3].dtype}")


def masked_quantiles(x: jax.Array, valid: jax.Array, qs: tuple[float, ...]) -> jax.Array:
    """Quantiles of ``x`` over ``valid`` entries (jittable; `numpy.quantile`'s linear rule).

    Args:
      x: ``[...]`` float values (finite where valid).
      valid: ``[...]`` bool, same shape.
      qs: quantile levels in [0, 1] (static).

    Returns:
      ``[len(qs)]`` float32; 0 where no entry is valid.
    """
    if x.size == 0:  # a zero-size batch: no entry at all (static)
        return jnp.zeros((len(qs),), jnp.float32)
    xs = jnp.sort(jnp.where(valid, x.astype(jnp.float32), jnp.inf).reshape(-1))
    n = jnp.sum(valid, dtype=jnp.int32)
    last = jnp.maximum(n - 1, 0)
    pos = jnp.asarray(qs, jnp.float32) * last.astype(jnp.float32)  # [Q]
    lo = jnp.minimum(jnp.floor(pos).astype(jnp.int32), last)
    hi = jnp.minimum(lo + 1, last)
    x_lo, x_hi = xs[lo], xs[hi]
    q = x_lo + (pos - lo.astype(jnp.float32)) * (x_hi - x_lo)
    return jnp.where(n > 0, q, 0.0)


_K3_SERIES_BELOW = 0.5
_K3_SERIES = tuple(1.0 / math.factorial(k) for k in range(2, 13))  # 1/2!, ..., 1/12!


def k3(c: jax.Array) -> jax.Array:
    """The k3 estimator term ``exp(c) - 1 - c``, elementwise, without cancellation near 0.

    ``exp(c) - c - 1`` in float32 loses every digit for ``|c| < 1e-4`` (it is 0
    at ``c = 1e-4``, exactly ``5e-9``), and ``expm1(c) - c`` still cancels about
    ``log2(2 / |c|)`` bits (relative error 6e-5 at ``|c| = 1e-2``).  This uses the
    Taylor series ``c^2 sum_k c^k / (k + 2)!`` through ``c^12`` for ``|c| < 0.5``
    (truncation below 1e-12 relative) and ``expm1(c) - c`` elsewhere: relative
    error below 1e-6 over the float32 range (tested against float64).
    Differentiable with a finite gradient wherever the value is finite (the
    unused branch sees a safe input).  Shared by the ``kl_k3`` diagnostic here
    and the KL penalty of `ais_jax.method.grpo.grpo_loss`.

    Args:
      c: ``[...]`` float log-ratio (float32 for reductions).

    Returns:
      ``[...]`` same dtype, ``>= 0`` (``+inf`` where ``exp(c)`` overflows).
    """
    small = jnp.abs(c) < _K3_SERIES_BELOW
    cs = jnp.where(small, c, 0.0)
    poly = jnp.zeros_like(cs)
    for coef in reversed(_K3_SERIES):  # Horner: 1/2! + c (1/3! + c (... + c / 12!))
        poly = coef + cs * poly
    return jnp.where(small, cs * cs * poly, jnp.expm1(c) - c)


def _seq_log_ratio(log_rho: jax.Array, valid: jax.Array) -> jax.Array:
    """``S_b``: the sum of each row's valid token log-ratios, before any cap.

    Args:
      log_rho: ``[B, N]`` float32 token log-ratios (anything where not valid).
      valid: ``[B, N]`` bool.

    Returns:
      ``[B]`` float32; 0 for a row without valid tokens, ``-inf`` when a valid
      token's ratio is 0, NaN when a valid token is NaN.  A token enters
      bounded above by ``float32 max / (2 N)`` so the sum never reaches
      ``+inf`` (module docstring).
    """
    bound = _F32_MAX / (2.0 * max(log_rho.shape[-1], 1))
    return jnp.sum(jnp.where(valid, jnp.minimum(log_rho, bound), 0.0), axis=-1,
                   dtype=jnp.float32)


def _diagnostics(log_rho: jax.Array, valid: jax.Array, keep: jax.Array,
                 weights: jax.Array) -> dict[str, jax.Array]:
    n = jnp.sum(valid, dtype=jnp.float32)
    inv_n = 1.0 / jnp.maximum(n, 1.0)
    c = jnp.where(valid, jnp.clip(log_rho, -LOG_RATIO_BOUND, LOG_RATIO_BOUND), 0.0)
    out = {
        "kl_k1": -jnp.sum(c) * inv_n,
        "kl_k3": jnp.minimum(jnp.sum(jnp.where(valid, k3(c), 0.0)) * inv_n, _F32_MAX),
    }
    out.update(zip((k for k, _ in _QUANTILES),
                   masked_quantiles(c, valid, tuple(q for _, q in _QUANTILES)), strict=True))
    out["dropped_token_frac"] = jnp.sum(valid & ~keep, dtype=jnp.float32) * inv_n
    seq_valid = jnp.any(valid, axis=1)  # [B]
    n_seq = jnp.sum(seq_valid, dtype=jnp.float32)
    seq_dropped = seq_valid & ~jnp.any(keep, axis=1)
    out["dropped_seq_frac"] = jnp.sum(seq_dropped, dtype=jnp.float32) / jnp.maximum(n_seq, 1.0)
    s_b = jnp.clip(_seq_log_ratio(log_rho, valid), -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    _, out["seq_log_ratio_std"] = _masked_mean_std(s_b, seq_valid, n_seq)
    n_keep = jnp.maximum(jnp.sum(keep, dtype=jnp.float32), 1.0)
    kept_w = jnp.where(keep, weights, 0.0)
    out["weight_mean"] = jnp.minimum(jnp.sum(kept_w) / n_keep, _F32_MAX)
    out["weight_max"] = jnp.max(kept_w) if kept_w.size else jnp.zeros((), jnp.float32)
    out["num_valid"] = n
    return {k: v.astype(jnp.float32) for k, v in out.items()}


def correction_weights(
    logp_train: jax.Array,
    logp_rollout: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    mode: str = "ais",
    cap: float | None = None,
    threshold: float = DEFAULT_GEO_THRESHOLD,
    **ais_kwargs: Any,
) -> CorrectionResult:
    """Per-token off-policy correction of the advantages, for every mode in `CORRECTION_MODES`.

    Jittable with ``mode``, ``cap``, ``threshold`` and the AIS options static.
    Everything runs under `jax.lax.stop_gradient` in float32, over the whole
    batch; masked positions may hold anything (NaN, Inf) and never leak.

    Args:
      logp_train: ``[B, N]`` trainer log-probs of the sampled tokens (same
        sampling distribution as the rollout; ``-inf`` allowed: ratio 0; NaN is
        taken as ``-inf``).
      logp_rollout: ``[B, N]`` log-probs recorded by the sampler (finite where valid).
      advantages: ``[B, N]`` per-token advantages ``A``.
      mask: ``[B, N]`` bool or 0/1; nonzero marks a valid generated token.
      mode: one of `CORRECTION_MODES` (see the module docstring for formulas).
      cap: ratio cap ``C > 1`` of every mode but ``none`` / ``geo_mask``;
        None: `DEFAULT_CAPS` of the mode.
      threshold: ``geo_mask`` bound (``>= 0``) on ``|mean log rho|`` of a sequence.
      **ais_kwargs: options of `ais_jax.method.ais.ais_coefficient` (``delta``,
        ``gamma``, ``beta_var``, ``eps``, ``use_ess``, ``use_mis``,
        ``use_var``); used by modes ``ais`` / ``tis`` / ``none``, ignored by the others.

    Returns:
      `CorrectionResult` (``weights``, ``advantages``, ``keep`` ``[B, N]``; ``stats()``).

    Raises:
      ValueError: unknown mode, ``cap <= 1``, negative ``threshold``, an
        unknown keyword, inputs that are not ``[B, N]`` of one shape, an input that
        is not an array (a mask of strings), non-float log-probs / advantages, a
        concrete mask with a value other than 0 and 1 (a traced one is not checked),
        or a ``use_*`` switch that is not a bool.  Zero-size inputs are valid (no token:
        alpha 0, empty weights, finite statistics).
    """
    arrays = as_arrays("correction_weights", logp_train, logp_rollout, advantages, mask)
    _validate(arrays, mode, cap, threshold, ais_kwargs)
    check_flags("correction_weights", **{k: v for k, v in ais_kwargs.items()
                                         if k.startswith("use_")})
    check_mask_values("correction_weights", arrays[3])
    if cap is None:
        cap = DEFAULT_CAPS[mode]
    lt, lr, adv, m = (jax.lax.stop_gradient(x) for x in arrays)
    lt = jnp.where(jnp.isnan(lt), -jnp.inf, lt)  # a NaN trainer log-prob: probability 0
    valid = m if m.dtype == jnp.bool_ else m != 0
    log_rho = jnp.where(valid, lt.astype(jnp.float32) - lr.astype(jnp.float32), 0.0)
    if mode in _AIS_MODES:
        res = ais_coefficient(lt, lr, adv, valid, C=cap, mode=mode, **ais_kwargs)
        diag = _diagnostics(log_rho, valid, valid, res.weights)
        return CorrectionResult(weights=res.weights, advantages=res.advantages, keep=valid,
                                metrics={**res.stats(), **diag}, ais=res)

    log_cap = math.log(cap) if _is_num(cap) else jnp.log(cap)
    if mode == "token_mask":
        keep_tok = ~(log_rho > log_cap)  # a NaN stays kept and propagates
        w = jnp.exp(log_rho)
    else:
        n_b = jnp.sum(valid, axis=1, dtype=jnp.float32)  # [B]
        s = _seq_log_ratio(log_rho, valid)  # [B], summed before any cap
        s_w = jnp.minimum(s, LOG_RATIO_BOUND)  # exp(s_w) cannot overflow
        if mode == "seq_tis":
            keep_seq, w_seq = jnp.ones_like(s, jnp.bool_), jnp.exp(jnp.minimum(s_w, log_cap))
        elif mode == "seq_mask":
            keep_seq, w_seq = ~(s > log_cap), jnp.exp(s_w)
        else:  # geo_mask
            g = s / jnp.maximum(n_b, 1.0)
            keep_seq, w_seq = ~(jnp.abs(g) > threshold), jnp.where(jnp.isnan(g), g, 1.0)
        keep_tok, w = keep_seq[:, None], w_seq[:, None]
    keep = valid & keep_tok
    weights = jnp.where(valid, jnp.where(keep, w, 0.0), 1.0)
    a = jnp.where(valid, adv.astype(jnp.float32), 0.0)
    # alpha's parts are reported in every mode (alpha 0: not applied), for comparisons.
    ais_stats = ais_coefficient(lt, lr, adv, valid, C=cap, mode="none", **ais_kwargs).stats()
    return CorrectionResult(
        weights=weights,
        advantages=jnp.where(keep, weights * a, 0.0),
        keep=keep,
        metrics={**ais_stats, **_diagnostics(log_rho, valid, keep, weights)},
    )


def ratio_stats(logp_old: Any, logp: Any, mask: Any) -> dict[str, np.ndarray]:
    """Per-row statistics of ``log rho = logp_old - logp`` over the valid tokens.

    Args:
      logp_old: ``[B, N]`` trainer log-probs, or the pair ``(truncated, full)``
        (`ais_jax.training.trainer.score`; the truncated one is used, as by the correction).
      logp: ``[B, N]`` rollout (sampler) log-probs.
      mask: ``[B, N]`` 1 on valid completion tokens.

    Returns:
      ``tokens``, ``log_ratio_abs_mean``, ``log_ratio_abs_max`` and
      ``log_ratio_sum``, each ``[B]`` (0 for a row without valid tokens).
    """
    lo = np.asarray(logp_old[0] if isinstance(logp_old, tuple) else logp_old, np.float64)
    m = np.asarray(mask) > 0
    lr = np.where(m, lo - np.asarray(logp, np.float64), 0.0)
    n = m.sum(axis=1)
    return {"tokens": n,
            "log_ratio_abs_mean": np.abs(lr).sum(axis=1) / np.maximum(n, 1),
            "log_ratio_abs_max": np.abs(lr).max(axis=1, initial=0.0),
            "log_ratio_sum": lr.sum(axis=1)}
