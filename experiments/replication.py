"""The pre-registered replication of the long-response setting: its section of docs/results.md.

The plan, hypotheses, test and noise floor are fixed in
``experiments/prereg/long_replication.md`` (committed before any of these runs); this module
only carries that analysis out on the logs ``experiments/logs/rep_<arm>_s<seed>`` and the warm
starts ``experiments/logs/long_warm_s<seed>`` (seeds 5-9), made by
``python experiments/long_arms.py warm --seeds 5 6 7 8 9`` and ``python
experiments/long_arms.py rep``.  The confirmatory analysis is rendered only when all 25 runs
exist (the pre-registration's stopping rule); before that the section says how many exist.

    python experiments/compare.py report   # regenerates docs/results.md, this section included
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # common, long_arms, prereg_tables
import common
import long_arms
from prereg_tables import (
    arms_table,
    curves_table,
    exploratory_table,
    noise_table,
    primary_table,
    window_header,
    window_row,
)

PREREG = "experiments/prereg/long_replication.md"
ARMS = tuple(long_arms.REP_ARMS)  # bf16 null none ais tis
SEEDS = long_arms.REP_SEEDS
HYPOTHESES = (("H1", "bf16", "none"), ("H2", "ais", "none"))
EVAL_STEPS = (20, 40, 60)  # eval.every=20; step 80 is the final evaluation
WINDOW = 20  # steps per window of the mechanism table


def loaded() -> dict[str, dict]:
    """Every logged replication run: ``rep_<arm>_s<seed>`` -> `common.load`'s dict."""
    names = [f"rep_{a}_s{s}" for s in SEEDS for a in ARMS]
    return {n: r for n in names if (r := common.load(n)) is not None}


