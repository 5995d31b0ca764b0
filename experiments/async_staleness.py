"""Asynchronous rollouts: the pre-registered staleness block (issue 40, item 6).

The plan, hypotheses, test and noise floor are fixed in ``experiments/prereg/async_staleness.md``
(committed before this driver and before any run); this module runs the arms and carries that
analysis out.  Every run is the embedded default config (``configs/tiny_arithmetic.yaml``:
warm start to 0.6, 200 GRPO steps of 32 prompts x 8, FP8 rollouts) with the arm's overrides::

    python experiments/async_staleness.py run [--seeds 10 ...] [--arms ...] [--until ISO]
    python experiments/async_staleness.py run --dry-run
    python experiments/async_staleness.py pilot          # the feasibility run (seed 99)
    python experiments/async_staleness.py report         # the section, once all 50 runs exist

Logs go to ``experiments/logs/async_<arm>_s<seed>/`` (metrics.jsonl, summary.json and run.json
with the command, code commit, CPU model and wall time); runs with a log are skipped.  The
confirmatory analysis is rendered only when all runs exist (the stopping rule); before that
`render` says how many exist.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # prereg_tables, common (experiments/)
from prereg_tables import (  # noqa: E402
    arms_table,
    curves_table,
    exploratory_table,
    noise_table,
    per_seed,
    primary_table,
    signed,
    window_header,
    window_means,
    window_row,
)

CONFIG = "configs/tiny_arithmetic.yaml"
PREREG = "experiments/prereg/async_staleness.md"
LOGS = os.path.join(ROOT, "experiments", "logs")
SEEDS = (10, 11, 12, 13, 14)  # reserved for this block (experiments/prereg/smollm2_fp4.md)
SPLIT = ("log.split_mismatch=true",)
ARMS = {  # in the order they run within a seed
    **{f"k{k}_{mode}": (f"rollout.staleness={k}", f"ais.mode={mode}", *(SPLIT if k else ()))
       for k in (0, 1, 4) for mode in ("none", "tis", "ais")},
    "null": ("rollout.staleness=0", "ais.mode=ais", "train.rng_stream=1"),
}
HYPOTHESES = (("H1", "k4_ais", "k4_none"), ("H2", "k4_tis", "k4_none"),
              ("H3", "k1_ais", "k1_none"), ("H4", "k1_tis", "k1_none"))
METRICS = (("sampled_accuracy", "sampled"), ("accuracy", "greedy"))
STEPS = 200
EVAL_STEPS = (50, 100, 150)  # eval.every=50; step 200 is the final evaluation
WINDOW = 20  # steps per window of the mechanism table
PILOT = ("seed=99", *ARMS["k4_none"], "train.steps=20", "eval.every=0")


def planned(seeds: Sequence[int] = SEEDS,
            arms: Sequence[str] = tuple(ARMS)) -> dict[str, tuple[str, ...]]:
    """Run names -> overrides, seed-major (the arms of a seed in `ARMS` order, then the next)."""
    return _common().grid("async", seeds, ARMS, arms)


def _common():
    import common  # experiments/common.py (imports no driver)

    return common


def cmd_run(seeds: Sequence[int], arms: Sequence[str], scratch: str, dry_run: bool,
            until: str = "") -> None:
    """Train every planned run without a log, one at a time, in order; ``until``: start none
    past this ISO date-time (`common.past`), so a session's end never cuts one off."""
    _common().run_missing(planned(seeds, arms), scratch, CONFIG, dry_run, until, LOGS)


def pilot(scratch: str) -> int:
    """The feasibility run (`PILOT`, seed 99, outside the study): prints its return code and
    wall time only; its logs stay in ``scratch`` (not experiments/logs), unread."""
    import subprocess
    import time

    c = _common()
    out_dir = os.path.join(scratch, "async_pilot_s99")
    cmd = [sys.executable, "-m", "ais_jax.train", "--config", CONFIG, f"out_dir={out_dir}",
           *c.COMMON, *PILOT]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(f"pilot: rc {proc.returncode}, {time.perf_counter() - t0:.0f} s ({' '.join(PILOT)})")
    return proc.returncode


