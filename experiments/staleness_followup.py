"""The staleness follow-up: the pre-registered block of issue 57, item 3.

The plan, hypotheses, test and noise floor are fixed in
``experiments/prereg/staleness_followup.md`` (committed before this driver and before any run);
this module runs the arms and carries that analysis out.  Every run is the embedded default
config (``configs/tiny_arithmetic.yaml``: warm start to 0.6, 200 GRPO steps of 32 prompts x 8,
FP8 rollouts) with the arm's overrides, as in the staleness block
(``experiments/async_staleness.py``)::

    python experiments/staleness_followup.py run [--seeds 23 ...] [--arms ...] [--until ISO]
    python experiments/staleness_followup.py run --dry-run
    python experiments/staleness_followup.py pilot       # the feasibility run (seed 99)
    python experiments/staleness_followup.py report      # the section, once all 35 runs exist

``run`` goes phase by phase (`PHASES`: H1's arms for every seed first, then H2's and H3's, then
``null``, then the exploratory arm), one run at a time; logs go to
``experiments/logs/followup_<arm>_s<seed>/`` (metrics.jsonl, summary.json and run.json with
the command, code commit, CPU model and wall time); runs with a log are skipped.  The
confirmatory analysis is rendered only when all runs exist (the stopping rule).
"""

from __future__ import annotations

import argparse
import os
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
    primary_table,
    window_header,
    window_row,
)

CONFIG = "configs/tiny_arithmetic.yaml"
PREREG = "experiments/prereg/staleness_followup.md"
LOGS = os.path.join(ROOT, "experiments", "logs")
PREFIX = "followup"
SEEDS = (23, 24, 25, 26, 27)  # never used by any study before (pre-registration)
K4 = ("rollout.staleness=4", "log.split_mismatch=true")
LO = ("train.learning_rate=2.5e-5",)
ARMS = {
    "hi_k4_ais": (*K4, "ais.mode=ais"),
    "hi_k4_naive": (*K4, "ais.mode=none", "train.proximal=behaviour"),
    "lo_k4_ais": (*LO, *K4, "ais.mode=ais"),
    "lo_k4_none": (*LO, *K4, "ais.mode=none"),
    "lo_k0_none": (*LO, "rollout.staleness=0", "ais.mode=none"),
    "null": (*K4, "ais.mode=ais", "train.rng_stream=1"),
    "hi_k4_none": (*K4, "ais.mode=none"),  # exploratory only
}
PHASES = (("hi_k4_ais", "hi_k4_naive"), ("lo_k4_ais", "lo_k4_none", "lo_k0_none"), ("null",),
          ("hi_k4_none",))  # run order: each phase for every seed, then the next phase
HYPOTHESES = (("H1", "hi_k4_ais", "hi_k4_naive"), ("H2", "lo_k4_ais", "lo_k4_none"),
              ("H3", "lo_k0_none", "lo_k4_none"))
METRICS = (("sampled_accuracy", "sampled"), ("accuracy", "greedy"))
STEPS = 200
EVAL_STEPS = (50, 100, 150)  # eval.every=50; step 200 is the final evaluation
WINDOW = 20  # steps per window of the mechanism table
DIAGNOSTICS = (("clip_frac", "clip_frac"), ("d_bar", "d_bar"), ("ess_ratio", "token ESS"),
               ("mismatch/stale_d_bar", "stale d_bar"), ("mismatch/quant_d_bar", "quant d_bar"),
               ("alpha", "alpha"))
PILOT = ("seed=99", *ARMS["hi_k4_naive"], "train.steps=20", "eval.every=0")


def planned(seeds: Sequence[int] = SEEDS,
            arms: Sequence[str] = tuple(ARMS)) -> dict[str, tuple[str, ...]]:
    """Run names -> overrides in the pre-registered order: phase by phase (`PHASES`), within a
    phase seed by seed, the phase's arms in order."""
    c = _common()
    out: dict[str, tuple[str, ...]] = {}
    for phase in PHASES:
        out |= c.grid(PREFIX, seeds, {a: ARMS[a] for a in phase}, arms)
    return out


