"""benchmarks/plan_heap.py on a hand-written buffer-assignment / live-range dump (known answers)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import plan_heap  # noqa: E402

BA = """BufferAssignment:
allocation 0: size 400, parameter 0, shape |f32[100]| at ShapeIndex {}:
 value: <1 p.1 @0> (size=400,offset=0): f32[100]{0}
allocation 1: size 1000, preallocated-temp:
 value: <2 a @0> (size=100,offset=0): f32[25]{0}
 value: <3 b{} (phi) @0> (size=200,offset=300): f32[50]{0}
 value: <4 c @0> (size=300,offset=700): f32[75]{0}
 value: <5 d @0> (size=400,offset=100): f32[100]{0}
allocation 2: size 64, color 1, preallocated-temp:
 value: <6 e @0> (size=64,offset=0): f32[16]{0}
"""
LR = """HloLiveRange (max 9):
  BufferLiveRange:
    a{}:0-5
  Live ranges at 4 (peak):
    p.1{}: 400 bytes (cumulative: 400 bytes)
    a{}: 100 bytes (cumulative: 500 bytes)
    b{}: 200 bytes (cumulative: 700 bytes)
    c{}: 300 bytes (cumulative: 1000 bytes)
    e{}: 64 bytes (cumulative: 1064 bytes)
  Stack trace breakdown for peak usage: 1064 bytes
"""


def test_heap_holes_known_answer(tmp_path):
    """Live temp a [0, 100), b [300, 500), c [700, 1000) in a 1000-byte heap (d not live, the
    parameter and the other memory space ignored): 600 live, 400 in holes [100, 300) and
    [500, 700)."""
    (tmp_path / "m.jit_rollout_fn.after_optimizations-buffer-assignment.txt").write_text(BA)
    (tmp_path / "m.jit_rollout_fn.after_optimizations-live-range.txt").write_text(LR)
    r = plan_heap.heap_report(str(tmp_path), "jit_rollout_fn")
    assert (r["heap_bytes"], r["live_temp_bytes"], r["hole_bytes"]) == (1000, 600, 400)
    assert r["largest_holes"][:2] == [(200, 500), (200, 100)]
    assert [n for _, n, _ in r["largest_live"]] == ["c", "b", "a"]


LR_RANGES = """HloLiveRange (max 9):
  BufferLiveRange:
    a{}:0-5
    b{}:3-8
    b2{}:8-9
    c{}:5-9
    d{}:0-2
  Live ranges at 0 (peak):
    d{}: 400 bytes (cumulative: 400 bytes)
  Stack trace breakdown for peak usage: 400 bytes
"""


def test_live_curve_known_answer(tmp_path):
    """Ranges a [0, 5] 100 B, b [3, 8] 200 B, c [5, 9] 300 B, d [0, 2] 400 B: 500 B at steps
    0-2, 600 B (a, b, c) at step 5, the maximum; b2 shares b's slot and overlaps it, so it
    counts once (twice would give 700 B at step 8)."""
    b2 = " value: <7 b2 @0> (size=200,offset=300): f32[50]{0}\n"
    ba = BA.replace("allocation 2:", b2 + "allocation 2:")
    (tmp_path / "m.jit_rollout_fn.after_optimizations-buffer-assignment.txt").write_text(ba)
    (tmp_path / "m.jit_rollout_fn.after_optimizations-live-range.txt").write_text(LR_RANGES)
    c = plan_heap.live_curve(str(tmp_path), "jit_rollout_fn")
    assert (c["max_live_temp_bytes"], c["step"]) == (600, 5)
    assert c["live_at_max"] == [(300, 1, "f32[75]"), (200, 1, "f32[50]"), (100, 1, "f32[25]")]
