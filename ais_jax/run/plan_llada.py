"""The memory plan of a LLaDA policy (``model.kind=llada``), for ``python -m ais_jax.plan``.

The masked-diffusion counterpart of `ais_jax.run.plan.make_plan`: the same
ahead-of-time compiles on abstract shapes over simulated devices, of the
programs `ais_jax.training.llada.steps.build_step_fns` builds:

- ``update``: the abstract `TrainState` (master params in ``model.param_dtype``,
  Adam moments), ``diffusion.inner_iterations`` guarded steps, each the estimator
  with per-block remat (``train.remat``), the head in ``train.logprob_chunk``
  chunks over the completion positions, batch-sharded activations and gradient
  accumulation over ``train.micro_batch_size`` rows, under FSDP (``mesh.fsdp``);
- ``rollout``: the FP8 copy (`ais_jax.training.steps.rollout_params`) and the
  denoising sampler, one forward over ``[rows, P + N]`` per step (LLaDA has no
  KV cache), plus the FP8 copy's estimates;
- ``score``: the trainer's detached estimates of the batch (its own program).

The model config is ``model.source``'s ``config.json`` (a LLaDA directory), the
scratch LLaDA model, or the preset of
`ais_jax.models.llada.checkpoint.LLADA_PRESETS` named like the source's last
path component (``/data/LLaDA-8B-Instruct`` -> ``LLaDA-8B-Instruct``).  The JSON
keys are the autoregressive plan's; the analytic part drops the KV cache and
the prefill logits and adds the sampler's per-step logits.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ais_jax.config.schema import Config
from ais_jax.core.errors import UsageError
from ais_jax.run.plan_report import (
    analytic_bytes,
    compile_init,
    compile_program,
    cpu_widening_probe,
    fits,
    plus_resident,
)


def resolve_llada_config(cfg: Config) -> tuple[Any, str]:
    """The `ais_jax.models.llada.model.LLaDAConfig` of ``cfg.model.source``, without weights.

    Args:
      cfg: the run config (``model.kind`` resolving to ``llada``).

    Returns:
      ``(LLaDAConfig, where it came from)``: ``"scratch"``, the config.json path or
      ``"preset NAME"``.

    Raises:
      UsageError: no LLaDA ``config.json`` and no preset of that name (names the presets),
        or a config.json that is not a supported LLaDA config.

    The config carries the run's ``model.attention`` settings.
    """
    from ais_jax.training.build import with_attention

    lcfg, origin = _resolve_llada_config(cfg)
    return with_attention(lcfg, cfg), origin


def _resolve_llada_config(cfg: Config) -> tuple[Any, str]:
    from ais_jax.models.llada.checkpoint import LLADA_PRESETS, config_from_dict
    from ais_jax.models.weight_files import read_json
    from ais_jax.training.build import scratch_llada_config

    src = cfg.model.source
    if src == "scratch":
        return scratch_llada_config(cfg), "scratch"
    path = os.path.join(src, "config.json")
    if os.path.isfile(path):
        try:
            return config_from_dict(read_json(path)), path
        except ValueError as e:
            raise UsageError(f"{path}: {e}") from None
    name = os.path.basename(src.rstrip("/\\")).lower()
    preset = {k.lower(): k for k in LLADA_PRESETS}.get(name)
    if preset is None:
        raise UsageError(f"model.source {src!r} has no config.json and matches no LLaDA preset "
                         f"({', '.join(LLADA_PRESETS)}); point it at a LLaDA directory")
    return config_from_dict(LLADA_PRESETS[preset]), f"preset {preset}"


def _compile_programs(cfg: Config, lcfg: Any, mesh: Any, state: Any, optimizer: Any,
                      prompt_len: int, pol: Any = None) -> dict[str, dict[str, float]]:
    """``{"update", "rollout", "score"}``: per-device bytes and compile seconds.

    The batch's abstract shapes come from the rollout program itself
    (``jax.eval_shape``), so the plan follows `ais_jax.training.llada.steps.DiffusionBatch`.
    ``pol``: LoRA's abstract `ais_jax.training.lora_policy.LoraPolicy` (the state then holds
    the adapters; `ais_jax.training.llada.lora_steps`), or None.
    """
    import jax
    import jax.numpy as jnp

    from ais_jax.training.llada import steps as ls

    r = cfg.rollout
    Pn, G, P = r.prompts_per_step, r.group_size, prompt_len
    eos = (lcfg.eos_token_id,) if lcfg.eos_token_id is not None else ()
    if pol is None:
        fns = ls.build_step_fns(state, mesh, optimizer, None, lcfg, cfg, eos, lcfg.pad_token_id)
    else:
        from ais_jax.training.llada.lora_steps import build_lora_step_fns

        fns = build_lora_step_fns(state, mesh, optimizer, None, lcfg, cfg, eos,
                                  lcfg.pad_token_id, pol)
    sds = jax.ShapeDtypeStruct
    key = jax.eval_shape(lambda: jax.random.key(0))
    prompts, pmask = sds((Pn, P), jnp.int32), sds((Pn, P), jnp.bool_)
    batch = jax.eval_shape(fns.rollout, state.params, prompts, pmask, key)
    logp_old = jax.eval_shape(fns.score, state.params, batch)
    ref = state.params if cfg.train.beta_kl > 0 and pol is None else None
    out = {}
    out["update"] = compile_program(fns.update.lower(state, batch, sds((Pn, G), jnp.float32), key,
                                                     ref, logp_old))
    out["rollout"] = compile_program(fns.rollout.lower(state.params, prompts, pmask, key))
    out["score"] = compile_program(fns.score.lower(state.params, batch))
    return out


def make_llada_plan(cfg: Config, devices: int, device_memory: int,
                    prompt_len: int, mesh: Any = None) -> dict[str, Any]:
    """The plan of a LLaDA run on ``devices`` devices (JAX must already see them).

    ``fits``: the start-up program's and the update's peaks, and the rollout's and the
    score's peaks plus the
    resident optimizer state (and the KL reference with ``train.beta_kl > 0``), are
    all at most ``device_memory``.

    Args:
      cfg: the run config (``model.kind`` resolving to ``llada``).
      devices: the device count (recorded).
      device_memory: bytes of one device.
      prompt_len: the prompt bucket ``P``.
      mesh: the mesh to compile for (default `build.build_mesh`).

    Returns:
      `ais_jax.run.plan.make_plan`'s JSON object (same keys) plus ``score`` and
      ``score_resident_peak_bytes``; ``model.kind`` is ``"llada"`` and the
      analytic part has ``sampler_logits_bytes`` in place of the KV cache.

    Raises:
      UsageError: unknown model source, indivisible batch, a prompt length the
        model's positions cannot hold.
    """
    import jax

    from ais_jax.config.checks import check_diffusion
    from ais_jax.models.llada.model import init_params, param_table
    from ais_jax.run.plan_report import abstract_state, check_batch, check_prompt_len
    from ais_jax.training import build
    from ais_jax.training import sharding as shd

    check_diffusion(cfg)
    lcfg, origin = resolve_llada_config(cfg)
    check_prompt_len(prompt_len, cfg, lcfg)
    mesh = build.build_mesh(cfg) if mesh is None else mesh
    shards = shd.batch_divisor(mesh)
    check_batch(cfg, shards)
    optimizer, _ = build.build_optimizers(cfg)
    state = full = abstract_state(cfg, lcfg, mesh, optimizer, param_table(lcfg))
    pol = None
    if cfg.lora.rank > 0:  # the state holds the adapters; the programs take the frozen base
        from ais_jax.run.plan_report import abstract_lora

        state, pol = abstract_lora(cfg, lcfg, mesh, full, optimizer)
    programs = {"init": compile_init(cfg, lcfg, mesh, state, optimizer, init_params, pol),
                **_compile_programs(cfg, lcfg, mesh, state, optimizer, prompt_len, pol)}
    r, t = cfg.rollout, cfg.train
    B, N = r.prompts_per_step * r.group_size, r.max_new_tokens
    analytic, resident = _llada_analytic(cfg, lcfg, mesh, state, full, pol, prompt_len, shards)
    roll_peak = plus_resident(programs["rollout"], resident)
    score_peak = plus_resident(programs["score"], resident)
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(full.params))
    plan: dict[str, Any] = {
        **programs, "devices": devices,
        "fits": fits([programs["update"]["peak_bytes"], programs["init"]["peak_bytes"],
                      roll_peak, score_peak], device_memory),
        "device_memory_bytes": device_memory, "rollout_resident_peak_bytes": roll_peak,
        "score_resident_peak_bytes": score_peak, "backend": jax.default_backend(),
        "model": {"source": cfg.model.source, "from": origin, "kind": "llada",
                  "params": n_params, "layers": lcfg.num_layers, "hidden": lcfg.hidden_size,
                  "vocab": lcfg.vocab_size, "lora_rank": cfg.lora.rank,
                  "param_dtype": cfg.model.param_dtype if pol is None else
                  f"{cfg.model.compute_dtype} frozen base + LoRA r={cfg.lora.rank} float32"},
        "mesh": {"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor},
        "shapes": {"prompts": r.prompts_per_step, "group": r.group_size, "rows": B,
                   "prompt_len": prompt_len, "new_tokens": N, "minibatches": t.minibatches,
                   "micro_batch_size": t.micro_batch_size,
                   "inner_iterations": cfg.diffusion.inner_iterations,
                   "block_length": cfg.diffusion.block_length,
                   "diffusion_steps": cfg.diffusion.steps},
        "analytic": analytic,
    }
    if plan["backend"] == "cpu":
        plan["cpu_widening"] = cpu_widening_probe(prompt_len + N, lcfg.hidden_size,
                                                  lcfg.intermediate_size)
    return plan


def _llada_analytic(cfg: Config, lcfg: Any, mesh: Any, state: Any, full: Any, pol: Any,
                    prompt_len: int, shards: int) -> tuple[dict[str, Any], int]:
    """`make_llada_plan`'s analytic bytes per device (`analytic_bytes` without the KV cache
    and the prefill, with the sampler's logits) and the bytes resident beside the rollout
    and the score (optimizer state, and the KL reference unless it is LoRA's base)."""
    B, N = cfg.rollout.prompts_per_step * cfg.rollout.group_size, cfg.rollout.max_new_tokens
    # LoRA: the params are the base (compute dtype), the optimizer state the adapters'
    analytic = analytic_bytes(cfg, lcfg, mesh, state if pol is None else full._replace(
        params=pol.base, opt_state=state.opt_state), prompt_len)
    del analytic["kv_cache_bytes"], analytic["prefill_logits_bytes"]  # no KV cache, no prefill
    # every denoising step: float32 logits of all rows x (P + N) positions, rows over the shards
    analytic["sampler_logits_bytes"] = math.ceil(B / shards) * (prompt_len + N) \
        * lcfg.vocab_size * 4
    # the KL reference is resident unless it is LoRA's frozen base (then it is the params)
    resident = analytic["opt_state_bytes"] + (analytic["params_bytes"] if cfg.train.beta_kl > 0
                                              and pol is None else 0)
    return analytic, resident
