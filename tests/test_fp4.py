"""FP4 rollout weights (ais_jax.models.fp4): NVFP4 / MXFP4 casts, error bounds, models, config."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _models import TINY, random_params
from _tiny import TINY_MODEL
from flax import struct
from hypothesis import given, settings
from hypothesis import strategies as st

from ais_jax.config.load import load_config
from ais_jax.config.schema import RolloutSection
from ais_jax.core.errors import UsageError
from ais_jax.models import fp4, fp8, model
from ais_jax.models.llada.model import LLaDAConfig
from ais_jax.models.llada.model import forward as llada_forward
from ais_jax.models.llada.model import init_params as llada_init
from ais_jax.models.llada.model import to_rollout_params as llada_rollout
from ais_jax.training.steps import rollout_params

# FP4 rounding is the subject here: compiled as a user's run (the suite's emitters round
# float4_e2m1fn conversions twice; tests/conftest.py)
pytestmark = pytest.mark.xla_optimized
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# TINY has intermediate 48 (a multiple of 16, not of 32): w_down's input dim fits NVFP4 only.
AR = dataclasses.replace(TINY, intermediate_size=64)
LLADA = LLaDAConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, mask_token_id=60, text_vocab_size=61)
FORMATS = ("nvfp4", "mxfp4")
SCALE_DTYPES = {"nvfp4": jnp.float8_e4m3fn, "mxfp4": jnp.float8_e8m0fnu}


def _np(x) -> np.ndarray:
    return np.asarray(x, np.float32)


def _rollout(params: dict, fmt: str = "e4m3", head: bool = True) -> dict:
    """`fp8.to_rollout_params` under jit (eager dispatch of its small ops is slow)."""
    return jax.jit(lambda p: fp8.to_rollout_params(p, dtype=fmt, quantize_lm_head=head))(params)


# ----------------------------------------------------------------------------- known answers


def test_e2m1_grid_and_round_to_nearest_even():
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    assert tuple(grid) == fp4.E2M1_GRID
    np.testing.assert_array_equal(_np(fp4.cast_e2m1(jnp.asarray(grid))), grid)
    np.testing.assert_array_equal(_np(fp4.cast_e2m1(jnp.asarray(-grid))), -grid)
    # ties go to the even mantissa; beyond 6 saturates (clipped before the cast)
    x = jnp.asarray([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, 100.0, -9.0])
    np.testing.assert_array_equal(_np(fp4.cast_e2m1(x)),
                                  [0, 1, 1, 2, 2, 4, 4, 6, 6, 6, -6])


def test_mx_scale_exponent_is_floor_log2_minus_2():
    amax = jnp.asarray([4.0, 3.99, 8.0, 0.75, 1.0, 0.0, 2.0**-125, 2.0**127])
    # floor(log2): 2, 1, 3, -1, 0, (zero block -> exponent 0), clipped low, clipped high
    np.testing.assert_array_equal(np.asarray(fp4.mx_scale_exponent(amax)),
                                  [0, -1, 1, -3, -2, 0, -126, 125])


def test_mxfp4_known_block():
    x = np.zeros((1, 32), np.float32)
    x[0, :6] = [3.0, 1.0, -0.6, 0.2, 2.2, -0.1]  # amax 3 -> scale 2**(1 - 2) = 0.5
    q = fp4.quantize_blocks(jnp.asarray(x), "mxfp4")
    assert q.scale.dtype == jnp.float8_e8m0fnu and q.scale.shape == (1, 1)
    assert float(q.scale.astype(jnp.float32)[0, 0]) == 0.5 and q.tensor_scale is None
    # x / 0.5 = [6, 2, -1.2, 0.4, 4.4, -0.2] -> E2M1 [6, 2, -1, 0.5, 4, 0]
    np.testing.assert_array_equal(_np(q.values())[0, :6], [6, 2, -1, 0.5, 4, 0])
    np.testing.assert_array_equal(_np(fp8.dequantize(q))[0, :6], [3, 1, -0.5, 0.25, 2, 0])
    # amax 7: scale 2**(2 - 2) = 1, and 7 is clipped to 6 (the OCP scale's known clipping)
    y = np.zeros((1, 32), np.float32)
    y[0, 0] = 7.0
    qy = fp4.quantize_blocks(jnp.asarray(y), "mxfp4")
    assert float(qy.scale.astype(jnp.float32)[0, 0]) == 1.0
    assert float(fp8.dequantize(qy)[0, 0]) == 6.0


def test_nvfp4_two_level_known_scales():
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 1.0  # tensor amax 1: s_t = 1 / (448 * 6) = 1 / 2688
    x[0, 16:20] = [0.01, -0.005, 0.002, 0.0]  # block 2: amax / 6 / s_t = 4.48 -> E4M3 4.5
    q = fp4.quantize_blocks(jnp.asarray(x), "nvfp4")
    assert q.scale.dtype == jnp.float8_e4m3fn and q.scale.shape == (1, 2)
    assert q.tensor_scale.dtype == jnp.float32 and q.tensor_scale.shape == (1, 1)
    assert float(q.tensor_scale[0, 0]) == np.float32(1 / 2688)
    np.testing.assert_array_equal(_np(q.scale), [[448.0, 4.5]])
    # block 2 in units of 4.5 / 2688: [5.973, -2.987, 1.195, 0] -> E2M1 [6, -3, 1, 0]
    np.testing.assert_array_equal(_np(q.values())[0, 16:20], [6, -3, 1, 0])
    expect = np.array([6, -3, 1, 0], np.float64) * 4.5 / 2688
    np.testing.assert_allclose(_np(fp8.dequantize(q))[0, 16:20], expect, rtol=1e-6)
    assert float(fp8.dequantize(q)[0, 0]) == pytest.approx(1.0, rel=1e-6)  # 6 * 448 / 2688


def test_nvfp4_block_below_e4m3_range_stores_zero():
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 16] = 1.0, 1e-7  # 1e-7 * 448 is far below E4M3's smallest subnormal
    q = fp4.quantize_blocks(jnp.asarray(x), "nvfp4")
    assert float(q.scale.astype(jnp.float32)[0, 1]) == 0.0
    out = _np(fp8.dequantize(q))
    assert np.all(np.isfinite(out)) and out[0, 16] == 0.0


# ----------------------------------------------------------------------------- packing


def _codes_as_e2m1(codes: np.ndarray) -> np.ndarray:
    """ml_dtypes' own E2M1 values of 4-bit codes (its float4 is one byte, code in the low bits)."""
    return np.asarray(codes, np.uint8).view(ml_dtypes.float4_e2m1fn)


