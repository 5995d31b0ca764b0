"""The diffusion setting of the study: BF16 / FP8 / FP8+TIS / FP8+AIS on the LLaDA default.

    python experiments/llada_arms.py warm --seeds 0 1 2     # one warm start per seed
    python experiments/llada_arms.py run --seeds 0 1 2 [--arms bf16 fp8_ais] [--dry-run]
    python experiments/llada_arms.py report                 # docs/results_llada.md from the logs

Every arm of a seed starts GRPO from the same warm-started policy: ``warm``
runs the warm start of ``configs/tiny_llada_countdown.yaml`` at that seed once
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
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository's ais_jax, also when it is not installed

CONFIG = "configs/tiny_llada_countdown.yaml"
RESULTS = os.path.join(ROOT, "docs", "results_llada.md")
NOTES = os.path.join(ROOT, "experiments", "llada_notes.md")
LOGS = os.path.join(ROOT, "experiments", "logs")
ARMS = {  # the paper's four arms
    "bf16": ("rollout.precision=bf16", "ais.mode=none"),
    "fp8": ("rollout.precision=fp8", "ais.mode=none"),
    "fp8_tis": ("rollout.precision=fp8", "ais.mode=tis"),
    "fp8_ais": ("rollout.precision=fp8", "ais.mode=ais"),
}
COMMON = ("checkpoint.every=0", "log.progress=false", "log.tensorboard=false")


def warm_dir(base: str, seed: int) -> str:
    return os.path.join(base, f"llada_warm_s{seed}")


def cmd_warm(seeds: Sequence[int], base: str) -> None:
    """Warm-start each seed's policy once and save it as a LLaDA checkpoint."""
    from ais_jax.build import build_run
    from ais_jax.config import load_config
    from ais_jax.llada.checkpoint import save
    from ais_jax.placement import to_host
    from ais_jax.warmstart import warm_start

    for seed in seeds:
        dest = warm_dir(base, seed)
        if os.path.exists(os.path.join(dest, "model.safetensors")):
            continue
        t0 = time.perf_counter()
        cfg = load_config(os.path.join(ROOT, CONFIG),
                          [f"seed={seed}", f"out_dir={dest}.run", *COMMON])
        run = build_run(cfg)
        params = warm_start(run, run.state.params)
        save(dest, to_host(params), run.model_cfg)
        run.codec.tokenizer.save(dest)
        shutil.rmtree(f"{dest}.run", ignore_errors=True)
        print(f"warm start seed {seed}: {time.perf_counter() - t0:.0f} s -> {dest}", flush=True)


def run_one(name: str, overrides: Sequence[str], scratch: str) -> None:
    out_dir = os.path.join(scratch, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    shown = ["python", "-m", "ais_jax.train", "--config", CONFIG, *COMMON, *overrides]
    cmd = [sys.executable, *shown[1:], f"out_dir={out_dir}"]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"run {name} failed with status {proc.returncode}")
    dest = os.path.join(LOGS, name)
    os.makedirs(dest, exist_ok=True)
    for f in ("metrics.jsonl", "summary.json"):
        shutil.copy(os.path.join(out_dir, f), os.path.join(dest, f))
    with open(os.path.join(dest, "run.json"), "w") as f:
        json.dump({"command": " ".join(shown), "wall_s": round(wall, 1),
                   "load_avg_start": [round(x, 2) for x in load0],
                   "load_avg_end": [round(x, 2) for x in os.getloadavg()]}, f, indent=1)
        f.write("\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    print(f"{name}: {wall:.0f} s", flush=True)


def cmd_run(seeds: Sequence[int], arms: Sequence[str], base: str, scratch: str,
            dry_run: bool) -> None:
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
                run_one(name, ov, scratch)


def _bootstrap_ci(xs: Sequence[float], reps: int = 10_000) -> tuple[float, float]:
    """95% percentile CI of the mean of ``xs`` by resampling its entries (seeds)."""
    import numpy as np

    a = np.asarray(xs, np.float64)
    idx = np.random.default_rng(0).integers(0, len(a), size=(reps, len(a)))
    means = a[idx].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def render() -> str:
    """docs/results_llada.md from experiments/logs/llada_<arm>_s<seed> (deterministic)."""
    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compare import load, mean_sd, run_stats, series

    runs = {}
    for arm in ARMS:
        for seed in range(10):
            r = load(f"llada_{arm}_s{seed}")
            if r is not None:
                st = run_stats(r)
                st["response_len"] = float(np.mean(series(r, "response_len")))
                runs[arm, seed] = st
    out = ["# The diffusion setting: BF16 / FP8 / FP8+TIS / FP8+AIS on the LLaDA default", "",
           "Generated by `python experiments/llada_arms.py report` from "
           "`experiments/logs/llada_<arm>_s<seed>/`; do not edit by hand.", "",
           f"Each run is `{CONFIG}` (0.6M-parameter masked-diffusion model, Countdown with 3 "
           "numbers from 1-6, 150 diffu-GRPO steps x 16 prompts x 8 samples, two inner "
           "iterations) started from its seed's shared warm start (`python "
           "experiments/llada_arms.py warm`), with the arm's rollout precision and correction "
           "(`run.json` holds each command, wall time and load). Held-out accuracy: 512 "
           "problems, greedy and sampled at T=1 (mean of 4).", ""]
    if not runs:
        return "\n".join([*out, "No runs logged yet.", ""])
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
    out += ["", "## Paired against uncorrected FP8 (same seed, same warm start)", "",
            "Difference arm - `fp8` of the accuracy after GRPO, per seed; mean with a 95% "
            "bootstrap interval over seeds (10,000 resamples of the seeds; with 2-3 seeds it is "
            "coarse and cannot exclude zero unless every seed agrees).", "",
            "| arm | metric | per seed | mean [95% CI] |", "|---|---|---|---|"]
    for arm in ARMS:
        if arm == "fp8":
            continue
        seeds = sorted(s for a, s in runs if a == arm and ("fp8", s) in runs)
        if not seeds:
            continue
        for key, label in (("greedy_after", "greedy"), ("sampled_after", "sampled")):
            d = [runs[arm, s][key] - runs["fp8", s][key] for s in seeds]
            lo, hi = _bootstrap_ci(d)
            per = ", ".join(f"s{s} {x:+.3f}" for s, x in zip(seeds, d, strict=True))
            out.append(f"| {arm} | {label} | {per} | {np.mean(d):+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    if os.path.exists(NOTES):
        with open(NOTES) as f:
            out += ["", f.read().rstrip()]
    return "\n".join(out) + "\n"


def cmd_report() -> None:
    with open(RESULTS, "w") as f:
        f.write(render())
    print(f"wrote {os.path.relpath(RESULTS, ROOT)}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("warm", "run", "report"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    ap.add_argument("--warm-dir", default=os.path.join("runs", "llada_warm"),
                    help="relative to the repository root")
    ap.add_argument("--scratch", default=os.path.join(ROOT, "runs", "llada_arms"))
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if a.command == "report":
        cmd_report()
    elif a.command == "warm":
        cmd_warm(a.seeds, a.warm_dir)
    else:
        cmd_run(a.seeds, a.arms, a.warm_dir, a.scratch, a.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
