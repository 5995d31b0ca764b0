"""benchmarks/prefill_scaling_smollm2.py's clipping statistics, against hand-computed values.

E4M3: largest finite 448, smallest normal 2^-6, smallest subnormal 2^-9 (values below 2^-10
round to 0).  No model is loaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import prefill_scaling_smollm2 as ps  # noqa: E402

from ais_jax.models import fp8  # noqa: E402


def _weight() -> fp8.QuantArray:
    return fp8.quantize(jnp.ones((2, 5), jnp.float32))


def test_fixed_scale_counts_saturation_flush_and_subnormals():
    # scale 1: 1000 saturates (ratio 1000 / 448), 2^-12 flushes to 0, 2^-12 and 2^-7 are
    # below the smallest normal, 0 is valid but not nonzero; the invalid row is not counted
    x = jnp.asarray([[[1000.0, 2.0**-12, 0.0, 1.0, 2.0**-7]],
                     [[5000.0, 2.0**-20, 1.0, 1.0, 1.0]]], jnp.float32)  # [B=2, T=1, 5]
    valid = jnp.asarray([[True], [False]])
    s = np.asarray(ps._input_stats(x, _weight(), valid, jnp.float32(1.0)))
    np.testing.assert_allclose(s, [5, 4, 1, 2, 1, 1000 / 448], rtol=1e-6)


def test_dynamic_scale_never_saturates_and_ignores_invalid_rows():
    # scale = 1000 / 448 from the valid row only: |x| / scale = 0.448 |x|; 2^-12 -> 1.1e-4
    # (below 2^-10: flushed), 2^-7 -> 0.0035 (subnormal), the amax maps to 448 exactly
    x = jnp.asarray([[[1000.0, 2.0**-12, 0.0, 1.0, 2.0**-7]],
                     [[5000.0, 2.0**-20, 1.0, 1.0, 1.0]]], jnp.float32)
    valid = jnp.asarray([[True], [False]])
    s = np.asarray(ps._input_stats(x, _weight(), valid, None))
    np.testing.assert_allclose(s, [5, 4, 1, 2, 0, 1.0], rtol=1e-6)


def test_clip_summary_fractions_and_maxima():
    # 2 steps x (1 layer x 4 inputs) x 6 stats; only the down input (index 3) has events
    st = np.zeros((2, 4, 6), np.float32)
    st[:, :, 0] = 10.0  # valid
    st[:, :, 1] = 8.0  # nonzero
    st[0, 3, 2], st[1, 3, 2] = 1.0, 3.0  # flushed: 4 of 16 nonzero
    st[1, 3, 4] = 2.0  # saturated: 2 of 20 valid
    st[:, :, 5] = 0.5
    st[1, 3, 5] = 1.5
    c = ps.clip_summary(st, 1)
    assert c["down"] == pytest.approx({"saturated": 0.1, "flush_to_zero": 0.25, "subnormal": 0.0,
                                       "max_over_clip": 1.5, "layers_saturating": 1})
    assert c["qkv"]["max_over_clip"] == 0.5 and c["qkv"]["saturated"] == 0.0
    assert c["all"]["flush_to_zero"] == pytest.approx(4 / 64)
    assert c["all"]["saturated"] == pytest.approx(2 / 80)
    assert c["per_layer_down"] == [{"layer": 0, "flush_to_zero": 0.25, "max_over_clip": 1.5}]
