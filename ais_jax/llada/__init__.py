"""LLaDA masked-diffusion LLMs: model, checkpoint format, sampler, log-prob estimator."""

from ais_jax.llada.checkpoint import config_from_dict, config_to_dict, load, save
from ais_jax.llada.estimator import (
    completion_logprobs,
    logprobs_given_input,
    mask_prompt,
    mismatch_stats,
)
from ais_jax.llada.model import (
    LLaDAConfig,
    forward,
    init_params,
    param_table,
    to_rollout_params,
)
from ais_jax.llada.sampler import DiffusionSample, generate, transfer_schedule

__all__ = [
    "DiffusionSample",
    "LLaDAConfig",
    "completion_logprobs",
    "config_from_dict",
    "config_to_dict",
    "forward",
    "generate",
    "init_params",
    "load",
    "logprobs_given_input",
    "mask_prompt",
    "mismatch_stats",
    "param_table",
    "save",
    "to_rollout_params",
    "transfer_schedule",
]
