"""The update program of a config compiled for a TPU / GPU target, deviceless: its memory and
whether its optimized HLO still holds an ``f32[..., T, T]`` score buffer (issue 54, item 1).

Compiles only the update (the plan's ``init`` and ``rollout`` programs are skipped), through
the plan's own code (`ais_jax.run.plan.make_plan` inside `ais_jax.run.plan_target`), so the
program is the one ``python -m ais_jax.plan --target NAME`` prices.  Needs libtpu (TPU
targets) in a separate environment, see docs/measurements/plan_targets.md.

    PYTHONPATH=$PWD /work/wt/_tpuvenv/bin/python benchmarks/deviceless_attention_hlo.py \\
        --config configs/qwen3_0p6b_gsm8k.yaml --target v6e-1 model.attention=reference
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter

os.environ.setdefault("AIS_JAX_SKIP_PATH_CHECK", "1")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--hlo-out", default="", help="write the update's optimized HLO here")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from ais_jax.run import plan, plan_report
    from ais_jax.run import plan_target as pt

    target = pt.parse_target(args.target)
    cfg = plan.load_plan_config(args.config, args.overrides)
    prompt_len = args.prompt_len or plan.DEFAULT_PROMPT_LEN
    pt.prepare_env(target)
    plan.configure_devices(1)
    seen: dict[str, object] = {}

    def compile_update_only(lowered):  # the update first, then the rollout (skipped)
        if "update" in seen:
            return {"peak_bytes": 0, "skipped": True}
        import time

        t0 = time.perf_counter()
        compiled = lowered.compile()
        seen["update"] = compiled.as_text()
        return plan_report.compiled_memory(compiled, time.perf_counter() - t0)

    plan.compile_program = compile_update_only
    plan.compile_init = lambda *a, **k: {"peak_bytes": 0, "skipped": True}
    out = pt.make_target_plan(cfg, target, 1 << 40, prompt_len, plan.make_plan)
    hlo = str(seen["update"])
    if args.hlo_out:
        with open(args.hlo_out, "w") as f:
            f.write(hlo)
    T = prompt_len + cfg.rollout.max_new_tokens - 1  # the trunk's sequence length
    square = Counter(re.findall(rf"f32\[[0-9,]*\b{T},{T}\]", hlo))
    result = {"target": args.target, "config": args.config, "overrides": args.overrides,
              "attention": cfg.model.attention, "T": T, "update": out["update"],
              f"f32[..,{T},{T}] shapes": dict(square)}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
