"""The LLaDA masked-diffusion model (`model`: bidirectional decoder, mask token, FP8 rollout copy)
and its checkpoint format (`checkpoint`). Same layer as `ais_jax.models`."""
