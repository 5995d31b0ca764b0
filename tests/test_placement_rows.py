"""Per-process rows (`ais_jax.training.placement`): which process scores a row, reading rows
from a process's own shards, and putting every process's numbers together.

The multi-process paths run for real in tests/test_multihost.py (2 processes x 2 devices,
a reward function that counts the rows each process scores); here the pure parts get
known answers from hand-made shards.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ais_jax.core.errors import UsageError
from ais_jax.training.placement import (
    combine_rows,
    owned_rows,
    row_owners,
    rows_from_shards,
    rows_to_host,
)


def test_row_owners_known_answers():
    # 8 rows on 4 devices of 2 processes, 2 rows each: the first two devices are process 0's.
    holders = [(0, slice(0, 2)), (0, slice(2, 4)), (1, slice(4, 6)), (1, slice(6, 8))]
    np.testing.assert_array_equal(row_owners(8, holders), [0, 0, 0, 0, 1, 1, 1, 1])
    # Rows replicated on both processes (a model axis across hosts): the lower one scores.
    holders = [(1, slice(0, 4)), (0, slice(0, 4)), (1, slice(4, 8)), (2, slice(4, 8))]
    np.testing.assert_array_equal(row_owners(8, holders), [0, 0, 0, 0, 1, 1, 1, 1])
    # A row no device holds has no owner.
    np.testing.assert_array_equal(row_owners(3, [(0, slice(0, 2))]), [0, 0, -1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(1, 10)),
                min_size=1, max_size=8))
def test_every_held_row_has_exactly_one_owner_that_holds_it(spec):
    holders = [(p, slice(a, a + n)) for p, a, n in spec]
    owner = row_owners(10, holders)
    for r in range(10):
        holding = {p for p, sl in holders if r in range(10)[sl]}
        assert owner[r] == (min(holding) if holding else -1)


def _shards(x, bounds, axis=0):
    """Hand-made ``(index, data)`` shards of ``x`` split along ``axis`` at ``bounds``."""
    out = []
    for a, b in bounds:
        index = [slice(None)] * x.ndim
        index[axis] = slice(a, b)
        out.append((tuple(index), x[tuple(index)]))
    return out


def test_rows_from_shards_known_answers():
    x = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    shards = _shards(x, [(2, 4), (6, 8)])  # this process holds rows 2, 3, 6, 7
    got = rows_from_shards(x.shape, x.dtype, shards, np.array([7, 2, 3]))
    np.testing.assert_array_equal(got, x[[7, 2, 3]])
    # Replicated shards (the same rows twice) and the batch on axis 1 (LLaDA [M, B, N]).
    y = np.arange(2 * 6 * 2, dtype=np.float32).reshape(2, 6, 2)
    shards = _shards(y, [(0, 3), (0, 3), (3, 6)], axis=1)
    np.testing.assert_array_equal(rows_from_shards(y.shape, y.dtype, shards, np.array([4, 0]),
                                                   axis=1), y[:, [4, 0]])


def test_rows_from_shards_refuses_what_it_cannot_read():
    x = np.zeros((4, 6), np.float32)
    with pytest.raises(ValueError, match=r"rows \[3\] are on no device"):
        rows_from_shards(x.shape, x.dtype, _shards(x, [(0, 2)]), np.array([0, 3]))
    split = [((slice(0, 4), slice(0, 3)), x[:, :3])]  # the other axis is split
    with pytest.raises(ValueError, match="split on an axis other than 0"):
        rows_from_shards(x.shape, x.dtype, split, np.array([0]))


def test_one_process_owns_every_row_and_combines_without_a_collective():
    import jax.numpy as jnp

    x = jnp.arange(12).reshape(6, 2)
    rows = owned_rows(x)
    np.testing.assert_array_equal(rows, np.arange(6))
    np.testing.assert_array_equal(rows_to_host(x, np.array([5, 1])), np.asarray(x)[[5, 1]])
    values = np.array([[0.5, 1.0]] * 6, np.float32)
    np.testing.assert_array_equal(combine_rows(values, rows, 6, 2), values)
    with pytest.raises(UsageError, match="reward function f raised"):
        combine_rows(None, rows, 6, 2, error="reward function f raised ValueError: bad")
