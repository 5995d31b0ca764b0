"""ais_jax: FP8-rollout GRPO with Adaptive Importance Sampling in JAX."""
