"""The arithmetic and the report of `ais_jax.run.plan`: byte sizes, the analytic breakdown, the
table.

`check_prompt_len` / `check_batch` refuse shapes a run cannot take;
`abstract_state` lays out the train state as sharded ShapeDtypeStructs;
`compiled_memory` reads a compiled program's bytes; `analytic_bytes` estimates
per-device memory from the shapes (next to the compiled numbers);
`cpu_widening_probe` measures how much the CPU backend overstates temporaries;
`format_plan` renders a plan as text.  Shared by `ais_jax.run.plan` and
`ais_jax.run.plan_llada`.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from ais_jax.config.schema import Config
from ais_jax.core.errors import UsageError

if TYPE_CHECKING:
    import optax
    from jax.sharding import Mesh

    from ais_jax.models.model import ModelConfig

GB = 1e9
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
MEMORY_KEYS = ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "peak_bytes")



def check_prompt_len(prompt_len: int, cfg: Config, model_cfg: ModelConfig) -> None:
    """``--prompt-len`` plus ``rollout.max_new_tokens`` must fit the model's positions.

    Raises:
      UsageError: a prompt length < 1, or one the model's ``max_position_embeddings``
        cannot hold with the new tokens (names the largest that fits).
    """
    if prompt_len < 1:
        raise UsageError(f"--prompt-len must be >= 1, got {prompt_len}")
    n_new, max_pos = cfg.rollout.max_new_tokens, model_cfg.max_position_embeddings
    if prompt_len + n_new > max_pos:
        raise UsageError(f"--prompt-len {prompt_len} + rollout.max_new_tokens={n_new} exceeds "
                         f"the model's {max_pos} positions; use --prompt-len <= "
                         f"{max(max_pos - n_new, 0)}")


def check_batch(cfg: Config, batch_shards: int) -> None:
    """Prompts by the batch shards, minibatches and micro-batches by rows; else UsageError."""
    r, t = cfg.rollout, cfg.train
    if r.prompts_per_step % batch_shards:
        raise UsageError(f"rollout.prompts_per_step={r.prompts_per_step} must be a multiple of "
                         f"mesh.data * mesh.fsdp = {batch_shards}")
    B = r.prompts_per_step * r.group_size
    if B % t.minibatches:
        raise UsageError(f"train.minibatches={t.minibatches} must divide rollout.prompts_per_step"
                         f" * rollout.group_size = {B}")
    micro = getattr(t, "micro_batch_size", 0) or 0
    if micro and (B // t.minibatches) % micro:
        raise UsageError(f"train.micro_batch_size={micro} must divide the {B // t.minibatches} "
                         f"rows of a minibatch ({B} rows / train.minibatches={t.minibatches})")


def abstract_state(cfg: Config, model_cfg: Any, mesh: Mesh,
                   optimizer: optax.GradientTransformation, table: Any = None) -> Any:
    """The train state as sharded ShapeDtypeStructs: no weights, nothing allocated.

    Args:
      cfg: the run config (``model.param_dtype``).
      model_cfg: the model config; the params follow `ais_jax.models.layout.param_table`.
      mesh: the trainer mesh (`ais_jax.training.sharding` rules give the shardings).
      optimizer: the optax optimizer; its state is ``jax.eval_shape(optimizer.init)``.
      table: the params' `ArrayInfo` tree (default: `ais_jax.models.layout.param_table`;
        LLaDA: `ais_jax.models.llada.model.param_table`).

    Returns:
      The `TrainState` that `ais_jax.training.steps` uses, of ShapeDtypeStructs.
    """
    import jax
    import jax.numpy as jnp

    from ais_jax.models import layout
    from ais_jax.training import sharding as shd
    from ais_jax.training.steps import DTYPES, TrainState

    dtype = DTYPES[cfg.model.param_dtype]
    shapes = jax.tree.map(lambda info: jax.ShapeDtypeStruct(info.shape(model_cfg), dtype),
                          layout.param_table(model_cfg) if table is None else table,
                          is_leaf=lambda x: isinstance(x, layout.ArrayInfo))
    psh = shd.param_shardings(shapes, mesh)
    params = with_shardings(shapes, psh)
    opt = jax.eval_shape(optimizer.init, params)
    opt = with_shardings(opt, shd.opt_state_shardings(opt, psh, mesh))
    count = jax.ShapeDtypeStruct((), jnp.int32, sharding=shd.replicated(mesh))
    return TrainState(params, opt, count, count)


def compiled_memory(compiled: Any, seconds: float) -> dict[str, float]:
    """Per-device ``memory_analysis()`` bytes of a compiled program (`MEMORY_KEYS`; peak =
    argument + output + temp - alias) and its compile seconds."""
    m = compiled.memory_analysis()
    out = {k: int(getattr(m, k.replace("_bytes", "_size_in_bytes"))) for k in MEMORY_KEYS[:4]}
    out["peak_bytes"] = sum(out[k] for k in MEMORY_KEYS[:3]) - out["alias_bytes"]
    return {**out, "compile_s": round(seconds, 2)}


def compile_program(lowered: Any) -> dict[str, Any]:
    """Compile ``lowered`` and read its bytes (`compiled_memory`).  A program the compiler
    refuses for memory (TPU: ``RESOURCE_EXHAUSTED: Ran out of memory on HBM ...``) gives
    ``peak_bytes: None`` and the compiler's line as ``refused``; any other compiler error
    (a plugin that cannot compile a program without its device libraries) ``failed``, so
    the plan still reports its other programs; Python errors propagate."""
    import time

    t0 = time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as e:  # jax.errors.JaxRuntimeError, imported lazily
        msg = " ".join(str(e).split())
        compiler = type(e).__name__ in ("JaxRuntimeError", "XlaRuntimeError")
        if "RESOURCE_EXHAUSTED" not in msg and not compiler:
            raise
        return {"peak_bytes": None,
                ("refused" if "RESOURCE_EXHAUSTED" in msg else "failed"): msg[:400],
                "compile_s": round(time.perf_counter() - t0, 2)}
    return compiled_memory(compiled, time.perf_counter() - t0)


def plus_resident(program: dict[str, Any], resident: int) -> int | None:
    """A program's peak plus the bytes resident beside it; None if the compiler refused it."""
    return None if program["peak_bytes"] is None else program["peak_bytes"] + resident


