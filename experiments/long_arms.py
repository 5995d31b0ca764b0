"""The long-response setting of the study: every correction arm on the multiplication config.

    python experiments/long_arms.py warm --seeds 0 1 2      # one warm start per seed
    python experiments/long_arms.py run --seeds 0 1 2 [--settings e4m3] [--arms bf16 none]
    python experiments/long_arms.py run --dry-run           # list what would run
    python experiments/long_arms.py warm --seeds 5 6 7 8 9  # the replication's warm starts
    python experiments/long_arms.py rep                     # the pre-registered replication

The report is part of ``docs/results.md`` (``python experiments/compare.py
report`` calls `render`).

Every arm of a seed starts GRPO from that seed's warm-started policy: ``warm``
runs the warm start of the config once per seed (it stops on the config's
accuracy criterion), exports it as an HF directory with its character
tokenizer under ``--warm-dir`` and records the warm start (checks, steps,
wall time) in ``experiments/logs/long_warm_s<seed>/warm.json``; ``run`` then
trains each arm with ``model.source=<that export> sft.steps=0``, so the arms
of a seed differ only in the rollout precision and the correction.

A *setting* is a rollout precision (`SETTINGS`): the escalation order of the
study, from the paper's FP8 E4M3 to lower precisions, tried until
uncorrected rollouts lose accuracy against BF16 beyond the seed spread.  An
*arm* is a correction mode (`ARMS`); ``bf16`` (BF16 rollouts, no correction)
does not depend on the setting.  Raw logs go to
``experiments/logs/long_bf16_s<seed>/`` and
``experiments/logs/long_<setting>_<arm>_s<seed>/``; runs with a log are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository's ais_jax, also when it is not installed
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiments/common.py
import common  # noqa: E402

CONFIG = "configs/tiny_multiplication.yaml"
LOGS = os.path.join(ROOT, "experiments", "logs")
SEEDS = (0, 1, 2)
SETTINGS = {  # rollout precision, in escalation order
    "e4m3": ("rollout.precision=fp8", "rollout.fp8_format=e4m3"),
    "e5m2": ("rollout.precision=fp8", "rollout.fp8_format=e5m2", "rollout.lm_head_fp8=true"),
    "nvfp4": ("rollout.precision=fp8", "rollout.fp8_format=nvfp4", "rollout.lm_head_fp8=true"),
    "mxfp4": ("rollout.precision=fp8", "rollout.fp8_format=mxfp4", "rollout.lm_head_fp8=true"),
}
ARMS = {  # correction modes on the low-precision rollouts
    "none": ("ais.mode=none",),
    "tis": ("ais.mode=tis",),
    "seq_mask": ("ais.mode=seq_mask",),
    "geo_mask": ("ais.mode=geo_mask",),
    "ais": ("ais.mode=ais",),
}
BF16 = ("rollout.precision=bf16", "ais.mode=none")
# The pre-registered replication (experiments/prereg/long_replication.md): fresh seeds, the
# MXFP4 + lm_head setting, a null arm (BF16 rollouts on another key stream: trajectory noise)
# and the held-out accuracy every 20 steps.  Run names: rep_<arm>_s<seed>.
REP_SEEDS = (5, 6, 7, 8, 9)
REP_ARMS = {
    "bf16": BF16,
    "null": (*BF16, "train.rng_stream=1"),
    "none": (*SETTINGS["mxfp4"], *ARMS["none"]),
    "ais": (*SETTINGS["mxfp4"], *ARMS["ais"]),
    "tis": (*SETTINGS["mxfp4"], *ARMS["tis"]),
}
REP_COMMON = ("eval.every=20",)
# Loading the export: no remat (the in-process default of a scratch model), same dtypes.
FROM_WARM = ("sft.steps=0", "sft.target_accuracy=0", "train.remat=none", "model.kind=ar")


def warm_dir(base: str, seed: int) -> str:
    return os.path.join(base, f"long_warm_s{seed}")


def run_name(setting: str | None, arm: str, seed: int) -> str:
    """``long_bf16_s<seed>`` for BF16 rollouts, else ``long_<setting>_<arm>_s<seed>``."""
    return f"long_bf16_s{seed}" if setting is None else f"long_{setting}_{arm}_s{seed}"


def cmd_warm(seeds: Sequence[int], base: str) -> None:
    """Warm-start each seed's policy once; export it; log the warm start."""
    for seed in seeds:
        common.warm_export(CONFIG, seed, warm_dir(base, seed), f"long_warm_s{seed}",
                    f"python experiments/long_arms.py warm --seeds {seed}", common.COMMON)