# --------------------------------------------------------------------- analysis


def loaded(logs: str = LOGS) -> dict[str, dict]:
    """Every logged run of the block: ``async_<arm>_s<seed>`` -> `common.load`'s dict."""
    return _common().loaded_runs(list(planned()), logs)


def diffs(have: dict[str, dict], arm: str, base: str, key: str) -> list[float]:
    """Per-seed ``arm - base`` of the held-out metric ``key`` after GRPO, seeds in order."""
    return _common().seed_diffs(have, "async", arm, base, key, SEEDS)


def windows(run: dict, key: str) -> list[float]:
    """Mean of the logged metric ``key`` over consecutive `WINDOW`-step windows of a run."""
    return window_means(run, key, WINDOW)


def _mechanism(have: dict[str, dict]) -> list[str]:
    """Per-window means over seeds: d_bar, ESS, alpha (ais arms) and the training reward; for
    k >= 1 the quantization and staleness parts of d_bar and ESS."""
    keys = (("d_bar", 4), ("ess_ratio", 4), ("alpha", 3), ("reward_mean", 3),
            ("mismatch/quant_d_bar", 4), ("mismatch/stale_d_bar", 4),
            ("mismatch/quant_ess", 4), ("mismatch/stale_ess", 4))
    out = window_header(WINDOW, STEPS)
    for arm in ARMS:
        runs = [have[f"async_{arm}_s{s}"] for s in SEEDS]
        for key, digits in keys:
            if (key == "alpha" and not arm.endswith("ais")) or (
                    key.startswith("mismatch/") and "log.split_mismatch=true" not in ARMS[arm]):
                continue
            out.append(window_row(arm, key, runs, key, WINDOW, digits))
    return out


def _cost_table(rows: Sequence[tuple[str, str, Sequence[float]]]) -> list[str]:
    """Descriptive differences ``(label, metric, per-seed differences)``: per seed and mean."""
    out = ["| comparison | metric | per seed | mean |", "|---|---|---|---|"]
    for label, metric, d in rows:
        out.append(f"| {label} | {metric} | {per_seed(SEEDS, d)} | "
                   f"{signed(statistics.mean(d))} |")
    return out


def _arms_table(have: dict[str, dict]) -> list[str]:
    return arms_table({arm: [have[f"async_{arm}_s{s}"] for s in SEEDS] for arm in ARMS},
                      (("sampled_accuracy", "sampled after"), ("accuracy", "greedy after")),
                      (("d_bar", "d_bar (mean)"), ("ess_ratio", "token ESS ratio (mean)")))


def confirmatory(have: dict[str, dict]) -> list[tuple[str, list[float]]]:
    """The pre-registered hypotheses (``"H1: a - b > 0"``, per-seed ``a - b`` of held-out
    sampled accuracy after GRPO, seeds in `SEEDS` order), from every run of the study."""
    return [(f"{h}: {a} - {b} > 0", diffs(have, a, b, "sampled_accuracy"))
            for h, a, b in HYPOTHESES]


FIGS = (("async_d_bar.png", "d_bar", "d_bar", "d_bar"),
        ("async_ess.png", "ess_ratio", "token ESS ratio", "token ESS ratio"),
        ("async_alpha.png", "alpha", "AIS alpha", "alpha (ais arms)"))


def _figures(runs: dict[str, list[dict]], figures: str) -> list[str]:
    """Draw d_bar, token ESS and alpha over training (seed mean, band: seed range) per arm
    into ``figures``; the page's image lines (one per figure)."""
    c = _common()
    os.makedirs(figures, exist_ok=True)
    out = []
    for fname, key, ylabel, what in FIGS:
        arms = [a for a in ARMS if a != "null" and (key != "alpha" or a.endswith("ais"))]
        title = f"Asynchronous rollouts: {what} by staleness k and correction"
        if c.figure(os.path.join(figures, fname), title, f"{ylabel} ({c.WINDOW}-step mean)",
                    {a: runs[a] for a in arms}, key):
            out += [f"![{what} by arm](figures/{fname})", ""]
    return out


