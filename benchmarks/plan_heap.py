"""Holes in a compiled program's temp heap: the bytes live at its peak against the heap's size.

Reads an XLA dump of one compiled module (``XLA_FLAGS="--xla_dump_to=DIR
--xla_dump_hlo_as_text"`` around ``python -m ais_jax.plan --target ...``; the TPU compiler
writes ``*after_optimizations-buffer-assignment.txt`` and ``*-live-range.txt``).  Prints
the size of the preallocated temp heap, the temp bytes live at the peak the live-range
analysis names, and the difference: holes the heap simulator left between live buffers
(fragmentation), with the largest holes and the largest live buffers.

Limits: the dump is the buffer assignment after optimization; the compiler's
``memory_analysis().temp_size_in_bytes`` (the plan's figure) was 0.9-2.7 GB larger than this
heap in the v6e-1 rollouts of docs/measurements/plan_targets.md, so compare heaps with heaps.

Usage: ``python benchmarks/plan_heap.py DIR [--module jit_rollout_fn]``.
"""

from __future__ import annotations

import argparse
import glob
import re
import sys

_ALLOC = re.compile(r"allocation (\d+): size (\d+), (.*)")
_VALUE = re.compile(r" value: <\d+ (\S+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)")
_LIVE = re.compile(r"\s+(\S+): (\d+) bytes")


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


def live_at_peak(path: str) -> list[str]:
    """The values the live-range dump lists as live at its peak."""
    names, inside = [], False
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        if line.startswith("  Live ranges at"):
            inside = True
        elif line.startswith("  Stack trace"):
            break
        elif inside and (m := _LIVE.match(line)):
            names.append(m.group(1).removesuffix("{}"))
    return names


def heap_report(directory: str, module: str) -> dict[str, object]:
    """Heap size, live temp bytes at the peak, holes (largest first) and the largest live
    buffers of ``module``'s dump in ``directory``."""
    ba = glob.glob(f"{directory}/*{module}*after_optimizations-buffer-assignment.txt")
    lr = glob.glob(f"{directory}/*{module}*after_optimizations-live-range.txt")
    if not ba or not lr:
        raise SystemExit(f"no buffer-assignment / live-range dump of {module!r} in {directory}")
    vals = temp_values(ba[0])
    live = sorted((vals[n][1], vals[n][0], n) for n in live_at_peak(lr[0]) if n in vals)
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
    a = ap.parse_args(argv)
    r = heap_report(a.dir, a.module)
    for k in ("heap_bytes", "live_temp_bytes", "hole_bytes"):
        print(f"{k}: {r[k]:,} ({r[k] / 1e9:.2f} GB)")
    for size, off in r["largest_holes"]:
        print(f"  hole {size / 1e9:.3f} GB at offset {off:,}")
    for size, name, shape in r["largest_live"]:
        print(f"  live {size / 1e9:.3f} GB {name} {shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
