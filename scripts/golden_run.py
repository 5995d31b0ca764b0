"""The golden run: a short fixed-seed run of the embedded default whose metrics guard the numbers.

``tests/test_golden.py`` guards the numbers in two ways:

* **on any CPU**: the cross-CPU run (`CROSS_CPU_OVERRIDES`: the golden run in float32
  compute, 30 warm-start and two RL steps) is well conditioned on CPUs with fused
  multiply-add: its metrics under XLA's AVX2 and AVX-512 code agree to 1.4e-7 (relative,
  every number of the run), so it must agree with ``tests/golden/cross_cpu.json`` within
  `CROSS_CPU_RTOL` / `CROSS_CPU_ATOL`.  XLA's SSE4.2 code (no FMA: every multiply-add
  rounds twice) gives other numbers (the warm start parts at 4e-4, the FP8 mismatch
  statistics by up to 60%), so CPUs without FMA have their own reference,
  ``tests/golden/cross_cpu_sse4_2.json``, with the same tolerance (`cross_cpu_path`).
* **exactly, per CPU kind**: the golden run (`OVERRIDES`) must reproduce one of the committed
  files ``tests/golden/golden_run_<cpu>.json`` to rtol 1e-5.  These numbers are exact for one
  machine type and one set of packages: sampled tokens turn any last-bit difference (another
  CPU's vector code, another jaxlib) into another trajectory, so the project keeps one file
  per CPU model its machines have (each records the `environment` it was made on: an AMD EPYC
  (Zen 3 era, no cpu_id recorded), an Intel Xeon, and an AMD EPYC family 25 model 17 (Zen 4,
  AVX-512) so far; the first two part at the first RL step's rollout, the Zen 4 already in the
  warm start).  A CPU kind without a file passes on the cross-CPU check and is told, once
  (a pytest warning), how to add its file.

    python scripts/golden_run.py          # a change altered the numbers on purpose: write this
                                          # machine's file and the cross-CPU reference, delete
                                          # the other machine types' files (they describe the
                                          # old numbers); say why in the commit message
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
# The cross-CPU run: the golden run with float32 compute (the bf16 casts of the default turn
# another CPU's last bits into whole bf16 steps), a 30-step warm start and two RL steps.
# Measured (AMD EPYC family 25 model 17, jax 0.10.2, this commit's overrides): the whole run
# under --xla_cpu_max_isa=AVX2 against the AVX-512 default, largest relative difference of
# any number 1.4e-7 (largest absolute 1.2e-7); the tolerance leaves a margin of ~700x (the
# exact per-CPU files guard the last bits).
CROSS_CPU_OVERRIDES = [
    *(o for o in OVERRIDES if not o.startswith(("sft.steps=", "train.steps=", "checkpoint."))),
    "sft.steps=30", "train.steps=2", "checkpoint.every=0", "model.compute_dtype=float32",
]
CROSS_CPU_RTOL, CROSS_CPU_ATOL = 1e-4, 1e-6
NO_FMA_ISA = "SSE4_2"  # the XLA ISA whose code stands for CPUs without fused multiply-add


def cross_cpu_path(fma: bool | None = None) -> str:
    """The cross-CPU reference for CPUs with FMA (``cross_cpu.json``) or without
    (``cross_cpu_sse4_2.json``); ``fma`` None: this process's (`has_fma`)."""
    fma = has_fma() if fma is None else fma
    return os.path.join(GOLDEN_DIR, "cross_cpu.json" if fma else "cross_cpu_sse4_2.json")


def has_fma() -> bool:
    """Whether XLA:CPU's code here has fused multiply-add: not under an ISA cap below AVX2,
    nor on an x86 CPU whose flags lack ``fma``; assumed elsewhere (aarch64 has it)."""
    if _isa_cap() in ("novec", "sse4_2", "avx"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")),
                         None)
    except OSError:
        return True
    return flags is None or "fma" in flags


# Wall-clock fields: not part of the computation (with ais_jax.training.flops.TIMING_KEYS).
TIMING = ("step_time_s", "timing_s/rollout", "timing_s/host", "timing_s/update",
          "perf/tokens_per_s", "perf/rollout_flops_per_s", "perf/update_flops_per_s", "perf/mfu")


def run_golden(out_dir: str, overrides: list[str] = OVERRIDES,
               env: dict[str, str] | None = None) -> dict:
    """Run the golden command (or the cross-CPU one: ``CROSS_CPU_OVERRIDES``) into
    ``out_dir``, in environment ``env`` (None: this one's); return its metrics and
    evaluations."""
    cmd = [sys.executable, "-m", "ais_jax.train", "--config",
           os.path.join(ROOT, "configs", "tiny_arithmetic.yaml"), f"out_dir={out_dir}",
           *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"golden run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    for r in metrics:
        for k in TIMING:
            r.pop(k, None)
    return {"overrides": list(overrides), "metrics": metrics,
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
    """x86 family, model and widest vector unit XLA uses, e.g. ``family 25 model 17 avx512``
    (``... sse4_2`` under ``XLA_FLAGS=--xla_cpu_max_isa=SSE4_2``).

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
    vector = next((v for v in ("avx512", "avx2", "avx") if v + "f" * (v == "avx512") in flags),
                  "novec")
    cap = _isa_cap()
    if cap is not None and _VECTORS.index(cap) < _VECTORS.index(vector):
        vector = cap  # XLA emits code for the capped ISA: another machine type's numbers
    return f"family {fields['cpu family']} model {fields['model']} {vector}"


_VECTORS = ("novec", "sse4_2", "avx", "avx2", "avx512")


def _isa_cap() -> str | None:
    """The vector unit ``--xla_cpu_max_isa`` in ``XLA_FLAGS`` caps XLA:CPU's code at, e.g.
    ``sse4_2``; None without the flag."""
    caps = re.findall(r"--xla_cpu_max_isa=(\S+)", os.environ.get("XLA_FLAGS", ""))
    if not caps:
        return None
    isa = caps[-1].lower()
    return "avx512" if isa.startswith(("avx512", "amx")) else isa if isa in _VECTORS else None


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


def _write(path: str, result: dict) -> None:
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--add", action="store_true",
                    help="keep the other machine types' files (the numbers did not change)")
    a = ap.parse_args(argv)
    env = environment()
    if not a.add:  # the numbers changed on purpose: the cross-CPU references change with them
        for fma in (True, False):
            run_env = dict(os.environ)
            if not fma:
                run_env["XLA_FLAGS"] = (run_env.get("XLA_FLAGS", "") +
                                        f" --xla_cpu_max_isa={NO_FMA_ISA}").strip()
            with tempfile.TemporaryDirectory() as d:
                cross = run_golden(os.path.join(d, "run"), CROSS_CPU_OVERRIDES, run_env)
            _write(cross_cpu_path(fma), {**cross, "environment": env})
    with tempfile.TemporaryDirectory() as d:
        result = run_golden(os.path.join(d, "run"))
    path = golden_path(env)
    _write(path, {**result, "environment": env})
    if not a.add:
        for other in golden_files():
            if other != path:
                os.remove(other)
                print(f"removed {os.path.relpath(other, ROOT)} (old numbers): run "
                      "`python scripts/golden_run.py --add` on that machine type")


if __name__ == "__main__":
    main()
