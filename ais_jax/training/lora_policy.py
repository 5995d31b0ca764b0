"""GRPO with LoRA: the trained state is the adapters, the frozen base rides beside it.

With ``lora.rank > 0`` the `ais_jax.training.optim.TrainState`'s ``params`` are the
adapters ``{"layers": {name: {"a": [L, r, in], "b": [L, out, r]}}}`` (float32 master
weights) and its optimizer state is only theirs.  The frozen base lives in `LoraPolicy`
(``run.lora``): the model's params cast to the compute dtype (bfloat16 by default),
laid out as full fine-tuning lays out its params, never donated and never differentiated.
The step programs (`ais_jax.training.steps.build_step_fns`) take it as their first,
extra argument; `Bound` passes it, so the host loop calls them as before:

* trainer forwards (score, GRPO loss): ``lora.with_adapters(base, adapters)``
  (`view`; the gradient is taken with respect to the adapters only); with ``lora.dropout > 0``
  only the differentiated loss forward draws dropout masks (`dropout_key`), the score stays
  deterministic;
* the rollout copy: ``lora.merge(base, adapters)``, then the usual bfloat16 cast and FP8
  quantization (`ais_jax.training.steps.rollout_params`);
* the KL reference (``train.beta_kl > 0``): the base itself (adapters off, no copy);
* evaluation and the ``final/`` export: the merged params (`merged`), and the adapters in
  PEFT's format under ``final/adapter``.

The same holds for LLaDA policies (`ais_jax.training.llada.lora_steps`).

A scratch model's warm start stays a full fine-tune: `set_base` makes its result the base
(adapters have ``B = 0``, so GRPO starts at the warm-started policy), and such a base is
saved with every checkpoint (`LoraPolicy.warm`), so a resume restores it.  A pretrained
(or un-warm-started scratch) base is rebuilt from ``model.source`` / the seed on resume.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from ais_jax.config.schema import Config
from ais_jax.core.errors import UsageError
from ais_jax.models import lora
from ais_jax.training import sharding as shd
from ais_jax.training.policy import cast_params

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def lora_config(cfg: Config) -> lora.LoraConfig | None:
    """The run's `ais_jax.models.lora.LoraConfig`, or None when ``lora.rank == 0`` (off)."""
    from ais_jax.config.checks import lora_targets

    lo = cfg.lora
    if lo.rank == 0:
        return None
    return lora.LoraConfig(lo.rank, lo.alpha, lora_targets(lo.targets), lo.dropout, lo.rslora)


def adapter_shardings(adapters: Any, lora_cfg: lora.LoraConfig, mesh: Mesh) -> Any:
    """`NamedSharding`s of the adapters from `ais_jax.models.lora.logical_axes` and the
    trainer's rules table (``A`` shares its base's input axis, ``B`` its output axis)."""
    axes = lora.logical_axes(lora_cfg)

    def one(x: Any, logical: tuple[str | None, ...]) -> NamedSharding:
        return NamedSharding(mesh, shd._spec(tuple(x.shape), logical, mesh, shd.RULES))

    return jax.tree.map(one, adapters, axes, is_leaf=lambda x: isinstance(x, tuple))


@dataclasses.dataclass
class LoraPolicy:
    """The frozen base and the LoRA settings of a run (``Run.lora``; mutable: `set_base`).

    Attributes:
      cfg: the LoRA settings.
      base: the frozen base params in the compute dtype, laid out with ``base_shardings``.
      base_shardings: the base's `NamedSharding`s (those of full fine-tuning's params).
      compute_dtype: the base's dtype.
      warm: the base is a warm start's result (saved with every checkpoint).
      start: the full-precision params a warm start begins from (None once it is done).
      merge_jit: `merge_fn`'s program, made on first use.
    """

    cfg: lora.LoraConfig
    base: Any
    base_shardings: Any
    compute_dtype: Any
    warm: bool = False
    start: Any = None
    merge_jit: Any = None

    def set_base(self, params: Any, *, warm: bool = True) -> None:
        """Make ``params`` (any float dtype) the frozen base: cast and laid out."""
        base = cast_params(params, self.compute_dtype)
        self.base = jax.device_put(base, self.base_shardings)
        self.warm, self.start = warm, None


def make_policy(cfg: Config, params: Any, mesh: Mesh) -> LoraPolicy:
    """`LoraPolicy` of ``params`` (the full-precision model); LoRA must be on."""
    lcfg = lora_config(cfg)
    assert lcfg is not None
    dtype = DTYPES[cfg.model.compute_dtype]
    sh = shd.param_shardings(params, mesh)
    pol = LoraPolicy(lcfg, None, sh, dtype)
    pol.set_base(params, warm=False)
    return pol


