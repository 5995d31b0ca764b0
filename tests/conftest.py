"""Session setup shared by every test module.

*Compilation cache.*  Most of the suite's time is XLA compiling the same tiny programs again
in fresh processes (CLI runs, multi-process runs) and in new jit closures, so the suite keeps
one persistent compilation cache of its own, shared by both xdist workers and every process
they start: a fresh directory per session (made by the controller, removed at its end),
never the user's (``runtime.compile_cache``'s default, ``~/.cache/ais_jax/jax``).
``JAX_COMPILATION_CACHE_DIR`` is the variable both JAX and
`ais_jax.run.runtime.resolve_compile_cache` read; it is set before any test imports JAX.

JAX writes a cache entry in place (no temporary file and rename), and takes its file lock
for reads and writes only when ``jax_compilation_cache_max_size`` is set; a reader that met
a half-written entry would make XLA abort the process.  So the size is set (4 GiB: the lock
is on, eviction never happens in a session), and the one test that SIGKILLs a run gives
that run no cache (tests/test_train.py).  An earlier form of the suite turned the cache
off after XLA aborted in the long-lived pytest process; that abort was the mapping limit
`_free_compiled_programs` now guards against (commit 1180568), not the cache.
"""

from __future__ import annotations

import gc
import os
import re
import tempfile

import pytest

# The controller (or a run without xdist) makes the directory; its workers inherit it.
_OWNER = "AIS_JAX_TEST_CACHE" not in os.environ
if _OWNER:
    os.environ["AIS_JAX_TEST_CACHE"] = tempfile.mkdtemp(prefix="ais_jax_test_cache_")
_CACHE = os.environ["AIS_JAX_TEST_CACHE"]
# A folder for what the test processes of a session make once and share (`tiny_run`).
_SHARES = "AIS_JAX_TEST_SHARED" not in os.environ
if _SHARES:
    os.environ["AIS_JAX_TEST_SHARED"] = tempfile.mkdtemp(prefix="ais_jax_test_shared_")
_SHARED = os.environ["AIS_JAX_TEST_SHARED"]
os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(4 << 30)  # turns JAX's file lock on
os.environ.pop("JAX_ENABLE_COMPILATION_CACHE", None)
# Only programs that take 0.1 s or more to compile go into the cache (a few hundred over a
# session: the ones the CLI runs of many tests share).  A run
# (`ais_jax.run.runtime.setup_compile_cache`) otherwise lowers the threshold to 0 for its whole
# process -- the in-process CLI tests did that to their xdist worker -- and then every later
# compile of that worker, a 20 ms eager op included, wrote an entry; each write takes the file
# lock and lists and stats the whole directory (JAX's eviction check), which grows to thousands
# of entries over a session.  Later modules compiled ~1.3-1.6x slower: tests/test_decode.py took
# 65 s after nine other files against 51 s with a 1 s threshold (two runs side by side).  JAX's
# own variable wins over the run's thresholds, in the workers and in every process they start.
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.1"
# The suite's programs are tiny: their cost is compiling them, not running them.  So the suite
# compiles with XLA's cheapest settings: JAX's `jax_disable_most_optimizations` (backend
# optimization level 0, no expensive LLVM passes) and XLA:CPU's older elemental emitters in place
# of its MLIR fusion emitters (`--xla_cpu_use_fusion_emitters=false`).  A 1-step tiny CLI run and
# a LLaDA one used 34 s of CPU at the defaults, 20 s at level 0 and 10 s with both; the suite
# took 20m41s, 15m43s and 10m56s on 2 idle cores (in the working tree).
#
# What these settings change: float32 results to rounding (reductions in another order), so two
# *different* programs no longer always give identical bits; and float4_e2m1fn conversions,
# which the elemental emitters round twice (through a 16-bit float: 1.7498 becomes 2.0, not
# 1.5; tests/test_suite_settings.py).  FP8 and bf16 conversions are exact in both.  A test
# carries ``@pytest.mark.xla_optimized`` -- and compiles as a user's run does, in its own process
# and in those it starts -- when its claim depends on that: two programs giving identical bits
# or agreeing to ~1e-6, FP4 rounding, the golden numbers, or real-size model work whose time is
# running, not compiling (SmolLM2's notebook: 77 s at level 0, 31 s at the defaults).
# Processes the tests start inherit both settings.
_LEVEL_0 = "JAX_DISABLE_MOST_OPTIMIZATIONS"
NO_FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_FLAGS = os.environ.get("XLA_FLAGS", "")
# Except under an ISA cap without F16C (``--xla_cpu_max_isa=SSE4_2``, the ISA check of
# tests/test_cpu_isa.py): there XLA:CPU (jaxlib 0.10.2) compiles some 16-bit float conversions
# into calls of ``__extendhfsf2`` / ``__truncsfhf2``, which its JIT does not link -- every FP8
# conversion under the elemental emitters, more at optimization level 0 -- so the suite
# compiles as a user's run does, at XLA's defaults (issue 58; ais_jax.core.errors.xla_link_error).
NO_F16C = re.search(r"--xla_cpu_max_isa=SSE4_2(\s|$)", _FLAGS) is not None
if not NO_F16C:
    os.environ[_LEVEL_0] = "1"
    if NO_FUSION_EMITTERS not in _FLAGS.split():
        os.environ["XLA_FLAGS"] = (_FLAGS + " " + NO_FUSION_EMITTERS).strip()


