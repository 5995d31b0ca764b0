"""benchmarks/_hlo_weights.py on hand-written TPU-style HLO with known answers (no libtpu).

Two programs: a decode loop whose dot fusion converts its float8 weight inside (as the TPU
compiler emits it: a ``convolution`` in a ``kOutput`` fusion, the convert in a nested fusion),
and the same loop fed by a standalone fusion that writes a bf16 copy of the whole weight.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import _hlo_weights as hw  # noqa: E402

# Decode loop: tuple (step, x bf16[8,256], weight f8[256,128], scale f32[], table bf16[16,256]).
# The weight (32768 B in float8) feeds the dot fusion; the table (8192 B) an add fusion only;
# the scale is read by the dot fusion too (4 B); x is carried (not invariant).
_INSIDE = """HloModule inside, is_scheduled=true

%dequant (p0: f8e4m3fn[256,128]) -> bf16[256,128] {
  %p0 = f8e4m3fn[256,128]{1,0:T(32,128)(4,1)} parameter(0)
  ROOT %cv = bf16[256,128]{1,0:T(8,128)(2,1)} convert(%p0)
}

%mm (a: bf16[8,256], w: f8e4m3fn[256,128], s: f32[]) -> bf16[8,256] {
  %a = bf16[8,256]{1,0} parameter(0)
  %w = f8e4m3fn[256,128]{1,0:T(32,128)(4,1)} parameter(1)
  %s = f32[] parameter(2)
  %wf = bf16[256,128]{1,0} fusion(%w), kind=kLoop, calls=%dequant
  %conv = bf16[8,128]{1,0} convolution(%a, %wf), dim_labels=bf_io->bf
  ROOT %pad = bf16[8,256]{1,0} pad(%conv, %a), padding=0_0x0_128
}

%addt (t: bf16[16,256], y: bf16[8,256]) -> bf16[8,256] {
  %t = bf16[16,256]{1,0} parameter(0)
  %y = bf16[8,256]{1,0} parameter(1)
  %sl = bf16[8,256]{1,0} slice(%t), slice={[0:8], [0:256]}
  ROOT %ad = bf16[8,256]{1,0} add(%sl, %y)
}

