"""Sampling from a policy: the jitted samplers and the prompt codec.

Holds the autoregressive KV-cache sampler (`sampler`, with its argument checks in
`sampler_args`), the LLaDA denoising sampler (`llada_sampler`) and the prompt codec shared by the
CLIs (`codec`: chat templates, left padding, completion decoding). May import `ais_jax.core`,
`ais_jax.method` (the sampling distribution) and `ais_jax.models`.
"""
