"""diffu-GRPO with LoRA for LLaDA policies: the LLaDA programs over a frozen base.

The diffusion counterpart of `ais_jax.training.steps._lora_step_fns`, with the same contract
(`ais_jax.training.lora_policy`): the `ais_jax.training.optim.TrainState`'s ``params`` are the
adapters ``{"layers": {name: {"a": [L, r, in], "b": [L, out, r]}}}`` (float32 master weights,
the only optimizer state), the frozen base rides in the `LoraPolicy` in the compute dtype, and
each program takes it first (not donated, not differentiated), wrapped in
`ais_jax.training.lora_policy.Bound` so the host loop calls them as without LoRA:

* rollout: the FP8 (or FP4 / BF16) copy is quantized from ``lora.merge(base, adapters)``,
  which also gives the rollout side of the estimator pair (``batch.logp``);
* score (``logp_old``: the estimates, and the trajectory replay with
  ``diffusion.ratio=trajectory``) and every update forward: ``with_adapters(base, adapters)``
  (LLaDA's `ais_jax.models.llada.model.forward` runs unchanged on the `LoraWeight` leaves);
* the KL reference (``train.beta_kl > 0``): the base itself, adapters off;
* LoRA dropout (``lora.dropout > 0``): only the update's loss forward draws masks
  (`ais_jax.training.lora_policy.dropout_key`); the score stays deterministic.

The warm start (scratch source) is LLaDA's masked-diffusion SFT over full params; its result
becomes the base (`LoraPolicy.set_base`), as on the AR path.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from jax.sharding import Mesh

from ais_jax.config.schema import Config
from ais_jax.models.llada.model import LLaDAConfig
from ais_jax.training.llada import steps as ls
from ais_jax.training.optim import TrainState


def build_lora_step_fns(state: TrainState, mesh: Mesh, optimizer: optax.GradientTransformation,
                        sft_optimizer: optax.GradientTransformation | None, lcfg: LLaDAConfig,
                        cfg: Config, eos_ids: tuple[int, ...], pad_id: int | None,
                        pol: Any) -> Any:
    """LLaDA's rollout / score / update programs with LoRA (`ais_jax.training.steps.StepFns`).

    Args:
      state: the initial state; its params are the adapters.
      mesh: the trainer's mesh.
      optimizer: the GRPO optimizer (over the adapters).
      sft_optimizer: the warm start's optimizer (full params of the base), or None.
      lcfg: the LLaDA model config.
      cfg: the run config.
      eos_ids: ids ending a response.
      pad_id: prompt padding id (the warm start's), or None.
      pol: the run's `ais_jax.training.lora_policy.LoraPolicy` (frozen base, LoRA settings).

    Returns:
      `ais_jax.training.steps.StepFns` whose rollout / score / update are `Bound` to
      ``pol`` (called with the state's adapters) and whose ``model_shardings`` are the base's.
    """
    from ais_jax.training import lora_policy as lp
    from ais_jax.training.steps import StepFns

    # LLaDA's programs and shardings for the adapter state (their SFT program works on the
    # full params of the warm start, whatever the state holds)
    full = ls.build_step_fns(state, mesh, optimizer, sft_optimizer, lcfg, cfg, eos_ids, pad_id,
                             lora_cfg=pol.cfg)
    st_sh, base_sh, lora_cfg = full.state_shardings, pol.base_shardings, pol.cfg
    batch_sh, old_sh, b2, rep = ls.shardings(mesh, cfg)

    def rollout_fn(base, adapters, pt, pm, key):
        merged = lp.merged(base, adapters, lora_cfg)
        return ls.rollout(merged, pt, pm, key, lcfg, cfg, eos_ids, mesh)

    def score_fn(base, adapters, batch):
        return ls.score(adapters, batch, lcfg, cfg, lp.view(base, lora_cfg), mesh)

    def update_fn(base, state, batch, rewards, key, ref_params, logp_old):
        del ref_params  # the KL reference is the base
        ref = base if cfg.train.beta_kl > 0 else None
        return ls.update(state, batch, rewards, key, ref, logp_old, optimizer, lcfg, cfg, mesh,
                         view=lp.view(base, lora_cfg),
                         dropout_key=lp.dropout_key(key, lora_cfg))

    rollout_jit = jax.jit(rollout_fn, in_shardings=(base_sh, st_sh.params, b2, b2, rep),
                          out_shardings=batch_sh)
    score_jit = jax.jit(score_fn, in_shardings=(base_sh, st_sh.params, batch_sh),
                        out_shardings=old_sh)
    update_jit = jax.jit(update_fn,
                         in_shardings=(base_sh, st_sh, batch_sh, b2, rep, None, old_sh),
                         out_shardings=(st_sh, rep), donate_argnums=(1,))
    return StepFns(lp.Bound(rollout_jit, pol), lp.Bound(score_jit, pol),
                   lp.Bound(update_jit, pol), full.sft, st_sh, b2, True, base_sh)