%body (arg: (s32[], bf16[8,256], f8e4m3fn[256,128], f32[], bf16[16,256])) -> (s32[], bf16[8,256], f8e4m3fn[256,128], f32[], bf16[16,256]) {
  %arg = (s32[], bf16[8,256]{1,0}, f8e4m3fn[256,128]{1,0}, f32[], bf16[16,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = bf16[8,256]{1,0} get-tuple-element(%arg), index=1
  %w = f8e4m3fn[256,128]{1,0:T(32,128)(4,1)} get-tuple-element(%arg), index=2
  %s = f32[] get-tuple-element(%arg), index=3
  %t = bf16[16,256]{1,0} get-tuple-element(%arg), index=4
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %y = bf16[8,256]{1,0} fusion(%x, %w, %s), kind=kOutput, calls=%mm
  %z = bf16[8,256]{1,0} fusion(%t, %y), kind=kLoop, calls=%addt
  ROOT %out = (s32[], bf16[8,256]{1,0}, f8e4m3fn[256,128]{1,0}, f32[], bf16[16,256]{1,0}) tuple(%i1, %z, %w, %s, %t)
}

%cond (c: (s32[], bf16[8,256], f8e4m3fn[256,128], f32[], bf16[16,256])) -> pred[] {
  %c = (s32[], bf16[8,256]{1,0}, f8e4m3fn[256,128]{1,0}, f32[], bf16[16,256]{1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%ci, %n), direction=LT
}

ENTRY %main (x0: bf16[8,256], w0: f8e4m3fn[256,128], s0: f32[], t0: bf16[16,256], wb: bf16[256,128]) -> bf16[8,256] {
  %x0 = bf16[8,256]{1,0} parameter(0)
  %w0 = f8e4m3fn[256,128]{1,0} parameter(1)
  %s0 = f32[] parameter(2)
  %t0 = bf16[16,256]{1,0} parameter(3)
  %wb = bf16[256,128]{1,0} parameter(4)
  %zero = s32[] constant(0)
  %tup = (s32[], bf16[8,256]{1,0}, f8e4m3fn[256,128]{1,0}, f32[], bf16[16,256]{1,0}) tuple(%zero, %x0, %w0, %s0, %t0)
  %wh = (s32[], bf16[8,256]{1,0}, f8e4m3fn[256,128]{1,0}, f32[], bf16[16,256]{1,0}) while(%tup), condition=%cond, body=%body
  ROOT %res = bf16[8,256]{1,0} get-tuple-element(%wh), index=1
}
"""  # noqa: E501

# The same program with the weight dequantized by a standalone fusion before the dot fusion:
# a bf16[256,128] weight copy written to memory.
_COPY = _INSIDE.replace("HloModule inside", "HloModule copy").replace(
    "  %y = bf16[8,256]{1,0} fusion(%x, %w, %s), kind=kOutput, calls=%mm\n",
    "  %wc = bf16[256,128]{1,0} fusion(%w), kind=kLoop, calls=%dequant\n"
    "  %y = bf16[8,256]{1,0} fusion(%x, %wc, %s), kind=kOutput, calls=%mm\n")


def test_array_bytes_counts_logical_elements_per_dtype():
    assert hw.array_bytes("f8e4m3fn[256,128]{1,0:T(32,128)(4,1)}") == 32768
    assert hw.array_bytes("bf16[16,256]{1,0:T(8,128)(2,1)S(1)}") == 8192
    assert hw.array_bytes("(f32[], s4[8,2])") == 4 + 8
    assert hw.arrays("(s32[], bf16[2,3]{1,0})") == [("s32", ()), ("bf16", (2, 3))]


def test_weight_bytes_read_per_step_of_a_hand_made_loop_body():
    r = hw.weight_reads_per_step(_INSIDE)
    assert r["body"] == "body"
    # the f8 weight (32768 B) and the f32 scale (4 B) reach the dot fusion; the table does not
    assert r["weight_bytes"] == 32768 + 4
    assert r["weight_arrays"] == 2
    assert r["weight_bytes_by_dtype"] == {"f8e4m3fn": 32768, "f32": 4}
    # every invariant is read by some kernel: weight, scale and table (8192 B)
    assert r["invariant_bytes_read"] == 32768 + 4 + 8192
    assert r["invariant_arrays_read"] == 3


def test_a_weight_carried_through_a_copy_or_prefetched_into_another_element_counts():
    # the ROOT passes back a copy of the weight (TPU re-pins some weights each step)
    moved = _INSIDE.replace("  ROOT %out", "  %wm = f8e4m3fn[256,128]{1,0} copy(%w)\n  ROOT %out")
    moved = moved.replace("tuple(%i1, %z, %w, %s, %t)", "tuple(%i1, %z, %wm, %s, %t)")
    assert hw.weight_reads_per_step(moved)["weight_bytes"] == 32768 + 4
    # the copy is carried in the table's element; the dot reads the weight through it
    pre = moved.replace("tuple(%i1, %z, %wm, %s, %t)", "tuple(%i1, %z, %w, %s, %wm)")
    pre = pre.replace("fusion(%x, %w, %s), kind=kOutput", "fusion(%x, %t, %s), kind=kOutput")
    r = hw.weight_reads_per_step(pre)
    assert r["weight_bytes_by_dtype"] == {"f8e4m3fn": 32768, "f32": 4}


def test_convert_inside_the_dot_fusion_is_no_copy():
    r = hw.dequant_copies(_INSIDE)
    assert r["verdict"] == "no dequantized weight copy"
    assert r["weight_copies"] == [] and r["other_f8_converts"] == []
    assert r["f8_dot_kernels"] == 1
    # the convolution itself reads the nested fusion's bf16 conversion of the weight
    assert hw.dot_operand_dtypes(_INSIDE) == {"bf16 x bf16 -> bf16": 1}


def test_standalone_convert_fusion_of_a_weight_shape_is_a_copy():
    r = hw.dequant_copies(_COPY)
    assert r["verdict"] == "dequantized weight copy"
    assert [(c["name"], c["type"], c["computation"]) for c in r["weight_copies"]] == [
        ("wc", "bf16[256,128]", "body")]
    # the weight's bytes read per step are still the float8 array's (the copy is written
    # and read again inside the step, which the verdict reports)
    assert hw.weight_reads_per_step(_COPY)["weight_bytes_by_dtype"] == {"f8e4m3fn": 32768,
                                                                         "f32": 4}


def test_convert_of_another_shape_is_listed_apart_and_bf16_has_no_float8():
    # the standalone convert writes a flat bf16[32768]: no weight's shape (e.g. a cache)
    other = _COPY.replace("%wc = bf16[256,128]{1,0} fusion", "%wc = bf16[32768]{0} fusion")
    r = hw.dequant_copies(other)
    assert r["weight_copies"] == [] and [c["name"] for c in r["other_f8_converts"]] == ["wc"]
    plain = _INSIDE.replace("f8e4m3fn", "bf16")
    assert hw.dequant_copies(plain)["verdict"] == "no float8 weights"
