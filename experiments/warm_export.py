"""One seed's warm start, exported and logged: shared by the study scripts.

`warm_export` runs a config's warm start (its SFT, stopped by ``sft.target_accuracy``)
once, saves the policy as an HF directory with its character tokenizer, and records the
warm start (checks, steps, wall time) in ``experiments/logs/<log_name>/warm.json``.
Used by ``long_arms.py warm`` and ``lora_arms.py warm``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOGS = os.path.join(ROOT, "experiments", "logs")


def warm_export(config: str, seed: int, dest: str, log_name: str, command: str,
                overrides: Sequence[str] = ()) -> bool:
    """Warm-start ``config`` at ``seed`` and export it to ``dest``, unless already there.

    Args:
      config: the config's path relative to the repository root.
      seed: the run's seed.
      dest: the export directory (``<dest>.run`` is the scratch output, removed after).
      log_name: the log directory's name under experiments/logs.
      command: the command line recorded in warm.json.
      overrides: extra config overrides.

    Returns:
      True when it ran, False when ``dest`` already held an export.
    """
    from ais_jax.config.load import load_config
    from ais_jax.models.pretrained import save_pretrained
    from ais_jax.training.build import build_run
    from ais_jax.training.warmstart import WarmStartLog, warm_start

    if os.path.exists(os.path.join(dest, "config.json")):
        return False
    t0 = time.perf_counter()
    cfg = load_config(os.path.join(ROOT, config), [f"seed={seed}", f"out_dir={dest}.run",
                                                   *overrides])
    run = build_run(cfg)
    log = WarmStartLog()
    params = warm_start(run, run.state.params, log=log)
    save_pretrained(params, run.model_cfg, dest)
    run.codec.tokenizer.save(dest)
    wall = time.perf_counter() - t0
    shutil.rmtree(f"{dest}.run", ignore_errors=True)
    logdir = os.path.join(LOGS, log_name)
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "warm.json"), "w") as f:
        json.dump({"command": command, "config": config, "wall_s": round(wall, 1),
                   "warm_start": log.as_dict()}, f, indent=1)
        f.write("\n")
    print(f"warm start seed {seed}: {wall:.0f} s -> {dest}", flush=True)
    return True
