"""benchmarks/weight_transfer.py: the byte count (known answers) and one short run on two
simulated devices (the FP8 copy is about half the BF16 copy's bytes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import weight_transfer as wt  # noqa: E402


def test_copy_bytes_counts_each_dtype_width():
    tree = {"w": jnp.zeros((3, 4), jnp.float8_e4m3fn), "s": jnp.zeros((3,), jnp.float32),
            "e": [jnp.zeros((5,), jnp.bfloat16)]}
    assert wt.copy_bytes(tree) == (3, 12 * 1 + 3 * 4 + 5 * 2)


def test_two_device_run_prints_half_the_bytes_for_fp8():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "weight_transfer.py"),
                          "--reps", "2"], capture_output=True, text=True, timeout=240,
                         cwd=ROOT, env=dict(os.environ, JAX_NUM_CPU_DEVICES="2"))
    assert out.returncode == 0, out.stderr[-2000:]
    mb = {p: float(m) for p, m in re.findall(r"(bf16|fp8): \d+ leaves, ([\d.]+) MB", out.stdout)}
    assert set(mb) == {"bf16", "fp8"}, out.stdout
    # the block linears are 1 byte per weight in FP8 plus per-tensor scales; the rest (norms,
    # embeddings) stays BF16 in both copies
    assert 0.45 < mb["fp8"] / mb["bf16"] < 0.6, out.stdout
    assert re.search(r"fp8 / bf16: bytes 0\.\d+x, transfer time [\d.]+x", out.stdout), out.stdout
