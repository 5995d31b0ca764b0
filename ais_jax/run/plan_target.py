"""Accelerator targets of ``python -m ais_jax.plan --target NAME``: every plugin-specific line.

A target is a compile-only topology of a real accelerator, made on this machine without the
hardware by the accelerator's own compiler plugin: TPUs through libtpu
(``jax.experimental.topologies.get_topology_desc(topology_name="v5e:4x4", platform="tpu")``),
NVIDIA GPUs through the CUDA PJRT plugin and an XLA ``GpuTargetConfigProto`` (`gpu_spec`).
The plan's programs are then compiled for those devices and ``memory_analysis()`` reports the
accelerator compiler's buffer assignment (no CPU widening of bf16 / FP8 operands).

Names: ``v5e-N`` / ``v6e-N`` (N chips, one device each), ``v5p-N`` / ``tpu7x-N`` (N
TensorCores as Cloud TPU counts them: N / 2 chips; a v5p chip is one megacore device, a
tpu7x chip two devices), ``v4-N`` (as v5p), ``h100`` / ``h200`` with an optional ``xN``
(N GPUs on one host, default 1).

Per-device memory (the verdict's limit), from the vendors' pages: v5e 16 GiB HBM per chip
(cloud.google.com/tpu/docs/v5e), v6e 32 GiB (cloud.google.com/tpu/docs/v6e), v5p 95 GiB
(cloud.google.com/tpu/docs/v5p), v4 32 GiB (cloud.google.com/tpu/docs/v4), tpu7x 192 GiB per
chip (cloud.google.com/tpu/docs/tpu7x), 96 GiB for each of its two devices; H100 SXM 80 GB
(nvidia.com/h100 datasheet; 85,520,809,984 B as CUDA reports it), H200 141 GB (nvidia.com/h200;
XLA's h200.txtpb: 151,397,597,184 B).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ais_jax.config.schema import Config
from ais_jax.core.errors import UsageError

GiB = 2**30
# chips -> topology of the 2D slices (v5e, v6e) and of the 3D ones (v4, v5p, tpu7x)
_TOPO_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
            256: "16x16"}
_TOPO_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
            256: "4x8x8"}
# family: (topology prefix, 3D?, chips per name unit, devices per chip, bytes per device)
_TPU = {"v5e": ("v5e", False, 1, 1, 16 * GiB), "v6e": ("v6e", False, 1, 1, 32 * GiB),
        "v4": ("v4", True, 2, 1, 32 * GiB), "v5p": ("v5p", True, 2, 1, 95 * GiB),
        "tpu7x": ("tpu7x", True, 2, 2, 96 * GiB)}
# name: (device_memory_size, memory bandwidth B/s, memory clock kHz, device name)
_GPU = {"h100": (85_520_809_984, 3_350_000_000_000, 2_619_000, "NVIDIA H100 80GB HBM3"),
        "h200": (151_397_597_184, 4_800_000_000_000, 3_750_000, "NVIDIA H200 141GB HBM3e")}
_PIP = {"tpu": 'pip install "jax[tpu]=={v}" (libtpu), best in its own venv '
               "(docs/measurements/plan_targets.md)",
        "cuda": "pip install --no-deps jax-cuda12-plugin=={v} jax-cuda12-pjrt=={v} (the CUDA "
                "PJRT plugin), best in its own venv (docs/measurements/plan_targets.md)"}


@dataclass(frozen=True)
class Target:
    """One accelerator target: ``name`` as given, ``platform`` (``"tpu"`` or ``"cuda"``),
    ``topology`` (the plugin's topology string), ``devices``, ``device_memory`` (bytes per
    device) and extra ``get_topology_desc`` keyword arguments."""

    name: str
    platform: str
    topology: str
    devices: int
    device_memory: int
    kwargs: dict[str, Any] = field(default_factory=dict)


def target_names() -> str:
    """The accepted name forms, for error messages."""
    return ("v5e-N / v6e-N (N chips: " + ", ".join(map(str, _TOPO_2D)) + "), v5p-N / v4-N / "
            "tpu7x-N (N TensorCores: " + ", ".join(str(2 * c) for c in _TOPO_3D)
            + "), h100 / h200 [xN]")


def parse_target(name: str) -> Target:
    """The `Target` a name stands for (``v5e-16``, ``v5p-8``, ``h100x8``; case-insensitive).

    Raises:
      UsageError: an unknown family or a size the family's slices do not come in.
    """
    text = str(name).strip().lower()
    m = re.fullmatch(r"(v5e|v6e|v5p|v4|tpu7x)-(\d+)", text)
    if m:
        prefix, is3d, per_unit, per_chip, mem = _TPU[m.group(1)]
        n = int(m.group(2))
        chips = n // per_unit if n % per_unit == 0 else -1
        table = _TOPO_3D if is3d else _TOPO_2D
        if chips not in table:
            sizes = ", ".join(f"{m.group(1)}-{c * per_unit}" for c in table)
            raise UsageError(f"--target {name!r}: {m.group(1)} slices come as {sizes}")
        topo = table[chips]
        kwargs = {"chips_per_host_bounds": (1, 1, 1)} if chips == 1 else {}
        return Target(text, "tpu", f"{prefix}:{topo}", chips * per_chip, mem, kwargs)
    m = re.fullmatch(r"(h100|h200)(?:x(\d+))?", text)
    if m and int(m.group(2) or 1) >= 1:
        n = int(m.group(2) or 1)
        return Target(text, "cuda", f"1x1x{n}", n, _GPU[m.group(1)][0])
    raise UsageError(f"--target {str(name)[:40]!r} is not a known accelerator; use one of "
                     f"{target_names()}")


def plugin_missing(target: Target) -> str | None:
    """None when the target's compiler plugin is importable, else the line that says how to
    install it (``pip install ...`` for the installed jax version)."""
    import jax  # the version only; starts no backend

    mod = "libtpu" if target.platform == "tpu" else "jax_plugins.xla_cuda12"
    try:
        found = importlib.util.find_spec(mod) is not None
    except ModuleNotFoundError:  # no jax_plugins package at all
        found = False
    if found:
        return None
    return (f"--target {target.name} compiles with the "
            f"{'TPU' if target.platform == 'tpu' else 'CUDA'} compiler, which is not installed: "
            + _PIP[target.platform].format(v=jax.__version__))


def gpu_spec(kind: str) -> str:
    """XLA's ``GpuTargetConfigProto`` text of an ``h100`` or ``h200``.

    openxla/xla's ``xla/backends/gpu/target_config/specs/h200.txtpb`` (commit 4336d12e) without
    ``collective_memory_granularity`` (jax 0.10.2's proto lacks it); the ``h100`` differs in
    memory size, bandwidth, memory clock and name only (both are sm_90 with 132 SMs and a 50 MiB
    L2).  The memory size matters: XLA's GPU compiler rematerializes to fit about 79% of it.
    """
    mem, bandwidth, mem_khz, desc = _GPU[kind]
    return _SPEC.format(mem=mem, bw=bandwidth, desc=desc, model=(
        f"sm_9.0a with {mem}B RAM, 132 cores, 1980000KHz clock, {mem_khz}KHz mem clock, "
        "52428800B L2$"))


def target_devices(target: Target) -> list[Any]:
    """The compile-only devices of ``target`` (starts the plugin, opens no hardware).

    Raises:
      UsageError: the plugin refuses the topology (its message, on one line).
    """
    from jax.experimental import topologies

    try:
        if target.platform == "tpu":
            topo = topologies.get_topology_desc(topology_name=target.topology, platform="tpu",
                                                **target.kwargs)
        else:
            topo = topologies.get_topology_desc(platform="cuda", topology=target.topology,
                                                target_config=gpu_spec(target.name[:4]))
    except Exception as e:  # the plugins' errors have no common type
        raise UsageError(plugin_error(target, e)) from None
    return list(topo.devices)


# libtpu's messages when another process holds its lock file (/tmp/libtpu_lockfile):
# tensorflow::tpu::TryAcquireTpuLock in openxla/xla (tpu_initialize_util.cc)
_LIBTPU_LOCK = ("libtpu_lockfile", "TPU is already in use")


def plugin_error(target: Target, e: BaseException) -> str:
    """The line for a plugin's refusal ``e`` of ``target``'s topology.

    libtpu loads in one process at a time: while another process holds its lock file it
    refuses, and its message may advise ``sudo rm /tmp/libtpu_lockfile``, wrong while that
    process runs (its lock is released when it exits).  That case gets its own line: wait
    for the other process, or, since a plan only compiles, let libtpu load beside it with
    ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``.  Other refusals keep the plugin's message.
    """
    msg = " ".join(str(e).split())[:300]
    if target.platform == "tpu" and any(s in msg for s in _LIBTPU_LOCK):
        return (f"--target {target.name}: another process is using libtpu (it holds "
                "/tmp/libtpu_lockfile) and libtpu loads in one process at a time; wait for "
                "that process to finish, or, since a plan only compiles, rerun with "
                "ALLOW_MULTIPLE_LIBTPU_LOAD=1 to load it beside that process")
    return (f"--target {target.name}: the {target.platform} plugin refused topology "
            f"{target.topology!r}: {msg}")


# XLA GPU flags a compile without a GPU needs (a flag the user set is kept): cuBLAS GEMMs
# (without autotuning XLA's Triton emitter finds no tile sizes for some 8B GEMMs), no
# autotuning (it runs kernels), and XLA's own sort instead of CUB's radix sort (its scratch
# size is asked from the CUDA runtime: the 8B update's quantiles of 131k log-ratios failed
# with "Error loading CUDA libraries"); docs/measurements/plan_targets.md.
GPU_FLAGS = {"xla_gpu_enable_triton_gemm": "false", "xla_gpu_autotune_level": "0",
             "xla_gpu_enable_cub_radix_sort": "false"}


def prepare_env(target: Target) -> None:
    """Environment the plugin needs before JAX starts: CUDA's version check skipped (it needs
    the CUDA libraries) and the XLA flags of `GPU_FLAGS`."""
    if target.platform == "cuda":
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
        flags = os.environ.get("XLA_FLAGS", "")
        for name, value in GPU_FLAGS.items():
            if name not in flags:
                flags = f"{flags} --{name}={value}".strip()
        os.environ["XLA_FLAGS"] = flags


@contextlib.contextmanager
def backend_as(target: Target) -> Iterator[None]:
    """``jax.default_backend()`` answers the target's platform (``"tpu"`` / ``"gpu"``) inside:
    the sampler picks its layout from it (unrolled layers, no weight transposes off CPU)."""
    import jax

    old = jax.default_backend
    name = "tpu" if target.platform == "tpu" else "gpu"
    jax.default_backend = lambda: name  # type: ignore[assignment]
    try:
        yield
    finally:
        jax.default_backend = old  # type: ignore[assignment]


def check_target_mesh(target: Target, cfg: Config) -> None:
    """The config's mesh must fit the target's devices (checked before any compile).

    Raises:
      UsageError: one line naming the mesh, the target's device count and the fix.
    """
    m = cfg.mesh
    need = m.data * m.fsdp * m.tensor
    if need > target.devices:
        raise UsageError(f"mesh data={m.data} x fsdp={m.fsdp} x tensor={m.tensor} needs {need} "
                         f"devices but --target {target.name} has {target.devices}; lower the "
                         f"mesh sizes (e.g. mesh.fsdp={target.devices // (m.data * m.tensor) or 1}"
                         ") or pick a larger target")


def make_target_plan(cfg: Config, target: Target, device_memory: int, prompt_len: int,
                     make_plan: Any) -> dict[str, Any]:
    """``make_plan`` (`ais_jax.run.plan.make_plan`) compiled for ``target`` by its own
    compiler, over its compile-only devices; the mesh takes the first ``mesh.data x mesh.fsdp
    x mesh.tensor`` of them.  Adds ``target`` (name, topology, devices, device kind, compiler,
    XLA flags).

    Raises:
      UsageError: the plugin refuses the topology, or `make_plan`'s errors.
    """
    from ais_jax.training import sharding as shd

    devices = target_devices(target)
    m = cfg.mesh
    mesh = shd.make_mesh(m.data, m.fsdp, m.tensor, devices=devices)
    with backend_as(target):
        plan = make_plan(cfg, target.devices, device_memory, prompt_len, mesh)
    plan["target"] = {
        "name": target.name, "topology": target.topology, "devices": target.devices,
        "mesh_devices": m.data * m.fsdp * m.tensor, "device_kind": devices[0].device_kind,
        "compiler": "TPU compiler (libtpu)" if target.platform == "tpu"
        else "XLA GPU compiler (CUDA PJRT plugin)",
        "xla_flags": os.environ.get("XLA_FLAGS", "")}
    return plan


_SPEC = """gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bw}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {mem}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{
    major: 9
    feature_extension: ACCELERATED_FEATURES
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  thread_dim_limit_x: 1024
  thread_dim_limit_y: 1024
  thread_dim_limit_z: 64
  device_vendor: "NVIDIA Corporation"
  platform_version: "Compute Capability 9.0a"
  model_str: "{model}"
  device_address_bits: 64
  pcie_bandwidth: 34359738368
  ecc_enabled: true
  name: "{desc}"
  driver_version: "13.0.0"
  runtime_version: "12.8.0"
  compile_time_toolkit_version: "12.8.0"
  dnn_version: "9.10.0"
  cub_version: "3.1.2"
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 10
  patch: 0
}}
device_description_str: "{desc}"
"""
