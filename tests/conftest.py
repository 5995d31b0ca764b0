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

import os
import tempfile

os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="ais_jax_test_cache_")
# Off for the suite and the processes it starts (test_runtime's second-process test turns it
# back on for its probes): twice this
# session XLA aborted the long-lived pytest process while (de)serializing an executable for the
# cache.  tests/test_runtime.py turns it on around the test that checks the cache is written.
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"]


def pytest_sessionfinish(session, exitstatus) -> None:
    """Remove the session's compilation cache."""
    import shutil

    shutil.rmtree(_CACHE, ignore_errors=True)
