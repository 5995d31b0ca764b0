"""Warm-start trajectories: validation (training-split) and held-out greedy accuracy every N steps.

``python experiments/warmstart_sweep.py --seeds 0 1 2 3 4 --every 25 [key=value ...]`` runs only
the supervised warm start of ``configs/tiny_arithmetic.yaml`` (criterion off, all
``sft.steps``) and prints, per seed, the greedy accuracy on the warm-start criterion's
validation problems and on the held-out evaluation problems at every ``--every`` steps.
Used to choose ``sft.target_accuracy`` (experiments/results_notes.md).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ais_jax.config.load import load_config
from ais_jax.config.schema import DEFAULT_CONFIG_PATH
from ais_jax.training.build import build_run
from ais_jax.training.evaluation import make_evaluator
from ais_jax.training.warmstart import WarmStartLog, make_accuracy_check, warm_start


def trajectory(seed: int, every: int, overrides: list[str]) -> dict[str, Any]:
    """The warm start of ``seed`` with validation and held-out checks every ``every`` steps."""
    cfg = load_config(DEFAULT_CONFIG_PATH, [f"seed={seed}", "sft.target_accuracy=0",
                                            "log.progress=false", *overrides])
    run = build_run(cfg)
    val = make_accuracy_check(run)
    held, _ = make_evaluator(run, num_samples=1)
    rows: list[dict[str, float]] = []

    def check(params: Any) -> float:
        acc = val(params)
        rows.append({"step": (len(rows) + 1) * every, "val": acc,
                     "heldout": held(params)["accuracy"]})
        return acc

    # A target above any accuracy keeps the criterion's checks on without ever stopping.
    cfg_on = load_config(DEFAULT_CONFIG_PATH, [f"seed={seed}", "sft.target_accuracy=1",
                                               f"sft.check_every={every}", "log.progress=false",
                                               *overrides])
    run.cfg = cfg_on
    t0 = time.perf_counter()
    warm_start(run, run.state.params, log=WarmStartLog(), check=lambda p: min(check(p), 0.999))
    return {"seed": seed, "rows": rows, "wall_s": time.perf_counter() - t0}


def main() -> None:
    """CLI: print one JSON line per seed."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    for seed in args.seeds:
        out = trajectory(seed, args.every, args.overrides)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
