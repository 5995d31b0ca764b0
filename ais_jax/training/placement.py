"""Moving arrays between hosts and the mesh, in one process or several.

Every process of a multi-host run holds the same host inputs (same seed, same problems),
so a global array is built from each process's host copy (`to_global`), and a global
result is gathered back with a collective that every process joins (`to_host`).

A step's sampled rows stay where they were sampled: `owned_rows` names the rows
(leading axis) this process scores, each row on exactly one process (the lowest-numbered
process whose devices hold it), `rows_to_host` reads them from this process's own shards
(no collective), and `combine_rows` puts every process's per-row numbers (rewards,
verdicts) together with one small all-gather of numbers, never of tokens.  One process
owns every row, and these are plain NumPy calls.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def owned_rows(x: jax.Array) -> np.ndarray:
    """The rows (indices along axis 0) of ``x`` this process scores, ascending.

    A row is owned by the lowest-numbered process whose devices hold it, so each row has
    exactly one owner even when rows are replicated across processes (e.g. a model axis
    that spans hosts).

    Args:
      x: a global array whose leading axis is the batch, e.g. the rollout tokens ``[B, N]``.

    Returns:
      ``[n]`` int64 row indices (``arange(B)`` with one process).
    """
    if jax.process_count() == 1:
        return np.arange(x.shape[0])
    holders = [(d.process_index, index[0])
               for d, index in x.sharding.devices_indices_map(x.shape).items()]
    return np.nonzero(row_owners(x.shape[0], holders) == jax.process_index())[0]


def row_owners(num_rows: int, holders: Iterable[tuple[int, slice]]) -> np.ndarray:
    """The process that scores each row: the lowest-numbered one holding it.

    Args:
      num_rows: ``B``.
      holders: ``(process_index, rows_slice)`` of every device (its slice of axis 0).

    Returns:
      ``[B]`` int64 process indices (-1 for a row no device holds).
    """
    owner = np.full(num_rows, np.iinfo(np.int64).max, np.int64)
    for process, rows in holders:
        held = np.arange(num_rows)[rows]
        owner[held] = np.minimum(owner[held], process)
    owner[owner == np.iinfo(np.int64).max] = -1
    return owner


def rows_to_host(x: jax.Array, rows: np.ndarray, axis: int = 0) -> np.ndarray:
    """``x`` taken at ``rows`` along ``axis``, as NumPy, read from this process's own shards.

    No collective: every row must be held by a device of this process (`owned_rows` of an
    array with the same layout), and no other axis of ``x`` may be split across devices.

    Args:
      x: a global array, e.g. tokens ``[B, N]`` (``axis=0``) or LLaDA log-probs ``[M, B, N]``
        (``axis=1``).
      rows: ``[n]`` indices along ``axis``.
      axis: the batch axis.

    Returns:
      ``x`` with ``axis`` replaced by the ``n`` rows, in the order of ``rows``.

    Raises:
      ValueError: a row is on no device of this process, or another axis is split.
    """
    if x.is_fully_addressable:
        return np.take(np.asarray(x), rows, axis=axis)
    return rows_from_shards(x.shape, x.dtype, [(s.index, s.data) for s in x.addressable_shards],
                            rows, axis)


def rows_from_shards(shape: tuple[int, ...], dtype: Any, shards: list[tuple[Any, Any]],
                     rows: np.ndarray, axis: int = 0) -> np.ndarray:
    """`rows_to_host` from ``(index, data)`` pairs (a process's addressable shards).

    Args:
      shape: the global shape.
      dtype: its dtype.
      shards: ``(index, data)``: ``index`` a tuple of slices into the global array,
        ``data`` the shard's values (read only when it holds a wanted row).
      rows: ``[n]`` indices along ``axis``.
      axis: the batch axis.

    Returns:
      The array of ``shape`` with ``axis`` replaced by the ``n`` rows.

    Raises:
      ValueError: a row is in no shard, or a shard is split on another axis.
    """
    out_shape = list(shape)
    out_shape[axis] = len(rows)
    out = np.empty(out_shape, dtype)
    where = {int(r): i for i, r in enumerate(rows)}
    filled = np.zeros(len(rows), bool)
    for index, data in shards:
        if any(d != axis and (index[d].start or 0, index[d].stop or shape[d]) != (0, shape[d])
               for d in range(len(shape))):
            raise ValueError(f"rows_to_host: {tuple(shape)} is split on an axis other than "
                             f"{axis}")
        held = np.arange(shape[axis])[index[axis]]
        pick = [(j, where[int(r)]) for j, r in enumerate(held)
                if int(r) in where and not filled[where[int(r)]]]
        if not pick:
            continue
        src, dst = (np.asarray(v) for v in zip(*pick, strict=True))
        at_out, at_in = [slice(None)] * len(shape), [slice(None)] * len(shape)
        at_out[axis], at_in[axis] = dst, src
        out[tuple(at_out)] = np.asarray(data)[tuple(at_in)]
        filled[dst] = True
    if not filled.all():
        missing = [int(r) for r in np.asarray(rows)[~filled][:5]]
        raise ValueError(f"rows_to_host: rows {missing} are on no device of process "
                         f"{jax.process_index()}")
    return out


def combine_rows(values: np.ndarray | None, rows: np.ndarray, total: int, width: int,
                 error: str = "") -> np.ndarray:
    """Every process's per-row numbers in one ``[total, K]`` array, on every process.

    Each process passes the numbers of its `owned_rows` (each row has one owner), or the
    error that stopped it from computing them.  A collective: one all-gather of
    ``total x K`` float32 numbers and a 512-byte message per process.  A row's number
    is its owner's exactly (the others add zeros).

    Args:
      values: ``[n, K]`` float32 numbers of ``rows``; None when ``error`` is set.
      rows: ``[n]`` the owned rows.
      total: ``B``, the number of rows.
      width: ``K``, the same on every process.
      error: this process's one-line error, or ``""``.

    Returns:
      ``[total, K]`` float32: row ``r`` holds its owner's numbers.

    Raises:
      UsageError: a process passed an error; every process raises the same line (the first
        failing process's message, naming that process).
    """
    if jax.process_count() == 1:
        if error:
            raise UsageError(error)
        return np.asarray(values, np.float32)
    from jax.experimental import multihost_utils

    full = np.zeros((total, width), np.float32)
    if values is not None and not error:
        full[rows] = values
    msg = np.zeros(512, np.uint8)
    raw = error.encode()[:512]
    msg[:len(raw)] = np.frombuffer(raw, np.uint8)
    got = multihost_utils.process_allgather({"v": full, "m": msg})
    msgs = [bytes(np.asarray(m, np.uint8)).rstrip(b"\0").decode(errors="replace")
            for m in np.asarray(got["m"])]
    failed = [i for i, m in enumerate(msgs) if m]
    if failed:
        raise UsageError(f"process {failed[0]}: {msgs[failed[0]]}")
    return np.asarray(got["v"]).sum(axis=0)