def fits(peaks: list[int | None], device_memory: int) -> bool:
    """Every peak known (no program refused) and at most ``device_memory``."""
    return all(p is not None and p <= device_memory for p in peaks)


def compile_init(cfg: Config, model_cfg: Any, mesh: Mesh, state: Any, optimizer: Any,
                 init_params: Any, pol: Any = None) -> dict[str, float]:
    """The start-up program's per-device bytes (`compile_program`): ``jax.jit(lambda key:
    optim.init_train_state(init_params(key, model_cfg, dtype), optimizer), out_shardings=
    steps.state_shardings(...))``, the train state made sharded from the first byte.

    ``pol``: LoRA's abstract policy; the program then makes the adapters' state (float32, fresh
    ``lora.init_adapters``) and the frozen base's shards (compute dtype; a run loads these).
    """
    import jax

    from ais_jax.training import optim, steps
    from ais_jax.training import sharding as shd

    rep = shd.replicated(mesh)
    if pol is None:
        dtype = jax.tree.leaves(state.params)[0].dtype
        fn = lambda key: optim.init_train_state(  # noqa: E731
            init_params(key, model_cfg, dtype), optimizer)
        out_sh = steps.state_shardings(state, mesh)
    else:
        from ais_jax.models import lora

        def fn(key):
            k1, k2 = jax.random.split(key)
            adapters = lora.init_adapters(k1, model_cfg, pol.cfg)
            return (optim.init_train_state(adapters, optimizer),
                    init_params(k2, model_cfg, pol.compute_dtype))
        out_sh = (steps.state_shardings(state, mesh, pol.cfg), pol.base_shardings)
    key = jax.eval_shape(lambda: jax.random.key(0))
    return compile_program(jax.jit(fn, in_shardings=rep, out_shardings=out_sh).lower(key))


