"""The AIS coefficient: adaptive blend of no correction and truncated importance sampling.

Implements docs/spec.md section 4.  Per valid token the rollout-training importance
ratio is truncated, ``w_bar = min(exp(logp_train - logp_rollout), C)``, and the
advantage is reweighted by ``w_tilde = 1 + alpha * (w_bar - 1)`` where ``alpha``
comes from three detached batch statistics:

* weight reliability ``alpha_ess = (1 + CV^2) ** -0.5`` (CV of ``w_bar``, ddof=1),
* divergence severity ``alpha_mis = min(1, d_bar / delta)``,
* variance amplification ``alpha_var = max(0, (D - gamma) / gamma)`` with
  ``D = std(A * w_bar) / (std(A) + eps)``,

combined as ``alpha = clip(alpha_ess - beta_var * alpha_var, 0, 1) * alpha_mis``.
``beta_var`` is not given in the paper's v1 hyperparameters; it defaults to 1.

Numerics (every statistic is finite for finite inputs, whatever their scale):

* CV is scale-free, so it is computed on ``exp(log w_bar - s)`` with ``s``
  the max of ``log w_bar`` over valid tokens rounded to a multiple of 16: the
  largest shifted weight lies in ``[e^-8, e^8]``, so a batch whose ratios are
  all tiny (log gaps around -60) does not underflow to CV = 0.  Ordinary
  batches (``|max log w_bar| < 8``) get ``s = 0`` and exactly the unshifted
  float32 numbers.
* ``D`` is scale-free in ``A`` except for ``eps``: ``A`` is divided by a power
  of two ``2^k > max |A|`` (exact) and ``eps`` by the same ``2^k``, so ``eps``
  keeps the units of ``A`` (``D = std(A w) / (std(A) + eps)`` exactly as
  written) and advantages up to float32 max do not overflow ``std``.  ``D`` is
  then ``e^s * std(A' w') / (std(A') + eps / 2^k)`` with the shifted weights
  ``w'`` above, and saturates at float32 max.
* ``d_bar`` averages ``|clip(logp_train - logp_rollout, -L, L)|`` with
  ``L = LOG_RATIO_BOUND = 87``: a ratio beyond ``e^+-87`` (outside float32's
  normal range), e.g. a trainer probability of 0 (``logp_train = -inf``, then
  ``w_bar = 0``), contributes ``L``.
* A NaN ``logp_train`` in a valid position is taken as ``-inf`` (probability 0,
  the bullet above), so one bad trainer log-prob cannot turn alpha and every
  weight of the batch into NaN; finite inputs are untouched.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

MODES = ("ais", "tis", "none")

#: Bound on ``|log ratio|`` in statistics (``d_bar`` here; the diagnostics of
#: `ais_jax.method.corrections`): ``e^87`` and ``e^-87`` are normal float32 numbers.
LOG_RATIO_BOUND = 87.0

_F32_MAX = float(jnp.finfo(jnp.float32).max)
_SHIFT_STEP = 16.0  # log w_bar is shifted by a multiple of this (see ais_coefficient)


@struct.dataclass
class AISResult:
    """Output of `ais_coefficient`.  Arrays of the input shape, scalars float32.

    Attributes:
      weights: ``w_tilde = 1 + alpha * (w_bar - 1)`` (exactly ``w_bar`` in mode
        ``"tis"``); 1.0 where the mask is 0.
      advantages: ``w_tilde * A`` where valid, 0 elsewhere (``A_tilde``).
      w_bar: truncated ratio ``min(exp(logp_train - logp_rollout), C)``; 1.0 where masked.
      alpha: the blend coefficient in [0, 1] actually applied (mode-dependent).
      alpha_ess: ``(1 + CV^2) ** -0.5``.
      alpha_mis: ``min(1, d_bar / delta)``.
      alpha_var: ``max(0, (D - gamma) / gamma)``.
      d_bar: mean ``|logp_train - logp_rollout|`` over valid tokens (each term
        clipped at `LOG_RATIO_BOUND`).
      var_amp: ``D = std(A * w_bar) / (std(A) + eps)`` (at most float32 max).
      ess_ratio: ``1 / (1 + CV^2)`` (= alpha_ess ** 2).
      cv: coefficient of variation of ``w_bar`` (sample std, ddof=1; 0 for < 2 tokens).
      num_valid: number of valid tokens (float32).
    """

    weights: jax.Array
    advantages: jax.Array
    w_bar: jax.Array
    alpha: jax.Array
    alpha_ess: jax.Array
    alpha_mis: jax.Array
    alpha_var: jax.Array
    d_bar: jax.Array
    var_amp: jax.Array
    ess_ratio: jax.Array
    cv: jax.Array
    num_valid: jax.Array

    def stats(self) -> dict[str, jax.Array]:
        """The scalar statistics as a dict (for logging)."""
        names = ("alpha", "alpha_ess", "alpha_mis", "alpha_var", "d_bar", "var_amp",
                 "ess_ratio", "cv", "num_valid")
        return {n: getattr(self, n) for n in names}


def _check_hparam(name: str, value: object, ok: bool, need: str) -> None:
    if isinstance(value, numbers.Real) and not (ok and math.isfinite(float(value))):
        raise ValueError(f"ais_coefficient: {name}={value!r} is invalid; {name} must be {need}")


def as_arrays(fn: str, *arrays: object) -> list[jax.Array]:
    """``jnp.asarray`` of the four inputs of ``fn``; an unconvertible one is a ValueError.

    Args:
      fn: the public function's name, for the message.
      *arrays: ``logp_train, logp_rollout, advantages, mask``.
    """
    names = ("logp_train", "logp_rollout", "advantages", "mask")
    out = []
    for name, x in zip(names, arrays, strict=True):
        try:
            out.append(jnp.asarray(x))
        except (TypeError, ValueError) as e:
            kind = "bool or numeric" if name == "mask" else "float"
            raise ValueError(f"{fn}: {name} must be a {kind} array, got "
                             f"{type(x).__name__} ({' '.join(str(e).split())[:120]})") from None
    return out


def check_mask_values(fn: str, mask: jax.Array) -> None:
    """A concrete non-bool mask holds only 0 and 1; a traced one (under `jax.jit`) is trusted.

    Args:
      fn: the public function's name, for the message.
      mask: the mask, already an array.

    Raises:
      ValueError: a concrete mask with a value other than 0 and 1 (-1, 0.5, NaN, ...).
    """
    if mask.dtype == jnp.bool_ or isinstance(mask, jax.core.Tracer):
        return
    values = np.asarray(mask)
    bad = values[~np.isin(values, (0, 1))]
    if bad.size:
        raise ValueError(f"{fn}: mask must hold only 0 and 1 (or bools), got {bad.size} other "
                         f"value(s), e.g. {bad.reshape(-1)[0].item()!r}; pass mask > 0 or a "
                         "bool mask")


def check_flags(fn: str, **flags: object) -> None:
    """The ablation switches ``use_ess`` / ``use_mis`` / ``use_var`` are real bools.

    Raises:
      ValueError: a flag that is not a bool (``"no"`` would otherwise count as True).
    """
    for name, value in flags.items():
        if not isinstance(value, bool | np.bool_):
            raise ValueError(f"{fn}: {name}={value!r} must be a bool (True or False), got "
                             f"{type(value).__name__}")


def _validate(shapes, dtypes, C, delta, gamma, beta_var, eps, mode) -> None:
    if mode not in MODES:
        raise ValueError(f"ais_coefficient: unknown mode {mode!r}; use one of {MODES}")
    _check_hparam("C", C, isinstance(C, numbers.Real) and C > 1, "> 1")
    _check_hparam("delta", delta, isinstance(delta, numbers.Real) and delta > 0, "> 0")
    _check_hparam("gamma", gamma, isinstance(gamma, numbers.Real) and gamma > 0, "> 0")
    _check_hparam("beta_var", beta_var, isinstance(beta_var, numbers.Real) and beta_var >= 0,
                  ">= 0")
    _check_hparam("eps", eps, isinstance(eps, numbers.Real) and eps > 0, "> 0")
    names = ("logp_train", "logp_rollout", "advantages", "mask")
    if len(set(shapes)) != 1:
        desc = ", ".join(f"{n}{tuple(s)}" for n, s in zip(names, shapes, strict=True))
        raise ValueError(f"ais_coefficient: inputs must have one shape, got {desc}")
    for n, d in zip(names[:3], dtypes[:3], strict=True):
        if not jnp.issubdtype(d, jnp.floating):
            raise ValueError(f"ais_coefficient: {n} must be a float array, got dtype {d}")
    if not (jnp.issubdtype(dtypes[3], jnp.bool_) or jnp.issubdtype(dtypes[3], jnp.number)):
        raise ValueError(f"ais_coefficient: mask must be bool or numeric, got dtype {dtypes[3]}")


def _masked_mean_std(x: jax.Array, valid: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and sample std (ddof=1) of ``x`` over ``valid``; std is 0 for n < 2."""
    mean = jnp.sum(jnp.where(valid, x, 0.0)) / jnp.maximum(n, 1.0)
    sq = jnp.sum(jnp.where(valid, jnp.square(x - mean), 0.0))
    std = jnp.where(n > 1, jnp.sqrt(sq / jnp.maximum(n - 1.0, 1.0)), 0.0)
    return mean, std


