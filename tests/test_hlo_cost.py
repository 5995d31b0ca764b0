# ruff: noqa: E501  (hand-written HLO lines are as long as the compiler prints them)
"""benchmarks/_hlo_cost.py on hand-written TPU-style HLO with known answers (no libtpu).

One module: an entry that runs a known-trip-count loop (3 iterations) and a decode loop
without a trip count.  Every kernel-level instruction carries an ``estimated_cycles`` in its
backend config; the fused computations' instructions carry none and must not be counted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import _hlo_cost as hc  # noqa: E402
import _hlo_stats as hs  # noqa: E402


def _bc(cycles: int) -> str:
    return (
        'backend_config={"flag_configs":[],"window_config":{"kernel_window_bounds":[],'
        f'"estimated_cycles":"{cycles}","iteration_bounds":["1"]}},"retry_config":{{}}}}'
    )


_TEXT = f"""HloModule cost, is_scheduled=true

%mm (a: bf16[8,256], w: bf16[4,128,256]) -> f32[8,128] {{
  %a = bf16[8,256]{{1,0}} parameter(0)
  %w = bf16[4,128,256]{{2,1,0}} parameter(1)
  %c = s32[] constant(1)
  %z = s32[] constant(0)
  %ds = bf16[1,128,256]{{2,1,0}} dynamic-slice(%w, %c, %z, %z), dynamic_slice_sizes={{1,128,256}}
  %wb = bf16[128,256]{{1,0}} bitcast(%ds)
  ROOT %d = f32[8,128]{{1,0}} dot(%a, %wb), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}
}}

%upd (buf: bf16[64,128], row: bf16[1,128], i: s32[]) -> bf16[64,128] {{
  %buf = bf16[64,128]{{1,0}} parameter(0)
  %row = bf16[1,128]{{1,0}} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = bf16[64,128]{{1,0}} dynamic-update-slice(%buf, %row, %i, %z)
}}

%conv (x: bf16[16,8,32], k: bf16[16,64,32]) -> f32[16,8,64] {{
  %x = bf16[16,8,32]{{2,1,0}} parameter(0)
  %k = bf16[16,64,32]{{2,1,0}} parameter(1)
  ROOT %cv = f32[16,8,64]{{2,1,0}} convolution(%x, %k), window={{size=16 stride=15 lhs_dilate=16}}, dim_labels=0bf_0oi->0bf
}}

