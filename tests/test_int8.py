"""INT8 W8A8 rollouts (ais_jax.models.int8): quantizer known answers, the exact integer GEMM
against a NumPy int64 reference, the int8 KV cache, ``rollout.precision=int8 / auto``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import TINY_RUN
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ais_jax.config.load import load_config
from ais_jax.config.schema import RolloutSection
from ais_jax.core.errors import UsageError
from ais_jax.models import attention, fp8, int8, kv_cache
from ais_jax.models.layout import ModelConfig
from ais_jax.models.qarray import QuantArray, native_precision
from ais_jax.run import cli as train
from ais_jax.training.steps import (
    int8_act_scaling,
    kv_format,
    resolve_precision,
    rollout_params,
)


def test_quantize_rounds_half_to_even_and_saturates_symmetric():
    # amax 127 -> scale 1: values map to themselves, rounded half to even
    x = jnp.array([127.0, 0.5, 1.5, 2.5, -0.5, -1.49, -126.6, 3.0])
    q = int8.quantize(x)
    assert float(q.scale.reshape(())) == 1.0 and q.value.dtype == jnp.int8
    assert q.value.tolist() == [127, 0, 2, 2, 0, -1, -127, 3]
    # a given scale: beyond 127 x scale saturates to +-127, never wraps to -128
    s = int8.quantize_static(jnp.array([1e6, -1e6, 254.0, -1.0]), jnp.float32(2.0))
    assert s.value.tolist() == [127, -127, 127, 0] and s.act_scaling == "prefill"
    # all-zero slice: the floor scale (float32's smallest normal), zeros
    z = int8.quantize(jnp.zeros((2, 3)), axes=-1)
    assert z.scale.tolist() == [[int8.SCALE_FLOOR]] * 2 and not z.value.any()
    assert float(np.finfo(np.float32).tiny) == int8.SCALE_FLOOR


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=9),
    st.floats(-(2.0**-120), 2.0**-120, width=32),
)
@example([5.06495872490537e16], 0.0)  # float32's 1 / 127 multiply != the rounded quotient
def test_amax_scale_is_amax_over_127_with_a_floor(xs, tiny):
    x = np.asarray([*xs, tiny], np.float32)
    # amax times float32's 1 / 127 (what XLA compiles amax / 127 to), in float32
    over = np.float32(np.abs(x).max()) * np.float32(int8.INV_QMAX)
    got = float(int8.amax_scale(jnp.abs(jnp.asarray(x)), (0,))[0])
    assert got == max(float(over), int8.SCALE_FLOOR)  # == amax / 127 above the floor
    assert got == pytest.approx(float(np.abs(x).max()) / 127, rel=2**-22, abs=int8.SCALE_FLOOR)
    assert got >= int8.SCALE_FLOOR  # never zero or subnormal: x / scale is always finite


def test_per_channel_weight_scales_and_valid_rows():
    w = jnp.array([[254.0, -127.0], [0.0, 0.0], [1.0, -0.5]])
    q = int8.quantize_weight(w)
    assert q.scale[:, 0].tolist() == pytest.approx([2.0, int8.SCALE_FLOOR, 1 / 127], rel=1e-6)
    assert q.value.tolist() == [[127, -64], [0, 0], [127, -64]]  # -63.5 -> -64 (even)
    # a padding row with a huge value sets no scale
    x = jnp.array([[1.0, -2.0], [1e9, 0.0]])
    v = int8.quantize(x, valid=jnp.array([[True], [False]]))
    assert float(v.scale.reshape(())) == pytest.approx(2 / 127)
    assert v.value[1].tolist() == [127, 0]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(1, 70), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_int_matmul_equals_numpy_int64(m, k, n, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-127, 128, (m, k), dtype=np.int64)
    b = rng.integers(-127, 128, (n, k), dtype=np.int64)
    got = int8.int_matmul(jnp.asarray(a, jnp.int8), jnp.asarray(b, jnp.int8))
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), a @ b.T)


def test_int_matmul_worst_case_row_is_exact():
    # 4096 products of 127 x -127: -66,064,384 (an f32 accumulation would still be exact
    # here; a bf16 one would not be) -- the int32 path keeps every bit
    a = jnp.full((1, 4096), 127, jnp.int8)
    b = jnp.full((2, 4096), -127, jnp.int8).at[1, 0].set(126)
    got = np.asarray(int8.int_matmul(a, b))
    assert got.tolist() == [[-127 * 127 * 4096, -127 * 127 * 4095 + 127 * 126]]


@pytest.mark.parametrize("act", ["tensor", "token", "prefill"])
def test_qdot_is_the_integer_gemm_times_the_scales(act):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4, 16)).astype(np.float32)
    w = int8.quantize_weight(jnp.asarray(rng.normal(size=(8, 16)), jnp.float32), act)
    fixed = jnp.float32(0.05) if act == "prefill" else None
    y = np.asarray(fp8.qdot(jnp.asarray(x), w, act_scale=fixed, out_dtype=jnp.float32))
    # reference: quantize x in NumPy the documented way, integer GEMM in int64
    if act == "prefill":
        sx = np.float32(0.05)
    elif act == "token":
        sx = np.max(np.abs(x), -1, keepdims=True) / np.float32(127)
    else:
        sx = np.max(np.abs(x)) / np.float32(127)
    xq = np.clip(np.round(x / sx), -127, 127).astype(np.int64)
    acc = xq @ np.asarray(w.value, np.int64).T
    ref = acc.astype(np.float32) * sx * np.asarray(w.scale)[:, 0]
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    # and close to the full-precision product
    wf = np.asarray(fp8.dequantize(w))
    assert np.max(np.abs(y - x @ wf.T)) < 0.1 * np.max(np.abs(x @ wf.T))


def test_fp8_entry_points_dispatch_and_fp8_is_unchanged():
    x = jnp.array([[0.3, -1.2, 2.0]])
    assert fp8.quantize(x, dtype="int8").value.dtype == jnp.int8
    assert fp8.quantize_static(x, 0.1, dtype=jnp.int8).value.tolist() == [[3, -12, 20]]
    assert float(fp8.prefill_scale(jnp.float32(127.0), jnp.int8, headroom=2.0)) == 2.0
    assert fp8.quantize(x).value.dtype == fp8.E4M3  # the default path stays E4M3
    p = {"embed": jnp.ones((4, 3)), "layers": {"wq": jnp.ones((1, 3, 3))}}
    rp = fp8.to_rollout_params(p, dtype="int8", act_scaling="token")
    wq = rp["layers"]["wq"]
    assert isinstance(wq, QuantArray)
    assert wq.value.dtype == jnp.int8 and wq.scale.shape == (1, 3, 1)


def test_int8_kv_cache_writes_and_reads_back():
    cfg = ModelConfig(
        vocab_size=8,
        hidden_size=8,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
        intermediate_size=8,
    )
    c = kv_cache.init_cache(cfg, 2, 5, fp8="int8")
    assert c.k.value.dtype == jnp.int8 and kv_cache.kv_dtype("int8") == jnp.int8
    new = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 1, 4)), jnp.float32)
    ck = kv_cache.cache_write(c.k, new, kv_cache.K_LAYOUT, 1, jnp.int32(1))
    view = kv_cache.cache_read(ck, kv_cache.K_LAYOUT, 1, jnp.float32)  # scales folded later
    assert isinstance(view, kv_cache.ScaledView) and kv_cache.is_per_token_int8(ck)
    assert view.x.shape == (2, 5, 1, 4) and view.scale.shape == (2, 5)
    back = attention.dequantize_view(view, jnp.float32)  # [B, S, K, H]
    np.testing.assert_allclose(
        np.asarray(back[:, 1:4]), np.asarray(new), atol=float(jnp.max(jnp.abs(new))) / 127
    )
    # each written (row, token) has the scale amax / 127 over its K x H values
    np.testing.assert_allclose(
        np.asarray(view.scale[:, 1:4]), np.abs(np.asarray(new)).max(axis=(2, 3)) / 127, rtol=1e-7
    )
    vw = kv_cache.cache_write(c.v, new, kv_cache.V_LAYOUT, 0, jnp.int32(2))
    vview = kv_cache.cache_read(vw, kv_cache.V_LAYOUT, 0, jnp.float32)
    np.testing.assert_array_equal(
        np.asarray(vview.x[:, 2:5] * vview.scale[:, 2:5, None, None]), np.asarray(back[:, 1:4])
    )  # same quantizer, either layout
    fixed = kv_cache.init_cache(cfg, 2, 5, fp8="int8", kv_scales=(jnp.ones(2), jnp.ones(2)))
    assert kv_cache.is_fixed_scale(fixed.v) and fixed.v.value.dtype == jnp.int8


def _int8_kv(rng: np.random.Generator, B: int, S: int, K: int, H: int) -> tuple:
    k = rng.integers(-127, 128, size=(B, S, K, H)).astype(np.float32)
    return k, (rng.random((B, S)) * 0.05 + 1e-3).astype(np.float32)


def test_folded_scales_equal_dequantize_then_attend():
    # int8 keys / values with per-(row, token) scales: the scales folded into the scores and
    # the probabilities == the dequantized cache attended to, to float32 rounding
    rng = np.random.default_rng(3)
    B, T, S, Q, K, H = 2, 3, 7, 4, 2, 8
    q = jnp.asarray(rng.normal(size=(B, T, Q, H)), jnp.float32)
    (k, sk), (v, sv) = _int8_kv(rng, B, S, K, H), _int8_kv(rng, B, S, K, H)
    valid = jnp.asarray(rng.random((B, S)) < 0.8).at[:, -T:].set(True)
    mask = attention.causal_mask(valid, S - T, T)
    views = (
        kv_cache.ScaledView(jnp.asarray(k), jnp.asarray(sk)),
        kv_cache.ScaledView(jnp.asarray(v), jnp.asarray(sv)),
    )
    folded = attention.attend(q, *views, mask, "reference")
    deq = attention.reference(
        q, jnp.asarray(k * sk[..., None, None]), jnp.asarray(v * sv[..., None, None]), mask.dense(T)
    )
    np.testing.assert_allclose(np.asarray(folded), np.asarray(deq), rtol=2e-6, atol=2e-7)
    # the chunked path dequantizes the view (it takes scalar scales only): same numbers
    chunked = attention.attend(q, *views, mask, "chunked", chunk=4)
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(deq), rtol=1e-5, atol=1e-6)


def test_folded_scales_known_answer():
    # H = 4 (1 / sqrt(H) = 0.5), power-of-two scales: every step is exact.
    # scores: q . k_int8 * s_k / 2 = (2 * 1 * 0.5, 2 * 2 * 0.25) / 2 = (0.5, 0.5) -> p = (.5, .5)
    # output: sum_t p[t] s_v[t] v_int8[t] = 0.5 * 0.25 * 4 + 0.5 * 0.5 * 8 = 2.5 (first column)
    q = jnp.asarray([2.0, 2.0, 0.0, 0.0]).reshape(1, 1, 1, 4)
    k = jnp.asarray([[1.0, 0, 0, 0], [0, 2.0, 0, 0]]).reshape(1, 2, 1, 4)
    v = jnp.asarray([[4.0, -8, 0, 1], [8.0, 0, 2, 1]]).reshape(1, 2, 1, 4)
    sk, sv = jnp.asarray([[0.5, 0.25]]), jnp.asarray([[0.25, 0.5]])
    mask = attention.causal_mask(jnp.ones((1, 2), bool), 1, 1)
    o = attention.attend(q, kv_cache.ScaledView(k, sk), kv_cache.ScaledView(v, sv), mask)
    assert o.reshape(-1).tolist() == [2.5, -1.0, 0.5, 0.375]


def test_auto_table_and_resolution():
    assert [
        native_precision(k)
        for k in (
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H200",
            "TPU7x",
            "TPU v5 lite",
            "TPU v6 lite",
            "TPU v5",
            "cpu",
            "NVIDIA A100-SXM4-80GB",
        )
    ] == ["fp8", "fp8", "fp8", "int8", "int8", "int8", "bf16", "bf16"]
    r = RolloutSection(precision="auto", fp8_format="e5m2")
    assert resolve_precision(r, "TPU7x").fp8_format == "e4m3"
    assert resolve_precision(r, "TPU v6 lite").precision == "int8"
    assert resolve_precision(r, "cpu").precision == "bf16"
    assert kv_format(RolloutSection(kv_cache_int8=True)) == "int8"
    p = {"embed": jnp.ones((4, 3), jnp.float32), "layers": {"wq": jnp.ones((1, 3, 3))}}
    rp = rollout_params(p, RolloutSection(precision="int8"))
    assert rp["layers"]["wq"].value.dtype == jnp.int8 and rp["embed"].dtype == jnp.bfloat16
    # INT8 activations: the default "tensor" means per token; prefill stays prefill
    assert rp["layers"]["wq"].act_scaling == "token"
    assert [int8_act_scaling(a) for a in ("tensor", "token", "prefill")] == [
        "token",
        "token",
        "prefill",
    ]


def test_config_accepts_int8_auto_and_rejects_two_kv_formats():
    assert load_config(None, ["rollout.precision=int8"]).rollout.precision == "int8"
    assert load_config(None, ["rollout.precision=auto"]).rollout.precision == "auto"
    with pytest.raises(UsageError, match="pick one KV cache format"):
        load_config(None, ["rollout.kv_cache_fp8=true", "rollout.kv_cache_int8=true"])


@pytest.mark.slow  # three 2-step tiny runs
@pytest.mark.parametrize(
    "extra",
    [
        ["rollout.precision=int8", "rollout.act_scaling=prefill", "rollout.kv_cache_int8=true"],
        ["rollout.precision=int8", "rollout.act_scaling=token", "rollout.kv_cache_int8=true"],
        ["rollout.precision=auto"],
    ],
)
def test_tiny_run_trains(extra, tmp_path, capsys):
    res = train.run(
        load_config(
            None, [f"out_dir={tmp_path}", *TINY_RUN, "checkpoint.every=0", "train.steps=2", *extra]
        )
    )
    assert len(res.metrics) == 2
    assert all(np.isfinite(r["loss"]) for r in res.metrics)
    if "rollout.precision=auto" in extra:
        assert (
            f"rollout.precision=auto: bf16 on {jax.devices()[0].device_kind}"
            in capsys.readouterr().out
        )
