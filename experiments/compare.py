"""The paper's comparison at small scale: BF16 / FP8 / FP8+TIS / FP8+AIS, stress runs, ablations.

Two commands::

    python experiments/compare.py run [--only NAME ...] [--dry-run]
    python experiments/compare.py report

``run`` trains every run of `RUNS` that has no log yet (each one is the
embedded default ``configs/tiny_arithmetic.yaml`` plus the overrides listed
below, so every arm gets the same budget) and copies its raw logs
(``metrics.jsonl``, ``summary.json`` and ``run.json`` with the command and
its wall time) to ``experiments/logs/NAME/``.  ``report`` reads only those
logs and writes ``docs/results.md`` and the figures in ``docs/figures/``;
running it twice gives the same ``results.md`` byte for byte.

The interpretation paragraphs of the report live in
``experiments/results_notes.md`` (hand-written after reading the numbers) and
are copied in verbatim; every number in the tables comes from the logs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiments/common.py
from common import (
    CONFIG,
    LOGS,
    REWARD_THRESHOLD,
    ROOT,
    WINDOW,
    alpha_figure,
    figure,
    load,
    mean_sd,
    run_one,
    run_stats,
    series,
    smooth,
)

from ais_jax.config.load import load_config

NOTES = os.path.join(ROOT, "experiments", "results_notes.md")
RESULTS = os.path.join(ROOT, "docs", "results.md")
FIGURES = os.path.join(ROOT, "docs", "figures")

SEEDS = (0, 1, 2)
ARMS = {  # the paper's four arms
    "bf16": ("rollout.precision=bf16", "ais.mode=none"),
    "fp8": ("rollout.precision=fp8", "ais.mode=none"),
    "fp8_tis": ("rollout.precision=fp8", "ais.mode=tis"),
    "fp8_ais": ("rollout.precision=fp8", "ais.mode=ais"),
}
# A larger mismatch users meet in practice: E5M2 weights (2 mantissa bits) and
# an FP8 output projection.
STRESS = ("rollout.fp8_format=e5m2", "rollout.lm_head_fp8=true")
STRESS_ARMS = ("fp8", "fp8_tis", "fp8_ais")
ABLATIONS = {  # on the stress setting, seed 0; the base is stress_fp8_ais_s0
    "no_ess": ("ais.use_ess=false",),
    "no_mis": ("ais.use_mis=false",),
    "no_var": ("ais.use_var=false",),
    "C2": ("ais.C=2",),
    "beta_var0.5": ("ais.beta_var=0.5",),
    "beta_var2": ("ais.beta_var=2",),
}
# The short study's task, pinned: its runs used 2-digit sums, the embedded default's task until
# issue 28 moved the default to three 1-digit numbers (experiments/warmstart_notes.md).
STUDY = ("task.difficulty={digits: 2, num_operands: 2, ops: '+'}",)


def runs() -> dict[str, tuple[str, ...]]:
    """Run name -> config overrides (COMMON and ``out_dir`` excluded)."""
    out: dict[str, tuple[str, ...]] = {}
    for seed in SEEDS:
        for arm, ov in ARMS.items():
            out[f"{arm}_s{seed}"] = (*STUDY, *ov, f"seed={seed}")
    # Run order = priority: the stress arms on seed 0, the ablations, then more seeds.
    for arm in STRESS_ARMS:
        out[f"stress_{arm}_s0"] = (*STUDY, *ARMS[arm], *STRESS, "seed=0")
    for name, ov in ABLATIONS.items():
        out[f"ablate_{name}_s0"] = (*STUDY, *ARMS["fp8_ais"], *STRESS, *ov, "seed=0")
    for seed in SEEDS[1:]:
        for arm in STRESS_ARMS:
            out[f"stress_{arm}_s{seed}"] = (*STUDY, *ARMS[arm], *STRESS, f"seed={seed}")
    return out


# ------------------------------------------------------------------------ run


def cmd_run(only: Sequence[str], dry_run: bool, scratch: str) -> None:
    todo = {n: ov for n, ov in runs().items()
            if (not only or any(n.startswith(o) for o in only))
            and not os.path.exists(os.path.join(LOGS, n, "run.json"))}
    for name, ov in todo.items():
        if dry_run:
            print(name, " ".join(ov))
        else:
            run_one(name, ov, scratch)


# --------------------------------------------------------------------- report


COLUMNS = (
    ("greedy_before", "greedy acc. before"),
    ("greedy_after", "greedy acc. after"),
    ("sampled_before", "sampled acc. before"),
    ("sampled_after", "sampled acc. after"),
    ("delta_greedy", "Δ greedy"),
    ("delta_sampled", "Δ sampled"),
    ("reward_last", "train reward, last 20 steps"),
    ("steps_to", f"steps to reward {REWARD_THRESHOLD}"),
    ("d_bar", "d_bar"),
    ("ess_early", "ESS first 20"),
    ("ess_late", "ESS last 20"),
    ("alpha", "alpha"),
    ("wall_s", "wall s / run"),
)


def table(groups: dict[str, list[dict]]) -> list[str]:
    head = "| run | seeds | " + " | ".join(c[1] for c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for label, rs in groups.items():
        if not rs:
            lines.append(f"| {label} | 0 | " + " | ".join("-" for _ in COLUMNS) + " |")
            continue
        st = [run_stats(r) for r in rs]
        cells = []
        for key, _ in COLUMNS:
            vals = [x[key] for x in st]
            if key == "steps_to":
                got = [v for v in vals if v is not None]
                cells.append(mean_sd(got, 0) + (f" ({len(vals) - len(got)} never)"
                                                if len(got) < len(vals) else ""))
            elif key == "wall_s":
                cells.append(f"{statistics.mean(vals):.0f}")
            elif any(v is None for v in vals):
                cells.append("-")
            else:
                cells.append(mean_sd(vals, 4 if key == "d_bar" else 3))
        lines.append(f"| {label} | {len(rs)} | " + " | ".join(cells) + " |")
    return lines


def per_run_table(runs_: dict[str, dict]) -> list[str]:
    """One row per run: held-out accuracy before -> after (greedy, sampled), pass@8."""
    lines = ["| run | greedy before -> after | sampled before -> after | pass@8 before -> after |",
             "|---|---|---|---|"]
    def pair(b: dict, a: dict, key: str) -> str:
        return f"{b[key]:.3f} -> {a[key]:.3f}" if key in b and key in a else "-"

    for name, r in runs_.items():
        b, a = r["summary"]["eval_before"], r["summary"]["eval_after"]
        cells = [pair(b, a, k) for k in ("accuracy", "sampled_accuracy", "pass@8")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def parts_table(groups: dict[str, list[dict]]) -> list[str]:
    """Per run group: the AIS statistics behind alpha (means over all steps and seeds)."""
    lines = ["| run | alpha_ess | alpha_mis | alpha_var | steps with alpha_var > 0 | "
             "var. amplification D | min alpha |", "|---|---|---|---|---|---|---|"]
    for label, rs in groups.items():
        if not rs:
            continue
        cat = {k: np.concatenate([series(r, k) for r in rs])
               for k in ("alpha_ess", "alpha_mis", "alpha_var", "var_amp", "alpha")}
        lines.append(
            f"| {label} | {cat['alpha_ess'].mean():.3f} | {cat['alpha_mis'].mean():.3f} | "
            f"{cat['alpha_var'].mean():.4f} | {int((cat['alpha_var'] > 0).sum())} of "
            f"{len(cat['alpha_var'])} | {cat['var_amp'].mean():.3f} | {cat['alpha'].min():.3f} |")
    return lines


def figure_by_seed(path: str, title: str, ylabel: str, prefixes: Sequence[str], key: str,
                   have: dict[str, dict]) -> bool:
    """One panel per seed, one smoothed curve per arm (seeds differ more than arms)."""
    seeds = [sd for sd in SEEDS if any(f"{p}_s{sd}" in have for p in prefixes)]
    if not seeds:
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.0 * len(seeds), 3.6), dpi=100)
    FigureCanvasAgg(fig)
    for i, sd in enumerate(seeds):
        ax = fig.add_subplot(1, len(seeds), i + 1)
        for p in prefixes:
            r = have.get(f"{p}_s{sd}")
            if r is not None:
                steps = np.array([row["step"] for row in r["rows"]])
                ax.plot(steps, smooth(series(r, key)), label=p, linewidth=1.3)
        ax.set_title(f"seed {sd}")
        ax.set_xlabel("RL step")
        if i == 0:
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    return True


def cmd_report(results: str = RESULTS, figures: str = FIGURES) -> None:
    """Write ``results`` (markdown) and the PNGs in ``figures`` from the logs."""
    import async_staleness
    import long_arms
    import replication
    import smollm2_fp4
    import smollm2_mechanism
    import staleness_followup
    from prereg_index import index_table
    names = runs()
    loaded = {n: load(n) for n in names}
    have = {n: r for n, r in loaded.items() if r is not None}
    if not have:
        raise SystemExit(f"no logs under {LOGS}; run `python experiments/compare.py run` first")

    def group(prefix: str, seeds: Sequence[int] = SEEDS) -> list[dict]:
        return [have[f"{prefix}_s{s}"] for s in seeds if f"{prefix}_s{s}" in have]

    main = {arm: group(arm) for arm in ARMS}
    stress = {f"stress {arm}": group(f"stress_{arm}") for arm in STRESS_ARMS}
    ablate = {"fp8_ais (stress, seed 0)": group("stress_fp8_ais", (0,))}
    ablate |= {name: group(f"ablate_{name}", (0,)) for name in ABLATIONS}

    os.makedirs(figures, exist_ok=True)
    figs = [
        ("results_ess.png", "ESS ratio over training (cf. the paper's Fig. 4)", "ESS / N",
         {**main, **stress}, "ess_ratio"),
        ("results_d_bar.png", "Mismatch d_bar", "mean |log-ratio|", {**main, **stress}, "d_bar"),
        ("results_stress_reward.png", "Training reward, stress setting (E5M2 + FP8 lm_head)",
         "reward", stress, "reward_mean"),
    ]
    drawn = set()
    if figure_by_seed(os.path.join(figures, "results_reward.png"),
                      "Training reward (10-step mean)", "reward", list(ARMS), "reward_mean",
                      have):
        drawn.add("results_reward.png")
    for fname, title, ylabel, curves, key in figs:
        if figure(os.path.join(figures, fname), title, ylabel, curves, key):
            drawn.add(fname)
    for prefix, label in (("fp8_ais", "default"), ("stress_fp8_ais", "stress")):
        rs = group(prefix)
        if rs:
            path = os.path.join(figures, f"results_alpha_{label}.png")
            alpha_figure(path, f"AIS alpha and its parts ({label} setting, seed mean)", rs)
            drawn.add(os.path.basename(path))

    def img(fname: str, alt: str) -> list[str]:
        return [f"![{alt}](figures/{fname})", ""] if fname in drawn else []

    cfg = _config_text()
    lines = [
        "# Results: BF16 / low-precision rollouts with every correction mode, at small scale",
        "",
        "<!-- Generated by `python experiments/compare.py report` from the raw logs in",
        "     experiments/logs/; do not edit by hand.",
        "     The Reading section is experiments/results_notes.md. -->",
        "",
        "Two settings: long responses (about 64 generated tokens, every correction mode,",
        "`experiments/long_arms.py`) and the embedded default's short ones (3-4 tokens, the",
        "paper's four arms, stress runs and AIS ablations). The diffusion setting is in",
        "[results_llada.md](results_llada.md). The Reading section at the end covers both.",
        "",
        "## Pre-registered studies",
        "",
        "Each was pre-registered in experiments/prereg/ before any of its runs; its section",
        "has the per-seed numbers, the noise floor and the exploratory comparisons. Every",
        "other result on this page and on results_llada.md is exploratory: not pre-registered,",
        "with analysis choices (formats, seeds, warm-start target) made while looking.",
        "",
        *index_table(),
        "",
        *long_arms.render(figures),
        *replication.render(),
        *smollm2_mechanism.render(),
        *smollm2_fp4.render(),
        *async_staleness.render(figures=figures),
        *staleness_followup.render(),
        "## The short-response setting (the embedded default)",
        "",
        "### Setting",
        "",
        f"Every run is the embedded default (`{CONFIG}`) with the overrides in its",
        "`experiments/logs/NAME/run.json`; the same budget for every arm:",
        "",
        *cfg,
        "",
        "Columns: held-out accuracy on 200 problems never seen in training, greedy",
        "(`accuracy`) and sampled at the rollout temperature (mean over 8 samples),",
        "before GRPO (after the supervised warm start) and after it; training reward",
        f"averaged over the last 20 steps; the first step at which the {WINDOW}-step mean",
        f"training reward reaches {REWARD_THRESHOLD}; mean d_bar; ESS ratio averaged over",
        "the first and the last 20 steps; mean alpha; wall time per run on a 2-core CPU.",
        "Cells are mean ± sample standard deviation over seeds. The arms of one seed share",
        "the same warm start (same seed), so the Δ columns (after minus before, per run)",
        "compare the arms without the spread of the warm start.",
        "",
        "### The four arms (3 seeds each)",
        "",
        *table(main),
        "",
        "Per run (seed `sN`):",
        "",
        *per_run_table({f"{arm}_s{sd}": have[f"{arm}_s{sd}"] for sd in SEEDS for arm in ARMS
                        if f"{arm}_s{sd}" in have}),
        "",
        *img("results_reward.png", "reward"),
        *img("results_ess.png", "ESS ratio"),
        *img("results_d_bar.png", "d_bar"),
        *img("results_alpha_default.png", "alpha"),
        "### A larger mismatch: E5M2 weights and an FP8 lm_head",
        "",
        "Overrides on top of each arm: `" + " ".join(STRESS) + "`.",
        "",
        *table(stress),
        "",
        *img("results_stress_reward.png", "stress reward"),
        *img("results_alpha_stress.png", "alpha stress"),
        "### Ablations (stress setting, seed 0)",
        "",
        "Each row switches one thing off or changes one hyperparameter of the",
        "`fp8_ais` stress run (first row): " + "; ".join(
            f"`{n}`: `{' '.join(ov)}`" for n, ov in ABLATIONS.items()) + ".",
        "",
        *table(ablate),
        "",
        "The statistics behind alpha in these runs (and in the default-setting AIS arm):",
        "",
        *parts_table({**ablate, "fp8_ais (default setting, 3 seeds)": main["fp8_ais"]}),
        "",
        "## Reading",
        "",
    ]
    if os.path.exists(NOTES):
        with open(NOTES) as f:
            lines += f.read().rstrip("\n").split("\n")
    total_long = sum(r["meta"]["wall_s"] for r in long_arms._loaded().values()) + sum(
        w["wall_s"] for w in long_arms._warm_logs().values())
    missing = sorted(n for n in names if n not in have)
    if missing:
        lines += ["", f"Runs without logs (not shown): {', '.join(missing)}."]
    total = sum(r["meta"]["wall_s"] for r in have.values())
    lines += ["", f"Total compute of the {len(have)} logged short-response runs: "
              f"{total / 60:.0f} min of wall time on the 2-core CPU; of the long-response "
              f"setting (warm starts included): {total_long / 60:.0f} min; together "
              f"{(total + total_long) / 60:.0f} min."]
    with open(results, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {results} and {len(drawn)} figures in {figures}")


def _config_text() -> list[str]:
    """The budget-defining keys of the default config, read from the file."""
    c = load_config(os.path.join(ROOT, CONFIG), list(STUDY))
    m, r, t, s = c.model, c.rollout, c.train, c.sft
    return [
        f"- model: from scratch, D={m.hidden_size}, L={m.num_layers}, heads "
        f"{m.num_heads}/{m.num_kv_heads}, MLP {m.intermediate_size}; task "
        f"`{c.task.name}` {dict(c.task.difficulty)}",
        f"- warm start: {s.steps} SFT steps x {s.batch_size} problems, lr {s.learning_rate}, "
        f"mistake rate {s.mistake_rate}",
        f"- GRPO: {t.steps} steps x {r.prompts_per_step} prompts x G={r.group_size}, "
        f"lr {t.learning_rate}, {r.max_new_tokens} new tokens at T={r.temperature}",
        f"- AIS: C={c.ais.C}, delta={c.ais.delta}, gamma={c.ais.gamma}, "
        f"beta_var={c.ais.beta_var}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train the runs that have no log yet")
    r.add_argument("--only", nargs="*", default=[], help="name prefixes to run")
    r.add_argument("--dry-run", action="store_true", help="list what would run")
    r.add_argument("--scratch", default=os.path.join(ROOT, "runs", "compare"),
                   help="where run directories live while training")
    rep = sub.add_parser("report", help="regenerate docs/results.md and figures from the logs")
    rep.add_argument("--out", default="", help="write DIR/results.md and DIR/figures/ instead")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        cmd_run(a.only, a.dry_run, a.scratch)
    elif a.out:
        cmd_report(os.path.join(a.out, "results.md"), os.path.join(a.out, "figures"))
    else:
        cmd_report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
