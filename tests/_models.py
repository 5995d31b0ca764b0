"""The tiny decoder configs and random params that the model and decode tests share."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from ais_jax.models import model

TINY = model.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=8)
# Every optional piece at once: biases everywhere, q/k norm, head_dim != D / Q, llama3 rope.
FULL = dataclasses.replace(TINY, head_dim=12, num_kv_heads=1, qkv_bias=True, o_bias=True,
                           mlp_bias=True, qk_norm=True, rope_scaling=(8.0, 1.0, 4.0, 32))


def random_params(cfg: model.ModelConfig, seed: int = 0) -> dict:
    """init_params' tree with norms and biases away from 1 / 0 and unit-scale activations."""
    rng = np.random.default_rng(seed)
    spec = jax.eval_shape(lambda: model.init_params(jax.random.key(0), cfg))

    def fill(path, x):
        name = jax.tree_util.keystr(path)
        r = rng.standard_normal(x.shape, np.float32)
        if "norm" in name:
            return jnp.asarray(1.0 + 0.3 * r)
        if "'b" in name:  # bq, bk, bv, bo, b_gate, b_up, b_down
            return jnp.asarray(0.3 * r)
        return jnp.asarray(r if "embed" in name else r / math.sqrt(x.shape[-1]))

    return jax.tree_util.tree_map_with_path(fill, spec)


def left_padded(cfg: model.ModelConfig, B: int, T: int, pads: list[int], seed: int = 0):
    tokens = jax.random.randint(jax.random.key(seed), (B, T), 0, cfg.vocab_size)
    mask = jnp.arange(T)[None, :] >= jnp.asarray(pads)[:, None]  # [B, T]
    return tokens, mask
