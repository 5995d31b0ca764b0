"""LoRA vs full fine-tuning on the embedded default's warm-started model (issue 27).

Each seed's policy is warm-started once with the embedded default
(``configs/tiny_arithmetic.yaml``: its SFT, stopped by ``sft.target_accuracy``)
and exported; every arm then runs the default's GRPO from that export
(``model.source=<export> sft.steps=0``), so the arms of a seed share the
starting policy, the problems and the sampling keys, and differ only in what
is trained:

* ``full``: the full fine-tune (f32 master, the default's lr 1e-4);
* ``lora``: rank-16 adapters on every block linear (alpha 32), same lr;
* ``lora_lr1e-3``: the same adapters at 10x the lr (adapters usually want a
  larger step: B starts at 0 and the update is scaled by alpha / rank).

Run names: ``lora_<arm>_s<seed>``; logs (metrics, summary, command, wall time)
in ``experiments/logs/``; runs with a log are skipped.  Usage::

    python experiments/lora_arms.py warm --seeds 0 1
    python experiments/lora_arms.py run --seeds 0 1
    python experiments/lora_arms.py report --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository's ais_jax, also when it is not installed
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiments/common.py
import common  # noqa: E402

CONFIG = "configs/tiny_arithmetic.yaml"
LOGS = os.path.join(ROOT, "experiments", "logs")
LORA = ("lora.rank=16", "lora.alpha=32")
ARMS = {
    "full": (),
    "lora": LORA,
    "lora_lr1e-3": (*LORA, "train.learning_rate=1e-3"),
}
# Loading the export: no remat (the in-process default of a scratch model), same dtypes.
FROM_WARM = ("sft.steps=0", "sft.target_accuracy=0", "train.remat=none", "model.kind=ar")



def warm_dir(base: str, seed: int) -> str:
    return os.path.join(ROOT, base, f"lora_warm_s{seed}")


def cmd_warm(seeds: Sequence[int], base: str) -> None:
    """Warm-start each seed's policy with the default's SFT; export it; log the warm start."""
    for seed in seeds:
        common.warm_export(CONFIG, seed, warm_dir(base, seed), f"lora_warm_s{seed}",
                    f"python experiments/lora_arms.py warm --seeds {seed}", common.COMMON)


def cmd_run(seeds: Sequence[int], arms: Sequence[str], base: str, scratch: str) -> None:
    run_one = common.run_one
    for seed in seeds:
        for arm in arms:
            name = f"lora_{arm}_s{seed}"
            if os.path.exists(os.path.join(LOGS, name, "run.json")):
                continue
            src = os.path.relpath(warm_dir(base, seed), ROOT)
            run_one(name, (f"model.source={src}", *FROM_WARM, f"seed={seed}", *ARMS[arm]),
                    scratch, CONFIG)


def report(seeds: Sequence[int], arms: Sequence[str]) -> str:
    """A markdown table: held-out accuracy before -> after GRPO per arm and seed."""
    rows = ["| seed | arm | greedy before -> after | sampled before -> after | "
            "pass@k before -> after | wall s |", "|---|---|---|---|---|---|"]
    for seed in seeds:
        for arm in arms:
            d = os.path.join(LOGS, f"lora_{arm}_s{seed}")
            if not os.path.exists(os.path.join(d, "summary.json")):
                continue
            with open(os.path.join(d, "summary.json")) as f:
                s = json.load(f)
            with open(os.path.join(d, "run.json")) as f:
                wall = json.load(f)["wall_s"]
            b, a = s["eval_before"], s["eval_after"]
            k = next((key for key in b if key.startswith("pass@")), None)
            pk = f"{b[k]:.3f} -> {a[k]:.3f}" if k else "-"
            rows.append(f"| {seed} | {arm} | {b['accuracy']:.3f} -> {a['accuracy']:.3f} | "
                        f"{b['sampled_accuracy']:.3f} -> {a['sampled_accuracy']:.3f} | "
                        f"{pk} | {wall:.0f} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("warm", "run", "report"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    ap.add_argument("--warm-dir", default=os.path.join("runs", "lora_warm"),
                    help="relative to the repository root")
    ap.add_argument("--scratch", default=os.path.join("runs", "lora_scratch"))
    args = ap.parse_args(argv)
    if args.command == "warm":
        cmd_warm(args.seeds, args.warm_dir)
    elif args.command == "run":
        cmd_run(args.seeds, args.arms, args.warm_dir, os.path.join(ROOT, args.scratch))
    else:
        print(report(args.seeds, args.arms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