def planned(seeds: Sequence[int], settings: Sequence[str], arms: Sequence[str],
            with_bf16: bool = True) -> dict[str, tuple[str, ...]]:
    """Run name -> overrides (without the warm-start source) for the given grid."""
    out: dict[str, tuple[str, ...]] = {}
    for seed in seeds:
        if with_bf16:
            out[run_name(None, "none", seed)] = (f"seed={seed}", *BF16)
        for setting in settings:
            for arm in arms:
                out[run_name(setting, arm, seed)] = (f"seed={seed}", *SETTINGS[setting],
                                                     *ARMS[arm])
    return out


def _run_all(runs: dict[str, tuple[str, ...]], base: str, scratch: str, dry_run: bool) -> None:
    """Train each run from its seed's warm start (runs with a log are skipped)."""
    run_one = common.run_one
    for name, ov in runs.items():
        if os.path.exists(os.path.join(LOGS, name, "run.json")):
            continue
        seed = int(name.rsplit("_s", 1)[1])
        full = (f"model.source={warm_dir(base, seed)}", *FROM_WARM, *ov)
        if dry_run:
            print(name, " ".join(full))
        else:
            run_one(name, full, scratch, CONFIG)


def cmd_run(seeds: Sequence[int], settings: Sequence[str], arms: Sequence[str], base: str,
            scratch: str, dry_run: bool, with_bf16: bool) -> None:
    _run_all(planned(seeds, settings, arms, with_bf16), base, scratch, dry_run)


def replication_planned(seeds: Sequence[int] = REP_SEEDS) -> dict[str, tuple[str, ...]]:
    """The replication's run names -> overrides (without the warm-start source), seed-major."""
    return {f"rep_{arm}_s{seed}": (f"seed={seed}", *REP_COMMON, *ov)
            for seed in seeds for arm, ov in REP_ARMS.items()}


def cmd_rep(seeds: Sequence[int], base: str, scratch: str, dry_run: bool) -> None:
    _run_all(replication_planned(seeds), base, scratch, dry_run)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("warm", "run", "rep"))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--settings", nargs="+", choices=tuple(SETTINGS), default=["e4m3"])
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    ap.add_argument("--no-bf16", action="store_true", help="skip the BF16 arm")
    ap.add_argument("--warm-dir", default=os.path.join("runs", "long_warm"),
                    help="relative to the repository root")
    ap.add_argument("--scratch", default=os.path.join(ROOT, "runs", "long_arms"))
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if a.command == "warm":
        cmd_warm(a.seeds, a.warm_dir)
    elif a.command == "rep":
        cmd_rep(a.seeds if a.seeds != list(SEEDS) else REP_SEEDS, a.warm_dir, a.scratch,
                a.dry_run)
    else:
        cmd_run(a.seeds, a.settings, a.arms, a.warm_dir, a.scratch, a.dry_run, not a.no_bf16)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# --------------------------------------------------------------------- report


# The first study's seeds.  Its results are exploratory (nothing was pre-registered); the
# replication (`REP_SEEDS`, runs rep_*, warm starts long_warm_s5..9) is reported on its own.
FIRST_SEEDS = (0, 1, 2, 3, 4)


def _loaded() -> dict[str, dict]:
    """Every logged run of the first study (seeds 0-4): name -> common.load(name)."""
    names = planned(FIRST_SEEDS, tuple(SETTINGS), tuple(ARMS))
    return {n: r for n in names if (r := common.load(n)) is not None}