def pytest_collection_modifyitems(config, items) -> None:
    """The longest test files first (tests/_schedule.py): the two xdist workers then end
    together instead of one running a long file alone at the end."""
    from _schedule import longest_first

    items[:] = longest_first(items)


# While XLA's default settings (`_user_settings`) are in effect: their undo and JAX's former
# optimization flag; empty under the suite's settings.
_USER: list = []


def _user_settings() -> None:
    """XLA's default settings, in this process (JAX's flag, and the fusion emitters back on
    through each compile's option overrides: XLA_FLAGS is read once per process) and in every
    process started from now on (the environment); no program compiled with the suite's
    settings is reused.  Nothing to do when they are in effect already."""
    if _USER:
        return
    import jax
    from jax._src import compiler

    plain = compiler.get_compile_options

    def with_fusion_emitters(*args, env_options_overrides=None, **kwargs):
        overrides = {**(env_options_overrides or {}), "xla_cpu_use_fusion_emitters": True}
        return plain(*args, env_options_overrides=overrides, **kwargs)

    # XLA_FLAGS is read when the backend starts: started here, under the suite's flags, it
    # keeps them for this process's unmarked tests (a marked first test left them off).
    jax.devices()
    mp = pytest.MonkeyPatch()
    mp.delenv(_LEVEL_0, raising=False)
    mp.setenv(
        "XLA_FLAGS",
        " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != NO_FUSION_EMITTERS),
    )
    mp.setattr(compiler, "get_compile_options", with_fusion_emitters)
    _USER.append((mp, jax.config.values["jax_disable_most_optimizations"]))
    jax.clear_caches()
    jax.config.update("jax_disable_most_optimizations", False)


def _suite_settings() -> None:
    """The suite's settings back (undoes `_user_settings`; nothing to do when they are in
    effect): no program compiled with XLA's defaults is reused."""
    if not _USER:
        return
    import jax

    mp, level_0 = _USER.pop()
    jax.config.update("jax_disable_most_optimizations", level_0)
    mp.undo()
    jax.clear_caches()


def _optimized(item) -> bool:
    return item is not None and item.get_closest_marker("xla_optimized") is not None


