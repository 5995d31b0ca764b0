"""Shared pieces of the GPU benchmarks (``gpu_rollout.py``, ``gpu_update.py``).

Random weights made on the device, configs loaded without their path checks,
memory figures (compiled memory analysis, the device's allocator statistics,
the KV cache's size), a wall-clock budget and the incremental JSON report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax

from ais_jax.config.load import load_config
from ais_jax.config.schema import SKIP_PATH_CHECK_ENV, Config, RuntimeSection
from ais_jax.models.hf_config import HF_PRESETS, model_config_from_hf
from ais_jax.models.model import ModelConfig, init_params
from ais_jax.run.runtime import apply_xla_flags
from ais_jax.training import flops

CONFIGS = {"Qwen3-0.6B": "configs/qwen3_0p6b_gsm8k.yaml",
           "Qwen3-8B": "configs/qwen3_8b_gsm8k.yaml"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, arch="qwen3")
PEAK_NOTE = ("peak_bytes_in_use is the allocator's process-wide high-water mark: it covers every "
             "program run so far in this process, not only this one")


def setup_env(xla_flags: str) -> dict[str, Any]:
    """Environment set before JAX starts its backend: ``XLA_FLAGS`` (appended) and a 90%
    GPU memory fraction unless ``XLA_PYTHON_CLIENT_MEM_FRACTION`` is set.

    Raises:
      UsageError: ``xla_flags`` given but the backend already started in this process.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    flags = apply_xla_flags(RuntimeSection(xla_flags=xla_flags))
    return {"XLA_FLAGS": flags,
            "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"]}


def model_config(name: str, layers: int | None = None) -> ModelConfig:
    """``"tiny"`` or an `HF_PRESETS` name, optionally cut to ``layers`` decoder blocks."""
    mc = TINY if name == "tiny" else model_config_from_hf(HF_PRESETS[name])
    if layers is not None and layers != mc.num_layers:
        mc = dataclasses.replace(mc, num_layers=layers)
    return mc


def config(name: str, overrides: Sequence[str]) -> Config:
    """The model's YAML config (the 0.6B one for ``"tiny"``) with ``overrides`` and one device
    (``mesh.fsdp=1``); its file-path checks are skipped (no checkpoint needed)."""
    path = os.path.join(ROOT, CONFIGS.get(name, CONFIGS["Qwen3-0.6B"]))
    old = os.environ.get(SKIP_PATH_CHECK_ENV)
    os.environ[SKIP_PATH_CHECK_ENV] = "1"
    try:
        return load_config(path, ["mesh.fsdp=1", "mesh.data=1", "mesh.tensor=1", *overrides])
    finally:
        if old is None:
            os.environ.pop(SKIP_PATH_CHECK_ENV, None)
        else:
            os.environ[SKIP_PATH_CHECK_ENV] = old


def device_params(mc: ModelConfig, dtype: Any, seed: int = 0) -> Any:
    """Random params made on the device by one jitted init (no host copy), in ``dtype``."""
    return jax.jit(lambda k: init_params(k, mc, dtype))(jax.random.key(seed))


def delete_tree(tree: Any) -> None:
    """Free the device buffers of every array leaf now."""
    for x in jax.tree_util.tree_leaves(tree):
        if isinstance(x, jax.Array) and not x.is_deleted():
            x.delete()


def compiled_memory(compiled: Any) -> dict[str, int] | None:
    """The compiled program's memory analysis in bytes (None where the backend has none)."""
    m = compiled.memory_analysis()
    if m is None:
        return None
    keys = ("argument", "output", "alias", "temp", "generated_code")
    return {k: int(getattr(m, f"{k}_size_in_bytes", 0)) for k in keys}


def device_memory() -> dict[str, int] | None:
    """``bytes_in_use``, ``peak_bytes_in_use`` and ``bytes_limit`` of device 0 (None on CPU)."""
    stats = jax.devices()[0].memory_stats()
    if not stats:
        return None
    return {k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
            if k in stats}


def kv_cache_bytes(mc: ModelConfig, rows: int, slots: int, *, fp8: bool,
                   dtype_bytes: int = 2) -> int:
    """Bytes of the sampler's KV cache: keys and values ``[L, rows, K, slots, H]``.

    Args:
      mc: model config (``L`` layers, ``K`` KV heads of width ``H``).
      rows: cache rows (prompts x samples).
      slots: cache slots; the sampler ends at ``prompt_len + new_tokens - 1``.
      fp8: float8 values (1 byte) plus one float32 scale per (layer, row, slot) for
        keys and for values.
      dtype_bytes: element size of a full-precision cache (bf16: 2).

    Returns:
      ``2 L rows slots K H b`` (+ ``2 L rows slots 4`` for the FP8 scales), the
      ``[rows, slots]`` validity mask excluded.
    """
    n = mc.num_layers * rows * slots
    values = 2 * n * mc.num_kv_heads * mc.head_dim * (1 if fp8 else dtype_bytes)
    return values + (2 * n * 4 if fp8 else 0)


def device_info() -> dict[str, Any]:
    """Backend, device, device kind, JAX version and the device's dense BF16 peak."""
    d = jax.devices()[0]
    return {"backend": jax.default_backend(), "device": str(d),
            "device_kind": getattr(d, "device_kind", ""), "jax": jax.__version__,
            "peak_bf16_flops": flops.peak_flops(d)}


def device_slug() -> str:
    """A short file-name tag of device 0: a `flops.PEAK_BF16_FLOPS` key ("h200") or the kind."""
    kind = getattr(jax.devices()[0], "device_kind", "").lower()
    for key in sorted(flops.PEAK_BF16_FLOPS, key=len, reverse=True):  # "gh200" before "h200"
        if key in kind:
            return re.sub(r"\W+", "_", key)
    return re.sub(r"\W+", "_", kind).strip("_") or jax.default_backend()


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    """``(fn(*args) ready, seconds)``."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


class Budget:
    """Wall-clock budget of a sweep, counted from construction."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.seconds - self.elapsed()


class Report:
    """A JSON report rewritten after every change: ``$OUT/<name>.json`` when ``OUT`` is set,
    and ``<docs_dir>/<name>_<device>.json`` on `save_docs`."""

    def __init__(self, name: str, data: dict[str, Any]):
        self.name, self.data = name, data
        out = os.environ.get("OUT")
        self.path = os.path.join(out, f"{name}.json") if out else None

    def write(self) -> None:
        if self.path:
            _dump(self.path, self.data)

    def save_docs(self, docs_dir: str) -> str:
        path = os.path.join(docs_dir, f"{self.name}_{device_slug()}.json")
        os.makedirs(docs_dir, exist_ok=True)
        _dump(path, self.data)
        return path


def _dump(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def maybe_trace(directory: str | None) -> Iterator[None]:
    """`jax.profiler.trace` into ``directory``, or nothing when it is None."""
    if directory is None:
        yield
        return
    os.makedirs(directory, exist_ok=True)
    with jax.profiler.trace(directory):
        yield

