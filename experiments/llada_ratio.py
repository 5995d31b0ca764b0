"""The pre-registered ratio study of the diffusion setting: its section of docs/results_llada.md.

The plan, hypotheses, test and noise floor are fixed in ``experiments/prereg/llada_ratio.md``
(committed before any of these runs, issue 29); this module only carries that analysis out on
the logs ``experiments/logs/ratio_<arm>_s<seed>`` (seeds 5-9, arms ``none``, ``null``,
``tis_traj``, ``ais_traj``, ``ais_est``) made by ``python experiments/llada_arms.py ratio``.
The confirmatory analysis is rendered only when all 25 runs exist (the pre-registration's
stopping rule); before that the section says how many exist. The reading written after the
numbers, ``experiments/llada_ratio_notes.md``, follows the analysis (only once it is made).

    python experiments/llada_arms.py report   # regenerates docs/results_llada.md with it
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # common, prereg_tables
import common
from prereg_tables import (
    arms_table,
    curves_table,
    exploratory_table,
    noise_table,
    primary_table,
)

PREREG = "experiments/prereg/llada_ratio.md"
NOTES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_ratio_notes.md")
SEEDS = (5, 6, 7, 8, 9)
ARM_OVERRIDES = {  # FP8 E4M3 rollouts; run names ratio_<arm>_s<seed> (llada_arms.py ratio)
    "none": ("rollout.precision=fp8", "ais.mode=none"),
    "null": ("rollout.precision=fp8", "ais.mode=none", "train.rng_stream=1"),
    "tis_traj": ("rollout.precision=fp8", "ais.mode=tis", "diffusion.ratio=trajectory"),
    "ais_traj": ("rollout.precision=fp8", "ais.mode=ais", "diffusion.ratio=trajectory"),
    "ais_est": ("rollout.precision=fp8", "ais.mode=ais", "diffusion.ratio=estimator"),
}
COMMON_OVERRIDES = ("eval.every=50",)
ARMS = tuple(ARM_OVERRIDES)  # none null tis_traj ais_traj ais_est
HYPOTHESES = (("H1", "ais_traj", "none"), ("H2", "ais_traj", "ais_est"))
EVAL_STEPS = (50, 100)  # eval.every=50; step 150 is the final evaluation
METRICS = (("sampled_accuracy", "sampled"), ("accuracy", "greedy"))


def loaded(logs: str = common.LOGS) -> dict[str, dict]:
    """Every logged run of the study: ``ratio_<arm>_s<seed>`` -> `common.load`'s dict."""
    names = [f"ratio_{a}_s{s}" for s in SEEDS for a in ARMS]
    return {n: r for n in names if (r := common.load(n, logs)) is not None}


def _diffs(have: dict[str, dict], arm: str, base: str, key: str) -> list[float]:
    """Per-seed ``arm - base`` of the held-out metric ``key`` after GRPO, seeds in order."""
    def after(a: str, s: int) -> float:
        return float(have[f"ratio_{a}_s{s}"]["summary"]["eval_after"][key])

    return [after(arm, s) - after(base, s) for s in SEEDS]


def _arms_table(have: dict[str, dict]) -> list[str]:
    cols = (("d_bar", "d_bar (correction's ratio)"), ("ess_ratio", "token ESS"),
            ("traj/d_bar", "d_bar trajectory"), ("est/d_bar", "d_bar estimator"),
            ("alpha", "alpha"))
    return arms_table({arm: [have[f"ratio_{arm}_s{s}"] for s in SEEDS] for arm in ARMS},
                      (("sampled_accuracy", "sampled after"), ("accuracy", "greedy after"),
                       ("pass@4", "pass@4 after")), cols)


def _curves(have: dict[str, dict]) -> list[str]:
    runs = {arm: [have[f"ratio_{arm}_s{s}"] for s in SEEDS] for arm in ARMS}
    return curves_table(runs, "sampled_accuracy", EVAL_STEPS, 150)


def confirmatory(have: dict[str, dict]) -> list[tuple[str, list[float]]]:
    """The pre-registered hypotheses (``"H1: a - b > 0"``, per-seed ``a - b`` of held-out
    sampled accuracy after GRPO, seeds in `SEEDS` order), from every run of the study."""
    return [(f"{h}: {a} - {b} > 0", _diffs(have, a, b, "sampled_accuracy"))
            for h, a, b in HYPOTHESES]


def render(logs: str = common.LOGS, notes: str = NOTES) -> list[str]:
    """The study's section of docs/results_llada.md (markdown lines) from the logs in ``logs``,
    then the hand-written reading in ``notes`` (when the file exists and the analysis is made)."""
    have = loaded(logs)
    total = len(ARMS) * len(SEEDS)
    out = ["## The correction's ratio: estimator vs trajectory (pre-registered)", "",
           f"Pre-registered in [{PREREG}](../{PREREG}) before any of its runs (issue 29): the "
           f"default above with FP8 E4M3 rollouts, seeds {SEEDS[0]}-{SEEDS[-1]}, arms "
           f"{', '.join(f'`{a}`' for a in ARMS)} (`null` is `none` on another RL-step key "
           "stream: the noise floor; `_traj` arms correct with the trajectory ratio, `ais_est` "
           "with d1's one-step estimate), one-sided paired t-tests of H1 (ais_traj > none) and "
           "H2 (ais_traj > ais_est) on held-out sampled accuracy after GRPO, Holm over the two "
           "at 0.05. Runs: `python experiments/llada_arms.py ratio` (each seed's warm start, "
           "then its five arms); each run's command, wall time and load are in "
           "`experiments/logs/ratio_<arm>_s<seed>/run.json`.", ""]
    if len(have) < total:
        return [*out, f"{len(have)} of {total} runs logged; the analysis is made when all "
                "exist (the pre-registration's stopping rule).", ""]
    hyps = confirmatory(have)
    noise = [(label, _diffs(have, "null", "none", key)) for key, label in METRICS]
    explore = [(f"{h} {a} - {b}", "greedy", _diffs(have, a, b, "accuracy"))
               for h, a, b in HYPOTHESES]
    explore += [(f"{a} - none", label, _diffs(have, a, "none", key))
                for a in ("tis_traj", "ais_est") for key, label in METRICS]
    return [*out, "### Confirmatory: the two pre-registered hypotheses", "",
            *primary_table(hyps, SEEDS), "",
            "Noise floor (the `null` arm against `none`, same seeds):", "",
            *noise_table(noise, SEEDS, "null - none"), "",
            f"### Arms (mean ± sd over the {len(SEEDS)} seeds; held-out, 512 problems)", "",
            *_arms_table(have), "",
            "d_bar, token ESS and alpha are means over the 150 steps of each run; the first two "
            "are of the ratio the arm corrects with (the estimator's in `none`, `null` and "
            "`ais_est`). The trajectory arms also log both ratios' d_bar (`traj/d_bar`, "
            "`est/d_bar`); `-` where an arm does not log one. alpha is logged as 0 without a "
            "correction and 1 with TIS.", "",
            "Held-out sampled accuracy during GRPO (mean over seeds; `eval.every=50`):", "",
            *_curves(have), "", "### Exploratory (no correction for multiplicity)", "",
            *exploratory_table(explore, SEEDS), "", *_notes(notes)]


def _notes(path: str) -> list[str]:
    """The reading written after the numbers (markdown lines), or none when there is no file."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [*f.read().rstrip().splitlines(), ""]