def _warm_logs() -> dict[int, dict]:
    """The first study's warm starts (seeds 0-4); the replication's (`REP_SEEDS`) are its own."""
    out = {}
    for seed in FIRST_SEEDS:
        p = os.path.join(LOGS, f"long_warm_s{seed}", "warm.json")
        if os.path.exists(p):
            with open(p) as f:
                out[seed] = json.load(f)
    return out


def _stats(run: dict) -> dict:
    import numpy as np

    st = common.run_stats(run)
    n = len(run["rows"])
    k = max(1, n // 5)
    ln = common.series(run, "response_len")
    st.update(len_first=float(np.mean(ln[:k])), len_last=float(np.mean(ln[-k:])),
              ess_early=float(np.mean(common.series(run, "ess_ratio")[:k])),
              ess_late=float(np.mean(common.series(run, "ess_ratio")[-k:])),
              ess_min=float(np.min(common.series(run, "ess_ratio"))),
              seq_sd=float(np.mean(common.series(run, "seq_log_ratio_std"))),
              dropped=float(np.mean(common.series(run, "dropped_seq_frac"))))
    return st


def _paired_rows(have: dict[str, dict], label: str, arm_of, base_of,
                 seeds: Sequence[int]) -> list[tuple[str, str, list[int], list[float]]]:
    """Held-out greedy / sampled accuracy after GRPO, arm minus base, per seed (the rows of
    `common.paired_table`); none when no seed has both runs."""
    seeds = [s for s in seeds if arm_of(s) in have and base_of(s) in have]
    if not seeds:
        return []
    out = []
    for key, metric in (("accuracy", "greedy"), ("sampled_accuracy", "sampled")):
        d = [have[arm_of(s)]["summary"]["eval_after"][key]
             - have[base_of(s)]["summary"]["eval_after"][key] for s in seeds]
        out.append((label, metric, seeds, d))
    return out


MISMATCH = os.path.join(LOGS, "long_mismatch_s0")
MISMATCH_FORMATS = ("e4m3", "e4m3_lmhead", "e5m2_lmhead", "nvfp4", "nvfp4_lmhead", "mxfp4",
                    "mxfp4_lmhead")


def _mismatch_table() -> list[str]:
    """The seed-0 warm policy's rollout/trainer mismatch per format (mismatch CLI JSONs)."""
    rows = []
    for fmt in MISMATCH_FORMATS:
        p = os.path.join(MISMATCH, f"{fmt}.json")
        if not os.path.exists(p):
            continue
        with open(p) as f:
            d = json.load(f)
        a, b = d["arms"]["fp8"], d["arms"]["bfloat16"]
        label = fmt.replace("_lmhead", " + lm_head")
        rows.append(f"| {label} | {a['d_bar']:.4f} | {a['ess_ratio']:.4f} | "
                    f"{a['abs_delta_p99']:.3f} | {a['seq_log_ratio_std']:.3f} | "
                    f"{a['seq_log_ratio_min']:+.2f} | {b['d_bar']:.4f} | "
                    f"{b['seq_log_ratio_std']:.3f} |")
    if not rows:
        return []
    return ["Mismatch of the seed-0 warm-started policy under each rollout format, before any "
            "GRPO (`python -m ais_jax.mismatch --model <warm export> --prompts "
            "experiments/logs/long_mismatch_s0/prompts.txt --num-prompts 64 --samples 4 "
            "--max-new-tokens 72 --fp8-format F [--lm-head-fp8] --bf16-arm --json ...`; 256 "
            "sampled responses of about 65 tokens; the BF16 columns are the sampler-vs-trainer "
            "control of the same run):", "",
            "| rollout format | d_bar | token ESS ratio | &#124;Δlogp&#124; p99 | "
            "seq. log-ratio sd | seq. log-ratio min | BF16 d_bar | BF16 seq. sd |",
            "|---|---|---|---|---|---|---|---|", *rows, ""]


def render(figures: str) -> list[str]:
    """The long-response section of docs/results.md (markdown lines) and its figures."""
    have = _loaded()
    warm = _warm_logs()
    out = ["## The long-response setting (multiplication with a written scratchpad)", "",
           "The first study of this setting (seeds 0-4) is exploratory: it was not "
           "pre-registered. Its replication on fresh seeds 5-9, pre-registered in "
           "`experiments/prereg/long_replication.md`, is not included in this section.", ""]
    if not have:
        return [*out, "No runs logged yet (`python experiments/long_arms.py run`).", ""]
    from ais_jax.config.load import load_config

    cfg = load_config(os.path.join(ROOT, CONFIG), [])
    m, r, t, s = cfg.model, cfg.rollout, cfg.train, cfg.sft
    out += [
        f"Every run is `{CONFIG}` started from its seed's warm start (`python "
        "experiments/long_arms.py warm`, exported and reloaded with "
        f"`model.source=<export> {' '.join(FROM_WARM)}`), plus the arm's overrides "
        "(`experiments/logs/NAME/run.json` holds each command, wall time and load):",
        "",
        f"- model: from scratch, D={m.hidden_size}, L={m.num_layers}, heads "
        f"{m.num_heads}/{m.num_kv_heads}, MLP {m.intermediate_size}; task `{cfg.task.name}` "
        f"{dict(cfg.task.difficulty)} (worked answers of 17-70 characters, mean 63.1 over "
        "all 2x3-digit pairs, plus `<eos>`)",
        f"- warm start: batches of {s.batch_size}, lr {s.learning_rate}, until greedy accuracy "
        f"on {s.check_size} training-split problems reaches {s.target_accuracy} (checked every "
        f"{s.check_every} steps, at most {s.max_steps})",
        f"- GRPO: {t.steps} steps x {r.prompts_per_step} prompts x G={r.group_size}, lr "
        f"{t.learning_rate}, up to {r.max_new_tokens} new tokens at T={r.temperature}",
        f"- held-out: {cfg.task.eval_size} problems, greedy and sampled at T={r.temperature} "
        f"(mean of {cfg.eval.num_samples})",
        "",
    ]
    if warm:
        out += ["Warm starts:", "", "| seed | steps | checks (step: accuracy), last three | "
                "wall s |", "|---|---|---|---|"]
        for seed, w in warm.items():
            ws = w["warm_start"]
            chk = ", ".join(f"{x['step']}: {x['accuracy']:.2f}" for x in ws["checks"][-3:])
            out.append(f"| {seed} | {ws['steps_run']} | {chk} | {w['wall_s']:.0f} |")
        out.append("")

    out += _mismatch_table()

    def group(setting: str | None, arm: str) -> list[tuple[int, dict]]:
        return [(sd, have[run_name(setting, arm, sd)]) for sd in FIRST_SEEDS
                if run_name(setting, arm, sd) in have]

    groups: dict[str, list[tuple[int, dict]]] = {"bf16": group(None, "none")}
    for setting in SETTINGS:
        for arm in ARMS:
            if (g := group(setting, arm)):
                groups[f"{setting} {arm}"] = g
    cols = (("greedy_before", "greedy before"), ("greedy_after", "greedy after"),
            ("delta_greedy", "Δ greedy"), ("sampled_before", "sampled before"),
            ("sampled_after", "sampled after"), ("delta_sampled", "Δ sampled"),
            ("d_bar", "d_bar"), ("ess_early", "ESS first 20%"), ("ess_late", "ESS last 20%"),
            ("ess_min", "ESS min"), ("seq_sd", "seq. log-ratio sd"),
            ("dropped", "dropped seq. share"), ("alpha", "alpha"), ("len_first", "len first 20%"),
            ("len_last", "len last 20%"), ("wall_s", "wall s / run"))
    out += ["### Arms (mean ± sd over seeds)", "",
            "| arm | seeds | " + " | ".join(x[1] for x in cols) + " |",
            "|" + "---|" * (len(cols) + 2)]
    for label, g in groups.items():
        st = [_stats(run) for _, run in g]
        digits = {"wall_s": 0, "len_first": 1, "len_last": 1, "d_bar": 4, "ess_early": 4,
                  "ess_late": 4, "ess_min": 4}
        cells = [common.mean_sd([x[k] for x in st], digits.get(k, 3)) for k, _ in cols]
        out.append(f"| {label} | {','.join(str(sd) for sd, _ in g)} | " + " | ".join(cells)
                   + " |")
    rows = []
    seeds = FIRST_SEEDS
    for setting in SETTINGS:
        rows += _paired_rows(have, f"bf16 − {setting} none (the gap)",
                             lambda sd: run_name(None, "none", sd),
                             lambda sd, st=setting: run_name(st, "none", sd), seeds)
    for setting in SETTINGS:  # what is left of the gap with AIS
        rows += _paired_rows(have, f"bf16 − {setting} ais (gap left)",
                             lambda sd: run_name(None, "none", sd),
                             lambda sd, st=setting: run_name(st, "ais", sd), seeds)
    for setting in SETTINGS:
        for arm in ARMS:
            if arm != "none":
                rows += _paired_rows(have, f"{setting} {arm} − {setting} none",
                                     lambda sd, st=setting, a=arm: run_name(st, a, sd),
                                     lambda sd, st=setting: run_name(st, "none", sd), seeds)
    out += ["", "### Paired differences of held-out accuracy after GRPO (exploratory)", "",
            "Per seed (the arms of a seed share its warm start and its problems), arm minus "
            "the reference, with n the number of seeds. The mean difference has its 95% paired "
            "t-interval (t distribution with n − 1 degrees of freedom); d_z is the mean over "
            "the standard deviation of the differences; the p-values are two-sided: the paired "
            "t-test and the exact sign-flip permutation test (all 2^n sign assignments; its "
            "smallest possible value is 0.25 with 3 seeds and 0.0625 with 5, so it cannot reach "
            "0.05 here). The family for Holm's correction is every row of this table "
            f"({len(rows)} comparisons of the long setting); the Holm column is the t-test "
            "p-value adjusted over it. None of these comparisons was pre-registered: the "
            "formats were escalated until a gap appeared, seeds 3-4 were added after seeing "
            "seeds 0-2 (every effect then shrank) and the warm-start target was chosen on "
            "seeds 0-2, so the table is exploratory and its p-values are optimistic. The "
            "pre-registered test of the two main claims is the replication on seeds 5-9 "
            "(`experiments/prereg/long_replication.md`), reported separately.", "",
            *common.paired_table(rows, f"family of {len(rows)}")]
    out.append("")
    os.makedirs(figures, exist_ok=True)
    curves = {label: [run for _, run in g] for label, g in groups.items()}
    figs = (("long_ess.png", "ESS ratio over training (cf. the paper's Fig. 4)", "ESS / N",
             "ess_ratio"),
            ("long_d_bar.png", "Mismatch d_bar over training", "mean |log-ratio|", "d_bar"),
            ("long_seq_sd.png", "Spread of the sequence log-ratio over training",
             "sd of sum of log-ratios", "seq_log_ratio_std"),
            ("long_response_len.png", "Response length over training", "tokens",
             "response_len"),
            ("long_reward.png", "Training reward (10-step mean)", "reward", "reward_mean"))
    for fname, title, ylabel, key in figs:
        if common.figure(os.path.join(figures, fname), title, ylabel, curves, key):
            out += [f"![{key}](figures/{fname})", ""]
    for label, g in groups.items():
        if label.endswith(" ais"):
            fname = f"long_alpha_{label.split()[0]}.png"
            common.alpha_figure(os.path.join(figures, fname),
                            f"AIS alpha and its parts ({label}, seed mean)", [x for _, x in g])
            out += [f"![alpha {label}](figures/{fname})", ""]
    wall = sum(x["meta"]["wall_s"] for x in have.values())
    wall_warm = sum(w["wall_s"] for w in warm.values())
    out += [f"Compute of this setting: {len(have)} GRPO runs, {wall / 60:.0f} min, plus "
            f"{len(warm)} warm starts, {wall_warm / 60:.0f} min (wall time on the 2-core CPU, "
            "one run at a time).", ""]
    return out