def render(logs: str = LOGS, figures: str | None = None) -> list[str]:
    """The block's results section (markdown lines) from the logs in ``logs``; with
    ``figures`` (a folder) also its d_bar / ESS / alpha curves, drawn there and linked."""
    have = loaded(logs)
    total = len(ARMS) * len(SEEDS)
    out = ["## Asynchronous rollouts: staleness and FP8 in one correction (pre-registered)", "",
           f"Pre-registered in [{PREREG}](../{PREREG}) before its driver and any run (issue 40): "
           f"`{CONFIG}` ({STEPS} GRPO steps, FP8 rollouts) with `rollout.staleness` k in "
           "{0, 1, 4} x `ais.mode` none / tis / ais, plus `null` (`k0_ais` on another RL-step "
           f"key stream: the noise floor), seeds {', '.join(map(str, SEEDS))}; one-sided paired "
           "t-tests of H1-H4 (ais / tis > none at k = 4 and k = 1) on held-out sampled accuracy "
           "after GRPO, Holm over the four at 0.05. Runs: `python "
           "experiments/async_staleness.py run`; each run's command, code commit, CPU model "
           "and wall time are in `experiments/logs/async_<arm>_s<seed>/run.json`.", ""]
    if len(have) < total:
        return [*out, f"{len(have)} of {total} runs logged; the analysis is made when all "
                "exist (the pre-registration's stopping rule).", ""]
    hyps = confirmatory(have)
    noise = [(label, diffs(have, "null", "k0_ais", key)) for key, label in METRICS]
    cost = [(f"{a} - k0_none", label, diffs(have, a, "k0_none", key))
            for a in ("k1_none", "k4_none") for key, label in METRICS]
    explore = [(f"{h} {a} - {b}", "greedy", diffs(have, a, b, "accuracy"))
               for h, a, b in HYPOTHESES]
    explore += [(f"k{k}_ais - k{k}_tis", label, diffs(have, f"k{k}_ais", f"k{k}_tis", key))
                for k in (0, 1, 4) for key, label in METRICS]
    runs = {arm: [have[f"async_{arm}_s{s}"] for s in SEEDS] for arm in ARMS}
    return [*out, "### Confirmatory: the four pre-registered hypotheses", "",
            *primary_table(hyps, SEEDS), "",
            "Noise floor (the `null` arm against `k0_ais`, same seeds):", "",
            *noise_table(noise, SEEDS, "null - k0_ais"), "",
            f"### Arms (mean ± sd over the {len(SEEDS)} seeds; held-out, 200 problems)", "",
            *_arms_table(have), "",
            "### Secondary (pre-registered, descriptive)", "",
            "The cost of staleness without a correction (per seed, no test):", "",
            *_cost_table(cost), "",
            f"Mechanism statistics per {WINDOW}-step window, mean over seeds:", "",
            *_mechanism(have), "",
            *(_figures(runs, figures) if figures else []),
            "Held-out greedy accuracy during GRPO (mean over seeds; `eval.every=50`):", "",
            *curves_table(runs, "accuracy", EVAL_STEPS, STEPS), "",
            "Held-out sampled accuracy during GRPO (mean over seeds):", "",
            *curves_table(runs, "sampled_accuracy", EVAL_STEPS, STEPS), "",
            "### Exploratory (no correction for multiplicity)", "",
            *exploratory_table(explore, SEEDS), ""]


def cmd_report(logs: str = LOGS) -> int:
    """Print the section when all runs exist (status 0); otherwise say how many do (status 1)."""
    lines = render(logs)
    if "### Confirmatory: the four pre-registered hypotheses" not in lines:
        print(lines[-2])
        return 1
    print("\n".join(lines))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("run", "pilot", "report"))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    ap.add_argument("--scratch", default=os.path.join(ROOT, "runs", "async_staleness"))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--until", default="", help="run: start nothing after this ISO date-time")
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if a.command == "run":
        cmd_run(a.seeds, a.arms, a.scratch, a.dry_run, a.until)
        return 0
    if a.command == "pilot":
        return pilot(a.scratch)
    return cmd_report()


if __name__ == "__main__":
    sys.exit(main())