def parse_bytes(text: str) -> int:
    """A memory size in bytes: ``"80GB"`` -> 80e9, ``"16GiB"`` -> 16 * 2**30, ``"1000"`` -> 1000.

    Args:
      text: a positive number with an optional unit (B, KB, MB, GB, TB: powers of
        1000; KiB, MiB, GiB, TiB: powers of 1024; case-insensitive).

    Returns:
      The size in bytes.

    Raises:
      UsageError: not a positive number with an optional B / KB / MB / GB / TB /
        KiB / MiB / GiB / TiB unit, or a size that is not finite (``1e400GB``)
        or under one byte.
    """
    shown = str(text)[:40]
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise UsageError(f"--device-memory {shown!r} is not a size; write e.g. 80GB, 16GiB or "
                         "a number of bytes")
    size = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(size) or size < 1:
        raise UsageError(f"--device-memory {shown!r} is not a finite size of at least one byte; "
                         "write e.g. 80GB or 16GiB")
    return int(size)


def device_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs (the largest shard)."""
    import jax

    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * x.dtype.itemsize
    return total


def with_shardings(tree: Any, shardings: Any) -> Any:
    """``tree`` of arrays / ShapeDtypeStructs as ShapeDtypeStructs laid out with ``shardings``."""
    import jax

    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def analytic_bytes(cfg: Config, model_cfg: ModelConfig, mesh: Mesh, state: Any,
                    prompt_len: int) -> dict[str, Any]:
    """Per-device estimates, next to the compiled numbers (formulas in the comments).

    Params, moments and the FP8 copy are exact shard sizes under the sharding rules
    (about total / (fsdp * tensor): a dim the mesh axis does not divide stays
    replicated); the rest use ``T = P + N - 1`` and rows over ``data * fsdp`` shards.
    """
    import jax

    from ais_jax.training import sharding as shd
    from ais_jax.training import steps

    r, c, t = cfg.rollout, model_cfg, cfg.train
    shards = shd.batch_divisor(mesh)
    B, P, N = r.prompts_per_step * r.group_size, prompt_len, r.max_new_tokens
    T, D, F, L, V = P + N - 1, c.hidden_size, c.intermediate_size, c.num_layers, c.vocab_size
    Q, QH, KH = c.num_heads, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    rp = jax.eval_shape(lambda p: steps.rollout_params(p, r), state.params)
    rp = with_shardings(rp, shd.param_shardings(rp, mesh, rollout=True))
    rows = getattr(t, "micro_batch_size", 0) or B // t.minibatches  # rows of one gradient
    rows_dev = math.ceil(rows / shards)
    remat = steps.remat_policy(cfg)
    chunk = getattr(t, "logprob_chunk", 0)
    chunk = N if chunk <= 0 or chunk > N else chunk
    # Kept for the backward per layer and row, bf16 (2 bytes): without remat the residual
    # inputs and norm outputs (4 D), q and attention output (2 QH), k and v (2 KH), gate, up
    # and silu*up (3 F), plus the float32 attention scores and probabilities (8 Q T^2);
    # "dots" the seven projection outputs (QH + 2 KH + 2 D + 2 F); "full" the layer input (D).
    saved = {"none": 2 * T * (4 * D + 2 * QH + 2 * KH + 3 * F) + 8 * Q * T * T,
             "dots": 2 * T * (QH + 2 * KH + 2 * D + 2 * F), "full": 2 * T * D}
    # with remat, one layer is recomputed at a time and its full working set is live again
    working = saved["none"] if remat != "none" else 0
    q8 = r.kv_cache_fp8 or r.kv_cache_int8  # 1-byte cache: + a float32 scale per (row, token)
    kv_bytes = 1 if q8 else 2
    return {
        "params_bytes": device_bytes(state.params),  # master dtype
        "opt_state_bytes": device_bytes(state.opt_state),  # Adam: mu and nu, param dtype
        "rollout_copy_bytes": device_bytes(rp),  # 1 byte per FP8 weight + scales, rest bf16
        # L x {k, v} x B x (P + N) slots x K x H x bytes, rows over the batch shards
        "kv_cache_bytes": L * 2 * math.ceil(B / shards) * (P + N)
        * (KH * kv_bytes + 4 * q8),
        # prefill logits [prompts, P, V] float32 (every prompt position, not just the last)
        "prefill_logits_bytes": math.ceil(r.prompts_per_step / shards) * P * V * 4,
        "remat": remat, "gradient_rows_per_device": rows_dev, "logprob_chunk": chunk,
        "activation_bytes_per_layer_row": saved.get(remat, saved["none"]),
        "update_activation_bytes": rows_dev * (L * saved.get(remat, saved["none"]) + working),
        # float32 logits of one head chunk: rows x chunk x V x 4, per gradient (logp_old and
        # logp_ref are scored the same number of rows at a time)
        "logprob_chunk_bytes": rows_dev * chunk * V * 4,
    }


def cpu_widening_probe(rows: int, d: int, f: int) -> dict[str, int]:
    """Temporaries of one bf16 ``[rows, d] @ [d, f]`` matmul (0 on an accelerator)."""
    import jax
    import jax.numpy as jnp

    a = jax.ShapeDtypeStruct((rows, d), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((d, f), jnp.bfloat16)
    m = jax.jit(jnp.matmul).lower(a, b).compile().memory_analysis()
    return {"shape": [rows, d, f], "operand_bytes": 2 * (rows * d + d * f),
            "temp_bytes": int(m.temp_size_in_bytes)}


def format_plan(plan: dict[str, Any]) -> str:
    """The human-readable table of a `make_plan` result (GB = 1e9 bytes, per device).

    Args:
      plan: what `make_plan` returns.

    Returns:
      The text, without a trailing newline.
    """
    g = lambda b: f"{b / GB:10.3f}"  # noqa: E731
    m, s, a, mesh = plan["model"], plan["shapes"], plan["analytic"], plan["mesh"]
    lines = [
        f"model {m['source']} ({m['from']}): {m['params'] / 1e9:.3f}B params, "
        f"{m['param_dtype']} master; mesh data={mesh['data']} fsdp={mesh['fsdp']} "
        f"tensor={mesh['tensor']} on {plan['devices']} {plan['backend']} devices",
        (f"target {plan['target']['name']}: compiled by the {plan['target']['compiler']} for "
         f"{plan['target']['devices']} x {plan['target']['device_kind']}, deviceless"
         if "target" in plan else "CPU simulation (the default): compiled by XLA's CPU "
         "backend; --target NAME compiles for a TPU or GPU with its own compiler"),
        f"batch: {s['prompts']} prompts x {s['group']} = {s['rows']} rows, prompt "
        f"{s['prompt_len']} + {s['new_tokens']} new tokens, {s['minibatches']} minibatches",
        "", f"{'GB per device':<22}" + "".join(f"{k[:-6]:>10}" for k in MEMORY_KEYS)
        + f"{'compile s':>11}"]
    for name in ("init", "update", "rollout", "score"):  # score: a LLaDA plan's own program
        if name not in plan:
            continue
        p = plan[name]
        lines.append(f"{name:<22}" + ((f"refused by the compiler: {p['refused']}"
                                       if "refused" in p else
                                       f"the compiler failed: {p.get('failed')}")
                                      if p["peak_bytes"] is None else
                                      "".join(g(p[k]) for k in MEMORY_KEYS)
                                      + f"{p['compile_s']:11.1f}"))
    resident = plan["rollout_resident_peak_bytes"]
    lines += [f"{'rollout + resident optimizer state':<62}"
              f"{'refused' if resident is None else g(resident)}",
              "(peak = argument + output + temp - alias)", "", "analytic, GB per device:"]
    rows = [
        ("params_bytes", f"params ({m['param_dtype']}; ~ total / (fsdp x tensor))"),
        ("opt_state_bytes", "optimizer state (Adam mu + nu, param dtype)"),
        ("rollout_copy_bytes", "FP8 rollout copy (1 byte per FP8 weight, rest bf16)"),
        ("kv_cache_bytes", "rollout KV cache L x 2 x B x (P+N) x K x H x 2 / shards"),
        ("prefill_logits_bytes", "rollout prefill logits [prompts, P, V] f32 / shards"),
        ("update_activation_bytes", f"update activations, remat={a['remat']}, "
                                    f"{a['gradient_rows_per_device']} rows"),
        ("logprob_chunk_bytes", f"log-prob logits chunk [rows, {a['logprob_chunk']}, V] f32"),
        ("sampler_logits_bytes", "LLaDA sampler step logits [rows, P+N, V] f32 / shards"),
    ]
    lines += [f"  {label:<60}{g(a[key])}" for key, label in rows if key in a]
    lines.append(f"  (per layer per row kept for the backward: "
                 f"{a['activation_bytes_per_layer_row'] / 1e6:.2f} MB; no remat "
                 "2T(4D + 2QH + 2KH + 3F) + 8QT^2, dots 2T(QH + 2KH + 2D + 2F), full 2TD)")
    lines += _verdict_lines(plan)
    return "\n".join(lines)


def _verdict_lines(plan: dict[str, Any]) -> list[str]:
    """`format_plan`'s last lines: the verdict (fits / does not fit / not known, the largest
    peak, the programs refused or failed) and the CPU backend's widening note."""
    resident = plan["rollout_resident_peak_bytes"]
    lines: list[str] = []
    peaks = [plan[k]["peak_bytes"] for k in ("init", "update") if k in plan]
    peaks = [p for p in (*peaks, resident) if p is not None]
    refused = [k for k in ("init", "update", "rollout", "score")
               if k in plan and "refused" in plan[k]]
    failed = [k for k in ("init", "update", "rollout", "score")
              if k in plan and "failed" in plan[k]]
    over = refused or max(peaks, default=0) > plan["device_memory_bytes"]
    word = "fits" if plan["fits"] else "does not fit" if over else "not known"
    lines += ["", f"verdict: {word} in "
                  f"{plan['device_memory_bytes'] / GB:.1f} GB (largest peak "
                  f"{max(peaks, default=0) / GB:.2f} GB"
                  + (f"; refused for memory: {', '.join(refused)}" if refused else "")
                  + (f"; compile failed, unknown: {', '.join(failed)}" if failed else "") + ")"]
    if "cpu_widening" in plan:
        w = plan["cpu_widening"]
        lines.append(
            "note: the CPU backend widens bf16 / FP8 dot operands to float32, so temporaries "
            f"are overstated: one bf16 [{w['shape'][0]}x{w['shape'][1]}] @ "
            f"[{w['shape'][1]}x{w['shape'][2]}] matmul takes {w['temp_bytes'] / 1e6:.1f} MB of "
            f"temporaries for {w['operand_bytes'] / 1e6:.1f} MB of operands (an accelerator: 0)")
    return lines