def test_pack_unpack_round_trips_every_e2m1_code():
    codes = np.arange(16, dtype=np.uint8)
    vals = _codes_as_e2m1(codes)
    np.testing.assert_array_equal(vals.astype(np.float32)[:8], fp4.E2M1_GRID)
    # every (low, high) pair of codes: byte k = code(v[2k]) | code(v[2k + 1]) << 4
    lo, hi = np.meshgrid(codes, codes)  # lo varies fastest: byte k == k
    pairs = np.stack([lo.ravel(), hi.ravel()], -1)  # [256, 2]
    v = jnp.asarray(_codes_as_e2m1(pairs).reshape(1, 512))
    packed = fp4.pack_e2m1(v)
    assert packed.dtype == jnp.uint8 and packed.shape == (1, 256)
    np.testing.assert_array_equal(np.asarray(packed)[0], lo.ravel() | (hi.ravel() << 4))
    np.testing.assert_array_equal(np.asarray(packed)[0], np.arange(256))
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float4_e2m1fn):
        back = np.asarray(fp4.unpack_e2m1(packed, dtype)).astype(np.float32)
        want = np.asarray(v).astype(np.float32)
        np.testing.assert_array_equal(back, want)
        np.testing.assert_array_equal(np.signbit(back), np.signbit(want))  # -0.0 is code 8
    back4 = np.asarray(fp4.unpack_e2m1(packed, jnp.float4_e2m1fn)).view(np.uint8)
    np.testing.assert_array_equal(back4.reshape(-1, 2), pairs)
    with pytest.raises(ValueError, match="even last dimension"):
        fp4.pack_e2m1(jnp.zeros((2, 3), jnp.float4_e2m1fn))


_roundtrip = jax.jit(lambda v: fp4.unpack_e2m1(fp4.pack_e2m1(v), jnp.float4_e2m1fn))


@settings(max_examples=30, deadline=None)
@given(codes=hnp.arrays(np.uint8, st.tuples(st.integers(1, 3), st.integers(1, 8).map(
    lambda n: 2 * n)), elements=st.integers(0, 15)))
