"""Paired tests over seeds for the studies: t-interval, exact sign-flip permutation test, Holm.

docs/spec.md section 7: arms are compared paired by seed (same warm start, same problems), with a
paired t-interval and an exact sign-flip permutation test over seeds, Holm's correction across a
declared family of hypotheses, and the effect reported with its interval. A percentile bootstrap
over 3-5 seeds is not a 95% interval (its coverage is ~76-84%), so nothing here bootstraps.

    from stats import paired_t, sign_flip_p, holm
    res = paired_t([0.02, 0.05, -0.01, 0.03, 0.04], alternative="greater")
    res.p, res.ci          # one-sided p; the two-sided 95% t-interval of the mean difference
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from scipy import stats as _sp

ALTERNATIVES = ("greater", "less", "two-sided")


class PairedT(NamedTuple):
    """A paired t-test of per-seed differences (arm minus reference).

    Attributes:
      n: number of pairs (seeds).
      mean: mean difference.
      sd: sample standard deviation of the differences (ddof = 1).
      t: the t statistic ``mean / (sd / sqrt(n))`` (inf when sd = 0 and mean != 0).
      df: degrees of freedom ``n - 1``.
      p: p-value under ``alternative``.
      ci: two-sided ``level`` t-interval of the mean difference.
      effect: standardized effect ``mean / sd`` (Cohen's d_z).
      alternative: "greater" (mean > 0), "less" or "two-sided".
    """

    n: int
    mean: float
    sd: float
    t: float
    df: int
    p: float
    ci: tuple[float, float]
    effect: float
    alternative: str


def _check(diffs: Sequence[float], alternative: str) -> list[float]:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    d = [float(x) for x in diffs]
    if len(d) < 2:
        raise ValueError(f"a paired test needs at least 2 differences, got {len(d)}")
    if not all(math.isfinite(x) for x in d):
        raise ValueError(f"differences must be finite, got {d}")
    return d


def paired_t(diffs: Sequence[float], alternative: str = "two-sided",
             level: float = 0.95) -> PairedT:
    """Paired t-test and t-interval of per-seed differences.

    Args:
      diffs: ``[n]`` per-seed differences (arm minus reference), n >= 2.
      alternative: "greater" tests mean > 0, "less" mean < 0, "two-sided" mean != 0.
      level: confidence level of the (always two-sided) interval.

    Returns:
      `PairedT`.
    """
    d = _check(diffs, alternative)
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    df = n - 1
    t = mean / se if se > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    if alternative == "greater":
        p = float(_sp.t.sf(t, df))
    elif alternative == "less":
        p = float(_sp.t.cdf(t, df))
    else:
        p = float(min(1.0, 2 * _sp.t.sf(abs(t), df)))
    half = float(_sp.t.ppf(0.5 + level / 2, df)) * se
    effect = mean / sd if sd > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    return PairedT(n, mean, sd, t, df, p, (mean - half, mean + half), effect, alternative)


def sign_flip_p(diffs: Sequence[float], alternative: str = "two-sided") -> float:
    """Exact sign-flip permutation p-value of the mean difference.

    Under the null hypothesis each per-seed difference is symmetric about 0, so all ``2^n``
    sign assignments are equally likely; the p-value is the share of them whose mean is at
    least as extreme as the observed one (ties count, with a 1e-12 relative tolerance).
    The smallest possible value is ``2^-n`` one-sided and ``2^(1-n)`` two-sided.

    Args:
      diffs: ``[n]`` per-seed differences, 2 <= n <= 20.
      alternative: "greater", "less" or "two-sided".

    Returns:
      The p-value.
    """
    d = _check(diffs, alternative)
    if len(d) > 20:
        raise ValueError(f"exact enumeration is limited to 20 differences, got {len(d)}")
    obs = sum(d)
    tol = 1e-12 * max(1.0, sum(abs(x) for x in d))
    hits = 0
    total = 0
    for signs in itertools.product((1.0, -1.0), repeat=len(d)):
        s = sum(sg * x for sg, x in zip(signs, d, strict=True))
        total += 1
        if alternative == "greater":
            hits += s >= obs - tol
        elif alternative == "less":
            hits += s <= obs + tol
        else:
            hits += abs(s) >= abs(obs) - tol
    return hits / total


def holm(pvalues: Mapping[str, float], alpha: float = 0.05) -> dict[str, tuple[float, bool]]:
    """Holm's step-down correction of a family of p-values.

    Sorted ascending, the i-th (0-based) of m p-values is multiplied by ``m - i``; adjusted
    values are made non-decreasing in that order and capped at 1. A hypothesis is rejected
    when its adjusted p-value is <= ``alpha`` (which controls the family-wise error rate).

    Args:
      pvalues: hypothesis name -> unadjusted p-value (the declared family).
      alpha: family-wise error rate.

    Returns:
      name -> (adjusted p-value, rejected).
    """
    if not pvalues:
        raise ValueError("holm needs at least one p-value")
    for k, p in pvalues.items():
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p-value of {k!r} must be in [0, 1], got {p}")
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m = len(order)
    out: dict[str, tuple[float, bool]] = {}
    running = 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[k]))
        out[k] = (running, running <= alpha)
    return {k: out[k] for k in pvalues}


def describe(res: PairedT, perm_p: float | None = None, digits: int = 3) -> str:
    """One markdown-ready line: mean [CI], effect, t, p (and the permutation p)."""
    f = f"{{:+.{digits}f}}"
    lo, hi = res.ci
    text = (f"{f.format(res.mean)} [{f.format(lo)}, {f.format(hi)}], d_z {res.effect:+.2f}, "
            f"t({res.df}) = {res.t:.2f}, p = {res.p:.3f} ({res.alternative})")
    if perm_p is not None:
        text += f", sign-flip p = {perm_p:.3f}"
    return text
