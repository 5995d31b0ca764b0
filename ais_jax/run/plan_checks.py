"""Checks of a plan's inputs made before JAX creates a device or traces a program.

`check_devices` bounds ``--devices`` by the mesh and by what JAX can simulate;
`check_plan_sizes` refuses a run whose largest arrays exceed all devices' memory together
(past int64 elements XLA would abort the process).  Used by `ais_jax.run.plan`.
"""

from __future__ import annotations

from typing import Any

from ais_jax.config.schema import Config
from ais_jax.core.errors import UsageError

# JAX creates every simulated CPU device up front (8,192 take about a minute and 1 GB here;
# 100,000 crash it), so larger counts are refused before any is made.
MAX_DEVICES = 65_536


def check_devices(n: int, cfg: Config) -> None:
    """``--devices``: at least 1, at most `MAX_DEVICES`, a multiple of the mesh's size.

    Checked before JAX creates any device (`configure_devices`).

    Raises:
      UsageError: one line naming the count, the limit or the mesh, and the fix.
    """
    m = cfg.mesh
    need = m.data * m.fsdp * m.tensor
    if n < 1:
        raise UsageError(f"--devices must be >= 1, got {n}")
    if n > MAX_DEVICES:
        raise UsageError(f"--devices {n} is more than the {MAX_DEVICES:,} a plan can simulate; "
                         f"use the mesh's size (mesh.data x mesh.fsdp x mesh.tensor = {need}): "
                         "devices outside the mesh do not change the memory per device")
    if need > n:
        raise UsageError(f"mesh data={m.data} x fsdp={m.fsdp} x tensor={m.tensor} needs {need} "
                         f"devices but only {n} are given (--devices {n}); raise --devices or "
                         "lower the mesh sizes")
    if n % need:
        raise UsageError(f"--devices {n} is not a multiple of the mesh's {need} devices "
                         f"(mesh.data={m.data} x mesh.fsdp={m.fsdp} x mesh.tensor={m.tensor}); "
                         f"use --devices {need}")


def check_plan_sizes(cfg: Config, model_cfg: Any, prompt_len: int, devices: int,
                     device_memory: int) -> None:
    """The plan's largest arrays fit the memory of all ``devices`` together; else UsageError.

    Checked before tracing: an array larger than every device's memory together fits in no
    sharding, and past int64 elements XLA aborts the process (a C++ ``terminate``), so such
    a run is refused with its size instead of traced.  The arrays, at one byte an element (a
    lower bound: FP8 is the smallest dtype here): a layer weight stacked over the layers,
    the embedding, the rollout's KV cache, and per micro-batch of the update the kept layer
    inputs, one layer's MLP activations and attention scores, and a chunk of logits.

    Args:
      cfg: the run config (``rollout.*``, ``train.minibatches``, ``train.micro_batch_size``,
        ``train.logprob_chunk``).
      model_cfg: the `ModelConfig` (or LLaDA config) of `resolve_model_config`.
      prompt_len: the prompt bucket ``P``.
      devices: the device count.
      device_memory: bytes of one device.

    Raises:
      UsageError: one line naming the array, its bytes and the memory of all devices.
    """
    r, t = cfg.rollout, cfg.train
    B, S = r.prompts_per_step * r.group_size, prompt_len + r.max_new_tokens
    rows = t.micro_batch_size or max(1, B // max(1, t.minibatches))
    L, D, F = model_cfg.num_layers, model_cfg.hidden_size, model_cfg.intermediate_size
    V, Q, H = model_cfg.vocab_size, model_cfg.num_heads, model_cfg.head_dim
    K = getattr(model_cfg, "num_kv_heads", Q)
    chunk = min(t.logprob_chunk or S, S)
    arrays = {
        f"the stacked MLP weights [L={L}, D={D}, F={F}]": L * D * F,
        f"the stacked attention weights [L={L}, D={D}, Q*H={Q * H}]": L * D * Q * H,
        f"the embedding [V={V}, D={D}]": V * D,
        f"the KV cache [L={L}, 2, rows={B}, S={S}, K*H={K * H}]": L * 2 * B * S * K * H,
        f"the kept layer inputs [L={L}, rows={rows}, S={S}, D={D}]": L * rows * S * D,
        f"one layer's MLP activations [rows={rows}, S={S}, F={F}]": rows * S * F,
        f"one layer's attention scores [rows={rows}, Q={Q}, S={S}, S={S}]": rows * Q * S * S,
        f"a chunk of logits [rows={rows}, {chunk}, V={V}]": rows * chunk * V,
    }
    total = devices * device_memory
    for what, elements in arrays.items():
        if elements > total:
            raise UsageError(f"{what} take at least {elements:.3g} bytes, more than the "
                             f"{devices} device(s) hold together ({total:.3g} bytes of "
                             "--device-memory x --devices): this run fits in no sharding; lower "
                             "the model or batch sizes, or raise --devices / --device-memory")
