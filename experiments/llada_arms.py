"""The diffusion setting of the study: BF16 / FP8 / FP8+TIS / FP8+AIS on the LLaDA default.

    python experiments/llada_arms.py warm --seeds 0 1 2     # one warm start per seed
    python experiments/llada_arms.py run --seeds 0 1 2 [--arms bf16 fp8_ais] [--dry-run]

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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("warm", "run"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    ap.add_argument("--warm-dir", default=os.path.join("runs", "llada_warm"),
                    help="relative to the repository root")
    ap.add_argument("--scratch", default=os.path.join(ROOT, "runs", "llada_arms"))
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if a.command == "warm":
        cmd_warm(a.seeds, a.warm_dir)
    else:
        cmd_run(a.seeds, a.arms, a.warm_dir, a.scratch, a.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
