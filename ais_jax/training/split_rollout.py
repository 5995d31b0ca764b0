"""The sampler on devices of its own (``mesh.rollout_devices = R``, issue 40 item 2).

The visible devices split into the trainer's mesh (the first ``data x fsdp x tensor``) and a
rollout mesh of the next ``R`` devices (``data = R``: each holds the whole rollout copy and
``1 / R`` of the rows).  Each rollout then runs three programs, dispatched without waiting:

1. ``quantize`` on the trainer's devices: the rollout copy (BF16, FP8 / FP4-quantized) of the
   current params, laid out without the FSDP axis (`ais_jax.training.steps.rollout_params`);
2. a transfer of that copy to the rollout devices (FP8 bytes on the wire, not BF16 / f32), and
   of the prompts;
3. ``sample`` on the rollout devices; its batch is transferred back to the trainer's rows.

With ``rollout.staleness >= 1`` the sampler of step t + k then runs while the trainer updates
on step t, on other devices.  The numbers are those of the shared-device program (the same
quantization and sampler; tests/test_split_rollout.py).
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from ais_jax.config.schema import Config
from ais_jax.models import fused
from ais_jax.models.model import ModelConfig
from ais_jax.rollout import sampler
from ais_jax.training import sharding as shd
from ais_jax.training.trainer import RolloutBatch


def check_devices(cfg: Config) -> None:
    """One line (`UsageError`) when the trainer's mesh plus ``mesh.rollout_devices`` needs
    more devices than are visible, or the run has several processes (not supported yet)."""
    from ais_jax.core.errors import UsageError

    m, n_dev, n_proc = cfg.mesh, len(jax.devices()), jax.process_count()
    need = m.data * m.fsdp * m.tensor + m.rollout_devices
    if need > n_dev:
        raise UsageError(
            f"mesh data={m.data} x fsdp={m.fsdp} x tensor={m.tensor} plus mesh.rollout_devices="
            f"{m.rollout_devices} needs {need} devices but only {n_dev} are visible; lower them "
            "(on CPU, JAX_NUM_CPU_DEVICES=N simulates N devices)")
    if n_proc > 1:
        raise UsageError(f"mesh.rollout_devices={m.rollout_devices} runs in one process only so "
                         f"far (this run has {n_proc}); set mesh.rollout_devices=0")


def rollout_mesh(cfg: Config, trainer_devices: int) -> Mesh | None:
    """The rollout mesh: devices ``trainer_devices .. trainer_devices + R - 1`` as
    ``(data=R, fsdp=1, tensor=1)``; None when ``mesh.rollout_devices`` is 0."""
    r = cfg.mesh.rollout_devices
    if not r:
        return None
    devices = jax.devices()[trainer_devices:trainer_devices + r]
    return shd.make_mesh(r, 1, 1, devices=devices)


class SplitRollout:
    """``rollout(params, prompt_tokens, prompt_mask, key) -> RolloutBatch`` as the shared
    program's, run as quantize (trainer) -> transfer -> sample (rollout devices) -> transfer.

    Args:
      params: the trainer's params (abstract shapes are enough).
      param_shardings: the trainer's params shardings.
      batch_sharding: the trainer's batch sharding (the batch comes back to it).
      mesh: the trainer's mesh.
      rmesh: the rollout mesh (`rollout_mesh`).
      model_cfg: model config.
      cfg: the run's config.
      ids: `ais_jax.training.steps.TokenIds`.
    """

    def __init__(self, params: Any, param_shardings: Any, batch_sharding: Any, mesh: Mesh,
                 rmesh: Mesh, model_cfg: ModelConfig, cfg: Config, ids: Any) -> None:
        from ais_jax.training.steps import kv_format, resolve_precision, rollout_params

        r = resolve_precision(cfg.rollout, rmesh.devices.flat[0].device_kind)
        self.batch_sharding, self.rmesh = batch_sharding, rmesh
        self.rb2 = shd.batch_sharding(rmesh, 2)

        def quantize(params: Any) -> Any:
            rp = rollout_params(params, r)
            return fused.fuse_linears(rp) if r.fused_linears else rp

        shapes = jax.eval_shape(quantize, params)
        self._copy_trainer = shd.param_shardings(shapes, mesh, rollout=True)
        self._copy_rollout = shd.param_shardings(shapes, rmesh, rollout=True)
        self.quantize = jax.jit(quantize, in_shardings=(param_shardings,),
                                out_shardings=self._copy_trainer)

        def sample(rp: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array,
                   key: jax.Array) -> RolloutBatch:
            import jax.numpy as jnp

            out = sampler.sample(
                rp, prompt_tokens, prompt_mask, key, model_cfg, max_new_tokens=r.max_new_tokens,
                temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                eos_id=ids.eos_ids or None, num_samples=r.group_size, kv_fp8=kv_format(r),
                pad_id=ids.pad_id)
            G = r.group_size
            return RolloutBatch(jnp.repeat(prompt_tokens, G, axis=0),
                                jnp.repeat(prompt_mask, G, axis=0), out.tokens,
                                out.mask.astype(jnp.float32), out.logp.astype(jnp.float32))

        rb = RolloutBatch(*(self.rb2,) * 5)
        self.sample = jax.jit(sample, in_shardings=(self._copy_rollout, self.rb2, self.rb2,
                                                    shd.replicated(rmesh)), out_shardings=rb)

    def __call__(self, params: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array,
                 key: jax.Array) -> RolloutBatch:
        copy = jax.device_put(self.quantize(params), self._copy_rollout)  # FP8 on the wire
        batch = self.sample(copy, jax.device_put(prompt_tokens, self.rb2),
                            jax.device_put(prompt_mask, self.rb2),
                            jax.device_put(key, shd.replicated(self.rmesh)))
        return jax.device_put(batch, RolloutBatch(*(self.batch_sharding,) * 5))

    def _cache_size(self) -> int:
        """Compilations of the sampler program (the run's compile count of ``rollout``)."""
        return self.sample._cache_size()


def split_fns(fns: Any, params: Any, mesh: Mesh, model_cfg: ModelConfig, cfg: Config,
              ids: Any) -> Any:
    """``fns`` (`ais_jax.training.steps.StepFns`) with its rollout replaced by a `SplitRollout`
    on the rollout mesh (`rollout_mesh`); ``params``: the trainer's (abstract) params."""
    rmesh = rollout_mesh(cfg, mesh.devices.size)
    return fns._replace(rollout=SplitRollout(params, fns.state_shardings.params,
                                             fns.batch_sharding, mesh, rmesh, model_cfg, cfg,
                                             ids))
