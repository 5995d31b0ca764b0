"""Training: everything that turns a config and a policy into updated parameters.

Holds completion log-probs at scale (`logprobs`), the model side of the GRPO loss (`policy`),
the update (`trainer`), the jitted step programs (`steps`), the optimizer (`optim`), sharding
and host placement (`sharding`, `placement`), one RL step on the host (`rl`), the supervised warm
start (`warmstart`), held-out evaluation (`evaluation`), a run built from its config (`build`)
and the LLaDA estimator, warm start and diffu-GRPO programs (`llada/`). May import every layer
below it (core, method, models, rollout, tasks, config); never `ais_jax.run`.
"""
