"""The GPU benchmark scripts (benchmarks/gpu_rollout.py, gpu_update.py) and their HLO helpers.

The scripts run in their ``--tiny`` CPU mode in-process; the HLO / StableHLO
counters are checked on hand-written snippets with known answers; and the
FP8 decode step is lowered for CUDA on this CPU machine (no GPU needed) to
check that the block linears multiply float8 operands converted straight into
the dot, never a dequantized weight copy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import _bench_common as bc  # noqa: E402
import _hlo_stats as hs  # noqa: E402

HLO = """HloModule m, entry_computation_layout={()->f32[4,8]{1,0}}

%fused_gemm (param_0: f8e4m3fn[4,8], param_1: f8e4m3fn[8,8]) -> f32[4,8] {
  %param_0 = f8e4m3fn[4,8]{1,0} parameter(0)
  %param_1 = f8e4m3fn[8,8]{1,0} parameter(1)
  %c0 = bf16[4,8]{1,0} convert(%param_0)
  %c1 = bf16[8,8]{1,0} convert(%param_1)
  ROOT %dot = f32[4,8]{1,0} dot(%c0, %c1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_add (p: f32[4,8]) -> f32[4,8] {
  %p = f32[4,8]{1,0} parameter(0)
  ROOT %a = f32[4,8]{1,0} add(%p, %p)
}

%inner_body (t: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %t = (s32[], f32[4,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[4,8]{1,0} get-tuple-element(%t), index=1
  %f = f32[4,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_add
  ROOT %r = (s32[], f32[4,8]{1,0}) tuple(%i, %f)
}

%inner_cond (t: (s32[], f32[4,8])) -> pred[] {
  %t = (s32[], f32[4,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(2)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%called (p: f32[4,8]) -> f32[4,8] {
  %p = f32[4,8]{1,0} parameter(0)
  ROOT %f = f32[4,8]{1,0} fusion(%p), kind=kLoop, calls=%fused_add
}

%decode_body (t: (s32[], f32[4,8], f8e4m3fn[4,8], /*index=3*/f8e4m3fn[8,8])) -> (s32[], f32[4,8], f8e4m3fn[4,8], /*index=3*/f8e4m3fn[8,8]) {
  %t = (s32[], f32[4,8]{1,0}, f8e4m3fn[4,8]{1,0}, /*index=3*/f8e4m3fn[8,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[4,8]{1,0} get-tuple-element(%t), index=1
  %a8 = f8e4m3fn[4,8]{1,0} get-tuple-element(%t), index=2
  %w8 = f8e4m3fn[8,8]{1,0} get-tuple-element(%t), index=3
  %g1 = f32[4,8]{1,0} fusion(%a8, %w8), kind=kCustom, calls=%fused_gemm
  %g2 = (f32[4,8]{1,0}, s8[1024]{0}) custom-call(%a8, %w8), custom_call_target="__cublas$lt$matmul$f8"
  %g3 = (f32[4,8]{1,0}, s8[1024]{0}) custom-call(%x, %x), custom_call_target="__cublas$lt$matmul"
  %f1 = f32[4,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_add
  %cp = f32[4,8]{1,0} copy(%f1)
  %tup = (s32[], f32[4,8]{1,0}) tuple(%i, %cp)
  %w = (s32[], f32[4,8]{1,0}) while(%tup), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"2"}}
  %c = f32[4,8]{1,0} call(%f1), to_apply=%called
  ROOT %r = (s32[], f32[4,8]{1,0}, f8e4m3fn[4,8]{1,0}, /*index=3*/f8e4m3fn[8,8]{1,0}) tuple(%i, %c, %a8, %w8)
}

%decode_cond (t: (s32[], f32[4,8], f8e4m3fn[4,8], /*index=3*/f8e4m3fn[8,8])) -> pred[] {
  %t = (s32[], f32[4,8]{1,0}, f8e4m3fn[4,8]{1,0}, /*index=3*/f8e4m3fn[8,8]{1,0}) parameter(0)
  %x = f32[4,8]{1,0} get-tuple-element(%t), index=1
  ROOT %done = pred[] fusion(%x), kind=kInput, calls=%fused_add
}

ENTRY %main () -> f32[4,8] {
  %z = s32[] constant(0)
  %x = f32[4,8]{1,0} constant({...})
  %a = f8e4m3fn[4,8]{1,0} constant({...})
  %b = f8e4m3fn[8,8]{1,0} constant({...})
  %t0 = (s32[], f32[4,8]{1,0}) tuple(%z, %x)
  %prefill = (s32[], f32[4,8]{1,0}) while(%t0), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"2"}}
  %t1 = (s32[], f32[4,8]{1,0}, f8e4m3fn[4,8]{1,0}, /*index=3*/f8e4m3fn[8,8]{1,0}) tuple(%z, %x, %a, %b)
  %decode = (s32[], f32[4,8]{1,0}, f8e4m3fn[4,8]{1,0}, /*index=3*/f8e4m3fn[8,8]{1,0}) while(%t1), condition=%decode_cond, body=%decode_body
  ROOT %out = f32[4,8]{1,0} get-tuple-element(%decode), index=1
}
"""  # noqa: E501

STABLEHLO = """module @jit_f {
  func.func public @main(%arg0: tensor<4x8xf8E4M3FN>, %arg1: tensor<8x8xf8E4M3FN>, %arg2: tensor<f32>, %arg3: tensor<4x8xbf16>) -> (tensor<4x8xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.convert %arg0 : (tensor<4x8xf8E4M3FN>) -> tensor<4x8xf32>
    %1 = stablehlo.convert %arg1 : (tensor<8x8xf8E4M3FN>) -> tensor<8x8xf32>
    %2 = stablehlo.dot_general %0, %1, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %3 = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<8x8xf32>
    %4 = stablehlo.multiply %1, %3 : tensor<8x8xf32>
    %5 = stablehlo.convert %4 : (tensor<8x8xf32>) -> tensor<8x8xbf16>
    %6 = stablehlo.dot_general %arg3, %5, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
    %7:2 = stablehlo.while(%iterArg = %c, %iterArg_1 = %arg0) : tensor<i32>, tensor<4x8xf8E4M3FN>
    cond {
      %c_2 = stablehlo.constant dense<3> : tensor<i32>
      %20 = stablehlo.compare  LT, %iterArg, %c_2,  SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %20 : tensor<i1>
    } do {
      %10 = stablehlo.convert %iterArg_1 : (tensor<4x8xf8E4M3FN>) -> tensor<4x8xf32>
      %11 = stablehlo.dot_general %10, %1, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
      %12 = func.call @helper(%arg0, %arg1) : (tensor<4x8xf8E4M3FN>, tensor<8x8xf8E4M3FN>) -> tensor<4x8xf32>
      stablehlo.return %iterArg, %iterArg_1 : tensor<i32>, tensor<4x8xf8E4M3FN>
    }
    %8 = stablehlo.dot_general %arg3, %5, contracting_dims = [1] x [1] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
    %9 = stablehlo.dot_general %0, %arg3, contracting_dims = [1] x [1] : (tensor<4x8xf32>, tensor<4x8xbf16>) -> tensor<4x4xf32>
    return %2 : tensor<4x8xf32>
  }
  func.func private @helper(%arg0: tensor<4x8xf8E4M3FN>, %arg1: tensor<8x8xf8E4M3FN>) -> tensor<4x8xf32> {
    %0 = stablehlo.convert %arg0 : (tensor<4x8xf8E4M3FN>) -> tensor<4x8xf32>
    %1 = stablehlo.convert %arg1 : (tensor<8x8xf8E4M3FN>) -> tensor<8x8xf32>
    %2 = stablehlo.dot_general %0, %1, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %2 : tensor<4x8xf32>
  }
}
"""  # noqa: E501


def test_decode_loop_stats_known_answer():
    s = hs.decode_loop_stats(HLO)
    assert s["decode_loops"] == 1 and s["decode_loop_rule"].startswith("top-level")
    # body: fusions g1, f1, 2 x the inner loop's 1, the called 1; custom calls g2, g3
    assert (s["fusions_per_step"], s["custom_calls_per_step"], s["kernels_per_step"]) == (5, 2, 7)
    assert s["fp8_gemms_per_step"] == 2  # the f8 GEMM fusion and the cuBLASLt f8 call
    assert s["condition_kernels"] == 1 and s["other_ops_per_step"] == {"copy": 1}
    assert s["fp8_gemms_total"] == 2
    assert s["custom_call_targets"] == ["__cublas$lt$matmul", "__cublas$lt$matmul$f8"]
    assert [(w["known_trip_count"], w["kernels"]) for w in s["while_loops"]] == [(2, 1), (None, 7)]


def test_decode_loop_stats_without_unknown_trip_loop_takes_the_largest():
    text = HLO.replace("body=%decode_body", 'body=%decode_body, backend_config={"known_trip_count":'
                       '{"n":"9"}}')
    s = hs.decode_loop_stats(text)
    assert s["decode_loop_rule"].startswith("no loop") and s["kernels_per_step"] == 7


def test_stablehlo_f8_dots_known_answer():
    s = hs.stablehlo_f8_dots(STABLEHLO)
    counts = (s["dots"], s["f8_dots"], s["dequantized_dots"], s["f8_one_operand_dots"])
    assert counts == (6, 3, 2, 1)
    assert s["f8_dots_by_function"] == {"main": 2, "helper": 1}
    assert s["whiles"] == [{"function": "main", "dots": 2, "f8_dots": 2, "f8_one_operand_dots": 0,
                            "dequantized_dots": 0}]


def test_kv_cache_bytes_known_answers():
    mc = bc.model_config("tiny")  # 2 layers, 2 KV heads of width 16
    assert bc.kv_cache_bytes(mc, 3, 5, fp8=False) == 2 * 2 * 3 * 5 * 2 * 16 * 2 == 3840
    assert bc.kv_cache_bytes(mc, 3, 5, fp8=True) == 1920 + 2 * 2 * 3 * 5 * 4 == 2160
    q8 = bc.model_config("Qwen3-8B")  # 36 layers, 8 KV heads of 128: 256 rows, 128 + 512 - 1
    assert bc.kv_cache_bytes(q8, 256, 639, fp8=False) == 24_121_442_304
    assert bc.kv_cache_bytes(q8, 256, 639, fp8=True) == 12_107_833_344


def test_sweep_order_puts_acceptance_configs_first():
    import gpu_rollout

    order = gpu_rollout.sweep_order(["Qwen3-0.6B", "Qwen3-8B"], [64, 256],
                                    ["fp8_kv", "bf16", "fp8"])
    assert order[:4] == [("Qwen3-8B", 256, "bf16"), ("Qwen3-8B", 256, "fp8"),
                         ("Qwen3-0.6B", 64, "bf16"), ("Qwen3-0.6B", 64, "fp8")]
    assert order[4:6] == [("Qwen3-8B", 256, "fp8_kv"), ("Qwen3-0.6B", 64, "fp8_kv")]
    assert len(order) == len(set(order)) == 12


@pytest.mark.slow  # two CPU compiles of the sampler program (~10-25 s on 2 shared cores)
def test_gpu_rollout_tiny(tmp_path, monkeypatch):
    import gpu_rollout

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")  # main() sets it; undone after
    gpu_rollout.main(["--tiny", "--arms", "bf16,fp8", "--batches", "8", "--new", "4",
                      "--prompt-len", "8", "--save-docs", "--docs-dir", str(tmp_path / "docs")])
    data = json.loads((tmp_path / "gpu_rollout.json").read_text())
    assert [(c["arm"], c["status"]) for c in data["configs"]] == [("bf16", "ok"), ("fp8", "ok")]
    L = bc.TINY.num_layers
    for c in data["configs"]:
        assert c["compile_s"] > 0 and len(c["reps_s"]) == 3 and c["tokens_per_s"] > 0
        assert c["median_s"] == sorted(c["reps_s"])[1]
        assert c["tokens_per_s"] == pytest.approx(8 * 4 / c["median_s"])
        assert c["ms_per_step"] == pytest.approx(1e3 * c["median_s"] / 4)
        assert c["generated_tokens"] == 8 * 4  # no EOS: every row runs the whole budget
        assert c["hlo"]["decode_loops"] == 1 and c["hlo"]["kernels_per_step"] > 0
        assert c["memory"]["compiled"]["argument"] > 0
        assert c["kv_cache_bytes"] == bc.kv_cache_bytes(bc.TINY, 8, 8 + 3, fp8=False)
    bf16, fp8 = data["configs"]
    assert bf16["lowered"]["f8_dots"] == 0
    assert fp8["lowered"]["f8_dots"] == 7 * (L + 1)  # decode step (L layers) + prefill's scan body
    assert fp8["lowered"]["dequantized_dots"] == 0
    ratio = data["ratios"]["tiny@8"]["fp8"]
    assert ratio == pytest.approx(fp8["tokens_per_s"] / bf16["tokens_per_s"]) and ratio > 0
    assert (tmp_path / "docs" / "gpu_rollout_cpu.json").exists()


def test_gpu_rollout_skips_what_the_budget_cannot_hold(tmp_path, monkeypatch, capsys):
    import gpu_rollout

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")  # main() sets it; undone after
    data = gpu_rollout.main(["--tiny", "--arms", "bf16,fp8", "--time-budget-s", "0"])
    assert [c["status"] for c in data["configs"]] == ["skipped", "skipped"]
    assert data["skipped"] == ["tiny@16 bf16", "tiny@16 fp8"]
    assert "skipped for the time budget: tiny@16 bf16, tiny@16 fp8" in capsys.readouterr().out
    assert json.loads((tmp_path / "gpu_rollout.json").read_text())["skipped"] == data["skipped"]


def test_xla_flags_after_backend_start_are_refused(monkeypatch):
    from ais_jax.core.errors import UsageError

    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    jax.devices()  # the backend is up
    with pytest.raises(UsageError, match="already started"):
        bc.setup_env("--xla_gpu_enable_command_buffer=")


@pytest.mark.slow  # compiles the update and score programs of a 1-layer model (~20-40 s)
def test_gpu_update_tiny(tmp_path, monkeypatch):
    import gpu_update

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")  # main() sets it; undone after
    gpu_update.main(["--tiny", "--reps", "3", "--trace"])
    data = json.loads((tmp_path / "gpu_update.json").read_text())
    (m,) = data["models"]
    assert m["status"] == "ok", m.get("traceback")
    assert (m["layers"], m["layers_full"]) == (1, 2) and "cut from 2 to 1" in m["cut"]
    assert m["score_program"] and m["minibatches"] == 4 and m["remat"] == "full"
    assert len(m["step_s"]) == 3 and m["tokens_per_s"] == pytest.approx(8 * 16 / m["median_step_s"])
    mc = bc.model_config("tiny", 1)
    from ais_jax.training import flops

    assert m["model_flops"] == flops.update_flops(mc, 8, 16, extra_forwards=1)
    assert m["hardware_flops"] == pytest.approx(m["model_flops"] * 5 / 4)
    assert m["mfu"] is None and "dense BF16 peak" in data["mfu_formula"]  # CPU: no peak
    assert m["update_program_only"] == {"mfu": None, "mfu_hardware": None}
    assert m["median_update_s"] < m["median_step_s"]  # the step adds the score program
    assert m["memory"]["update"]["temp"] > 0 and m["memory"]["update"]["alias"] > 0  # donated
    assert all(v == v for v in m["metrics"].values()) and "d_bar" in m["metrics"]
    assert any((tmp_path / "trace").rglob("*.xplane.pb"))


def _tiny_rollout_lowered_for_cuda(arm: str) -> str:
    """The rollout program (`steps.build_step_fns`) of the tiny model, lowered for CUDA here."""
    import gpu_rollout

    from ais_jax.models.model import init_params
    from ais_jax.training import optim, steps
    from ais_jax.training import sharding as shd

    mc = bc.TINY
    cfg = bc.config("tiny", ["rollout.prompts_per_step=1", "rollout.group_size=8",
                             "rollout.max_new_tokens=8", "train.minibatches=1",
                             *gpu_rollout.ARMS[arm]])
    opt = optim.make_optimizer(1e-6)
    params = jax.eval_shape(lambda: init_params(jax.random.key(0), mc, jnp.bfloat16))
    state = jax.eval_shape(lambda p: optim.init_train_state(p, opt), params)
    fns = steps.build_step_fns(state, shd.make_mesh(), opt, None, mc, cfg, steps.TokenIds((), None))
    args = (params, jax.ShapeDtypeStruct((1, 16), jnp.int32), jax.ShapeDtypeStruct((1, 16), bool),
            jax.eval_shape(lambda: jax.random.key(1)))
    return fns.rollout.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_fp8_decode_step_lowered_for_cuda_feeds_float8_into_the_dots():
    text = _tiny_rollout_lowered_for_cuda("fp8")
    L = bc.TINY.num_layers
    s = hs.stablehlo_f8_dots(text)
    assert s["dequantized_dots"] == 0  # no multiply of a converted weight before a dot
    assert s["f8_one_operand_dots"] == 0  # weights and activations both float8
    assert s["f8_dots"] == 7 * (L + 1)  # 7 block linears: L unrolled decode layers + prefill scan
    per_loop = sorted(w["f8_dots"] for w in s["whiles"])
    assert per_loop[-1] == 7 * L  # the decode step (one segment for 8 new tokens)
    assert 7 in per_loop  # the prefill's scanned layer
    assert "f8E4M3FN" in text and "stablehlo.dot_general" in text


def test_fp8_kv_decode_step_lowered_for_cuda_reads_a_dequantized_cache():
    s = hs.stablehlo_f8_dots(_tiny_rollout_lowered_for_cuda("fp8_kv"))
    decode = max(s["whiles"], key=lambda w: w["f8_dots"])
    assert decode["f8_dots"] == 7 * bc.TINY.num_layers
    assert decode["dequantized_dots"] == 2 * bc.TINY.num_layers  # scores and values per layer


def test_rollout_time_estimate_uses_the_closest_measurements():
    import gpu_rollout

    def ok(model, rows, arm, build, median):
        return {"model": model, "rows": rows, "arm": arm, "status": "ok", "lower_s": 1.0,
                "compile_s": build - 1.0, "median_s": median, "layers": 36}

    report = {"configs": [ok("A", 256, "bf16", 50.0, 8.0), ok("A", 256, "fp8", 90.0, 6.0),
                          {"model": "B", "rows": 64, "arm": "bf16", "status": "skipped"}]}
    est = gpu_rollout._estimate
    assert est(report, "A", 36, 64, "fp8", 3) == 90.0 + 4 * (8.0 / 256) * 64  # model and arm
    assert est(report, "A", 36, 64, "fp8_kv", 3) == 50.0 + 4 * 2.0  # the model's fastest build
    assert est(report, "B", 28, 64, "fp8", 3) == 90.0 * 28 / 36  # the arm on A, per layer
    assert est(report, "B", 28, 64, "fp8_token", 3) == 30.0  # nothing to go by
