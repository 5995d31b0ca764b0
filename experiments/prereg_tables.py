"""Markdown tables of a pre-registered paired study (shared by its report sections).

A pre-registered study here compares arms paired by seed: each hypothesis is a one-sided paired
t-test of per-seed differences (arm minus reference) with Holm's correction over the declared
family, the noise floor is the difference between two arms that differ only by their RL-step
key stream, and everything else is exploratory (two-sided, no correction).  These functions
only format what `stats` computes; the modules that call them (``replication.py``,
``llada_ratio.py``) choose the arms, metrics and seeds their pre-registration fixed.

    from prereg_tables import primary_table
    primary_table([("H1: ais - none > 0", [0.02, 0.05, -0.01, 0.03, 0.04])], (5, 6, 7, 8, 9))
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from stats import holm, paired_t, sign_flip_p


def signed(x: float, digits: int = 3) -> str:
    """``x`` with its sign, e.g. ``+0.030``."""
    return f"{x:+.{digits}f}"


def interval(d: Sequence[float]) -> str:
    """The mean difference with its two-sided 95% paired t-interval: ``+m [lo, hi]``."""
    t = paired_t(d)
    return f"{signed(t.mean)} [{signed(t.ci[0])}, {signed(t.ci[1])}]"


def per_seed(seeds: Sequence[int], d: Sequence[float]) -> str:
    """``s5 +0.010, s6 -0.020, ...``: each seed's difference."""
    return ", ".join(f"s{s} {signed(x)}" for s, x in zip(seeds, d, strict=True))


def mean_sd(xs: Sequence[float]) -> str:
    """``mean ± sd`` (sample sd) to 3 decimals."""
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def eval_curve(run: dict, key: str, steps: Sequence[int]) -> list[float]:
    """Held-out ``key`` of a run (`common.load`'s dict) before GRPO, at each of ``steps``
    (its ``eval_<key>`` rows) and after GRPO."""
    by_step = {r["step"]: r for r in run["rows"] if f"eval_{key}" in r}
    s = run["summary"]
    return [s["eval_before"][key], *(by_step[k][f"eval_{key}"] for k in steps),
            s["eval_after"][key]]


