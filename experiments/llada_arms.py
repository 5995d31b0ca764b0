"""The diffusion setting of the study: BF16 / FP8 / FP8+TIS / FP8+AIS on the LLaDA default.

    python experiments/llada_arms.py warm --seeds 0 1 2     # one warm start per seed
    python experiments/llada_arms.py run --seeds 0 1 2 [--arms bf16 fp8_ais] [--dry-run]
    python experiments/llada_arms.py report                 # docs/results_llada.md from the logs
    python experiments/llada_arms.py ratio [--seeds 7] [--until ISO] [--dry-run]
                                                            # the pre-registered ratio study

``ratio`` runs the study of ``experiments/prereg/llada_ratio.md`` (issue 29): seeds 5-9,
arms `RATIO_ARMS`, run names ``ratio_<arm>_s<seed>``, seed by seed, from the same warm starts.
Each seed's warm start is recorded in ``experiments/logs/ratio_warm/warm_s<seed>.json`` (sha256
of the weights, CPU model, commit): the warm start is deterministic on one CPU model only, so a
seed begun on one machine type is refused on another (`check_warm`).

Every arm of a seed starts GRPO from the same warm-started policy: ``warm``
(``experiments/llada_warm.py``, shared with ``llada_complete_ratio.py``) runs
the warm start of ``configs/tiny_llada_countdown.yaml`` at that seed once
and saves it as a LLaDA checkpoint (with its character tokenizer) under
``--warm-dir``; ``run`` then trains each arm with ``model.source=<that
checkpoint> sft.steps=0`` (``model.kind: auto`` recognises it), so the arms
differ only in the rollout precision and the correction.  The warm start is
deterministic for a seed, so this equals warm-starting inside every run, at a
quarter of the cost.  Raw logs (``metrics.jsonl``, ``summary.json``,
``run.json`` with the command, wall time and load) go to
``experiments/logs/llada_<arm>_s<seed>/``; runs with a log are skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository's ais_jax, also when it is not installed
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiments/common.py
import common  # noqa: E402
import llada_complete_ratio  # noqa: E402
import llada_ratio  # noqa: E402
import llada_warm  # noqa: E402

CONFIG = llada_warm.CONFIG
RESULTS = os.path.join(ROOT, "docs", "results_llada.md")
NOTES = os.path.join(ROOT, "experiments", "llada_notes.md")
LOGS = os.path.join(ROOT, "experiments", "logs")
RATIO_WARM = os.path.join(LOGS, "ratio_warm")  # warm_s<seed>.json: each seed's warm start
ARMS = {  # the paper's four arms
    "bf16": ("rollout.precision=bf16", "ais.mode=none"),
    "fp8": ("rollout.precision=fp8", "ais.mode=none"),
    "fp8_tis": ("rollout.precision=fp8", "ais.mode=tis"),
    "fp8_ais": ("rollout.precision=fp8", "ais.mode=ais"),
}

# The pre-registered ratio study (experiments/prereg/llada_ratio.md): its seeds, arms and
# common overrides are declared beside its analysis, in llada_ratio.py.
RATIO_SEEDS = llada_ratio.SEEDS
RATIO_ARMS = llada_ratio.ARM_OVERRIDES
RATIO_COMMON = llada_ratio.COMMON_OVERRIDES


warm_dir = llada_warm.warm_dir
warm_record = llada_warm.warm_record


def cmd_warm(seeds: Sequence[int], base: str) -> None:
    """Warm-start each seed's policy once and save it as a LLaDA checkpoint (`llada_warm`)."""
    llada_warm.warm(seeds, base)


