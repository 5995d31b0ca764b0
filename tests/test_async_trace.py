"""benchmarks/async_trace.py's reading of a profiler trace, on a hand-made trace with known
waits (the real trace needs a profiled run: the script's own command, docs/performance.md)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import async_trace as at  # noqa: E402


def _x(name, ts, dur, module=None):
    e = {"ph": "X", "pid": 1, "tid": 2 if module else 1, "name": name, "ts": ts, "dur": dur}
    if module:
        e["args"] = {"hlo_module": module}
    return e


def test_step_waits_finds_the_longest_read_and_what_ran_during_it(tmp_path):
    events = [
        _x("$stale.py:89 step", 1000, 600),
        _x(at.HOST_READ, 1010, 5),   # the batch's tokens: ready, no wait
        _x(at.HOST_READ, 1100, 480),  # the update's metrics
        _x(at.HOST_READ, 1590, 1),
        _x("fusion.1", 1050, 150, "jit_rollout_fn"),  # 100 us of it inside the long read
        _x("fusion.2", 1200, 390, "jit_update_fn"),  # 380 us inside (1200-1580)
        _x("ThunkExecutor::Execute", 1050, 540, "jit_update_fn"),  # an envelope: not counted
        _x("$stale.py:89 step", 2000, 100),  # a step without reads
        _x(at.HOST_READ, 3000, 50),  # outside every step
    ]
    trace = tmp_path / "plugins" / "profile" / "x" / "h.trace.json.gz"
    trace.parent.mkdir(parents=True)
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": [*events, {"ph": "M", "name": "thread_name"}]}, f)
    got = at.step_waits(at.read_trace(str(tmp_path)))
    assert got[0] == {"wall_ms": 0.6, "reads": 3, "blocked_ms": 0.486, "longest_ms": 0.48,
                      "longest_at_ms": 0.1,
                      "during": {"jit_update_fn": 0.38, "jit_rollout_fn": 0.1}}
    assert got[1]["reads"] == 0 and got[1]["during"] == {} and got[1]["longest_ms"] == 0.0