def _common():
    import common  # experiments/common.py (imports no driver)

    return common


def cmd_run(seeds: Sequence[int], arms: Sequence[str], scratch: str, dry_run: bool,
            until: str = "", logs: str = LOGS) -> None:
    """Train every planned run without a log in ``logs``, one at a time, in order; ``until``:
    start none past this ISO date-time (`common.past`), so a session's end never cuts one off."""
    _common().run_missing(planned(seeds, arms), scratch, CONFIG, dry_run, until, logs)


def pilot(scratch: str) -> int:
    """The feasibility run (`PILOT`, seed 99, outside the study): prints its return code and
    wall time only; its logs stay in ``scratch`` (not experiments/logs), unread."""
    import subprocess
    import time

    c = _common()
    out_dir = os.path.join(scratch, "followup_pilot_s99")
    cmd = [sys.executable, "-m", "ais_jax.train", "--config", CONFIG, f"out_dir={out_dir}",
           *c.COMMON, *PILOT]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(f"pilot: rc {proc.returncode}, {time.perf_counter() - t0:.0f} s ({' '.join(PILOT)})")
    return proc.returncode


# --------------------------------------------------------------------- analysis


def loaded(logs: str = LOGS) -> dict[str, dict]:
    """Every logged run of the block: ``followup_<arm>_s<seed>`` -> `common.load`'s dict."""
    return _common().loaded_runs(list(planned()), logs)


def diffs(have: dict[str, dict], arm: str, base: str, key: str) -> list[float]:
    """Per-seed ``arm - base`` of the held-out metric ``key`` after GRPO, seeds in order."""
    return _common().seed_diffs(have, PREFIX, arm, base, key, SEEDS)


def confirmatory(have: dict[str, dict]) -> list[tuple[str, list[float]]]:
    """The pre-registered hypotheses (``"H1: a - b > 0"``, per-seed ``a - b`` of held-out
    sampled accuracy after GRPO, seeds in `SEEDS` order), from every run of the block."""
    return [(f"{h}: {a} - {b} > 0", diffs(have, a, b, "sampled_accuracy"))
            for h, a, b in HYPOTHESES]


def _mechanism(runs: dict[str, list[dict]]) -> list[str]:
    """Per-window means over seeds: d_bar, its staleness part (k = 4 arms), clip_frac and the
    training reward."""
    keys = (("d_bar", 4), ("mismatch/stale_d_bar", 4), ("clip_frac", 4), ("reward_mean", 3))
    out = window_header(WINDOW, STEPS)
    for arm, rs in runs.items():
        for key, digits in keys:
            if key.startswith("mismatch/") and "log.split_mismatch=true" not in ARMS[arm]:
                continue
            out.append(window_row(arm, key, rs, key, WINDOW, digits))
    return out


def _header() -> list[str]:
    """The section's title and its setting paragraph."""
    return ["## Staleness follow-up: naive PPO and a smaller step (pre-registered)", "",
            f"Pre-registered in [{PREREG}](../{PREREG}) before its driver and any run (issue "
            f"57): `{CONFIG}` ({STEPS} GRPO steps, FP8 rollouts, one update per batch) at "
            f"staleness k = 4, seeds {', '.join(map(str, SEEDS))} (never used before); arms "
            f"{', '.join(f'`{a}`' for a in ARMS)} (`hi` = lr 1e-4, `lo` = lr 2.5e-5; `naive` "
            "is AReaL's naive PPO, `train.proximal=behaviour`: the ratio and clip against the "
            "sampler's log-probs, no importance weight; `null` is `hi_k4_ais` on another "
            "RL-step key stream: the noise floor; `hi_k4_none` is exploratory). One-sided "
            "paired t-tests of H1 (hi_k4_ais > hi_k4_naive), H2 (lo_k4_ais > lo_k4_none) and "
            "H3 (lo_k0_none > lo_k4_none: staleness costs accuracy at the smaller step) on "
            "held-out sampled accuracy after GRPO, Holm over the three at 0.05. Runs: `python "
            "experiments/staleness_followup.py run`; each run's command, code commit, CPU "
            f"model and wall time are in `experiments/logs/{PREFIX}_<arm>_s<seed>/run.json`.",
            ""]


