"""Moving arrays between hosts and the mesh, in one process or several.

Every process of a multi-host run holds the same host values (same seed, same
computation), so a global array is built from each process's host copy, and a
global result is gathered back with a collective that every process joins.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import numpy as np

from ais_jax.core.errors import UsageError


def place(tree: Any, shardings: Any) -> Any:
    """Lay ``tree`` out with ``shardings`` (a matching pytree of shardings).

    One process: `jax.device_put` (a no-op for a leaf already laid out so).  Several
    processes: a leaf already laid out so is kept; any other is rebuilt as a
    global array from its host copy; `jax.device_put` onto a mesh that spans
    processes with one device each gave arrays whose shards could not be read
    back (orbax failed on them at the first checkpoint, jax 0.10.2).
    """
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    from jax.experimental import multihost_utils

    def one(x: Any, sharding: Any) -> Any:
        if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
            return x  # already laid out (start-up builds leaves in their shards)
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            x = multihost_utils.process_allgather(x, tiled=True)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx],
                                            dtype=host.dtype)

    return jax.tree.map(one, tree, shardings)


def to_global(x: np.ndarray, sharding: Any) -> jax.Array:
    """A global array with ``sharding`` from the host array ``x`` every process holds."""
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx], dtype=x.dtype)


def to_host(x: Any) -> Any:
    """The whole value of a (possibly cross-process) array or pytree, as NumPy on every process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return jax.tree.map(np.asarray, multihost_utils.process_allgather(x, tiled=True))
    return jax.tree.map(np.asarray, x)


def check_same_on_every_process(x: np.ndarray, what: str) -> None:
    """Every process must hold the same bytes of ``x``; else one `UsageError` on all of them.

    Each process computes the host values of a step itself (`ais_jax.training.rl`), so a
    value that depends on the host (a clock, a pid, an unseeded random draw, a live API in
    a reward function) would silently mix: the update would train on each process's own
    rows while process 0 logs its own view.  One all-gather of an 8-byte digest per call
    (nothing in one process).

    Args:
      x: the host array every process computed, e.g. the step's rewards ``[B]``.
      what: what ``x`` is, for the message.

    Raises:
      UsageError: the digests differ; every process raises the same line.
    """
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    raw = hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=8).digest()
    mine = np.frombuffer(raw, dtype=np.int32)  # [2]: int32 travels on every backend
    digests = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 2)
    differ = [i for i in range(len(digests)) if (digests[i] != digests[0]).any()]
    if differ:
        raise UsageError(f"{what} differ between processes (process 0 and process(es) "
                         f"{differ} computed other values): a reward must depend only on the "
                         "prompt, the completion and the row (no clock, pid, unseeded random "
                         "draw or live service); make it deterministic")
