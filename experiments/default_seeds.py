"""The embedded default's five seeds (issue 28, item 6): the README's first command at seeds 0-4.

``python experiments/default_seeds.py --seeds 0 1 2 3 4`` runs, per seed,
``python -m ais_jax.train --config configs/tiny_arithmetic.yaml seed=S`` (progress bars off,
run directory under ``--scratch``) and keeps its logs in ``experiments/logs/demo_seed_S/``:
``metrics.jsonl``, ``summary.json``, ``warm_start.json``, ``stdout.txt`` and ``run.json``
(command, wall time, load averages, exit status).  Seeds with a log are skipped;
``--report`` prints the before -> after table docs/measured.md quotes.
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
LOGS = os.path.join(ROOT, "experiments", "logs")
CONFIG = "configs/tiny_arithmetic.yaml"


def run_seed(seed: int, scratch: str) -> None:
    """Run the default at ``seed``; copy its logs to ``experiments/logs/demo_seed_<seed>``."""
    out = os.path.join(scratch, f"demo_seed_{seed}")
    shutil.rmtree(out, ignore_errors=True)
    args = ["--config", CONFIG, f"seed={seed}", "log.progress=false"]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ais_jax.train", *args, f"out_dir={out}"],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"seed {seed} failed with status {proc.returncode}")
    dest = os.path.join(LOGS, f"demo_seed_{seed}")
    os.makedirs(dest, exist_ok=True)
    for f in ("metrics.jsonl", "summary.json", "warm_start.json"):
        shutil.copy(os.path.join(out, f), os.path.join(dest, f))
    with open(os.path.join(dest, "stdout.txt"), "w") as f:
        f.write(proc.stdout)
    with open(os.path.join(dest, "run.json"), "w") as f:
        json.dump({"command": " ".join(["python", "-m", "ais_jax.train", *args]),
                   "wall_s": round(wall, 1), "exit": proc.returncode,
                   "load_avg_start": [round(x, 2) for x in load0],
                   "load_avg_end": [round(x, 2) for x in os.getloadavg()]}, f, indent=1)
        f.write("\n")
    shutil.rmtree(out, ignore_errors=True)
    print(f"seed {seed}: {wall:.0f} s", flush=True)


def report(seeds: Sequence[int]) -> str:
    """Markdown rows: warm-start steps, held-out greedy / sampled / pass@8 before -> after."""
    rows = ["| seed | warm-start steps | greedy | sampled | pass@8 | wall |",
            "|---|---|---|---|---|---|"]
    for seed in seeds:
        d = os.path.join(LOGS, f"demo_seed_{seed}")
        if not os.path.exists(os.path.join(d, "run.json")):
            continue
        with open(os.path.join(d, "summary.json")) as f:
            s = json.load(f)
        with open(os.path.join(d, "warm_start.json")) as f:
            w = json.load(f)
        with open(os.path.join(d, "run.json")) as f:
            r = json.load(f)
        b, a = s["eval_before"], s["eval_after"]
        rows.append(
            f"| {seed} | {w['steps_run']} | {b['accuracy']:.3f} -> {a['accuracy']:.3f} | "
            f"{b['sampled_accuracy']:.3f} -> {a['sampled_accuracy']:.3f} | "
            f"{b['pass@8']:.3f} -> {a['pass@8']:.3f} | {r['wall_s']:.0f} s "
            f"(load {r['load_avg_start'][0]:.1f}) |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--scratch", default=os.path.join(ROOT, "runs", "demo"))
    ap.add_argument("--report", action="store_true", help="print the table, run nothing")
    args = ap.parse_args(argv)
    if args.report:
        print(report(args.seeds))
        return 0
    for seed in args.seeds:
        if not os.path.exists(os.path.join(LOGS, f"demo_seed_{seed}", "run.json")):
            run_seed(seed, args.scratch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
