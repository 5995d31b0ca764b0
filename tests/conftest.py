"""Session setup shared by every test module.

The tests' runs use a persistent compilation cache of their own, a fresh directory per
session, instead of the user's (``runtime.compile_cache``'s default, ``~/.cache/ais_jax/jax``):
the suite then neither depends on nor adds to what other processes left there.  A cache
shared with other jobs can hold an entry another process was killed while writing, and
XLA aborts the whole process when it deserializes such an entry (seen once beside killed
runs on the 2-core VM).  ``JAX_COMPILATION_CACHE_DIR`` is the variable both JAX and
`ais_jax.run.runtime.resolve_compile_cache` read; it is set before any test imports JAX.
"""

from __future__ import annotations

import gc
import os
import tempfile

import pytest

os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="ais_jax_test_cache_")
# Off for the suite and the processes it starts (test_runtime's cache tests turn it on for
# themselves): each test compiles its programs in its own process anyway.
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"]


def pytest_sessionfinish(session, exitstatus) -> None:
    """Remove the session's compilation cache."""
    import shutil

    shutil.rmtree(_CACHE, ignore_errors=True)


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
def tiny_run(tmp_path_factory):
    """One uninterrupted 3-step tiny run from the default config file (as the CLI starts),
    made once per test process: ``(out_dir, RunResult)``.

    Several modules (test_train, test_reliability_run, test_reliability_results) start from
    this run; a test that changes the directory works on a copy (`_tiny.copy_run`), never
    on it.
    Checkpoints 1, 2 and 3 are kept (``checkpoint.keep`` 3, the default).
    """
    from _tiny import TINY_3_STEPS, TINY_RUN

    from ais_jax.config.load import load_config
    from ais_jax.config.schema import DEFAULT_CONFIG_PATH
    from ais_jax.run import cli

    out = tmp_path_factory.mktemp("tiny_run")
    cfg = load_config(DEFAULT_CONFIG_PATH, [f"out_dir={out}", *TINY_RUN, *TINY_3_STEPS])
    return out, cli.run(cfg)

