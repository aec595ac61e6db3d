"""NumPy's order, whatever the ranks: every function whose result lists elements
(indices, values, sets) gives them in NumPy's order on every layout, so that
nothing a client builds on the order (labels, positions) follows the ranks.

Each call runs on an array with repeated values, NaNs where the dtype has them
and empty shards (uneven rows), in every layout of the suite's meshes, and must
equal NumPy's result exactly (values and dtype); ``unique_values`` comes sorted,
as ``np.unique``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor._ops._fallback import GatherWarning
from ops_helpers import W, corner_layouts, make

A = np.array([[3, 1, 2, 1], [0, 3, 3, 2], [1, 0, 2, 2], [3, 1, 0, 1], [2, 2, 1, 0]])
F = np.where(A == 0, np.nan, A.astype(np.float64))
B = np.array([2, 5, 1, 1, 7])

CALLS = {
    "nonzero": lambda x: np.nonzero(x),
    "argwhere": lambda x: np.argwhere(x),
    "flatnonzero": lambda x: np.flatnonzero(x),
    "where(cond)": lambda x: np.where(x > 1),
    "mask": lambda x: x[x > 1],
    "extract": lambda x: np.extract(x > 1, x),
    "compress": lambda x: np.compress(np.arange(x.shape[0]) % 2 == 0, x, axis=0),
    "unique": lambda x: np.unique(x, return_index=True, return_inverse=True,
                                  return_counts=True),
    "unique_values": lambda x: np.unique_values(x),
    "unique_counts": lambda x: np.unique_counts(x),
    "unique_all": lambda x: np.unique_all(x),
    "union1d": lambda x: np.union1d(x, B),
    "intersect1d": lambda x: np.intersect1d(x, B, return_indices=True),
    "setdiff1d": lambda x: np.setdiff1d(x, B),
    "setxor1d": lambda x: np.setxor1d(x, B),
    "sort": lambda x: np.sort(x, axis=0),
    "argsort stable": lambda x: np.argsort(x, axis=0, kind="stable"),
    "argsort flat": lambda x: np.argsort(x, axis=None, kind="stable"),
    "searchsorted": lambda x: np.searchsorted(np.sort(x, axis=None), [0, 1.5, 2, 9]),
}


def _plain(v):
    if isinstance(v, tuple):
        return tuple(_plain(x) for x in v)
    return v.full_tensor() if hasattr(v, "full_tensor") else np.asarray(v)


def _same(got, want, what):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for g, w in zip(got, want):
            _same(g, w, what)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got, want)
    np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("data", ["int", "float"])
def test_order_is_numpys(name, data):
    full = A if data == "int" else F
    call = CALLS[name]
    if name in ("intersect1d", "union1d", "setdiff1d", "setxor1d", "unique_values",
                "unique_counts", "unique_all", "searchsorted", "flatnonzero", "extract"):
        full = full.reshape(-1)
    # unique_values is sorted as np.unique is (NumPy lists integers in a hash
    # set's order, which its clients do not expect): docs/ecosystem.md
    want = np.unique(full, equal_nan=False) if name == "unique_values" else call(full)
    # every layout, Partial but for booleans' masks (a sum of parts is no mask)
    for mesh, pls in corner_layouts(full.ndim, partial=False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GatherWarning)
            got = _plain(call(make(full, mesh, pls)))
        _same(got, want, f"{name} on {pls} of a {mesh.shape} mesh (np {W})")
