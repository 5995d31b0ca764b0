"""`python -m ais_jax.plan --target NAME`: the target table, the missing-plugin line, bad input.

The project's test environment has neither libtpu nor the CUDA plugin; the one test that
compiles for a target runs only where libtpu is importable (a separate venv, see
docs/measurements/plan_targets.md) and is skipped here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from _tiny import TINY_MODEL

from ais_jax.core.errors import UsageError
from ais_jax.run import plan
from ais_jax.run import plan_target as pt

TINY = [*TINY_MODEL, "rollout.prompts_per_step=4", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "sft.steps=0"]
GiB = 2**30
# main() with the plugins hidden, whatever is installed: the missing-plugin path, deterministic
NO_PLUGIN = """import importlib.util, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: (None if name in ("libtpu", "jax_plugins.xla_cuda12")
                                             else real(name, *a))
from ais_jax.run.plan import main
sys.exit(main(sys.argv[1:]))
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}


def _cli(*args: str, code: str = NO_PLUGIN) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], env=_env(), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("name, platform, topology, devices, memory, kwargs", [
    ("v5e-1", "tpu", "v5e:1x1", 1, 16 * GiB, {"chips_per_host_bounds": (1, 1, 1)}),
    ("v5e-8", "tpu", "v5e:2x4", 8, 16 * GiB, {}),
    ("V5E-16", "tpu", "v5e:4x4", 16, 16 * GiB, {}),
    ("v6e-1", "tpu", "v6e:1x1", 1, 32 * GiB, {"chips_per_host_bounds": (1, 1, 1)}),
    ("v6e-8", "tpu", "v6e:2x4", 8, 32 * GiB, {}),
    ("v5p-8", "tpu", "v5p:2x2x1", 4, 95 * GiB, {}),  # 8 TensorCores = 4 megacore chips
    ("v5p-32", "tpu", "v5p:2x2x4", 16, 95 * GiB, {}),
    ("tpu7x-8", "tpu", "tpu7x:2x2x1", 8, 96 * GiB, {}),  # 4 chips, 2 devices each
    ("h100", "cuda", "1x1x1", 1, 85_520_809_984, {}),
    ("h100x8", "cuda", "1x1x8", 8, 85_520_809_984, {}),
    ("h200x2", "cuda", "1x1x2", 2, 151_397_597_184, {}),
])
def test_target_table(name, platform, topology, devices, memory, kwargs):
    t = pt.parse_target(name)
    assert (t.platform, t.topology, t.devices, t.device_memory, t.kwargs) == (
        platform, topology, devices, memory, kwargs)


@pytest.mark.parametrize("name, message", [
    ("v5e-3", "v5e slices come as v5e-1, v5e-4"),
    ("v5p-3", "v5p slices come as v5p-8, v5p-16"),
    ("a100", "is not a known accelerator"),
    ("h100x0", "is not a known accelerator"),
    ("", "is not a known accelerator"),
])
def test_unknown_target_is_one_usage_error(name, message):
    with pytest.raises(UsageError, match=message):
        pt.parse_target(name)


def test_gpu_specs_differ_in_memory_and_name_only():
    h100, h200 = pt.gpu_spec("h100"), pt.gpu_spec("h200")
    assert "device_memory_size: 85520809984" in h100 and '"NVIDIA H100 80GB HBM3"' in h100
    assert "device_memory_size: 151397597184" in h200 and '"NVIDIA H200 141GB HBM3e"' in h200
    diff = [a for a, b in zip(h100.splitlines(), h200.splitlines(), strict=True) if a != b]
    assert [d.split(":")[0].strip() for d in diff] == [
        "memory_bandwidth", "device_memory_size", "model_str", "name", "device_description_str"]


def test_mesh_must_fit_the_target():
    cfg = plan.load_plan_config(None, [*TINY, "mesh.fsdp=8"])
    pt.check_target_mesh(pt.parse_target("v5e-8"), cfg)  # 8 of 8: fine
    pt.check_target_mesh(pt.parse_target("v5e-16"), cfg)  # 8 of 16: fine
    with pytest.raises(UsageError, match=r"needs 8 devices but --target v5p-8 has 4; .*"
                                         r"mesh.fsdp=4"):
        pt.check_target_mesh(pt.parse_target("v5p-8"), cfg)