def test_property_unpack_inverts_pack(codes):
    v = jnp.asarray(_codes_as_e2m1(codes))
    back = _roundtrip(v)  # one compiled program per shape, not one per eager op
    np.testing.assert_array_equal(np.asarray(back).view(np.uint8), codes)


@pytest.mark.slow  # ~9 s in the full suite on 2 busy cores
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_values_are_the_unpacked_cast(fmt):
    # The packed copy holds exactly the E2M1 values the unpacked code stored.
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 64)), jnp.float32)
    q, old = fp4.quantize_blocks(x, fmt), _unpacked_quantize(x, fmt)
    assert old.value.dtype == jnp.float4_e2m1fn and old.value.shape == x.shape
    np.testing.assert_array_equal(np.asarray(q.values(jnp.float4_e2m1fn)).view(np.uint8),
                                  np.asarray(old.value).view(np.uint8))
    np.testing.assert_array_equal(_np(fp8.dequantize(q)), _np(fp8.dequantize(old)))
    for dt in (jnp.float32, jnp.bfloat16):
        xa = jnp.asarray(np.random.default_rng(1).standard_normal((5, 64)), dt)
        w_new, w_old = (jax.tree.map(lambda a: a[1], w) for w in (q, old))  # [3, 64]
        np.testing.assert_array_equal(_np(fp4.block_qdot(xa, w_new)),
                                      _np(fp4.block_qdot(xa, w_old)))


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
def test_bytes_per_weight_measured_from_the_arrays():
    w = jnp.asarray(np.random.default_rng(0).standard_normal((2, 64, 128)), jnp.float32)
    nv, mx = fp4.quantize_blocks(w, "nvfp4"), fp4.quantize_blocks(w, "mxfp4")
    assert nv.nbytes == nv.value.nbytes + nv.scale.nbytes + nv.tensor_scale.nbytes
    assert fp4.bytes_per_weight(nv) == pytest.approx(0.5625 + 4 / (64 * 128))
    assert fp4.bytes_per_weight(mx) == 0.53125
    e4m3 = fp8.quantize_weight(w)
    assert e4m3.nbytes / w.size == pytest.approx(1 + 4 / (64 * 128))  # FP8: twice as large


@struct.dataclass
class _Unpacked(fp4.BlockQuantArray):
    """The old layout: ``value`` ``float4_e2m1fn`` ``[..., out, in]``, one byte per value."""

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    def values(self, dtype=jnp.float32):
        return self.value.astype(dtype)


