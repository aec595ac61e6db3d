"""``DTensor.flat`` as ``ndarray.flat`` on every placement: reads are new arrays,
writes reach the DTensor (scikit-learn's ``a.flat[::n + 1] += v`` on a diagonal
among them), values repeated as NumPy repeats them; 1 to 4 ranks, uneven at 3,
each checked against the same code on the gathered NumPy array."""

from __future__ import annotations


import numpy as np
import pytest

from mpitensor import Partial, Replicate, Shard
from ops_helpers import assert_matches, layout_fixture, make, quiet  # noqa: F401

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")
layout = layout_fixture((R, S0, S1, PS), (R, S0, S1))
pytestmark = pytest.mark.usefixtures("quiet")


@pytest.fixture
def arrays(layout):
    """(our DTensor, NumPy's array) of one (5, 5) value, laid out as ``layout``."""
    mesh, pls = layout
    full = np.arange(25.0).reshape(5, 5) - 7.0
    return make(full, mesh, pls), full


# Each a write a program makes through ``flat``, on ours and on NumPy's.
WRITES = [
    ("diagonal-iadd", lambda x: x.flat.__setitem__(slice(None, None, 6),
                                                    x.flat[::6] + 100.0)),
    ("item", lambda x: x.flat.__setitem__(7, -3.0)),
    ("negative-item", lambda x: x.flat.__setitem__(-1, 42.0)),
    ("slice", lambda x: x.flat.__setitem__(slice(3, 12), 9.0)),
    ("repeated", lambda x: x.flat.__setitem__(slice(2, 9), [1.0, 2.0, 3.0])),
    ("cut", lambda x: x.flat.__setitem__(slice(20, None), np.arange(10.0))),
    ("index-list", lambda x: x.flat.__setitem__([0, 24, 12], [5.0, 6.0, 7.0])),
    ("mask", lambda x: x.flat.__setitem__(np.arange(25) % 4 == 0, [1.0, 2.0])),
    ("zero-d", lambda x: x.flat.__setitem__(4, np.array(8.0))),
]


@pytest.mark.parametrize("name,write", WRITES, ids=[w[0] for w in WRITES])
def test_a_write_through_flat_reaches_the_dtensor(arrays, name, write):
    a, full = arrays
    write(full)
    write(a)
    assert_matches(a, full)


def test_a_sequence_into_one_element_raises_as_numpys(arrays):
    a, full = arrays
    for x in (full, a):
        for value in ([8.0], [8.0, 9.0]):
            with pytest.raises(ValueError, match="single item"):
                x.flat[4] = value
    assert_matches(a, full)


def test_the_augmented_diagonal_idiom(arrays):
    """``a.flat[::n + 1] += v`` as scikit-learn regularises a covariance."""
    a, full = arrays
    full.flat[::6] += 0.5
    a.flat[::6] += 0.5
    assert_matches(a, full)


def test_reads_are_new_arrays(arrays):
    a, full = arrays
    for key in (3, -2, slice(2, 11), slice(None, None, 6), [1, 7, 3]):
        ours, numpys = a.flat[key], full.flat[key]
        assert_matches(ours, numpys)
        ours[...] = 0.0
    assert_matches(a, full)
    assert len(a.flat) == full.size
    assert_matches(a.flat.copy(), full.flat.copy())
    assert a.flat.base is a
    with pytest.raises(IndexError):
        a.flat[25]


def test_assigning_flat_fills_with_the_value_repeated(arrays):
    a, full = arrays
    for value in (2.5, [1.0, 2.0], np.arange(4.0)):
        full.flat = value
        a.flat = value
        assert_matches(a, full)


def test_iterating_flat_gives_the_elements_in_c_order(arrays):
    a, full = arrays
    got = [float(x.full_tensor()) for x in a.flat]
    assert got == list(full.flat)
    assert np.array_equal(np.asarray(a.flat), np.asarray(full.flat))