def abstract_lora(cfg: Config, model_cfg: Any, mesh: Mesh, state: Any,
                  optimizer: Any) -> tuple[Any, Any]:
    """``(adapters' TrainState, LoraPolicy of the base)`` of sharded ShapeDtypeStructs, from
    full fine-tuning's abstract ``state`` (``python -m ais_jax.plan`` with ``lora.rank > 0``;
    the base in the compute dtype, laid out as ``state.params``).

    Raises:
      UsageError: the rank exceeds a target's dimension.
    """
    import jax

    from ais_jax.models import lora
    from ais_jax.training import sharding as shd
    from ais_jax.training.lora_policy import DTYPES, LoraPolicy, adapter_shardings, lora_config
    from ais_jax.training.optim import TrainState

    lcfg = lora_config(cfg)
    lora.validate_lora(lcfg, model_cfg)
    dtype = DTYPES[cfg.model.compute_dtype]
    psh = jax.tree.map(lambda x: x.sharding, state.params)
    base = with_shardings(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype),
                                       state.params), psh)
    shapes = jax.eval_shape(lambda k: lora.init_adapters(k, model_cfg, lcfg),
                            jax.random.key(0))
    ash = adapter_shardings(shapes, lcfg, mesh)
    adapters = with_shardings(shapes, ash)
    opt = jax.eval_shape(optimizer.init, adapters)
    opt = with_shardings(opt, shd.opt_state_shardings(opt, ash, mesh))
    pol = LoraPolicy(lcfg, base, psh, dtype)
    return TrainState(adapters, opt, state.step, state.skipped), pol