%body (p: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {{
  %p = (s32[], f32[8,128]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %y = f32[8,128]{{1,0}} get-tuple-element(%p), index=1
  %e = f32[8,128]{{1,0}} exponential(%y), {_bc(10)}
  ROOT %t = (s32[], f32[8,128]{{1,0}}) tuple(%i, %e)
}}

%cond (p: (s32[], f32[8,128])) -> pred[] {{
  %p = (s32[], f32[8,128]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT, {_bc(1)}
}}

%dbody (p: (s32[], bf16[64,128], bf16[1,128])) -> (s32[], bf16[64,128], bf16[1,128]) {{
  %p = (s32[], bf16[64,128]{{1,0}}, bf16[1,128]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %b = bf16[64,128]{{1,0}} get-tuple-element(%p), index=1
  %r = bf16[1,128]{{1,0}} get-tuple-element(%p), index=2
  %u = bf16[64,128]{{1,0}} fusion(%b, %r, %i), kind=kLoop, calls=%upd, {_bc(500)}
  %cc = bf16[1,128]{{1,0}} custom-call(%r), custom_call_target="Helper", {_bc(7)}
  ROOT %t = (s32[], bf16[64,128]{{1,0}}, bf16[1,128]{{1,0}}) tuple(%i, %u, %cc)
}}

%dcond (p: (s32[], bf16[64,128], bf16[1,128])) -> pred[] {{
  %p = (s32[], bf16[64,128]{{1,0}}, bf16[1,128]{{1,0}}) parameter(0)
  ROOT %f = pred[] constant(false)
}}

ENTRY %main (a: bf16[8,256], w: bf16[4,128,256], x: bf16[16,8,32], b: bf16[64,128], k: bf16[16,64,32]) -> f32[8,128] {{
  %a = bf16[8,256]{{1,0}} parameter(0)
  %w = bf16[4,128,256]{{2,1,0}} parameter(1)
  %x = bf16[16,8,32]{{2,1,0}} parameter(2)
  %b = bf16[64,128]{{1,0}} parameter(3)
  %k = bf16[16,64,32]{{2,1,0}} parameter(4)
  %mmf = f32[8,128]{{1,0}} fusion(%a, %w), kind=kOutput, calls=%mm, {_bc(1000)}
  %cvf = f32[16,8,64]{{2,1,0}} fusion(%x, %k), kind=kOutput, calls=%conv, {_bc(2000)}
  %z = s32[] constant(0)
  %t0 = (s32[], f32[8,128]{{1,0}}) tuple(%z, %mmf)
  %lp = (s32[], f32[8,128]{{1,0}}) while(%t0), condition=%cond, body=%body, backend_config={{"known_trip_count":{{"n":"3"}}}}
  %r0 = bf16[1,128]{{1,0}} constant({{...}})
  %t1 = (s32[], bf16[64,128]{{1,0}}, bf16[1,128]{{1,0}}) tuple(%z, %b, %r0)
  %dl = (s32[], bf16[64,128]{{1,0}}, bf16[1,128]{{1,0}}) while(%t1), condition=%dcond, body=%dbody
  ROOT %out = f32[8,128]{{1,0}} get-tuple-element(%lp), index=1
}}
"""


@pytest.fixture(scope="module")
def mod():
    return hs.parse_hlo(_TEXT)


def test_cycles_multiply_loops_and_skip_fused_instructions(mod):
    items = hc.price(mod, mod.entry)
    # 1000 + 2000 + 3 x 10 (body) + 4 x 1 (condition: trip count + 1) + decode body once
    # (500 + 7: an unknown trip count counts once)
    assert sum(p.cycles * p.runs for p in items) == 1000 + 2000 + 30 + 4 + 507
    assert {p.name: p.runs for p in items}["e"] == 3


def test_decode_body_is_the_loop_without_a_trip_count(mod):
    assert hc.decode_body(mod) == "dbody"
    r = hc.program_cost(_TEXT, "v6e", decode=True)
    assert r["estimated_cycles"] == 507
    assert r["segment_cycles"] == [507]
    assert r["estimated_s"] == pytest.approx(507 / hc.CHIPS["v6e"][3])
    assert [t["name"] for t in r["top"]] == ["u", "cc"]
    assert r["top"][0]["share"] == pytest.approx(500 / 507)


def test_decode_body_is_the_costliest_decode_segment():
    """Two decode segments (loops without a trip count) with the same kernels: the body the
    compiler prices higher is the step, whichever comes first in the module."""
    seg = _TEXT[_TEXT.index("%dbody (") : _TEXT.index("%dcond (")]
    for first, second in ((500, 900), (900, 500)):
        body2 = seg.replace("%dbody", "%dbody2").replace(f'"{500}"', f'"{second}"')
        text = _TEXT.replace(seg, seg.replace(f'"{500}"', f'"{first}"') + body2)
        text = text.replace(
            "  ROOT %out",
            "  %dl2 = (s32[], bf16[64,128]{1,0}, bf16[1,128]{1,0}) while(%dl), "
            "condition=%dcond, body=%dbody2\n"
            # a loop without a trip count and one kernel (not more than half a segment's two):
            # not a decode segment, however costly
            "  %sl = (s32[], f32[8,128]{1,0}) while(%t0), condition=%cond, body=%sbody\n"
            "  ROOT %out",
        )
        small = _TEXT[_TEXT.index("%body (") : _TEXT.index("%cond (")]
        small = small.replace("%body", "%sbody").replace('"10"', '"5000"')  # one exp, 5000 cycles
        text = text.replace("%cond (", small + "%cond (", 1)
        m = hs.parse_hlo(text)
        assert hc.decode_body(m) == ("dbody2" if second > first else "dbody")
        r = hc.program_cost(text, "v6e", decode=True)
        assert r["estimated_cycles"] == 900 + 7
        assert r["segment_cycles"] == [first + 7, second + 7]
        assert [w.name for w in hc.decode_loops(m)] == ["dl", "dl2"]
        assert [w.name for w in hs.top_level_whiles(m) if w.trip_count is None] == [
            "dl",
            "dl2",
            "sl",
        ]


def test_flops_of_dots_batched_convolutions_and_elementwise(mod):
    items = {p.name: p for p in hc.price(mod, mod.entry)}
    assert items["mmf"].flops == 2 * 8 * 128 * 256
    # a batched matmul as a dilated convolution: 16 batches, one valid tap each:
    # 2 x out(16 x 8 x 64) x in-features 32
    assert items["cvf"].flops == 2 * 16 * 8 * 64 * 32
    assert items["e"].flops == 8 * 128  # one per element
    assert items["cc"].flops == 0 and items["cc"].bytes == 0  # custom calls at 0


def test_bytes_count_slices_and_in_place_updates(mod):
    items = {p.name: p for p in hc.price(mod, mod.entry)}
    # the dot fusion reads x, one dynamic slice of the stacked weight, writes f32[8,128]
    assert items["mmf"].bytes == 8 * 256 * 2 + 128 * 256 * 2 + 8 * 128 * 4
    # the update fusion moves the row (read) and writes it in place, plus the index
    assert items["u"].bytes == 128 * 2 + 4 + 128 * 2
    assert items["e"].bytes == 2 * 8 * 128 * 4


def test_roofline_sums_the_binding_side_per_instruction(mod):
    items = [
        hc.Priced("a", "fusion", "", 2, 0, 1e12, 1e9),  # compute-bound: 2 x 1 s
        hc.Priced("b", "fusion", "", 1, 0, 0.0, 4e9),  # memory-bound: 2 s
    ]
    s = hc.summarize(items, peak=1e12, bandwidth=2e9, clock=1e9)
    assert s["roofline_s"] == pytest.approx(4.0)
    assert s["compute_bound_s"] == pytest.approx(2.0) and s["memory_bound_s"] == 2.0
    assert s["flops"] == 2e12 and s["bytes"] == 6e9


def test_trip_count_inferred_from_the_condition_when_the_config_has_none():
    # the TPU compiler writes no known_trip_count: the condition's `i < 3` (i from 0) gives it
    text = _TEXT.replace(', backend_config={"known_trip_count":{"n":"3"}}', "")
    mod = hs.parse_hlo(text)
    loop = next(i for i in mod.computations["main"] if i.name == "lp")
    assert loop.trip_count is None and hc.infer_trip_count(mod, "main", loop) == 3
    decode = next(i for i in mod.computations["main"] if i.name == "dl")
    assert hc.infer_trip_count(mod, "main", decode) is None  # a constant-false condition
    items = {p.name: p for p in hc.price(mod, mod.entry)}
    assert items["e"].runs == 3 and items["lt"].runs == 4


_FLASH = """HloModule flash, is_scheduled=true

ENTRY %main (q: bf16[2,4,256,128], k: bf16[2,4,256,128], v: bf16[2,4,256,128], s: s32[2,256]) -> bf16[2,4,256,128] {
  %q = bf16[2,4,256,128]{3,2,1,0} parameter(0)
  %k = bf16[2,4,256,128]{3,2,1,0} parameter(1)
  %v = bf16[2,4,256,128]{3,2,1,0} parameter(2)
  %s = s32[2,256]{1,0} parameter(3)
  %fwd = (bf16[2,4,256,128]{3,2,1,0}, f32[2,4,256,128]{3,2,1,0}) custom-call(%q, %k, %v, %s), custom_call_target="tpu_custom_call", metadata={op_name="jit(loss)/jvp(jit(flash_attention))/pallas_call"}
  %o = bf16[2,4,256,128]{3,2,1,0} get-tuple-element(%fwd), index=0
  %dq = bf16[2,4,256,128]{3,2,1,0} custom-call(%q, %k, %v, %o), custom_call_target="tpu_custom_call", metadata={op_name="jit(loss)/transpose(jvp(jit(flash_attention)))/flash_mha_bwd_dq_block_q_major=128/pallas_call"}
  %dkv.1 = (bf16[2,4,256,128]{3,2,1,0}, bf16[2,4,256,128]{3,2,1,0}) custom-call(%q, %k, %v, %o), custom_call_target="tpu_custom_call"
  %flash_mha_bwd_dkv_block_q_major_128.2 = (bf16[2,4,256,128]{3,2,1,0}, bf16[2,4,256,128]{3,2,1,0}) custom-call(%q, %k, %v, %o), custom_call_target="tpu_custom_call"
  %other = bf16[2,4,256,128]{3,2,1,0} custom-call(%q, %k), custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/my_kernel/pallas_call"}
  ROOT %host = bf16[2,4,256,128]{3,2,1,0} custom-call(%dq), custom_call_target="flash_attention_host"
}
"""


def test_flash_attention_custom_calls_priced_by_their_own_roofline():
    items = {p.name: p for p in hc.price(hs.parse_hlo(_FLASH), "main")}
    x = 2 * 4 * 256 * 128  # elements of q / k / v / o
    unit = 2 * 4 * 256 * 256 * 128  # B N Tq Tk D
    # forward: 4 B N Tq Tk D; q, k, v, segment ids read, o and the f32 residual written
    assert items["fwd"].flops == 4 * unit
    assert items["fwd"].bytes == 3 * 2 * x + 2 * 256 * 4 + 2 * x + 4 * x
    assert items["dq"].flops == 6 * unit and items["dq"].bytes == 4 * 2 * x + 2 * x
    # the dkv kernel, told by its instruction name; one without a flash name stays unpriced
    assert items["flash_mha_bwd_dkv_block_q_major_128.2"].flops == 8 * unit
    assert "dkv.1" not in items and "other" not in items and "host" not in items


_SPLASH = """HloModule splash, is_scheduled=true

ENTRY %main (n: s8[4,2,2], q: bf16[2,4,256,128], k: bf16[2,2,256,128], v: bf16[2,2,256,128], s: s32[2,256]) -> bf16[2,4,256,128] {
  %n = s8[4,2,2]{2,1,0} parameter(0)
  %q = bf16[2,4,256,128]{3,2,1,0} parameter(1)
  %k = bf16[2,2,256,128]{3,2,1,0} parameter(2)
  %v = bf16[2,2,256,128]{3,2,1,0} parameter(3)
  %s = s32[2,256]{1,0} parameter(4)
  %fwd = (bf16[2,4,256,128]{3,2,1,0}, f32[2,4,256,128]{3,2,1,0}) custom-call(%n, %n, %q, %k, %v, %s), custom_call_target="tpu_custom_call", metadata={op_name="jit(loss)/splash_mha_fwd_segmented_residuals/pallas_call"}
  %o = bf16[2,4,256,128]{3,2,1,0} get-tuple-element(%fwd), index=0
  %dkv = (bf16[2,2,256,128]{3,2,1,0}, bf16[2,2,256,128]{3,2,1,0}) custom-call(%n, %q, %k, %v, %s, %o), custom_call_target="tpu_custom_call", metadata={op_name="jit(loss)/splash_mha_dkv_segmented_no_residuals/pallas_call"}
  ROOT %dq = bf16[2,4,256,128]{3,2,1,0} custom-call(%n, %q, %k, %v, %s, %o), custom_call_target="tpu_custom_call", metadata={op_name="jit(loss)/splash_mha_dq_segmented_no_residuals/pallas_call"}
}
"""


def test_splash_attention_custom_calls_priced_with_native_gqa():
    """Splash kernels: block tables (integers) before q; 4 query heads over 2 kv heads."""
    items = {p.name: p for p in hc.price(hs.parse_hlo(_SPLASH), "main")}
    x = 2 * 4 * 256 * 128  # elements of q / o
    unit = 2 * 4 * 256 * 256 * 128  # B Q Tq Tk D: each query head over all 256 keys
    tables = 4 * 2 * 2  # s8
    assert items["fwd"].flops == 4 * unit
    assert items["fwd"].bytes == 2 * tables + 2 * x + 2 * 2 * (x // 2) + 2 * 256 * 4 + 2 * x + 4 * x
    assert items["dkv"].flops == 8 * unit and items["dq"].flops == 6 * unit
    assert items["dq"].bytes == tables + 2 * x + 2 * 2 * (x // 2) + 2 * 256 * 4 + 2 * x + 2 * x


_MULTILINE = """HloModule m, is_scheduled=true

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %k = f32[8]{0} custom-call(%x), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 256}"
}}, metadata={op_name="jit(f)/splash_mha_fwd/pallas_call"}
  ROOT %after = f32[8]{0} negate(%k)
}
"""


def test_parse_joins_an_instruction_spanning_lines():
    """A Pallas kernel's ``kernel_metadata`` holds newlines; its tail starts at column 0 and
    must not end the computation (everything after it was dropped before)."""
    mod = hs.parse_hlo(_MULTILINE)
    names = [i.name for i in mod.computations["main"]]
    assert names == ["x", "k", "after"]
    assert mod.computations["main"][1].operands == ("x",)


def test_batch_as_window_convolution_over_a_size_one_input_has_one_tap():
    """TPU HLO writes a batched matmul (here ``btd,nhd->bnth``) as a convolution whose batch
    dim is a 64-wide window over a padded size-1 input: one valid tap per output."""
    types = {"w": "bf16[16,128,1024,1]{2,1,0,3}", "h": "bf16[64,768,1024,1]{2,1,3,0}"}
    ins = hs.Instr(
        "c",
        "f32[16,128,64,768]{1,3,0,2}",
        "convolution",
        ("w", "h"),
        ", window={size=64x1 pad=63_63x0_0 rhs_reversal=1x0}, dim_labels=1bf0_0oi1->1b0f",
    )
    assert hc._gemm_flops(ins, types) == 2.0 * 16 * 128 * 64 * 768 * 1024
