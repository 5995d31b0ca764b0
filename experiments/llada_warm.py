"""The per-seed warm starts of the LLaDA studies, shared by their drivers.

Every arm of a seed starts GRPO from the same warm-started policy: `warm` runs the warm start of
``configs/tiny_llada_countdown.yaml`` at that seed once and saves it as a LLaDA checkpoint (with
its character tokenizer) under ``<base>/llada_warm_s<seed>``; the drivers then train each arm
with ``model.source=<that checkpoint> model.kind=auto sft.steps=0`` (`source`).  The warm start
is deterministic for a seed on one CPU model, not across models, so `check_warm` records each
seed's warm start (sha256 of the weights, CPU model, commit) the first time and refuses a
different one later.  ``llada_arms.py`` (the four-arm study and the ratio study) and
``llada_complete_ratio.py`` import this module; it imports only ``common``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository's ais_jax, also when it is not installed
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiments/common.py
import common  # noqa: E402

CONFIG = "configs/tiny_llada_countdown.yaml"


def warm_dir(base: str, seed: int) -> str:
    """The directory of ``seed``'s saved warm start under ``base``."""
    return os.path.join(base, f"llada_warm_s{seed}")


def source(base: str, seed: int) -> tuple[str, str, str]:
    """The overrides that start a run from ``seed``'s saved warm start (no warm start of its
    own)."""
    return (f"model.source={warm_dir(base, seed)}", "model.kind=auto", "sft.steps=0")


def warm(seeds: Sequence[int], base: str) -> None:
    """Warm-start each seed's policy once (`CONFIG` at that seed, with ``common.COMMON``) and
    save it as a LLaDA checkpoint in `warm_dir`; a seed whose checkpoint exists is skipped."""
    from ais_jax.config.load import load_config
    from ais_jax.models.llada.checkpoint import save
    from ais_jax.training.build import build_run
    from ais_jax.training.placement import to_host
    from ais_jax.training.warmstart import warm_start

    for seed in seeds:
        dest = warm_dir(base, seed)
        if os.path.exists(os.path.join(dest, "model.safetensors")):
            continue
        t0 = time.perf_counter()
        cfg = load_config(os.path.join(ROOT, CONFIG),
                          [f"seed={seed}", f"out_dir={dest}.run", *common.COMMON])
        run = build_run(cfg)
        params = warm_start(run, run.state.params)
        save(dest, to_host(params), run.model_cfg)
        run.codec.tokenizer.save(dest)
        shutil.rmtree(f"{dest}.run", ignore_errors=True)
        print(f"warm start seed {seed}: {time.perf_counter() - t0:.0f} s -> {dest}", flush=True)


def warm_record(base: str, seed: int) -> dict:
    """What identifies a seed's warm start: the sha256 of its saved weights, the CPU model and
    code commit it was made with."""
    with open(os.path.join(warm_dir(base, seed), "model.safetensors"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return {"seed": seed, "model_sha256": sha, "cpu": common.cpu_model(),
            "commit": common.code_commit()}


def check_warm(base: str, seed: int, records: str) -> None:
    """Record the seed's warm start (``records/warm_s<seed>.json``) the first time; later,
    refuse a warm start that differs from the recorded one (one line, exit 2).

    The arms of a seed are paired through their shared warm start.  The warm start is
    deterministic on one CPU model but not across models, so a seed left unfinished by one
    session must be finished on the same machine type.
    """
    rec = warm_record(base, seed)
    path = os.path.join(records, f"warm_s{seed}.json")
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old["model_sha256"] != rec["model_sha256"]:
            print(f"seed {seed}: this machine's warm start ({rec['cpu']}) is not the one its "
                  f"logged arms started from ({old['cpu']}, {os.path.relpath(path, ROOT)}): "
                  "finish the seed on that machine type, or run other seeds (--seeds)",
                  file=sys.stderr)
            raise SystemExit(2)
        return
    os.makedirs(records, exist_ok=True)
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
