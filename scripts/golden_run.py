"""The golden run: a short fixed-seed run of the embedded default whose metrics guard the numbers.

``tests/test_golden.py`` runs the same command and requires it to reproduce one of the
committed golden files ``tests/golden/golden_run_<cpu>.json``.  The numbers are exact for one
machine type and one set of packages: sampled tokens turn any last-bit difference (another
CPU's vector code, another jaxlib) into another trajectory, so the project keeps one file per
CPU model its machines have (each records the `environment` it was made on: an AMD EPYC (Zen 3
era, no cpu_id recorded), an Intel Xeon, and an AMD EPYC family 25 model 17 (Zen 4, AVX-512) so
far; the first two part at the first RL step's rollout, the Zen 4 already in the warm start).

    python scripts/golden_run.py          # a change altered the numbers on purpose: write this
                                          # machine's file and delete the others (they describe
                                          # the old numbers); say why in the commit message
    python scripts/golden_run.py --add    # a new machine type, numbers unchanged: add its file

After a deliberate change the other machine types' files are gone; the first session on each
adds its file back with ``--add`` from the same commit.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_DIR = os.path.join(ROOT, "tests", "golden")

# The embedded default, shortened: sums of two 1-digit numbers (pinned: the default's
# task is three 1-digit numbers since issue 28) so 60 warm-start steps reach a
# policy with a nonzero reward spread; two minibatches and a KL term so the
# shuffle and reference-policy paths are guarded too.
OVERRIDES = [
    "sft.steps=60", "sft.warmup_steps=10", "sft.target_accuracy=0", "train.steps=4",
    "train.learning_rate=1e-3",
    "train.minibatches=2", "train.beta_kl=0.01", "rollout.prompts_per_step=8",
    "task.eval_size=16", "task.difficulty={digits: 1, num_operands: 2, ops: '+'}",
    "eval.every=2", "eval.num_samples=2",
    "checkpoint.every=2", "log.tensorboard=false", "log.progress=false",
]
# Wall-clock fields: not part of the computation (with ais_jax.training.flops.TIMING_KEYS).
TIMING = ("step_time_s", "timing_s/rollout", "timing_s/host", "timing_s/update",
          "perf/tokens_per_s", "perf/rollout_flops_per_s", "perf/update_flops_per_s", "perf/mfu")


def run_golden(out_dir: str) -> dict:
    """Run the golden command into ``out_dir``; return its metrics and evaluations."""
    cmd = [sys.executable, "-m", "ais_jax.train", "--config",
           os.path.join(ROOT, "configs", "tiny_arithmetic.yaml"), f"out_dir={out_dir}",
           *OVERRIDES]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"golden run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    for r in metrics:
        for k in TIMING:
            r.pop(k, None)
    return {"overrides": OVERRIDES, "metrics": metrics,
            "eval_before": summary["eval_before"], "eval_after": summary["eval_after"]}


PACKAGES = ("jax", "jaxlib", "numpy", "ml_dtypes", "optax", "flax")


def environment() -> dict[str, str]:
    """The machine and package versions the numbers depend on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    except OSError:
        pass
    env = {"cpu": cpu, "python": platform.python_version()}
    cpu_id = _cpu_id()
    if cpu_id:
        env["cpu_id"] = cpu_id
    for name in PACKAGES:
        try:
            env[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            env[name] = "absent"
    return env


def _cpu_id() -> str | None:
    """x86 family, model and widest vector unit, e.g. ``family 25 model 17 avx512``.

    The model name alone does not name a machine type: "AMD EPYC" covers Zen 3 (AVX2) and
    Zen 4 (AVX-512), whose XLA CPU code reduces in other orders (their runs part in the warm
    start).  None where /proc/cpuinfo has no such lines.
    """
    try:
        with open("/proc/cpuinfo") as f:
            fields = dict(ln.split(":", 1) for ln in f.read().split("\n\n")[0].splitlines()
                          if ":" in ln)
    except OSError:
        return None
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    if "cpu family" not in fields or "model" not in fields:
        return None
    flags = fields.get("flags", "").split()
    vector = next((v for v in ("avx512f", "avx2", "avx") if v in flags), "novec")
    return f"family {fields['cpu family']} model {fields['model']} {vector.removesuffix('f')}"


def golden_path(env: dict[str, str]) -> str:
    """This machine type's golden file: ``tests/golden/golden_run_<cpu slug>.json``.

    The slug is the model name plus, for files made since the AMD EPYC generations parted,
    the ``cpu_id`` (family, model, vector unit); older files carry only the name.
    """
    name = env["cpu"] + (f" {env['cpu_id']}" if env.get("cpu_id") else "")
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"
    return os.path.join(GOLDEN_DIR, f"golden_run_{slug}.json")


def golden_files() -> list[str]:
    """Every committed golden file, sorted."""
    return sorted(glob.glob(os.path.join(GOLDEN_DIR, "golden_run_*.json")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--add", action="store_true",
                    help="keep the other machine types' files (the numbers did not change)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        result = run_golden(os.path.join(d, "run"))
    env = environment()
    result["environment"] = env
    path = golden_path(env)
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)}")
    if not a.add:
        for other in golden_files():
            if other != path:
                os.remove(other)
                print(f"removed {os.path.relpath(other, ROOT)} (old numbers): run "
                      "`python scripts/golden_run.py --add` on that machine type")


if __name__ == "__main__":
    main()