def initial_adapters(cfg: Config, model_cfg: Any, lora_cfg: lora.LoraConfig) -> dict:
    """Float32 adapters to start from: ``model.adapter`` (PEFT) or fresh (``B = 0``).

    Raises:
      UsageError: the rank exceeds a target's dimension; the adapter directory does not load
        for this model (`ais_jax.models.peft_io.load_peft_adapter`, one line), holds other
        LoRA settings than the lora section, or was trained on another base
        (`ais_jax.models.base_digest`; ``model.allow_base_change``).
    """
    lora.validate_lora(lora_cfg, model_cfg)
    if not cfg.model.adapter:
        return lora.init_adapters(jax.random.fold_in(jax.random.key(cfg.seed), 2), model_cfg,
                                  lora_cfg)
    from ais_jax.models.base_digest import check_same_base, read_adapter_base, source_digest
    from ais_jax.models.peft_io import load_peft_adapter

    adapters, got = load_peft_adapter(cfg.model.adapter, model_cfg, jnp.float32)
    check_same_base(read_adapter_base(cfg.model.adapter), source_digest(cfg.model.source),
                    f"model.adapter {cfg.model.adapter}", cfg.model.source,
                    cfg.model.allow_base_change)
    differ = adapter_mismatch(got, lora_cfg)
    if differ:
        raise UsageError(f"model.adapter {cfg.model.adapter} was trained with other LoRA "
                         f"settings ({'; '.join(d for d, _ in differ)}); set "
                         f"{' '.join(fix for _, fix in differ)}")
    return adapters


ADAPTER_KEYS = ("rank", "alpha", "rslora", "targets")  # must match; dropout may differ


def _as_override(v: object) -> str:
    """A lora setting as a config override writes it (``true``, ``8``, ``wq,wv``)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, tuple):
        return ",".join(v)
    return f"{v:g}" if isinstance(v, float) else str(v)


def adapter_mismatch(got: lora.LoraConfig, want: lora.LoraConfig) -> list[tuple[str, str]]:
    """Each setting of `ADAPTER_KEYS` in which an adapter's file (``got``) differs from the
    run's lora section (``want``): ``("lora.KEY: adapter X, config Y", "lora.KEY=X")``, the
    difference and its fix; empty when they agree."""
    out = []
    for key in ADAPTER_KEYS:
        a, b = _as_override(getattr(got, key)), _as_override(getattr(want, key))
        if getattr(got, key) != getattr(want, key):
            out.append((f"lora.{key}: adapter {a}, config {b}", f"lora.{key}={a}"))
    return out


def view(base: Any, lora_cfg: lora.LoraConfig) -> Any:
    """``(adapters, dropout_key=None) -> with_adapters(base, adapters)``: the trainer's model
    params (unmerged); a dropout key (only the update's loss forward passes one) turns on
    ``lora.dropout`` on the LoRA branches' inputs."""
    def fn(adapters: Any, dropout_key: jax.Array | None = None) -> Any:
        return lora.with_adapters(base, adapters, lora_cfg, dropout_key=dropout_key)
    return fn


#: Folded into the update's key to give the LoRA dropout its own stream (``"LoRA"``).
DROPOUT_STREAM = 0x4C6F5241


def dropout_key(key: jax.Array, lora_cfg: lora.LoraConfig) -> jax.Array | None:
    """The update's LoRA dropout key (its own stream of the update's ``key``), or None
    without dropout.  `ais_jax.training.optim.apply_update` folds in the optimizer step and
    the micro-batch, so every update draws fresh masks and the same seed the same ones."""
    return None if lora_cfg.dropout == 0 else jax.random.fold_in(key, DROPOUT_STREAM)


def merged(base: Any, adapters: Any, lora_cfg: lora.LoraConfig) -> Any:
    """The base with the adapters folded in (base dtype): rollout copy, evaluation, export."""
    return lora.merge(base, adapters, lora_cfg)


class Bound:
    """A jitted step program ``fn(base, *args)`` called as ``fn(*args)`` with ``policy.base``.

    The base is read at each call, so a warm start replacing it (`LoraPolicy.set_base`)
    is seen by every program; ``_cache_size`` is the wrapped program's compile count.
    """

    def __init__(self, fn: Any, policy: LoraPolicy) -> None:
        self.fn, self.policy = fn, policy

    def __call__(self, *args: Any) -> Any:
        return self.fn(self.policy.base, *args)

    def _cache_size(self) -> int:
        return self.fn._cache_size()

    def lower(self, *args: Any) -> Any:
        """``jax.jit``'s ``lower`` with the base (compiled-memory measurements)."""
        return self.fn.lower(self.policy.base, *args)


def merge_fn(policy: LoraPolicy) -> Any:
    """Jitted ``adapters -> merged params`` laid out as the base (evaluation, export)."""
    if policy.merge_jit is None:
        policy.merge_jit = jax.jit(lambda base, adapters: merged(base, adapters, policy.cfg),
                                   out_shardings=policy.base_shardings)
    return Bound(policy.merge_jit, policy)


def model_params(run: Any, params: Any) -> Any:
    """The model params of a state's ``params``: themselves, or merged with LoRA on."""
    pol = getattr(run, "lora", None)
    return params if pol is None else merge_fn(pol)(params)