@pytest.fixture(autouse=True)
def _xla_optimized(request):
    """A test marked ``xla_optimized`` runs under XLA's default settings (`_user_settings`),
    in this process and in every process it starts; any other test under the suite's.

    The settings stay from one marked test to the next one of the same module (see
    `pytest_runtest_teardown`), so those tests share their compiled programs -- each of
    tests/test_fp4.py's 28 tests recompiled the same quantizers and eager ops after two
    ``jax.clear_caches()``; programs never cross from one setting to the other."""
    if _optimized(request.node):
        _user_settings()
    else:
        _suite_settings()
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test's fixtures are torn down: the suite's settings back, unless this test and
    the next are marked ``xla_optimized`` and of the same module.  (A module- or
    session-scoped fixture that such a next test is the first to use is then made under XLA's
    defaults.  tests/test_pretrained.py's ``smollm2``, first used by a marked test after an
    unmarked one, is made under the suite's: a module fixture is set up before the test's
    function-scoped `_xla_optimized`.)"""
    try:
        return (yield)
    finally:
        if not (_optimized(item) and _optimized(nextitem) and nextitem.module is item.module):
            _suite_settings()


def pytest_sessionfinish(session, exitstatus) -> None:
    """Remove the session's compilation cache (its owner only: a worker's end is not the
    session's)."""
    import shutil

    if _OWNER:
        shutil.rmtree(_CACHE, ignore_errors=True)
    if _SHARES:
        shutil.rmtree(_SHARED, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop every compiled program after each test module.

    Each XLA:CPU executable holds its own memory mappings, and the jit caches keep every
    program a test compiled alive for the whole session.  Over the full suite one pytest
    process passed Linux's default ``vm.max_map_count`` (65530): past it ``mmap`` fails
    inside XLA, which aborted or crashed the process in whichever test compiled next
    (three CI tries, all in tests/test_timing.py's CLI runs at 91-95% of the suite; the
    process had ~25,000 mappings at 45%).  Clearing the caches between modules lets the
    executables be freed, so the count stays at what one module needs.
    """
    yield
    import jax

    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def tiny_run():
    """One uninterrupted 3-step tiny run from the default config file (as the CLI starts),
    made once per session: ``(out_dir, RunResult)``.

    Several modules (test_train, test_reliability_run, test_reliability_results,
    test_gcs_run) start from this run; a test that changes the directory works on a copy
    (`_tiny.copy_run`), never on it.  Checkpoints 1, 2 and 3 are kept (``checkpoint.keep`` 3,
    the default).  The first test process that needs it makes it, under a file lock, in the
    session's shared folder (the two xdist workers each made their own before); the others
    wait for it and read its result.  One run per compiler setting (``XLA_FLAGS``, JAX's
    optimization level): a pytest process under an ISA cap (tests/test_cpu_isa.py) computes
    other bits, so it makes its own.
    """
    import fcntl
    import hashlib
    import pathlib
    import pickle

    setting = f"{os.environ.get('XLA_FLAGS', '')}|{os.environ.get(_LEVEL_0, '')}"
    out = os.path.join(_SHARED, "tiny_run_" + hashlib.sha256(setting.encode()).hexdigest()[:12])
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not os.path.exists(out + ".pickle"):
            result = _make_tiny_run(out)
            with open(out + ".pickle.tmp", "wb") as f:
                pickle.dump(result, f)
            os.replace(out + ".pickle.tmp", out + ".pickle")
        with open(out + ".pickle", "rb") as f:
            return pathlib.Path(out), pickle.load(f)


def _make_tiny_run(out: str):
    """`tiny_run`'s run into ``out`` (a half-made one from a failed try removed first)."""
    import shutil

    from _tiny import TINY_3_STEPS, TINY_RUN

    from ais_jax.config.load import load_config
    from ais_jax.config.schema import DEFAULT_CONFIG_PATH
    from ais_jax.run import cli

    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(DEFAULT_CONFIG_PATH, [f"out_dir={out}", *TINY_RUN, *TINY_3_STEPS])
    return cli.run(cfg)


@pytest.fixture(scope="session")
def gcs_emulator():
    """The in-memory GCS emulator (tests/_gcs.py), one per test process: its URL; the
    variables gcsfs and TensorStore read point at it until the session ends."""
    pytest.importorskip("gcp_storage_emulator")
    pytest.importorskip("gcsfs")
    from _gcs import ENV, start_emulator

    saved = {k: os.environ.get(k) for k in ENV}
    proc, url = start_emulator()
    yield url
    proc.kill()
    proc.wait()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def gcs_bucket(gcs_emulator):
    """A new empty bucket in the emulator: ``gs://<name>``."""
    import uuid

    from _gcs import make_bucket

    return make_bucket(gcs_emulator, f"ais-{uuid.uuid4().hex[:12]}")
