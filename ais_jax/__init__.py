"""ais_jax: FP8-rollout GRPO with Adaptive Importance Sampling (AIS) in JAX.

The public contract (docs/spec.md section 8) is importable from the top level;
heavier pieces are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ais_coefficient": "ais_jax.method.ais",
    "AISResult": "ais_jax.method.ais",
    "group_advantages": "ais_jax.method.grpo",
    "grpo_loss": "ais_jax.method.grpo",
    "token_logprobs": "ais_jax.method.distributions",
    "sequence_logprobs": "ais_jax.training.policy",
    "QuantArray": "ais_jax.models.fp8",
    "quantize": "ais_jax.models.fp8",
    "dequantize": "ais_jax.models.fp8",
    "to_rollout_params": "ais_jax.models.fp8",
    "ModelConfig": "ais_jax.models.model",
    "init_params": "ais_jax.models.model",
    "forward": "ais_jax.models.model",
    "load_pretrained": "ais_jax.models.pretrained",
    "save_pretrained": "ais_jax.models.pretrained",
    "load_tokenizer": "ais_jax.models.pretrained",
    "sample": "ais_jax.rollout.sampler",
    "Rollout": "ais_jax.rollout.sampler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ais_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