def _warm(seed: int) -> dict | None:
    p = os.path.join(long_arms.LOGS, f"long_warm_s{seed}", "warm.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def _after(have: dict[str, dict], arm: str, seed: int, key: str) -> float:
    return float(have[f"rep_{arm}_s{seed}"]["summary"]["eval_after"][key])


def _diffs(have: dict[str, dict], arm: str, base: str, key: str) -> list[float]:
    """Per-seed ``arm - base`` of the held-out metric ``key`` after GRPO, seeds in order."""
    return [_after(have, arm, s, key) - _after(have, base, s, key) for s in SEEDS]


def _primary(have: dict[str, dict]) -> list[str]:
    """The confirmatory table: H1 and H2 on sampled accuracy, one-sided, Holm over both."""
    return primary_table(confirmatory(have), SEEDS)


def confirmatory(have: dict[str, dict]) -> list[tuple[str, list[float]]]:
    """The pre-registered hypotheses (``"H1: a - b > 0"``, per-seed ``a - b`` of held-out
    sampled accuracy after GRPO, seeds in `SEEDS` order), from every run of the study."""
    return [(f"{h}: {a} - {b} > 0", _diffs(have, a, b, "sampled_accuracy"))
            for h, a, b in HYPOTHESES]


def _noise_floor(have: dict[str, dict]) -> list[str]:
    return noise_table([(label, _diffs(have, "null", "bf16", key))
                        for key, label in (("sampled_accuracy", "sampled"),
                                           ("accuracy", "greedy"))], SEEDS, "null - bf16")


def _exploratory(have: dict[str, dict]) -> list[str]:
    rows = [("H1 bf16 - none", "bf16", "none", "accuracy", "greedy"),
            ("H2 ais - none", "ais", "none", "accuracy", "greedy"),
            ("tis - none", "tis", "none", "sampled_accuracy", "sampled"),
            ("tis - none", "tis", "none", "accuracy", "greedy"),
            ("ais - tis", "ais", "tis", "sampled_accuracy", "sampled"),
            ("ais - tis", "ais", "tis", "accuracy", "greedy")]
    return exploratory_table([(label, metric, _diffs(have, a, b, key))
                              for label, a, b, key, metric in rows], SEEDS)


def _arms_table(have: dict[str, dict]) -> list[str]:
    return arms_table({arm: [have[f"rep_{arm}_s{s}"] for s in SEEDS] for arm in ARMS},
                      (("sampled_accuracy", "sampled after"), ("accuracy", "greedy after"),
                       ("pass@4", "pass@4 after")),
                      (("ess_ratio", "token ESS ratio (mean)"), ("d_bar", "d_bar (mean)"),
                       ("alpha", "alpha (mean)")))


def _curves(have: dict[str, dict], key: str = "sampled_accuracy") -> list[str]:
    runs = {arm: [have[f"rep_{arm}_s{s}"] for s in SEEDS] for arm in ARMS}
    return curves_table(runs, key, EVAL_STEPS, 80)


def _mechanism(have: dict[str, dict]) -> list[str]:
    """Secondary (pre-registered, descriptive): per 20-step window, mean over seeds, token ESS,
    d_bar, the sequence log-ratio spread, the training reward, and alpha with its parts in the
    AIS arm."""
    keys = (("ess_ratio", "token ESS ratio", 4), ("d_bar", "d_bar", 4),
            ("seq_log_ratio_std", "seq. log-ratio sd", 3), ("alpha", "alpha", 3),
            ("alpha_ess", "alpha_ess", 3), ("alpha_mis", "alpha_mis", 3),
            ("alpha_var", "alpha_var", 3), ("reward_mean", "training reward", 3))
    out = window_header(WINDOW, 80)
    for arm in ARMS:
        runs = [have[f"rep_{arm}_s{s}"] for s in SEEDS]
        out += [window_row(arm, label, runs, key, WINDOW, digits) for key, label, digits in keys
                if arm == "ais" or not key.startswith("alpha")]
    return out


def render() -> list[str]:
    """The replication's section of docs/results.md (markdown lines)."""
    have = loaded()
    total = len(ARMS) * len(SEEDS)
    out = ["## Replication on fresh seeds (pre-registered)", "",
           f"Pre-registered in [{PREREG}](../{PREREG}) before any of its runs: the long-response "
           f"setting above, seeds {SEEDS[0]}-{SEEDS[-1]} (never used before), arms "
           f"{', '.join(f'`{a}`' for a in ARMS)} (`null` is BF16 on another RL-step key "
           "stream: the noise floor), one-sided paired t-tests of H1 (bf16 > none) and H2 "
           "(ais > none) on held-out sampled accuracy after GRPO, Holm over the two at 0.05. "
           "`none`, `ais` and `tis` roll out with MXFP4 weights and an MXFP4 lm_head. Runs: "
           "`python experiments/long_arms.py warm --seeds 5 6 7 8 9`, then `python "
           "experiments/long_arms.py rep`; each run's command, wall time and load are in "
           "`experiments/logs/rep_<arm>_s<seed>/run.json`.", ""]
    if len(have) < total:
        return [*out, f"{len(have)} of {total} runs logged; the analysis is made when all "
                "exist (the pre-registration's stopping rule).", ""]
    out += ["Warm starts (the config's criterion, greedy accuracy 0.5 on 100 training-split "
            "problems):", "", "| seed | steps | last check | wall s |", "|---|---|---|---|"]
    for s in SEEDS:
        w = _warm(s)
        if w is not None:
            ws = w["warm_start"]
            last = ws["checks"][-1]
            out.append(f"| {s} | {ws['steps_run']} | {last['step']}: {last['accuracy']:.2f} | "
                       f"{w['wall_s']:.0f} |")
    out += ["", "### Confirmatory: the two pre-registered hypotheses", "", *_primary(have), "",
            "Noise floor (the `null` arm against `bf16`, same seeds):", "", *_noise_floor(have),
            "", f"### Arms (mean ± sd over the {len(SEEDS)} seeds; held-out, 200 problems)", "",
            *_arms_table(have), "",
            "Token ESS ratio, d_bar and alpha are means over the 80 steps of each run (alpha is "
            "logged as 0 without a correction and 1 with TIS).", "",
            "Held-out sampled accuracy during GRPO (mean over seeds; `eval.every=20`):", "",
            *_curves(have), "", "Held-out greedy accuracy during GRPO (mean over seeds):", "",
            *_curves(have, "accuracy"), "",
            "Mechanism statistics per 20-step window, mean over seeds (secondary, "
            "pre-registered, descriptive):", "", *_mechanism(have), "",
            "### Exploratory (no correction for multiplicity)", "",
            *_exploratory(have), ""]
    return out
