"""Where the host waits in an asynchronous GRPO step: a profiler trace, read back (issue 40).

Builds the async arm of `benchmarks/async_step.py` (``rollout.staleness=k`` on shared devices,
same config and overrides), steps it past compilation, then records ``--steps`` steps with
`jax.profiler.trace` (a Perfetto trace) and reads the trace back.  Per traced step it prints:

* the step's wall time and the host's blocked time: the summed duration of its
  ``np.asarray(jax.Array)`` events (every device-to-host read of the step: the batch's
  tokens and mask, the rewards' inputs, the update's metrics);
* the longest of those waits, and which XLA programs (``hlo_module``: ``jit_rollout_fn``,
  ``jit_update_fn``, ...) ran on the device while the host waited, with their busy time in
  thread-milliseconds (summed over XLA's CPU threads, so it can exceed the wait).

A blocking read of the batch on the critical path would show up as a long wait while the
rollout that produced that batch runs.  What the asynchronous step should show instead: one
long wait per step, the last, for the update's metrics, while the device runs the rollout of
step ``t + k`` (dispatched first) and the update of step ``t``.

    python benchmarks/async_trace.py [--k 1] [--steps 3] [--host-delay 0.15] [--set KEY=V ...]
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HOST_READ = "np.asarray(jax.Array)"
STEP = "stale.py"  # the async step's own Python frame: StaleRollouts.step


def read_trace(path: str) -> list[dict[str, Any]]:
    """The complete (``ph == "X"``) events of the one Perfetto trace under ``path``."""
    files = glob.glob(os.path.join(path, "**", "*.trace.json.gz"), recursive=True)
    if len(files) != 1:
        raise SystemExit(f"expected one *.trace.json.gz under {path}, found {len(files)}")
    with gzip.open(files[0]) as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X"]


def step_waits(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per traced step (a ``StaleRollouts.step`` frame): wall and blocked ms, the longest
    host read and the device programs' busy ms during it (see the module docstring)."""
    steps = sorted((e for e in events if e["name"].startswith("$") and STEP in e["name"]
                    and e["name"].endswith(" step")), key=lambda e: e["ts"])
    reads = [e for e in events if e["name"] == HOST_READ]
    device = [e for e in events if e.get("args", {}).get("hlo_module")]
    out = []
    for s in steps:
        lo, hi = s["ts"], s["ts"] + s["dur"]
        mine = [r for r in reads if lo <= r["ts"] <= hi]
        longest = max(mine, key=lambda r: r["dur"]) if mine else None
        busy: collections.Counter = collections.Counter()
        if longest is not None:
            a, b = longest["ts"], longest["ts"] + longest["dur"]
            for e in device:
                overlap = min(b, e["ts"] + e["dur"]) - max(a, e["ts"])
                if overlap > 0 and e["name"] != "ThunkExecutor::Execute":
                    busy[e["args"]["hlo_module"]] += overlap
        out.append({"wall_ms": s["dur"] / 1e3, "reads": len(mine),
                    "blocked_ms": sum(r["dur"] for r in mine) / 1e3,
                    "longest_ms": longest["dur"] / 1e3 if longest else 0.0,
                    "longest_at_ms": (longest["ts"] - lo) / 1e3 if longest else 0.0,
                    "during": {k: v / 1e3 for k, v in busy.most_common(4)}})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=1, help="rollout.staleness of the traced run")
    ap.add_argument("--steps", type=int, default=3, help="traced steps")
    ap.add_argument("--warmup", type=int, default=3, help="untraced first steps")
    ap.add_argument("--host-delay", type=float, default=0.0,
                    help="seconds of host work per batch added by a sleeping user reward")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides KEY=VALUE")
    a = ap.parse_args(argv)
    if a.k < 1:
        raise SystemExit("--k must be >= 1 (the asynchronous step)")
    import jax
    from async_step import Arm, _slow_reward

    overrides = [*a.set, _slow_reward(a.host_delay)] if a.host_delay > 0 else a.set
    arm = Arm(f"async k={a.k}", a.k, overrides, a.warmup + a.steps + a.k + 1)
    for _ in range(a.warmup):
        arm.step(timed=False)
    path = tempfile.mkdtemp(prefix="async_trace_")
    jax.profiler.start_trace(path, create_perfetto_trace=True)
    for _ in range(a.steps):
        arm.step(timed=True)
    jax.profiler.stop_trace()
    print(f"trace: {path}; rollout.staleness={a.k}, shared devices, host delay "
          f"{a.host_delay:g} s")
    for i, w in enumerate(step_waits(read_trace(path)), 1):
        during = ", ".join(f"{k} {v:.1f} ms" for k, v in w["during"].items()) or "nothing"
        print(f"step {i}: wall {w['wall_ms']:.1f} ms; {w['reads']} host reads blocked "
              f"{w['blocked_ms']:.1f} ms; longest {w['longest_ms']:.1f} ms at "
              f"+{w['longest_at_ms']:.1f} ms, while the device ran (thread-ms): {during}")


if __name__ == "__main__":
    main()
