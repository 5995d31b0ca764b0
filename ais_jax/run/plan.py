"""Memory per device of a run, before it runs: ``python -m ais_jax.plan --config PATH [k=v]``.

Compiles the rollout and update programs ahead of time on abstract shapes (no
weights, no data) over ``--devices N`` simulated CPU devices (docs/spec.md
section 7) and prints per device the compiled argument / output / temporary
bytes, an analytic breakdown, and whether the run fits in ``--device-memory``.
The model config is ``model.source``'s ``config.json``, else the preset of
`ais_jax.models.hf_config.HF_PRESETS` named like the source's last path component
(case-insensitive: ``/data/Qwen3-8B`` -> ``Qwen3-8B``).  A LLaDA policy is planned by
`ais_jax.run.plan_llada`.

Peak = argument + output + temp - alias bytes (a donated, aliased buffer counts
once); the rollout is judged with the resident optimizer state added.  The CPU
backend widens bf16 / FP8 dot operands to float32, so it overstates an
accelerator's temporaries (the text output measures it on one matmul).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ais_jax.config.load import load_config
from ais_jax.config.schema import SKIP_PATH_CHECK_ENV, Config
from ais_jax.core.errors import UsageError
from ais_jax.models.weight_files import read_json as _read_json
from ais_jax.run.plan_checks import MAX_DEVICES, check_devices, check_plan_sizes  # noqa: F401
from ais_jax.run.plan_report import (
    abstract_state,
    analytic_bytes,
    check_batch,
    check_prompt_len,
    compile_init,
    compile_program,
    cpu_widening_probe,
    fits,
    format_plan,
    parse_bytes,
    plus_resident,
)

_check_batch = check_batch  # the name tests/test_plan.py uses

if TYPE_CHECKING:  # jax is imported only after the device count is set (see `main`)
    import optax
    from jax.sharding import Mesh

    from ais_jax.models.model import ModelConfig

DEFAULT_PROMPT_LEN = 256
DEFAULT_DEVICE_MEMORY = "80GB"


def load_plan_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """`ais_jax.config.load.load_config` without the path checks (model and data need not exist).

    Args:
      path: YAML config file, or None for the dataclass defaults.
      overrides: dotted ``a.b=value`` overrides, as ``python -m ais_jax.train`` takes them.

    Returns:
      The validated `Config`.

    Raises:
      UsageError: missing file, unknown key, bad value.
    """
    old = os.environ.get(SKIP_PATH_CHECK_ENV)
    os.environ[SKIP_PATH_CHECK_ENV] = "1"
    try:
        return load_config(path, overrides)
    finally:
        if old is None:
            del os.environ[SKIP_PATH_CHECK_ENV]
        else:
            os.environ[SKIP_PATH_CHECK_ENV] = old


def configure_devices(n: int) -> None:
    """Make JAX see ``n`` CPU devices: env vars before import, config before backend start.

    Args:
      n: number of simulated devices.

    Raises:
      UsageError: JAX is already running with another device count.
    """
    if n < 1:
        raise UsageError(f"--devices must be >= 1, got {n}")
    if "jax" not in sys.modules:
        os.environ["JAX_NUM_CPU_DEVICES"] = str(n)
        os.environ["JAX_PLATFORMS"] = "cpu"
        return
    import jax
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_num_cpu_devices", n)
        jax.config.update("jax_platforms", "cpu")
    elif jax.device_count() != n:
        raise UsageError(f"jax is already initialized with {jax.device_count()} devices, not "
                         f"--devices {n}; run the plan in a fresh process")


def resolve_model_config(cfg: Config) -> tuple[ModelConfig, str]:
    """The model config of ``cfg.model.source``, without reading any weights.

    It carries the run's ``model.attention`` settings
    (`ais_jax.training.build.with_attention`), as the trainer's does.

    ``scratch``: the trainer's scratch model; a directory with a ``config.json``:
    that file (and ``generation_config.json``'s EOS ids); a LLaDA policy: see
    `ais_jax.run.plan_llada.resolve_llada_config`; otherwise the preset
    of `ais_jax.models.hf_config.HF_PRESETS` named like the last path component
    (case-insensitive, ``.gguf`` dropped; ``smollm2``: ``SmolLM2-135M``).

    Args:
      cfg: the run config.

    Returns:
      ``(ModelConfig, where it came from)``: ``"scratch"``, the config.json path
      or ``"preset NAME"``.

    Raises:
      UsageError: no ``config.json`` and no preset of that name (names the presets).
    """
    from ais_jax.training.build import with_attention

    model_cfg, origin = _resolve_model_config(cfg)
    return with_attention(model_cfg, cfg), origin


def _resolve_model_config(cfg: Config) -> tuple[ModelConfig, str]:
    from ais_jax.models.hf_config import HF_PRESETS, merge_generation_eos, model_config_from_hf
    from ais_jax.training.build import model_kind

    if model_kind(cfg) == "llada":  # a LLaDAConfig (`ais_jax.run.plan_llada`)
        from ais_jax.run.plan_llada import resolve_llada_config
        return resolve_llada_config(cfg)
    src = cfg.model.source
    if src == "scratch":
        from ais_jax.tasks import CharTokenizer
        from ais_jax.training.build import scratch_model_config

        m = cfg.model
        return scratch_model_config(
            CharTokenizer(), hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
            num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
            head_dim=m.head_dim), "scratch"
    path = os.path.join(src, "config.json")
    if os.path.isfile(path):
        model_cfg = model_config_from_hf(_read_json(path))
        gen = os.path.join(src, "generation_config.json")
        if os.path.isfile(gen):
            model_cfg = merge_generation_eos(model_cfg, _read_json(gen), gen)
        return model_cfg, path
    name = "SmolLM2-135M" if src == "smollm2" else os.path.basename(src.rstrip("/\\"))
    preset = {k.lower(): k for k in HF_PRESETS}.get(name.removesuffix(".gguf").lower())
    if preset is None:
        raise UsageError(f"model.source {src!r} has no config.json and matches no preset "
                         f"({', '.join(HF_PRESETS)}); point it at an HF directory")
    return model_config_from_hf(HF_PRESETS[preset]), f"preset {preset}"


def _compile_programs(cfg: Config, model_cfg: ModelConfig, mesh: Mesh, state: Any,
                      optimizer: optax.GradientTransformation,
                      prompt_len: int, lora_policy: Any = None) -> dict[str, dict[str, float]]:
    """``{"update", "rollout"}``: per-device ``memory_analysis()`` bytes and compile seconds."""
    import jax
    import jax.numpy as jnp

    from ais_jax.training import steps

    r = cfg.rollout
    Pn, B, P, N = r.prompts_per_step, r.prompts_per_step * r.group_size, prompt_len, \
        r.max_new_tokens
    eos = tuple(model_cfg.eos_token_ids) or ((model_cfg.eos_token_id,)
                                             if model_cfg.eos_token_id is not None else ())
    pad = model_cfg.pad_token_id if model_cfg.pad_token_id is not None else (eos[0] if eos else 0)
    fns = steps.build_step_fns(state, mesh, optimizer, None, model_cfg, cfg,
                               steps.TokenIds(eos, pad), lora_policy)
    sds = jax.ShapeDtypeStruct
    key = jax.eval_shape(lambda: jax.random.key(0))
    batch = steps.RolloutBatch(sds((B, P), jnp.int32), sds((B, P), jnp.bool_),
                               sds((B, N), jnp.int32), sds((B, N), jnp.float32),
                               sds((B, N), jnp.float32))
    ref = state.params if cfg.train.beta_kl > 0 and lora_policy is None else None
    out = {}
    # The run's update program: logp_old comes from the score program (a forward of the
    # same rows, smaller than the update) unless the update takes it from its own forward.
    logp_old = sds((B, N), jnp.float32) if fns.score_for_update else None
    out["update"] = compile_program(fns.update.lower(
        state, batch, sds((Pn, r.group_size), jnp.float32), key, ref, logp_old))
    out["rollout"] = compile_program(fns.rollout.lower(
        state.params, sds((Pn, P), jnp.int32), sds((Pn, P), jnp.bool_), key))
    return out


def make_plan(cfg: Config, devices: int, device_memory: int,
              prompt_len: int = DEFAULT_PROMPT_LEN, mesh: Mesh | None = None) -> dict[str, Any]:
    """The plan of ``cfg`` on ``devices`` devices (JAX must already see them).

    ``fits``: the start-up program's peak (`plan_report.compile_init`), the update's peak
    and the rollout's peak plus the optimizer state (resident while the rollout runs; plus
    the KL reference params if ``train.beta_kl > 0``) are all at most ``device_memory``.

    Args:
      cfg: the run config.
      devices: the device count (recorded; see `configure_devices`).
      device_memory: bytes of one device.
      prompt_len: the prompt bucket ``P``.
      mesh: the mesh to compile for (default `build.build_mesh`: the visible devices; a
        target's compile-only devices: `make_target_plan`).

    Returns:
      The JSON object `main` prints: ``init`` / ``update`` / ``rollout`` memory (bytes per
      device), ``devices``, ``fits``, ``device_memory_bytes``, ``model``,
      ``mesh``, ``shapes``, ``analytic``, ``rollout_resident_peak_bytes``.

    Raises:
      UsageError: unknown model source, too few devices, indivisible batch, a
        prompt length the model's positions cannot hold (`check_prompt_len`).
    """
    import jax

    from ais_jax.training import build
    from ais_jax.training import sharding as shd

    if build.model_kind(cfg) == "llada":  # the masked-diffusion programs
        from ais_jax.run.plan_llada import make_llada_plan
        return make_llada_plan(cfg, devices, device_memory, prompt_len, mesh)
    from ais_jax.models.model import init_params

    model_cfg, origin = resolve_model_config(cfg)
    check_prompt_len(prompt_len, cfg, model_cfg)
    mesh = build.build_mesh(cfg) if mesh is None else mesh
    check_batch(cfg, shd.batch_divisor(mesh))
    optimizer, _ = build.build_optimizers(cfg)
    state = abstract_state(cfg, model_cfg, mesh, optimizer)
    full, pol = state, None
    if cfg.lora.rank > 0:  # the state holds the adapters; the programs take the frozen base
        from ais_jax.run.plan_report import abstract_lora
        state, pol = abstract_lora(cfg, model_cfg, mesh, full, optimizer)
    programs = {"init": compile_init(cfg, model_cfg, mesh, state, optimizer, init_params, pol),
                **_compile_programs(cfg, model_cfg, mesh, state, optimizer, prompt_len, pol)}
    # LoRA: the params are the base (compute dtype), the optimizer state the adapters'
    analytic = analytic_bytes(cfg, model_cfg, mesh, state if pol is None else full._replace(
        params=pol.base, opt_state=state.opt_state), prompt_len)
    # The optimizer state (and the KL reference, unless it is LoRA's base) stay on the device.
    resident = analytic["opt_state_bytes"]
    if cfg.train.beta_kl > 0 and pol is None:
        resident += analytic["params_bytes"]
    roll_peak = plus_resident(programs["rollout"], resident)
    r = cfg.rollout
    plan: dict[str, Any] = {
        **programs, "devices": devices,
        "fits": fits([programs["update"]["peak_bytes"], programs["init"]["peak_bytes"],
                      roll_peak], device_memory),
        "device_memory_bytes": device_memory, "rollout_resident_peak_bytes": roll_peak,
        "backend": jax.default_backend(),
        "model": {"source": cfg.model.source, "from": origin, "params": model_cfg.num_params,
                  "layers": model_cfg.num_layers, "hidden": model_cfg.hidden_size,
                  "vocab": model_cfg.vocab_size, "lora_rank": cfg.lora.rank,
                  "param_dtype": cfg.model.param_dtype if pol is None else
                  f"{cfg.model.compute_dtype} frozen base + LoRA r={cfg.lora.rank} float32"},
        "mesh": {"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor},
        "shapes": {"prompts": r.prompts_per_step, "group": r.group_size,
                   "rows": r.prompts_per_step * r.group_size, "prompt_len": prompt_len,
                   "new_tokens": r.max_new_tokens, "minibatches": cfg.train.minibatches},
        "analytic": analytic,
    }
    if plan["backend"] == "cpu":
        plan["cpu_widening"] = cpu_widening_probe(
            prompt_len + r.max_new_tokens, model_cfg.hidden_size, model_cfg.intermediate_size)
    return plan


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2 (not argparse's usage block)
        raise UsageError(message)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 and one ``error:`` line on bad input).

    Args:
      argv: the arguments (default ``sys.argv[1:]``).
    """
    ap = _Parser(prog="python -m ais_jax.plan",
                 description="Per-device memory of a run's compiled programs, without weights.")
    ap.add_argument("--config", help="YAML config (default: configs/tiny_arithmetic.yaml)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. mesh.fsdp=8")
    ap.add_argument("--devices", type=int, help="simulated devices (default: the mesh product)")
    ap.add_argument("--target", help="compile for an accelerator with its own compiler, "
                    "deviceless: v5e-1, v5e-16, v6e-8, v5p-8, tpu7x-8, h100, h100x8, ... "
                    "(needs libtpu / the CUDA plugin; default: simulate on CPU)")
    ap.add_argument("--device-memory", default=None,
                    help="memory of one device, e.g. 80GB, 16GiB (default: the target's; "
                         "80GB for the CPU simulation)")
    ap.add_argument("--prompt-len", type=int, default=DEFAULT_PROMPT_LEN,
                    help=f"prompt bucket P (default {DEFAULT_PROMPT_LEN})")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    try:
        args = ap.parse_intermixed_args(argv)
        from ais_jax.config.schema import DEFAULT_CONFIG_PATH

        target = None
        if args.target is not None:
            from ais_jax.run import plan_target as pt

            target = pt.parse_target(args.target)
            if args.devices is not None:
                raise UsageError(f"--devices simulates CPU devices and --target {target.name} "
                                 f"brings its own {target.devices}; give one of them")
            missing = pt.plugin_missing(target)
            if missing:
                raise UsageError(missing)
        memory = parse_bytes(args.device_memory or (DEFAULT_DEVICE_MEMORY if target is None
                                                    else str(target.device_memory)))
        cfg = load_plan_config(args.config or DEFAULT_CONFIG_PATH, args.overrides)
        devices = (args.devices if args.devices is not None
                   else cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor)
        # before JAX makes any device or compiles anything
        check_devices(devices, cfg) if target is None else pt.check_target_mesh(target, cfg)
        model_cfg = resolve_model_config(cfg)[0]
        check_prompt_len(args.prompt_len, cfg, model_cfg)
        check_plan_sizes(cfg, model_cfg, args.prompt_len,  # before tracing
                         devices if target is None else target.devices, memory)
        if target is None:
            configure_devices(devices)
            plan = make_plan(cfg, devices, memory, args.prompt_len)
        else:
            pt.prepare_env(target)
            configure_devices(1)  # the default backend stays one CPU device
            plan = pt.make_target_plan(cfg, target, memory, args.prompt_len, make_plan)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while compiling: one line, as the train CLI
        print("interrupted; no plan was printed (rerun the same command for it)",
              file=sys.stderr)
        return 130
    print(json.dumps(plan) if args.json else format_plan(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