def _unpacked_quantize(x, fmt):
    """`fp4.quantize_blocks` as it was before packing (its E2M1 values, unpacked)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fp4, "pack_e2m1", lambda v: v)
        q = fp4.quantize_blocks(x, fmt)
    return _Unpacked(value=q.value, scale=q.scale, tensor_scale=q.tensor_scale, fmt=q.fmt)


# XLA:CPU (jaxlib 0.10.2) capped below F16C (--xla_cpu_max_isa=SSE4_2 or AVX, or a CPU without
# it) cannot link the FP4 sampler's programs, with the fusion emitters too: "LLVM compilation
# error: Symbols not found: [ __extendhfsf2 ]" (issue 58).  An XLA defect, not a rounding one;
# strict, so the mark goes when a jaxlib links them.
_NO_F16C = re.search(r"--xla_cpu_max_isa=(SSE4_2|AVX)(\s|$)", os.environ.get("XLA_FLAGS", ""))


@pytest.mark.slow  # ~12 s in the full suite on 2 busy cores
@pytest.mark.xfail(bool(_NO_F16C), raises=jax.errors.JaxRuntimeError, strict=True,
                   reason="XLA:CPU without F16C does not link __extendhfsf2 (issue 58)")
@pytest.mark.parametrize("fmt", FORMATS)
def test_sampler_on_packed_copy_equals_unpacked_math(fmt):
    from ais_jax.rollout import sampler

    params = random_params(AR)
    sec = RolloutSection(fp8_format=fmt, lm_head_fp8=True)
    packed = jax.jit(lambda p: rollout_params(p, sec))(params)
    with pytest.MonkeyPatch.context() as mp:  # the old layout: E2M1 values unpacked
        mp.setattr(fp4, "pack_e2m1", lambda v: v)
        old = jax.jit(lambda p: rollout_params(p, sec))(params)
    old = jax.tree.map(lambda q: _Unpacked(value=q.value, scale=q.scale,
                                           tensor_scale=q.tensor_scale, fmt=q.fmt)
                       if isinstance(q, fp4.BlockQuantArray) else q, old,
                       is_leaf=lambda q: isinstance(q, fp4.BlockQuantArray))
    assert old["layers"]["w_up"].value.dtype == jnp.float4_e2m1fn
    assert fp8.tree_nbytes(packed["layers"]) < 0.6 * fp8.tree_nbytes(old["layers"])
    toks = jax.random.randint(jax.random.key(3), (3, 5), 0, AR.vocab_size)
    mask = jnp.ones((3, 5), bool).at[0, :2].set(False)
    a, b = (sampler.sample(r, toks, mask, jax.random.key(4), AR, max_new_tokens=6,
                           decode_segments=1) for r in (packed, old))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(_np(a.logp), _np(b.logp), rtol=0, atol=1e-6)
    fwd = jax.jit(model.forward, static_argnums=2)
    np.testing.assert_allclose(_np(fwd(packed, toks, AR)), _np(fwd(old, toks, AR)),
                               rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- error bound


def _half_step(v: np.ndarray) -> np.ndarray:
    """Half the E2M1 grid spacing at |v| (0.5 below 2, 1 below 4, 2 up to 6)."""
    return np.where(v < 2, 0.25, np.where(v < 4, 0.5, 1.0))


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
@settings(max_examples=40, deadline=None)
@given(fmt=st.sampled_from(FORMATS), seed=st.integers(0, 2**31 - 1),
       log_mag=st.floats(-20, 20), heavy=st.booleans())
def test_round_trip_within_half_a_grid_step(fmt, seed, log_mag, heavy):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 64)) * 2.0**log_mag
    if heavy:  # per-block magnitudes over 6 orders
        x *= 10.0 ** rng.uniform(-3, 3, (3, 64 // 16)).repeat(16, -1)
    x = x.astype(np.float32)
    q = fp4.quantize_blocks(jnp.asarray(x), fmt)
    block = fp4.FP4_FORMATS[fmt][0]
    eff = np.repeat(_np(q.scale), block, -1)  # per-element block scale
    if q.tensor_scale is not None:
        eff = eff * _np(q.tensor_scale)
    err = np.abs(_np(fp8.dequantize(q)) - x)
    ok = eff > 0
    v = np.abs(x[ok]) / eff[ok]
    # round to nearest inside [-6, 6]; beyond 6 (MX scales, or an NVFP4 block scale
    # rounded down in E4M3) the value is clipped: error |v| - 6
    bound = np.maximum(_half_step(v), v - 6.0) * eff[ok]
    assert np.all(err[ok] <= bound * (1 + 1e-6) + 1e-30)
    if fmt == "nvfp4":  # s_b == 0 only for blocks below 2**-10 / 448 of the tensor amax
        assert np.all(np.abs(x[~ok]) <= np.abs(x).max() * 2.0**-10 / 448 * 6)
        assert np.all(err[~ok] == np.abs(x[~ok]))
    else:
        assert ok.all()


# ----------------------------------------------------------------------------- storage


@pytest.mark.parametrize("fmt", FORMATS)
def test_rollout_params_dtypes_shapes_and_bytes(fmt):
    params = random_params(AR)
    r = _rollout(params, fmt)
    block = fp4.FP4_FORMATS[fmt][0]
    for name in (*fp8.BLOCK_LINEARS, "lm_head"):
        w, full = (r[name], params[name]) if name == "lm_head" else (
            r["layers"][name], params["layers"][name])
        assert isinstance(w, fp4.BlockQuantArray) and isinstance(w, fp8.QuantArray)
        assert w.value.dtype == jnp.uint8  # two E2M1 codes per byte
        assert w.value.shape == (*full.shape[:-1], full.shape[-1] // 2)
        assert w.shape == full.shape and w.dtype == jnp.float4_e2m1fn
        assert w.scale.dtype == SCALE_DTYPES[fmt]
        assert w.scale.shape == (*full.shape[:-1], full.shape[-1] // block)
        if fmt == "nvfp4":
            assert w.tensor_scale.dtype == jnp.float32
            assert w.tensor_scale.shape == (*full.shape[:-2], 1, 1)
        else:
            assert w.tensor_scale is None
        # half a byte per E2M1 value (packed) + 1 byte per block (+ 4 per matrix)
        n_mat = int(np.prod(full.shape[:-2]))
        expect = full.size // 2 + full.size // block + (4 * n_mat if fmt == "nvfp4" else 0)
        assert w.nbytes == fp8.tree_nbytes(w) == expect
        assert fp4.bytes_per_weight(w) == expect / full.size
    assert fp8.tree_nbytes(r) == sum(x.nbytes for x in jax.tree_util.tree_leaves(r))
    np.testing.assert_array_equal(np.asarray(r["embed"]), np.asarray(params["embed"]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_tied_lm_head_gets_a_quantized_copy(fmt):
    cfg = dataclasses.replace(AR, tie_embeddings=True)
    params = random_params(cfg)
    r = jax.eval_shape(lambda p: fp8.to_rollout_params(p, dtype=fmt, quantize_lm_head=True),
                       params)
    assert isinstance(r["lm_head"], fp4.BlockQuantArray) and "lm_head" not in params
    assert r["lm_head"].shape == params["embed"].shape


def test_bad_block_size_and_settings_raise():
    params = random_params(TINY)  # intermediate 48: w_down [L, 32, 48]
    jax.eval_shape(lambda p: fp8.to_rollout_params(p, dtype="nvfp4"), params)  # 48 = 3 x 16
    with pytest.raises(ValueError, match=r"layers\.w_down: input dim 48 is not a multiple of "
                                         r"the mxfp4 block size 32") as e:
        jax.eval_shape(lambda p: fp8.to_rollout_params(p, dtype="mxfp4"), params)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="not a multiple of the nvfp4 block size 16"):
        fp4.quantize_blocks(jnp.ones((4, 24)), "nvfp4")
    with pytest.raises(ValueError, match="input dim 15 is not a multiple"):  # odd: refused
        fp4.quantize_blocks(jnp.ones((4, 15)), "nvfp4")
    with pytest.raises(ValueError, match="unknown fp4 format"):
        fp4.quantize_blocks(jnp.ones((4, 32)), "fp4")
    with pytest.raises(ValueError, match="must stay 'tensor'"):
        fp8.to_rollout_params(params, dtype="nvfp4", act_scaling="token")
    with pytest.raises(ValueError, match="must stay 'tensor'"):
        fp8.to_rollout_params(params, dtype="nvfp4", weight_scaling="channel")


# ----------------------------------------------------------------------------- models


def _rel(a, b) -> float:
    a, b = _np(a), _np(b)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _dequantized(r: dict) -> dict:
    """``r`` with every FP4 weight replaced by its float32 dequantization."""
    return jax.tree.map(lambda x: fp8.dequantize(x) if isinstance(x, fp4.BlockQuantArray) else x,
                        r, is_leaf=lambda x: isinstance(x, fp4.BlockQuantArray))


@pytest.mark.slow  # ~21 s in the full suite on 2 busy cores
@pytest.mark.parametrize("fmt", FORMATS)
def test_ar_rollout_forward(fmt):
    toks = jax.random.randint(jax.random.key(1), (2, 9), 0, AR.vocab_size)
    p32 = random_params(AR)
    fwd = jax.jit(model.forward, static_argnums=2)
    # The W4A16 matmul is the dequantized weight's matmul (float32: to rounding).
    r32 = _rollout(p32, fmt)
    np.testing.assert_allclose(_np(fwd(r32, toks, AR)), _np(fwd(_dequantized(r32), toks, AR)),
                               rtol=1e-4, atol=1e-4)
    # Against BF16: E2M1 with block scales has a relative weight error of ~9.5 % (NVFP4)
    # to ~11.5 % (MXFP4) on these Gaussian weights; through 2 residual blocks and the head
    # the logits' relative error measured 0.21 (NVFP4) and 0.26 (MXFP4) here (E4M3: 0.10).
    # The bound 0.5 leaves ~2x room and still fails a broken cast (the logits of other
    # random params: 1.57); FP4 must also be coarser than E4M3.
    pb = jax.tree.map(lambda x: x.astype(jnp.bfloat16), p32)
    ref = fwd(pb, toks, AR)
    err8 = _rel(fwd(_rollout(pb), toks, AR), ref)
    err = _rel(fwd(_rollout(pb, fmt), toks, AR), ref)
    assert err8 < err < 0.5, (fmt, err8, err)


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
@pytest.mark.parametrize("fmt", FORMATS)
def test_llada_rollout_forward(fmt):
    params = llada_init(jax.random.key(0), LLADA)
    toks = jax.random.randint(jax.random.key(1), (2, 7), 0, 64)
    fwd = jax.jit(llada_forward, static_argnums=2)
    r = jax.jit(lambda p: llada_rollout(p, dtype=fmt, quantize_lm_head=True))(params)
    assert isinstance(r["layers"]["wq"], fp4.BlockQuantArray)
    assert isinstance(r["lm_head"], fp4.BlockQuantArray)
    a, b = fwd(params, toks, LLADA), fwd(r, toks, LLADA)
    np.testing.assert_allclose(_np(b), _np(fwd(_dequantized(r), toks, LLADA)),
                               rtol=1e-4, atol=1e-4)
    assert 0 < _rel(b, a) < 0.5  # measured 0.09 (NVFP4), 0.12 (MXFP4); see the AR test


def test_trainer_rollout_params_and_sampler():
    from ais_jax.rollout import sampler

    params = random_params(AR)
    rp = jax.jit(lambda p: rollout_params(p, RolloutSection(fp8_format="mxfp4",
                                                           lm_head_fp8=True)))(params)
    assert rp["layers"]["w_up"].value.dtype == jnp.uint8
    assert rp["layers"]["w_up"].dtype == jnp.float4_e2m1fn
    assert rp["layers"]["w_up"].scale.dtype == jnp.float8_e8m0fnu
    toks = jnp.ones((2, 3), jnp.int32)
    out = sampler.sample(rp, toks, jnp.ones((2, 3), bool), jax.random.key(0), AR,
                         max_new_tokens=3, decode_segments=1)
    assert out.tokens.shape == (2, 3) and np.all(np.isfinite(_np(out.logp)))


# ----------------------------------------------------------------------------- config / CLI


def test_config_accepts_and_rejects_formats():
    for fmt in ("e4m3", "e5m2", "nvfp4", "mxfp4"):
        assert load_config(None, [f"rollout.fp8_format={fmt}"]).rollout.fp8_format == fmt
    with pytest.raises(UsageError, match=re.escape(
            "rollout.fp8_format must be one of 'e4m3', 'e5m2', 'nvfp4', 'mxfp4', got 'fp4'")):
        load_config(None, ["rollout.fp8_format=fp4"])
    for key, value in (("act_scaling", "token"), ("act_scaling", "prefill"),
                       ("weight_scaling", "channel")):
        with pytest.raises(UsageError, match=f"rollout.{key}='{value}' does not apply to "
                                             "rollout.fp8_format=nvfp4"):
            load_config(None, ["rollout.fp8_format=nvfp4", f"rollout.{key}={value}"])
        load_config(None, ["rollout.fp8_format=e4m3", f"rollout.{key}={value}"])
        load_config(None, ["rollout.precision=bf16", "rollout.fp8_format=mxfp4",
                           f"rollout.{key}={value}"])


def test_cli_bad_format_exit_2():
    proc = subprocess.run([sys.executable, "-m", "ais_jax.train", "--print-config", *TINY_MODEL,
                           "rollout.fp8_format=fp4"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err[-2000:]
    assert "rollout.fp8_format must be one of" in err and "'mxfp4'" in err


def test_mismatch_cli_format_choices(capsys):
    from ais_jax.run import mismatch

    assert mismatch.main(["--model", "random:tiny", "--fp8-format", "fp4"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert mismatch.main(["--model", "random:tiny", "--fp8-format", "nvfp4",
                          "--act-scaling", "token"]) == 2
    assert "does not apply" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", FORMATS)
def test_rollout_sharding_specs(fmt):
    from jax.sharding import AbstractMesh, AxisType, PartitionSpec

    from ais_jax.training import sharding as shd

    mesh = AbstractMesh((1, 2, 2), shd.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
    params = jax.eval_shape(lambda: model.init_params(jax.random.key(0), AR))
    r = jax.eval_shape(lambda p: fp8.to_rollout_params(p, dtype=fmt, quantize_lm_head=True),
                       params)
    specs = shd.param_specs(r, mesh, rollout=True)
    wq = specs["layers"]["wq"]
    assert wq.value == PartitionSpec(None, "tensor", None) and wq.scale == PartitionSpec()
    # wo [L, D, QH]: packed value [L, 32, 16]; its input (heads) axis splits over tensor
    assert r["layers"]["wo"].value.shape == (AR.num_layers, 32, 16)
    assert specs["layers"]["wo"].value == PartitionSpec(None, None, "tensor")
    if fmt == "nvfp4":  # [L, 1, 1]: too small to split, replicated
        assert wq.tensor_scale == PartitionSpec(None, None, None)