def curves_table(runs: dict[str, Sequence[dict]], key: str, steps: Sequence[int],
                 last: int) -> list[str]:
    """Mean over each arm's runs (``arm -> runs``) of the held-out ``key`` before GRPO, at
    ``steps`` and after GRPO (step ``last``): one row per arm."""
    cols = ("0", *map(str, steps), str(last))
    out = ["| arm | " + " | ".join(f"step {c}" for c in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for arm, rs in runs.items():
        curves = [eval_curve(r, key, steps) for r in rs]
        means = [statistics.mean(c[i] for c in curves) for i in range(len(cols))]
        out.append(f"| {arm} | " + " | ".join(f"{m:.3f}" for m in means) + " |")
    return out


def primary_table(hypotheses: Sequence[tuple[str, Sequence[float]]],
                  seeds: Sequence[int], alpha: float = 0.05) -> list[str]:
    """The confirmatory table: one row per hypothesis ``(label, per-seed differences)``.

    Each difference is tested one-sided (mean > 0) by the paired t-test and the exact sign-flip
    permutation test; Holm's step-down correction runs over the t-test p-values of all rows
    (the family) at ``alpha``.
    """
    tests = {h: paired_t(d, "greater") for h, d in hypotheses}
    adj = holm({h: t.p for h, t in tests.items()}, alpha)
    out = [f"| hypothesis | per seed | mean [95% t-interval] | d_z | t({len(seeds) - 1}) | "
           "one-sided p | sign-flip p (one-sided) | Holm p | rejected at "
           f"{alpha:g} |", "|---|---|---|---|---|---|---|---|---|"]
    for h, d in hypotheses:
        t = tests[h]
        out.append(f"| {h} | {per_seed(seeds, d)} | {interval(d)} | {t.effect:+.2f} | "
                   f"{t.t:.2f} | {t.p:.3f} | {sign_flip_p(d, 'greater'):.3f} | "
                   f"{adj[h][0]:.3f} | {'yes' if adj[h][1] else 'no'} |")
    return out


def noise_table(rows: Sequence[tuple[str, Sequence[float]]], seeds: Sequence[int],
                pair: str) -> list[str]:
    """The noise floor: per metric ``(label, per-seed differences of the pair)``, the mean
    absolute difference and the mean with its t-interval; ``pair`` names it (``null - bf16``)."""
    out = [f"| metric | per seed ({pair}) | mean of \\|{pair}\\| | mean [95% t-interval] |",
           "|---|---|---|---|"]
    for label, d in rows:
        out.append(f"| {label} | {per_seed(seeds, d)} | "
                   f"{statistics.mean(abs(x) for x in d):.3f} | {interval(d)} |")
    return out


def exploratory_table(rows: Sequence[tuple[str, str, Sequence[float]]],
                      seeds: Sequence[int]) -> list[str]:
    """Exploratory comparisons ``(label, metric, per-seed differences)``: two-sided paired
    t-test and sign-flip p-values, no correction for multiplicity."""
    out = ["| comparison | metric | per seed | mean [95% t-interval] | d_z | two-sided p | "
           "sign-flip p (two-sided) |", "|---|---|---|---|---|---|---|"]
    for label, metric, d in rows:
        t = paired_t(d)
        out.append(f"| {label} | {metric} | {per_seed(seeds, d)} | {interval(d)} | "
                   f"{t.effect:+.2f} | {t.p:.3f} | {sign_flip_p(d):.3f} |")
    return out


def run_mean(run: dict, key: str) -> float | None:
    """Mean of a logged metric over a run's steps (`common.load`'s dict); None when the run
    does not log it."""
    xs = [r[key] for r in run["rows"] if key in r]
    return statistics.mean(xs) if xs else None


def arms_table(runs: dict[str, Sequence[dict]], after: Sequence[tuple[str, str]],
               diagnostics: Sequence[tuple[str, str]]) -> list[str]:
    """Per arm (``arm -> its runs, one per seed``), mean ± sd over the runs of: each held-out
    metric ``after`` (``(summary key, column label)``) after GRPO, sampled accuracy before
    GRPO, each per-step mean of ``diagnostics`` (``(row key, column label)``; ``-`` where a
    run does not log it) and the mean wall time.  One row per arm, in ``runs``' order."""
    labels = [label for _, label in after] + ["sampled before"]
    labels += [label for _, label in diagnostics] + ["wall s (mean)"]
    out = ["| arm | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for arm, rs in runs.items():
        cells = [mean_sd([r["summary"]["eval_after"][k] for r in rs]) for k, _ in after]
        cells.append(mean_sd([r["summary"]["eval_before"]["sampled_accuracy"] for r in rs]))
        for key, _ in diagnostics:
            means = [run_mean(r, key) for r in rs]
            cells.append("-" if None in means else mean_sd(means))
        wall = statistics.mean(r["meta"]["wall_s"] for r in rs)
        out.append(f"| {arm} | " + " | ".join(cells) + f" | {wall:.0f} |")
    return out


def window_means(run: dict, key: str, window: int) -> list[float]:
    """Mean of the logged metric ``key`` over consecutive ``window``-step windows of a run
    (the last window may be shorter)."""
    xs = [r[key] for r in run["rows"]]
    return [statistics.mean(xs[i:i + window]) for i in range(0, len(xs), window)]


def window_header(window: int, steps: int) -> list[str]:
    """The header of a per-window table: ``| arm | statistic | steps 1-10 -> ... -> 51-60 |``."""
    return [f"| arm | statistic | steps 1-{window} -> ... -> {steps - window + 1}-{steps} |",
            "|---|---|---|"]


def window_row(arm: str, label: str, runs: Sequence[dict], key: str, window: int,
               digits: int) -> str:
    """One row of a per-window table: the mean over ``runs`` (one per seed) of each window's
    mean of ``key``, ``digits`` decimals, joined by arrows."""
    per = [window_means(r, key, window) for r in runs]
    mean = [statistics.mean(w[i] for w in per) for i in range(len(per[0]))]
    return f"| {arm} | {label} | " + " -> ".join(f"{x:.{digits}f}" for x in mean) + " |"