def render(logs: str = LOGS) -> list[str]:
    """The block's results section (markdown lines) from the logs in ``logs``."""
    have = loaded(logs)
    total = len(ARMS) * len(SEEDS)
    out = _header()
    if len(have) < total:
        return [*out, f"{len(have)} of {total} runs logged; the analysis is made when all "
                "exist (the pre-registration's stopping rule).", ""]
    runs = {arm: [have[f"{PREFIX}_{arm}_s{s}"] for s in SEEDS] for arm in ARMS}
    noise = [(label, diffs(have, "null", "hi_k4_ais", key)) for key, label in METRICS]
    explore = [(f"{h} {a} - {b}", "greedy", diffs(have, a, b, "accuracy"))
               for h, a, b in HYPOTHESES]
    explore += [(f"{a} - {b}", label, diffs(have, a, b, key))
                for a, b in (("hi_k4_naive", "hi_k4_none"), ("hi_k4_ais", "hi_k4_none"),
                             ("lo_k4_ais", "lo_k0_none")) for key, label in METRICS]
    return [*out, "### Confirmatory: the three pre-registered hypotheses", "",
            *primary_table(confirmatory(have), SEEDS), "",
            "Noise floor (the `null` arm against `hi_k4_ais`, same seeds):", "",
            *noise_table(noise, SEEDS, "null - hi_k4_ais"), "",
            f"### Arms (mean ± sd over the {len(SEEDS)} seeds; held-out, 200 problems)", "",
            *arms_table(runs, (("sampled_accuracy", "sampled after"),
                               ("accuracy", "greedy after")), DIAGNOSTICS), "",
            f"The diagnostics are means over the {STEPS} steps of each run (descriptive). "
            "`clip_frac` is the share of tokens the PPO clip acts on (0 by construction with "
            "the current proximal and one update per batch); `stale d_bar` and `quant d_bar` "
            "are the staleness and quantization parts of d_bar (`log.split_mismatch`, k = 4 "
            "arms; `-` at k = 0); alpha is logged as 0 without a correction.", "",
            "### Secondary (pre-registered, descriptive)", "",
            f"Mechanism statistics per {WINDOW}-step window, mean over seeds:", "",
            *_mechanism(runs), "",
            "Held-out greedy accuracy during GRPO (mean over seeds; `eval.every=50`):", "",
            *curves_table(runs, "accuracy", EVAL_STEPS, STEPS), "",
            "Held-out sampled accuracy during GRPO (mean over seeds):", "",
            *curves_table(runs, "sampled_accuracy", EVAL_STEPS, STEPS), "",
            "### Exploratory (no correction for multiplicity)", "",
            *exploratory_table(explore, SEEDS), ""]


def cmd_report(logs: str = LOGS) -> int:
    """Print the section when all runs exist (status 0); otherwise say how many do (status 1)."""
    lines = render(logs)
    if "### Confirmatory: the three pre-registered hypotheses" not in lines:
        print(lines[-2])
        return 1
    print("\n".join(lines))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``run`` (``--seeds``, ``--arms``, ``--until``, ``--dry-run``),
    ``pilot`` or ``report``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("run", "pilot", "report"))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    ap.add_argument("--scratch", default=os.path.join(ROOT, "runs", "staleness_followup"))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--until", default="", help="run: start nothing after this ISO date-time "
                    "(e.g. 2026-12-06T09:30), so no run is cut off")
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if a.command == "run":
        if not set(a.seeds) <= set(SEEDS):
            ap.error(f"run: --seeds must be among the pre-registered {list(SEEDS)}")
        cmd_run(sorted(a.seeds), a.arms, a.scratch, a.dry_run, a.until)
        return 0
    if a.command == "pilot":
        return pilot(a.scratch)
    return cmd_report()


if __name__ == "__main__":
    sys.exit(main())
