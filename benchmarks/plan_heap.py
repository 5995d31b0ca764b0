"""Holes in a compiled program's temp heap: the bytes live at its peak against the heap's size.

Reads an XLA dump of one compiled module (``XLA_FLAGS="--xla_dump_to=DIR
--xla_dump_hlo_as_text"`` around ``python -m ais_jax.plan --target ...``; the TPU compiler
writes ``*after_optimizations-buffer-assignment.txt`` and ``*-live-range.txt``).  Prints
the size of the preallocated temp heap, the temp bytes live at the peak the live-range
analysis names, and the difference: holes the heap simulator left between live buffers
(fragmentation), with the largest holes and the largest live buffers.

The live-range dump's own "peak" is the step where its analysis (parameters included) peaks,
not necessarily where the most temp bytes are live; ``--curve`` also sums each temp value's
live range (`BufferLiveRange`) over the whole schedule and prints the maximum, its step, and
the largest values live there (grouped by shape): the heap minus that maximum is what no
schedule point needs (holes).

Limits: the dump is the buffer assignment after optimization; the compiler's
``memory_analysis().temp_size_in_bytes`` (the plan's figure) was 0.9-2.7 GB larger than this
heap in the v6e-1 rollouts of docs/measurements/plan_targets.md, so compare heaps with heaps.

Usage: ``python benchmarks/plan_heap.py DIR [--module jit_rollout_fn] [--curve]``.
"""

from __future__ import annotations

import argparse
import glob
import re
import sys

_ALLOC = re.compile(r"allocation (\d+): size (\d+), (.*)")
_VALUE = re.compile(r" value: <\d+ (\S+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)")
_LIVE = re.compile(r"\s+(\S+): (\d+) bytes")
_RANGE = re.compile(r"\s+(\S+):(\d+)-(\d+)$")


def temp_values(path: str) -> dict[str, tuple[int, int, str]]:
    """``{value: (size, offset, shape)}`` of the default memory space's preallocated temp."""
    out, temp = {}, False
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        m = _ALLOC.match(line)
        if m:
            temp = "preallocated-temp" in m.group(3) and "color" not in m.group(3)
        elif temp and line.startswith(" value:"):
            v = _VALUE.match(line)
            if v:
                out[v.group(1).removesuffix("{}")] = (
                    int(v.group(2)),
                    int(v.group(3)),
                    v.group(4)[:80],
                )
    return out


def _section(path: str, start: str, stop: str, pattern: re.Pattern) -> list[re.Match]:
    """The matches of ``pattern`` on the lines of ``path`` after the line starting ``start``,
    up to the line starting ``stop``."""
    out, inside = [], False
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        if line.startswith(start):
            inside = True
        elif line.startswith(stop):
            break
        elif inside and (m := pattern.match(line)):
            out.append(m)
    return out


def live_at_peak(path: str) -> list[str]:
    """The values the live-range dump lists as live at its peak."""
    return [m.group(1).removesuffix("{}")
            for m in _section(path, "  Live ranges at", "  Stack trace", _LIVE)]


def live_ranges(path: str) -> dict[str, tuple[int, int]]:
    """``{value: (first step, last step)}`` of the live-range dump's ``BufferLiveRange``."""
    return {m.group(1).removesuffix("{}"): (int(m.group(2)), int(m.group(3)))
            for m in _section(path, "  BufferLiveRange", "  Live ranges at", _RANGE)}


def live_curve(directory: str, module: str) -> dict[str, object]:
    """The most temp bytes live at one step of the schedule, the step, and the values live
    there (``[(bytes, count, shape)]``, largest first).  Values of one heap slot (offset and
    size) whose ranges overlap count once (a loop's carry and its aliases)."""
    ba, lr = _dump_files(directory, module)
    vals, ranges = temp_values(ba), live_ranges(lr)
    slots: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    for name, (size, off, shape) in vals.items():
        if name in ranges and size:
            slots.setdefault((off, size), []).append((*ranges[name], shape))
    events: dict[int, int] = {}
    spans = []  # (start, end, size, shape): merged ranges per slot
    for (_, size), rs in slots.items():
        rs.sort()
        a, b, shape = rs[0]
        for a2, b2, _ in [*rs[1:], (1 << 62, 0, "")]:
            if a2 <= b:
                b = max(b, b2)
                continue
            spans.append((a, b, size, shape))
            events[a] = events.get(a, 0) + size
            events[b + 1] = events.get(b + 1, 0) - size
            a, b, shape = a2, b2, _
    live, best, step = 0, 0, 0
    for t in sorted(events):
        live += events[t]
        if live > best:
            best, step = live, t
    groups: dict[str, list[int]] = {}
    for a, b, size, shape in spans:
        if a <= step <= b:
            g = groups.setdefault(shape.split("{")[0], [0, 0])
            g[0], g[1] = g[0] + size, g[1] + 1
    top = sorted(((n, c, sh) for sh, (n, c) in groups.items()), reverse=True)
    return {"max_live_temp_bytes": best, "step": step, "live_at_max": top[:10]}


def _dump_files(directory: str, module: str) -> tuple[str, str]:
    ba = glob.glob(f"{directory}/*{module}*after_optimizations-buffer-assignment.txt")
    lr = glob.glob(f"{directory}/*{module}*after_optimizations-live-range.txt")
    if not ba or not lr:
        raise SystemExit(f"no buffer-assignment / live-range dump of {module!r} in {directory}")
    return ba[0], lr[0]


def heap_report(directory: str, module: str) -> dict[str, object]:
    """Heap size, live temp bytes at the peak, holes (largest first) and the largest live
    buffers of ``module``'s dump in ``directory``."""
    ba, lr = _dump_files(directory, module)
    vals = temp_values(ba)
    live = sorted((vals[n][1], vals[n][0], n) for n in live_at_peak(lr) if n in vals)
    heap = max(off + size for size, off, _ in vals.values())
    holes, end, used = [], 0, 0
    for off, size, _ in live:
        if off > end:
            holes.append((off - end, end))
        used += max(0, off + size - max(off, end))
        end = max(end, off + size)
    holes.append((heap - end, end))
    big = sorted(((size, n, vals[n][2]) for _, size, n in live), reverse=True)[:8]
    return {
        "heap_bytes": heap,
        "live_temp_bytes": used,
        "hole_bytes": heap - used,
        "largest_holes": sorted(holes, reverse=True)[:6],
        "largest_live": big,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="the --xla_dump_to directory")
    ap.add_argument("--module", default="jit_rollout_fn", help="module name (substring)")
    ap.add_argument("--curve", action="store_true", help="also the max live temp bytes")
    a = ap.parse_args(argv)
    r = heap_report(a.dir, a.module)
    for k in ("heap_bytes", "live_temp_bytes", "hole_bytes"):
        print(f"{k}: {r[k]:,} ({r[k] / 1e9:.2f} GB)")
    for size, off in r["largest_holes"]:
        print(f"  hole {size / 1e9:.3f} GB at offset {off:,}")
    for size, name, shape in r["largest_live"]:
        print(f"  live {size / 1e9:.3f} GB {name} {shape}")
    if a.curve:
        c = live_curve(a.dir, a.module)
        m = c["max_live_temp_bytes"]
        print(
            f"max_live_temp_bytes: {m:,} ({m / 1e9:.2f} GB) at step {c['step']}; "
            f"heap - max: {(r['heap_bytes'] - m) / 1e9:.2f} GB"
        )
        for size, count, shape in c["live_at_max"]:
            print(f"  at max {size / 1e9:.3f} GB {count} x {shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