def cmd_run(seeds: Sequence[int], arms: Sequence[str], base: str, scratch: str,
            dry_run: bool) -> None:
    run_one = common.run_one
    for seed in seeds:
        src = warm_dir(base, seed)
        for arm in arms:
            name = f"llada_{arm}_s{seed}"
            if os.path.exists(os.path.join(LOGS, name, "run.json")):
                continue
            ov = (f"seed={seed}", f"model.source={src}", "model.kind=auto", "sft.steps=0",
                  *ARMS[arm])
            if dry_run:
                print(name, " ".join(ov))
            else:
                run_one(name, ov, scratch, CONFIG)


def ratio_planned(seeds: Sequence[int] = RATIO_SEEDS) -> dict[str, tuple[str, ...]]:
    """The ratio study's run names -> overrides (without the warm-start source), seed-major."""
    return {f"ratio_{arm}_s{seed}": (f"seed={seed}", *RATIO_COMMON, *ov)
            for seed in seeds for arm, ov in RATIO_ARMS.items()}


def check_warm(base: str, seed: int, records: str = RATIO_WARM) -> None:
    """`llada_warm.check_warm` with the ratio study's records (``RATIO_WARM``) by default."""
    llada_warm.check_warm(base, seed, records)


def cmd_ratio(base: str, scratch: str, dry_run: bool, until: str = "",
              seeds: Sequence[int] = RATIO_SEEDS) -> None:
    """Warm-start the study's ``seeds`` (once each; `check_warm`), then train every planned run
    of them without a log; ``until``: start no warm start or run past this ISO date-time
    (`common.past`)."""
    for name, ov in ratio_planned(seeds).items():
        if os.path.exists(os.path.join(LOGS, name, "run.json")):
            continue
        seed = int(name.rsplit("_s", 1)[1])
        full = (f"model.source={warm_dir(base, seed)}", "model.kind=auto", "sft.steps=0", *ov)
        if dry_run:
            print(name, " ".join(full))
            continue
        if common.past(until):
            return
        cmd_warm([seed], base)
        check_warm(base, seed)
        if common.past(until):
            return
        common.run_one(name, full, scratch, CONFIG)


