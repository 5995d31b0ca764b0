"""Moving arrays between hosts and the mesh, in one process or several.

Every process of a multi-host run holds the same host values (same seed, same
computation), so a global array is built from each process's host copy, and a
global result is gathered back with a collective that every process joins.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


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
