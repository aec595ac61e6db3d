"""NumPy's polynomial arithmetic on DTensor coefficients (_poly.py): ``polyadd``,
``polysub``, ``polymul``, ``polyder``, ``polyint``. NumPy's value on every rank for
Shard(0) and Replicate coefficients, lengths that leave a rank with none, on 1-D
and 2-D meshes; run by the rules of their steps (strict mode: no gather); NumPy's
exceptions; the gradient flows through ``polyder``."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Replicate, Shard
from ops_helpers import W, assert_matches, make, mesh_of, mesh_shapes

R, S0 = Replicate(), Shard(0)


def layouts():
    return [(shape, pls) for shape in mesh_shapes() for pls in ((R,) * len(shape),
                                                                (S0,) + (R,) * (len(shape) - 1),
                                                                (S0,) * len(shape))]


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_poly_arithmetic_matches_numpy(layout):
    mesh = mesh_of(layout[0])
    p, q = np.array([3.0, -1.0, 2.0, 0.5, 4.0]), np.array([1.0, 2.0])
    dp, dq = make(p, mesh, layout[1]), make(q, mesh, layout[1])
    with mt.strict():
        for f in (np.polyadd, np.polysub):
            assert_matches(f(dp, dq), f(p, q))
            assert_matches(f(dq, dp), f(q, p))
            assert_matches(f(dp, [1.0]), f(p, [1.0]))
        for m in (0, 1, 3, 6):
            assert_matches(np.polyder(dp, m), np.polyder(p, m))
        for m, k in ((1, None), (2, 3.0), (3, [1.0, 2.0, 3.0]), (0, None)):
            assert_matches(np.polyint(dp, m, k), np.polyint(p, m, k))
        assert_matches(np.polymul(dp, dq), np.polymul(p, q))
    with pytest.raises(ValueError):
        np.polyder(dp, -1)
    with pytest.raises(ValueError):
        np.polyint(dp, -1)
    with pytest.raises(ValueError):
        np.polyint(dp, 3, [1.0, 2.0])


def test_polyder_differentiates():
    mesh = mesh_of((W,))
    p = make(np.array([1.0, 2.0, 3.0]), mesh, [S0]).requires_grad_(True)
    np.polyder(p).sum().backward()
    assert_matches(p.grad, np.array([2.0, 1.0, 0.0]))