def render(logs: str = LOGS) -> str:
    """docs/results_llada.md from ``logs``: the four arms' ``llada_<arm>_s<seed>``, the
    ratio study's ``ratio_<arm>_s<seed>`` (`llada_ratio`) and the complete-ratio block's
    ``complete_<arm>_s<seed>`` (`llada_complete_ratio`; deterministic)."""
    import numpy as np

    load, mean_sd, run_stats, series = common.load, common.mean_sd, common.run_stats, common.series

    runs = {}
    for arm in ARMS:
        for seed in range(10):
            r = load(f"llada_{arm}_s{seed}", logs)
            if r is not None:
                st = run_stats(r)
                st["response_len"] = float(np.mean(series(r, "response_len")))
                runs[arm, seed] = st
    out = ["# The diffusion setting: BF16 / FP8 / FP8+TIS / FP8+AIS on the LLaDA default", "",
           "Generated by `python experiments/llada_arms.py report` from "
           "`experiments/logs/llada_<arm>_s<seed>/`, `ratio_<arm>_s<seed>/` and "
           "`complete_<arm>_s<seed>/`; do not edit by hand.", "",
           "The four-arm study's results are exploratory: none of its runs was pre-registered "
           "(the project's first pre-registered study is the long-setting replication, "
           "`experiments/prereg/long_replication.md`). The last two sections, the ratio study "
           "(`experiments/llada_ratio.py`) and the complete-ratio block "
           "(`experiments/llada_complete_ratio.py`), are pre-registered.", "",
           f"Each run is `{CONFIG}` (0.6M-parameter masked-diffusion model, Countdown with 3 "
           "numbers from 1-6, 150 diffu-GRPO steps x 16 prompts x 8 samples, two inner "
           "iterations) started from its seed's shared warm start (`python "
           "experiments/llada_arms.py warm`), with the arm's rollout precision and correction "
           "(`run.json` holds each command, wall time and load). Held-out accuracy: 512 "
           "problems, greedy and sampled at T=1 (mean of 4).", ""]
    ratio = [*llada_ratio.render(logs), *llada_complete_ratio.render(logs)]
    if not runs:
        return "\n".join([*out, "No runs logged yet.", "", *ratio])
    cols = [("greedy_before", "greedy before"), ("greedy_after", "greedy after"),
            ("delta_greedy", "Δ greedy"), ("sampled_before", "sampled before"),
            ("sampled_after", "sampled after"), ("delta_sampled", "Δ sampled"),
            ("d_bar", "d_bar"), ("ess_early", "ESS first 20"), ("ess_late", "ESS last 20"),
            ("alpha", "alpha"), ("response_len", "response len"), ("wall_s", "wall s")]
    out += ["## Arms (mean ± sd over seeds)", "",
            "| arm | seeds | " + " | ".join(c[1] for c in cols) + " |",
            "|" + "---|" * (len(cols) + 2)]
    for arm in ARMS:
        seeds = sorted(s for a, s in runs if a == arm)
        if not seeds:
            continue
        cells = [mean_sd([runs[arm, s][k] for s in seeds], 1 if k == "wall_s" else 3)
                 for k, _ in cols]
        out.append(f"| {arm} | {','.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    rows = []
    for arm in ARMS:
        if arm == "fp8":
            continue
        seeds = sorted(s for a, s in runs if a == arm and ("fp8", s) in runs)
        if len(seeds) < 2:
            continue
        for key, label in (("greedy_after", "greedy"), ("sampled_after", "sampled")):
            rows.append((f"{arm} − fp8", label, seeds,
                         [runs[arm, s][key] - runs["fp8", s][key] for s in seeds]))
    if rows:
        out += ["", "## Paired against uncorrected FP8 (same seed, same warm start; exploratory)",
                "", "Difference arm − `fp8` of the held-out accuracy after GRPO, per seed, with "
                "n the number of seeds; the mean has its 95% paired t-interval (t distribution "
                "with n − 1 degrees of freedom), d_z is the mean over the standard deviation of "
                "the differences, and the p-values are two-sided: the paired t-test and the "
                "exact sign-flip permutation test (all 2^n sign assignments; with 3 seeds its "
                "smallest possible value is 0.25). Holm's correction is over the family of the "
                f"{len(rows)} rows of this table (the t-test p-values). Nothing here was "
                "pre-registered: these are exploratory comparisons.", "",
                *common.paired_table(rows, f"family of {len(rows)}")]
    if os.path.exists(NOTES):
        with open(NOTES) as f:
            out += ["", f.read().rstrip()]
    return "\n".join([*out, "", *ratio]).rstrip("\n") + "\n"


def cmd_report() -> None:
    with open(RESULTS, "w") as f:
        f.write(render())
    print(f"wrote {os.path.relpath(RESULTS, ROOT)}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("warm", "run", "report", "ratio"))
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="warm / run: default 0 1 2; ratio: default all of 5-9")
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    ap.add_argument("--warm-dir", default=os.path.join("runs", "llada_warm"),
                    help="relative to the repository root")
    ap.add_argument("--scratch", default=os.path.join(ROOT, "runs", "llada_arms"))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--until", default="", help="ratio: start nothing after this ISO "
                    "date-time (e.g. 2026-12-02T07:30), so no run is cut off")
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if a.command == "report":
        cmd_report()
    elif a.command == "warm":
        cmd_warm(a.seeds or [0, 1, 2], a.warm_dir)
    elif a.command == "ratio":
        if not set(a.seeds or ()) <= set(RATIO_SEEDS):
            ap.error(f"ratio: --seeds must be among the pre-registered {list(RATIO_SEEDS)}")
        cmd_ratio(a.warm_dir, a.scratch, a.dry_run, a.until, a.seeds or RATIO_SEEDS)
    else:
        cmd_run(a.seeds or [0, 1, 2], a.arms, a.warm_dir, a.scratch, a.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
