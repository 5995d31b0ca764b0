"""Training of LLaDA policies: the diffu-GRPO log-prob estimator (`estimator`), the
masked-diffusion warm start (`sft`) and the diffu-GRPO step programs (`steps`). Same layer as
`ais_jax.training`."""
