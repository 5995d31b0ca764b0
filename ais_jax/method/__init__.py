"""The method, as pure math on log-probs, advantages and masks, with no model knowledge.

Holds `ais` (the AIS coefficient), `corrections` (every correction mode: TIS, masks, sequence
ratios, AIS), `grpo` (group advantages and the clipped GRPO objective with k3 KL) and
`distributions` (the sampling distribution shared by sampler and trainer: temperature,
top-k / top-p, token log-probs, inverse-CDF draws). May import only `ais_jax.core`.
"""
