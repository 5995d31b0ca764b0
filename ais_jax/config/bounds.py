"""Numeric bounds of a run configuration, checked before any work (issue 39 rows 3, 4, 8).

`check_numeric_bounds` (part of every config validation, machine-independent):

* every int key (``seed`` has its own rule, ``[0, 2**32)``) lies in the int32
  range: steps, counts and sizes become int32 array values, XLA dimensions or
  optax step counters, and a larger value ended in an OverflowError mid-run;
* products the programs hold as int32 (rows of a step, tokens of a step,
  evaluation samples, optimizer updates of the run) fit int32 too;
* every float key is finite in float32 (``ais.eps=1e300`` is inf there) and a
  nonzero float is not below float32's smallest normal number (``ais.gamma=1e-300``
  is 0 in float32, then a division by it made every step NaN).

`check_host_memory` (the trainer's CLI, before the run starts; `ais_jax.run.plan`
plans for other machines and skips it): the problems, rows and scratch-model
parameters a run holds at once must fit in this machine's memory, each counted
at a lower bound of its real cost, so a refused config could never have run.

Every problem is a one-line `UsageError` naming the key, the bound and the fix.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from ais_jax.core.errors import UsageError
from ais_jax.core.safe_yaml import clip

INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(float32).max
FLOAT32_TINY = 1.1754943508222875e-38  # numpy.finfo(float32).tiny, the smallest normal
# Bytes one generated problem (prompt, answer, metadata) takes in Python at least: 549-727
# measured (tracemalloc, 20,000 problems of arithmetic, countdown, multiplication, sudoku,
# gsm_synth); a dataset row or a rollout row costs more.
PROBLEM_BYTES = 512
# ``seed`` is checked against [0, 2**32) by `ais_jax.config.checks`.
_OWN_RULE = ("seed",)


def numeric_leaves(cfg: Any, prefix: str = "") -> Iterator[tuple[str, type, Any]]:
    """``(dotted key, int or float, value)`` of every numeric leaf of a config, in order.

    Args:
      cfg: a config dataclass value (the root or a section).
      prefix: prepended to the keys (``"train."`` for a section).
    """
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from numeric_leaves(value, f"{prefix}{f.name}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield f"{prefix}{f.name}", type(value), value


def _products(cfg: Any) -> list[tuple[str, int]]:
    r, t, e = cfg.rollout, cfg.train, cfg.eval
    return [
        ("rollout.prompts_per_step * rollout.group_size (rows of an RL step)",
         r.prompts_per_step * r.group_size),
        ("rollout.prompts_per_step * rollout.group_size * rollout.max_new_tokens (tokens of "
         "an RL step)", r.prompts_per_step * r.group_size * r.max_new_tokens),
        ("task.eval_size * eval.num_samples (evaluation samples)", cfg.task.eval_size
         * e.num_samples),
        ("train.steps * train.epochs * train.minibatches (optimizer updates, an int32 count)",
         t.steps * t.epochs * t.minibatches),
    ]


def check_numeric_bounds(cfg: Any) -> None:
    """Every int key in int32, the int32 products, every float key usable in float32.

    Args:
      cfg: an `ais_jax.config.schema.Config` (types already checked).

    Raises:
      UsageError: the first key (or product) out of range, in one line with the fix.
    """
    for key, tp, value in numeric_leaves(cfg):
        if key in _OWN_RULE:
            continue
        if tp is int and not -INT32_MAX <= value <= INT32_MAX:
            raise UsageError(f"{key}={clip(value)} is outside the int32 range (|value| <= "
                             f"2**31 - 1 = {INT32_MAX}); use a smaller value")
        if tp is float and not abs(value) <= FLOAT32_MAX:
            raise UsageError(f"{key}={clip(value)} is not finite in float32 (|value| <= "
                             f"{FLOAT32_MAX:.4g}); use a smaller value")
        if tp is float and value != 0 and abs(value) < FLOAT32_TINY:
            raise UsageError(f"{key}={clip(value)} is below float32's smallest normal number "
                             f"({FLOAT32_TINY:.4g}) and would be 0 or lose its precision in "
                             "float32; use 0 or a larger value")
    for what, product in _products(cfg):
        if product > INT32_MAX:
            raise UsageError(f"{what} = {clip(product)} exceeds the int32 range (2**31 - 1 = "
                             f"{INT32_MAX}); lower one of these keys")


def physical_memory() -> int:
    """Bytes of memory this process may use: physical RAM, or a smaller cgroup limit."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        total = 1 << 50
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def _scratch_params(cfg: Any, vocab: int) -> int:
    m = cfg.model
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    block = 2 * m.hidden_size * q + 2 * m.hidden_size * kv + 3 * m.hidden_size \
        * m.intermediate_size
    return m.num_layers * block + vocab * m.hidden_size


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_host_memory(cfg: Any, memory: int | None = None) -> None:
    """What a run holds at once, counted at a lower bound of its cost, against this machine.

    The evaluation problems (``task.eval_size``) and their samples, the warm-start batch and
    check problems, an RL step's rows (`PROBLEM_BYTES` each), and a scratch model's
    parameters (4 bytes each in float32, 2 in bfloat16; the optimizer adds more).

    Args:
      cfg: an `ais_jax.config.schema.Config` that passed `check_numeric_bounds`.
      memory: bytes available (default `physical_memory`).

    Raises:
      UsageError: one line naming the key, the bytes it needs and the memory.
    """
    memory = physical_memory() if memory is None else memory
    r, s = cfg.rollout, cfg.sft
    need = [
        ("task.eval_size or eval.num_samples", "evaluation samples",
         cfg.task.eval_size * max(1, cfg.eval.num_samples) * PROBLEM_BYTES),
        ("rollout.prompts_per_step or rollout.group_size", "rows of an RL step",
         r.prompts_per_step * r.group_size * (PROBLEM_BYTES + 4 * r.max_new_tokens)),
    ]
    if s.steps > 0 and cfg.model.source == "scratch":  # the warm start runs (training.build)
        need.append(("sft.batch_size", "warm-start problems of one step",
                     s.batch_size * PROBLEM_BYTES))
        if s.target_accuracy > 0:
            need.append(("sft.check_size", "warm-start check problems",
                         s.check_size * PROBLEM_BYTES))
    if cfg.model.source == "scratch":
        from ais_jax.tasks import CharTokenizer  # the scratch model's vocabulary

        per = 2 if cfg.model.param_dtype == "bfloat16" else 4
        need.append(("model.hidden_size, model.num_layers or model.intermediate_size",
                     "scratch-model parameters",
                     _scratch_params(cfg, CharTokenizer().vocab_size) * per))
    for keys, what, nbytes in need:
        if nbytes > memory:
            raise UsageError(f"{keys}: the {what} alone need at least {_gib(nbytes)}, more than "
                             f"this machine's {_gib(memory)} of memory; lower {keys}")