def _shifted_weights(log_w: jax.Array, valid: jax.Array, n: jax.Array,
                     empty: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The scale-free CV of ``w_bar`` (module docstring): ``(shift, w_s, cv)``.

    ``log w_bar`` is shifted by its max over valid tokens rounded to a multiple of 16
    (0 for ordinary batches: bit-identical to the unshifted formula), so the shifted
    weights ``w_s = exp(log w_bar - shift)`` (0 where not valid) lie in ``[0, e^8]``.
    """
    lmax = jnp.float32(-jnp.inf) if empty else jnp.max(jnp.where(valid, log_w, -jnp.inf))
    shift = jnp.where(jnp.isneginf(lmax), 0.0, _SHIFT_STEP * jnp.round(lmax / _SHIFT_STEP))
    w_s = jnp.where(valid, jnp.exp(log_w - shift), 0.0)
    w_mean, w_std = _masked_mean_std(w_s, valid, n)
    cv = jnp.where(w_mean > 0, w_std / jnp.where(w_mean > 0, w_mean, 1.0), 0.0)
    return shift, w_s, cv


def _variance_amplification(a: jax.Array, w_s: jax.Array, shift: jax.Array, valid: jax.Array,
                            n: jax.Array, eps: float, empty: bool) -> jax.Array:
    """``D = std(A w) / (std(A) + eps)``, at most float32 max (module docstring).

    ``A`` is divided by ``2^e > max |A|`` (exact) and ``eps`` by the same ``2^e``;
    ``w = e^shift w_s`` (`_shifted_weights`).  0 when ``std(A w)`` is 0.
    """
    _, e = jnp.frexp(jnp.float32(0.0) if empty else jnp.max(jnp.abs(a)))
    a_s = jnp.ldexp(a, -e)
    _, a_std = _masked_mean_std(a_s, valid, n)
    _, aw_std = _masked_mean_std(a_s * w_s, valid, n)
    num = aw_std * jnp.exp(shift)
    den = a_std + jnp.ldexp(jnp.asarray(eps, jnp.float32), -e)
    ratio = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), jnp.inf)
    return jnp.where(aw_std == 0, 0.0, jnp.minimum(ratio, _F32_MAX))


def ais_coefficient(
    logp_train: jax.Array,
    logp_rollout: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    C: float = 5.0,
    delta: float = 0.02,
    gamma: float = 1.2,
    beta_var: float = 1.0,
    eps: float = 1e-6,
    mode: str = "ais",
    use_ess: bool = True,
    use_mis: bool = True,
    use_var: bool = True,
) -> AISResult:
    """Adaptive importance-sampling weights for FP8-rollout policy gradients.

    All statistics are float32 and computed under `jax.lax.stop_gradient`, over
    the valid tokens of the whole batch. Masked positions may hold anything
    (NaN, Inf): they are selected away with ``where`` and never leak.

    Args:
      logp_train: ``[...]`` BF16 trainer log-probs of the sampled tokens
        (pre-update weights, same temperature as the sampler).
      logp_rollout: ``[...]`` log-probs recorded by the (FP8) sampler.
      advantages: ``[...]`` per-token advantages ``A`` (sequence advantage
        broadcast to its tokens).
      mask: ``[...]`` bool or 0/1 (a concrete mask with another value is refused); nonzero
        marks a valid generated token.
      C: truncation cap of the importance ratio (> 1).
      delta: divergence scale of the necessity gate (> 0).
      gamma: variance-amplification threshold (> 0).
      beta_var: weight of the variance penalty (>= 0; not in the paper's v1 list).
      eps: stabilizer of ``std(A)``.
      mode: ``"ais"`` (adaptive alpha), ``"tis"`` (alpha = 1: truncated IS) or
        ``"none"`` (alpha = 0: no correction).
      use_ess, use_mis, use_var: ablation switches of mode ``"ais"``: a term
        switched off enters alpha as its neutral value (``alpha_ess`` and
        ``alpha_mis`` as 1, ``alpha_var`` as 0); the result still reports the
        measured statistic.

    Returns:
      `AISResult`; ``result.advantages`` is the reweighted advantage ``A_tilde``.
      With no valid token alpha is 0 and all weights are 1 in every mode.
      A NaN ``logp_train`` in a valid position is guarded like ``-inf``: the
      trainer gives the token no usable probability, so its ratio is 0
      (``w_bar = 0``, ``LOG_RATIO_BOUND`` in ``d_bar``) and every other token keeps
      finite weights.  A NaN ``logp_rollout`` or advantage in a valid position
      (outside the contract: the sampler records a finite log-prob for a token it
      drew) still propagates, so the GRPO update skips the step and counts it.

    Raises:
      ValueError: the four inputs differ in shape, an input is not an array (a mask
        of strings), a float input is not floating point, a concrete mask holds a
        value other than 0 and 1, an ablation switch is not a bool, or a
        hyperparameter / mode is invalid.  Under `jax.jit` the checks of shapes,
        dtypes, switches and hyperparameters still run (they are static); the mask's
        values are checked only when it is concrete (a traced mask is taken as given:
        nonzero is valid).  Zero-size inputs are valid: no token is valid, so alpha is
        0 and the (empty) weights are 1.  Scalars are one-token batches.
    """
    arrays = as_arrays("ais_coefficient", logp_train, logp_rollout, advantages, mask)
    check_flags("ais_coefficient", use_ess=use_ess, use_mis=use_mis, use_var=use_var)
    _validate([a.shape for a in arrays], [a.dtype for a in arrays],
              C, delta, gamma, beta_var, eps, mode)
    check_mask_values("ais_coefficient", arrays[3])
    lt, lr, adv, m = (jax.lax.stop_gradient(a) for a in arrays)
    lt = jnp.where(jnp.isnan(lt), -jnp.inf, lt)  # a NaN trainer log-prob: probability 0
    valid = m.astype(jnp.bool_) if m.dtype == jnp.bool_ else m != 0
    n = jnp.sum(valid, dtype=jnp.float32)

    raw = jnp.where(valid, lt.astype(jnp.float32) - lr.astype(jnp.float32), 0.0)
    log_cap = math.log(C) if isinstance(C, numbers.Real) else jnp.log(C)
    log_w = jnp.minimum(raw, log_cap)  # log w_bar; -inf where the trainer probability is 0
    w_bar = jnp.where(valid, jnp.exp(log_w), 1.0)
    a = jnp.where(valid, adv.astype(jnp.float32), 0.0)
    empty = valid.size == 0  # zero-size inputs: the reductions take their empty values
    shift, w_s, cv = _shifted_weights(log_w, valid, n, empty)
    ess_ratio = 1.0 / (1.0 + jnp.square(cv))
    alpha_ess = jax.lax.rsqrt(1.0 + jnp.square(cv))

    diff = jnp.clip(raw, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    d_bar = jnp.sum(jnp.abs(diff)) / jnp.maximum(n, 1.0)
    alpha_mis = jnp.minimum(1.0, d_bar / delta)
    var_amp = _variance_amplification(a, w_s, shift, valid, n, eps, empty)
    alpha_var = jnp.maximum(0.0, (var_amp - gamma) / gamma)

    if mode == "ais":
        a_ess = alpha_ess if use_ess else 1.0
        a_var = beta_var * alpha_var if use_var else 0.0
        alpha = jnp.clip(a_ess - a_var, 0.0, 1.0) * (alpha_mis if use_mis else 1.0)
    else:
        alpha = (jnp.ones if mode == "tis" else jnp.zeros)((), jnp.float32)
    alpha = jnp.where(n > 0, alpha, 0.0).astype(jnp.float32)

    # tis: exactly w_bar (1 + 1 * (w_bar - 1) would round tiny ratios to 0).
    weights = w_bar if mode == "tis" else jnp.where(valid, 1.0 + alpha * (w_bar - 1.0), 1.0)
    return AISResult(
        weights=weights,
        advantages=jnp.where(valid, weights * a, 0.0),
        w_bar=w_bar,
        alpha=alpha,
        alpha_ess=alpha_ess.astype(jnp.float32),
        alpha_mis=alpha_mis.astype(jnp.float32),
        alpha_var=alpha_var.astype(jnp.float32),
        d_bar=d_bar.astype(jnp.float32),
        var_amp=var_amp.astype(jnp.float32),
        ess_ratio=ess_ratio.astype(jnp.float32),
        cv=cv.astype(jnp.float32),
        num_valid=n,
    )
