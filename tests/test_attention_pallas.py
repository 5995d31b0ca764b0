"""``model.attention=pallas``: JAX's TPU flash-attention kernel, run in Pallas's TPU
interpret mode on CPU, against the reference attention (forward and gradient, float32).

Shapes are tiny but cross the kernel's 128-slot block (T = 100 is padded to 128 inside);
grouped-query (4 query heads, 2 key / value heads); left padding in one row, a hole in the
other.  Outputs of padding queries differ by design (`ais_jax.models.attention_pallas`), so
the comparison and the loss cover the valid queries only.  Not under ``jax.checkpoint``:
interpret mode runs the kernel through ordered IO callbacks, which remat refuses on CPU
(the TPU compile of the update, with remat, is the check there).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ais_jax.models import attention as att
from ais_jax.models import attention_pallas as ap

B, T, Q, K, H = 2, 100, 4, 2, 8
VALID = jnp.ones((B, T), bool).at[0, :37].set(False).at[1, 60:63].set(False)


def _qkv():
    kq, kk, kv = jax.random.split(jax.random.key(3), 3)
    return (
        jax.random.normal(kq, (B, T, Q, H)),
        jax.random.normal(kk, (B, T, K, H)),
        jax.random.normal(kv, (B, T, K, H)),
    )


def _loss(impl, mask, w):
    """Weighted sum of the valid queries' outputs (padding queries' rows weighted 0)."""

    def f(q, k, v):
        o = att.attend(q, k, v, mask, impl)
        return jnp.sum(o * w * VALID[..., None])

    return f


@pytest.mark.slow  # interpret mode: ~7-10 s each on the shared cores
@pytest.mark.parametrize("causal", [True, False])
def test_pallas_matches_reference_forward_and_gradient_f32(causal):
    q, k, v = _qkv()
    mask = att.causal_mask(VALID) if causal else att.bidirectional_mask(VALID)
    w = jax.random.normal(jax.random.key(4), (B, T, Q * H))
    vp, gp = jax.value_and_grad(_loss("pallas", mask, w), (0, 1, 2))(q, k, v)
    vr, gr = jax.value_and_grad(_loss("reference", mask, w), (0, 1, 2))(q, k, v)
    op, orf = att.attend(q, k, v, mask, "pallas"), att.attend(q, k, v, mask, "reference")
    ok = np.asarray(VALID)[..., None]
    np.testing.assert_allclose(np.where(ok, op, 0), np.where(ok, orf, 0), atol=1e-5, rtol=1e-5)
    assert np.all(np.isfinite(op))  # padding queries too
    np.testing.assert_allclose(vp, vr, rtol=1e-5)
    for a, b in zip(gp, gr, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)


def test_pallas_falls_back_where_the_kernel_does_not_fit():
    q, k, v = _qkv()
    # queries at a cache offset (T != S): the reference attention, exactly
    mask = att.causal_mask(VALID, 90, 10)
    o = att.attend(q[:, :10], k, v, mask, "pallas")
    assert np.array_equal(o, att.attend(q[:, :10], k, v, mask, "reference"))
    assert ap.padded_len(767) == 768 and ap.padded_len(128) == 128 and ap.padded_len(1) == 128
    with pytest.raises(ValueError, match="one query per key slot"):
        ap.flash(q[:, :10], k, v, VALID, causal=True)


@pytest.mark.slow  # interpret mode through a 2-layer model: ~10-20 s on the shared cores
def test_model_logprobs_and_gradient_pallas_equal_reference():
    from ais_jax.models.model import ModelConfig, init_params
    from ais_jax.training.logprobs import completion_logprobs

    prompt = jax.random.randint(jax.random.key(1), (2, 12), 0, 50)
    pmask = jnp.ones((2, 12), bool).at[0, :5].set(False)
    tokens = jax.random.randint(jax.random.key(2), (2, 20), 0, 50)
    out = {}
    for impl in ("reference", "pallas"):
        cfg = ModelConfig(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=8,
            qk_norm=True,
            attention=impl,
        )
        params = init_params(jax.random.key(0), cfg)

        def loss(p, cfg=cfg):
            lp = completion_logprobs(p, prompt, pmask, tokens, cfg, remat="none")
            return jnp.sum(lp), lp

        out[impl] = jax.grad(loss, has_aux=True)(params)
    (g_ref, lp_ref), (g_got, lp_got) = out["reference"], out["pallas"]
    np.testing.assert_allclose(lp_got, lp_ref, atol=2e-5)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.slow  # interpret mode through LLaDA's 2 layers: ~10 s on the shared cores
def test_llada_forward_pallas_equals_reference():
    import dataclasses

    from ais_jax.models.llada import model as llada

    base = llada.LLaDAConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        mask_token_id=39,
    )
    params = llada.init_params(jax.random.key(0), base)
    tokens = jax.random.randint(jax.random.key(3), (2, 11), 0, 40)
    mask = jnp.ones((2, 11), bool).at[0, :4].set(False).at[1, 7].set(False)
    fwd = jax.jit(llada.forward, static_argnums=2)
    ref = fwd(params, tokens, dataclasses.replace(base, attention="reference"), mask)
    got = fwd(params, tokens, dataclasses.replace(base, attention="pallas"), mask)
    np.testing.assert_allclose(got[mask], ref[mask], atol=2e-5)


def test_rotate_half_matrix_and_matmul_rope_are_exact():
    from ais_jax.models import model as mm

    r = mm.rotate_half_matrix(4)
    x = jnp.arange(1.0, 5.0)  # [1, 2, 3, 4] -> [-3, -4, 1, 2]
    assert np.array_equal(x @ r, jnp.array([-3.0, -4.0, 1.0, 2.0]))
    inv = mm.rope_inv_freq(mm.ModelConfig(64, 32, 48, 1, 4, 2, 8))
    pos = jnp.array([[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]])
    for dtype in (jnp.float32, jnp.bfloat16):
        q = jax.random.normal(jax.random.key(5), (2, 5, 3, 8)).astype(dtype)  # [B, T, N, H]
        want = mm.apply_rope(q, pos, inv)
        got = mm.apply_rope(q.transpose(0, 2, 1, 3), pos, inv, heads_axis=1, matmul=True)
        assert np.array_equal(np.asarray(got.transpose(0, 2, 1, 3)), np.asarray(want))


def test_kernel_len_and_head_major_choice():
    import dataclasses

    from ais_jax.models import model as mm

    cfg = mm.ModelConfig(64, 32, 48, 1, 4, 2, 8, attention="pallas")
    assert att.kernel_len(cfg, 767) == 768 and att.kernel_len(cfg, 256) == 256
    assert att.kernel_len(cfg, 1) == 1  # a decode step: no kernel
    ref = dataclasses.replace(cfg, attention="reference")
    assert att.kernel_len(ref, 767) == 767
    lp = jax.tree.map(lambda a: a[0], mm.init_params(jax.random.key(0), cfg)["layers"])
    h = jnp.zeros((1, 7, 32))
    assert mm.heads_major(lp, cfg, h) and not mm.heads_major(lp, ref, h)
    assert not mm.heads_major({**lp, "wq": object()}, cfg, h)  # a quantized / LoRA weight
    assert not mm.heads_major({"wqkv": lp["wq"]}, cfg, h)  # the rollout's fused layout


@pytest.mark.slow  # interpret mode, one block: ~10 s on the shared cores
def test_head_major_block_equals_token_major_reference():
    """`_layer` on the kernel's head-major path (biases, q/k norm, head_dim 12, one kv head,
    llama3 rope) against the token-major reference block: outputs, k / v and gradients of the
    valid positions, float32."""
    import dataclasses

    from ais_jax.models import model as mm
    from tests._models import FULL, random_params

    cfg = dataclasses.replace(FULL, num_layers=1)
    lp = jax.tree.map(lambda a: a[0], random_params(cfg)["layers"])
    valid = jnp.ones((2, 20), bool).at[0, :5].set(False)
    x = jax.random.normal(jax.random.key(6), (2, 20, cfg.hidden_size))
    w = jax.random.normal(jax.random.key(7), x.shape) * valid[..., None]
    pos, mask, inv = mm.positions_from_mask(valid), att.causal_mask(valid), mm.rope_inv_freq(cfg)

    def run(impl):
        c = dataclasses.replace(cfg, attention=impl)

        def loss(lp, x):
            y, (k, v) = mm._layer(x, lp, pos, mask, inv, c)
            return jnp.sum(y * w), (y, k, v)

        return jax.grad(loss, (0, 1), has_aux=True)(lp, x)

    assert mm.heads_major(lp, dataclasses.replace(cfg, attention="pallas"), x)
    (gp, outp), (gr, outr) = run("pallas"), run("reference")
    ok = np.asarray(valid)[..., None]
    for a, b in zip(outp, outr, strict=True):
        a, b = np.asarray(a).reshape(2, 20, -1), np.asarray(b).reshape(2, 20, -1)
        np.testing.assert_allclose(np.where(ok, a, 0), np.where(ok, b, 0), atol=2e-5, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(gr), strict=True):
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


_MESH_CHILD = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from ais_jax.models import attention as att, attention_pallas as ap
from ais_jax.training import sharding as shd

def rows(q, k, v, seg, causal):  # a jnp stand-in for the kernel (interpret mode cannot shard)
    G = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, G, 1), jnp.repeat(v, G, 1)
    s = jnp.einsum("bnth,bnsh->bnts", q, k)
    T = q.shape[2]
    vis = (seg[:, :, None] == seg[:, None, :]) & (jnp.arange(T)[:, None] >= jnp.arange(T))
    p = jax.nn.softmax(jnp.where(vis[:, None], s, -1e30), -1)
    return jnp.einsum("bnts,bnsh->bnth", p, v)

ap._interpreted = rows
B, Q, K, T, H = 4, 4, 2, 128, 8
q, k, v = (jax.random.normal(jax.random.key(i), (B, n, T, H)) for i, n in enumerate((Q, K, K)))
valid = jnp.ones((B, T), bool).at[0, :30].set(False)
def loss(mesh):
    f = lambda q, k, v: jnp.sum(ap.flash_heads(q, k, v, valid, True, mesh) ** 2)
    return jax.jit(jax.value_and_grad(f, (0, 1, 2)))
want = loss(None)(q, k, v)
for mesh in (shd.make_mesh(1, 4, 1), shd.make_mesh(1, 2, 2)):
    fwd = jax.jit(lambda q, k, v: ap.flash_heads(q, k, v, valid, True, mesh))
    text = fwd.lower(q, k, v).as_text()
    assert any(s in text for s in ("manual_computation", "SPMDFullToShardShape")), text[:300]
    got = loss(mesh)(q, k, v)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
print("ok")
"""


@pytest.mark.slow  # a child interpreter on 4 host devices: ~20 s on the shared cores
def test_kernel_runs_under_shard_map_on_a_mesh():
    """On a mesh of several devices the kernel call is shard_mapped (rows over fsdp, heads over
    tensor): same values and gradients as one device (a jnp stand-in for the kernel: Pallas's
    interpret mode cannot run sharded; the TPU compile of the 8B update is the check there)."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", _MESH_CHILD], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def test_an_explicit_pallas_off_tpu_is_announced_on_cpu_and_refused_on_gpu():
    from ais_jax.core.errors import UsageError
    from ais_jax.training.steps import interpret_note

    note = interpret_note("pallas", "cpu")
    assert note is not None and "interpret mode" in note and "model.attention=auto" in note
    assert interpret_note("pallas", "tpu") is None
    for other in ("auto", "reference", "chunked", "cudnn"):
        assert interpret_note(other, "cpu") is None
        assert interpret_note(other, "gpu") is None
    with pytest.raises(UsageError, match=r"runs only on TPU.*not on gpu"):
        interpret_note("pallas", "gpu")