@pytest.mark.parametrize("args, message", [
    (["--target", "v5e-16"], 'pip install "jax[tpu]=='),
    (["--target", "h100x8"], "pip install --no-deps jax-cuda12-plugin=="),
    (["--target", "v9z-4"], "is not a known accelerator"),
    (["--target", "v5e-16", "--devices", "4"], "give one of them"),
])
def test_target_bad_input_exits_2_with_one_line(args, message):
    res = _cli(*TINY, *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert message in lines[0] and "Traceback" not in res.stderr and res.stdout == ""


def test_missing_plugin_line_names_the_installed_jax_version():
    import jax

    line = pt.plugin_missing(pt.Target("v5e-1", "tpu", "v5e:1x1", 1, 16 * GiB))
    if importlib.util.find_spec("libtpu") is None:
        assert line is not None and f'jax[tpu]=={jax.__version__}"' in line
    else:  # a venv with libtpu: nothing is missing
        assert line is None


@pytest.mark.slow  # compiles init / update / rollout of the tiny model for a TPU v5e: ~40 s
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="needs libtpu (the TPU compiler): run in a venv that has it")
def test_tiny_plan_for_v5e_1_with_libtpu():
    res = subprocess.run([sys.executable, "-m", "ais_jax.plan", "--json", "--prompt-len", "8",
                          "--target", "v5e-1", *TINY], env=_env(), capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["backend"] == "tpu" and out["target"]["device_kind"] == "TPU v5 lite"
    assert out["device_memory_bytes"] == 16 * GiB and out["fits"] is True
    for name in ("init", "update", "rollout"):
        p = out[name]
        assert p["peak_bytes"] == (p["argument_bytes"] + p["output_bytes"] + p["temp_bytes"]
                                   - p["alias_bytes"]) > 0
    a = out["analytic"]
    assert out["init"]["output_bytes"] >= a["params_bytes"] + a["opt_state_bytes"]
    assert "cpu_widening" not in out


class _Lowered:  # a lowered program whose compile fails with ``error``
    def __init__(self, error: Exception):
        self.error = error

    def compile(self):
        raise self.error


def test_a_program_refused_for_memory_is_reported_not_raised():
    from ais_jax.run import plan_report as pr

    msg = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
           "temporaries (16.56G) exceeds available HBM (15.75G).")
    p = pr.compile_program(_Lowered(RuntimeError(msg)))
    assert p["peak_bytes"] is None and p["refused"] == msg
    with pytest.raises(RuntimeError, match="INTERNAL"):  # other compiler errors propagate
        pr.compile_program(_Lowered(RuntimeError("INTERNAL: no tile sizes")))
    assert pr.plus_resident(p, 5) is None and pr.plus_resident({"peak_bytes": 7}, 5) == 12
    assert pr.fits([7, 12], 12) and not pr.fits([7, 13], 12) and not pr.fits([None, 1], 12)


def test_a_program_the_compiler_fails_on_is_reported_and_the_verdict_is_not_known():
    """A plugin that cannot compile one program (the CUDA plugin asked for its libraries on
    the 8B update) leaves the other programs' figures and a verdict that claims nothing."""
    import jax

    from ais_jax.run import plan_report as pr

    msg = "INTERNAL: CUDA Runtime error: Error loading CUDA libraries."
    p = pr.compile_program(_Lowered(jax.errors.JaxRuntimeError(msg)))
    assert p["peak_bytes"] is None and p["failed"] == msg and "refused" not in p
    assert not pr.fits([1, p["peak_bytes"]], 10**9)


def test_gpu_targets_get_the_flags_a_deviceless_compile_needs(monkeypatch):
    # The 8B update failed in the CUDA plugin ("Error loading CUDA libraries") until CUB's
    # radix sort and autotuning were off; a flag the user set keeps the user's value.
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=2")
    monkeypatch.delenv("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", raising=False)
    pt.prepare_env(pt.parse_target("h100x8"))
    flags = os.environ["XLA_FLAGS"].split()
    assert sorted(flags) == ["--xla_gpu_autotune_level=2", "--xla_gpu_enable_cub_radix_sort=false",
                             "--xla_gpu_enable_triton_gemm=false"]
    assert os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] == "1"
    monkeypatch.setenv("XLA_FLAGS", "")
    pt.prepare_env(pt.parse_target("v5e-1"))  # TPU: nothing added
    assert os.environ["XLA_FLAGS"] == ""


# libtpu's three refusals when another process holds its lock file (openxla/xla,
# tpu_initialize_util.cc TryAcquireTpuLock)
LIBTPU_LOCKED = [
    "The TPU is already in use by process with pid 4242. Not attempting to load libtpu.so in "
    "this process.",
    'Internal error when accessing libtpu multi-process lockfile. Run "$ sudo rm '
    '/tmp/libtpu_lockfile".',
    'The TPU is already in use by another process probably owned by another user. Run "$ sudo '
    'lsof -w /dev/accel0" to figure out which process is using the TPU. If you still get this '
    'message, run "$ sudo rm /tmp/libtpu_lockfile".',
]


@pytest.mark.parametrize("message", LIBTPU_LOCKED)
def test_libtpu_held_by_another_process_names_the_real_situation(message, monkeypatch):
    """Issue 55 row 11: libtpu's ``sudo rm /tmp/libtpu_lockfile`` is wrong while the process
    holding the lock runs; the line says what is going on and what to do."""
    from jax.experimental import topologies

    def refuse(**kwargs):
        raise RuntimeError(f"ABORTED: {message}")

    monkeypatch.setattr(topologies, "get_topology_desc", refuse)
    with pytest.raises(UsageError) as e:
        pt.target_devices(pt.parse_target("v5e-4"))
    line = str(e.value)
    assert line.startswith("--target v5e-4: another process is using libtpu"), line
    assert "ALLOW_MULTIPLE_LIBTPU_LOAD=1" in line and "wait" in line
    assert "sudo rm" not in line and "\n" not in line


def test_other_plugin_refusals_keep_the_plugin_message(monkeypatch):
    from jax.experimental import topologies

    def refuse(**kwargs):
        raise RuntimeError("INVALID_ARGUMENT: bad topology\n  detail")

    monkeypatch.setattr(topologies, "get_topology_desc", refuse)
    with pytest.raises(UsageError, match=r"--target v5e-4: the tpu plugin refused topology "
                                         r"'v5e:2x2': INVALID_ARGUMENT: bad topology detail$"):
        pt.target_devices(pt.parse_target("v5e-4"))


def test_plan_interrupted_prints_one_line_and_exits_130(monkeypatch, capsys):
    """Issue 55 row 8: Ctrl-C while the plan compiles: one line and 130, no traceback."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan, "configure_devices", lambda n: None)
    monkeypatch.setattr(plan, "make_plan", interrupted)
    assert plan.main([*TINY, "--devices", "2", "mesh.fsdp=2"]) == 130
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip() == \
        "interrupted; no plan was printed (rerun the same command for it)"
