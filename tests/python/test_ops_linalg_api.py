"""The array API's np.linalg functions, np.matrix_transpose, np.cross,
np.linalg.multi_dot, np.linalg.matrix_power and np.array_equiv on DTensors:
NumPy's value bit for bit (small integers as floats, so every sum is exact in any
order) and dtype on every rank, for the suite's layouts on shapes that leave
shards empty; what moves is what the rules they are made of move (nothing for
transposes, diagonals and cross products over unsharded vectors); NumPy's
exception types for bad arguments."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import W, corner_layouts, make, matches_or_raises_alike, mesh_of, mesh_shapes
from test_ops_pointwise import exact

R, S0, S1 = Replicate(), Shard(0), Shard(1)


def ints(shape, kind=np.float64, mod=7):
    n = int(np.prod(shape))
    return ((np.arange(n) * 5) % mod - mod // 2).astype(kind).reshape(shape)


def plain(pls):
    return not any(p.is_partial() for p in pls)


class no_gather(warnings.catch_warnings):
    def __enter__(self):
        super().__enter__()
        warnings.simplefilter("error", GatherWarning)


@pytest.mark.parametrize("shape", ((0, 3), (3, 0), (2, 1), (5, 4), (4, 7), (3, 4, 4)),
                         ids=str)
def test_transposes_diagonals_traces(shape):
    full = ints(shape)
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        with no_gather(), CommDebugMode() as mode:
            mt1 = np.matrix_transpose(dt)
            mt2 = np.linalg.matrix_transpose(dt)
            dg = np.linalg.diagonal(dt, offset=1)
            tr = np.linalg.trace(dt, offset=-1, dtype=np.float32)
        assert mode.get_total_counts() == 0
        exact(mt1, np.matrix_transpose(full))
        exact(mt2, np.linalg.matrix_transpose(full))
        exact(dg, np.linalg.diagonal(full, offset=1))
        exact(tr, np.asarray(np.linalg.trace(full, offset=-1, dtype=np.float32)))


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_products(mesh_shape):
    mesh = mesh_of(mesh_shape)
    a, b = ints((6, 5)), ints((5, 3), mod=5)
    u, v = ints((6,)), ints((5,), np.int64)
    layouts = [(S0,), (S1,), (R,)] if len(mesh_shape) == 1 else [(S0, S1), (R, S0), (S1, R)]
    for pls in layouts:
        da, db = make(a, mesh, pls), make(b, mesh, pls[::-1])
        du, dv = (make(x, mesh, tuple(p if p != S1 else R for p in pls)) for x in (u, v))
        with no_gather():
            exact(np.linalg.matmul(da, db), np.linalg.matmul(a, b))
            exact(np.linalg.outer(du, dv), np.linalg.outer(u, v))
            exact(np.linalg.tensordot(da, db, axes=1), np.linalg.tensordot(a, b, axes=1))
            exact(np.linalg.tensordot(da, da, axes=((0, 1), (0, 1))),
                  np.asarray(np.linalg.tensordot(a, a, axes=((0, 1), (0, 1)))))
            for axis in (-1, 0):
                exact(np.linalg.vecdot(da, da, axis=axis), np.linalg.vecdot(a, a, axis=axis))
            c = a + 1j * a[::-1]
            dc = make(c, mesh, pls)
            exact(np.linalg.vecdot(dc, da), np.linalg.vecdot(c, a))
            i8 = (a * 20).astype(np.int8)
            exact(np.linalg.vecdot(make(i8, mesh, pls), make(i8, mesh, pls)),
                  np.linalg.vecdot(i8, i8))  # wraps as NumPy's
            exact(np.linalg.vecdot(da, make(a[0], mesh, (R,) * mesh.ndim)),
                  np.linalg.vecdot(a, a[0]))
            bits = a > 0
            exact(np.linalg.vecdot(make(bits, mesh, pls), make(bits, mesh, pls)),
                  np.linalg.vecdot(bits, bits))
            # Values whose sums round: where the axis is whole, NumPy's own loop.
            r = np.random.default_rng(0).standard_normal((6, 5))
            dr = make(r, mesh, tuple(R if p == S1 else p for p in pls))
            exact(np.linalg.vecdot(dr, dr), np.linalg.vecdot(r, r))
            # BLAS rounds a block of rows as it rounds the whole only where the
            # operands are whole: replicated ones here.
            whole = make(r, mesh, (R,) * mesh.ndim)
            exact(np.linalg.tensordot(whole, make(r.T.copy(), mesh, (R,) * mesh.ndim), axes=1),
                  np.linalg.tensordot(r, r.T, axes=1))
            exact(np.tensordot(whole, whole, axes=([1], [1])),
                  np.tensordot(r, r, axes=([1], [1])))
            z = r + 1j * r[::-1]
            dz = make(z, mesh, tuple(R if p == S1 else p for p in pls))
            exact(np.linalg.vector_norm(dz, axis=1), np.linalg.vector_norm(z, axis=1))
            exact(np.linalg.vector_norm(dr, axis=-1, ord=3), np.linalg.vector_norm(r, axis=-1,
                                                                                   ord=3))
            chain = [a, b, ints((3, 4)), ints((4, 2), mod=3)]
            dchain = [make(x, mesh, pls) for x in chain]
            for k in (2, 3, 4):
                exact(np.linalg.multi_dot(dchain[:k]), np.linalg.multi_dot(chain[:k]))
            exact(np.linalg.multi_dot([du, da, db]), np.linalg.multi_dot([u, a, b]))
            exact(np.linalg.multi_dot([da, db, make(ints((3,)), mesh, (R,) * mesh.ndim)]),
                  np.linalg.multi_dot([a, b, ints((3,))]))
            exact(np.linalg.multi_dot([du, da, make(ints((5,)), mesh, (R,) * mesh.ndim)]),
                  np.asarray(np.linalg.multi_dot([u, a, ints((5,))])))


def test_matrix_power():
    for mesh, pls in corner_layouts(2):
        m = ints((4, 4), mod=3)
        dm = make(m, mesh, pls)
        with no_gather():
            for n in (0, 1, 2, 3, 5, 6, 13):
                exact(np.linalg.matrix_power(dm, n), np.linalg.matrix_power(m, n))
        stack = ints((2, 3, 3), np.int64, mod=3)
        dstack = make(stack, mesh, (R,) * mesh.ndim)
        for n in (0, 4):
            exact(np.linalg.matrix_power(dstack, n), np.linalg.matrix_power(stack, n))
    mesh = mesh_of((W,))
    bad = [ints((4, 3)), ints((4,)), ints((3, 3))]
    for full, n in zip(bad, (2, 2, 1.5)):
        dt = make(full, mesh, (S0,))
        matches_or_raises_alike(lambda: np.linalg.matrix_power(dt, n),
                                lambda: np.linalg.matrix_power(full, n), compare=exact)


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_cross_moves_nothing_over_unsharded_vectors(mesh_shape):
    mesh = mesh_of(mesh_shape)
    a, b = ints((7, 3)), ints((7, 3), mod=5)
    for rows in ((S0,), (R,)) if len(mesh_shape) == 1 else ((S0, R), (S0, S0), (R, R)):
        da, db = make(a, mesh, rows), make(b, mesh, rows)
        with no_gather(), CommDebugMode() as mode:
            got = np.cross(da, db)
            lin = np.linalg.cross(da, db)
        assert mode.get_total_counts() == 0
        assert got.placements == rows
        exact(got, np.cross(a, b))
        exact(lin, np.linalg.cross(a, b))
        # The vectors along dim 0 and the output's along dim 1: made whole first.
        exact(np.cross(make(a.T.copy(), mesh, rows), db, axisa=0, axisc=1),
              np.cross(a.T, b, axisa=0, axisc=1))
        exact(np.cross(da, make(b[2], mesh, (R,) * mesh.ndim)), np.cross(a, b[2]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            exact(np.cross(make(a[:, :2], mesh, rows), db), np.cross(a[:, :2], b))
            exact(np.cross(da, make(b[:, :2], mesh, rows)), np.cross(a, b[:, :2]))
            exact(np.cross(make(a[:, :2], mesh, rows), make(b[:, :2], mesh, rows)),
                  np.cross(a[:, :2], b[:, :2]))
        ai = a.astype(np.int32)
        exact(np.cross(make(ai, mesh, rows), db), np.cross(ai, b))


def test_norms():
    for mesh, pls in corner_layouts(3):
        full = ints((3, 4, 2))
        dt = make(full, mesh, pls)
        with no_gather():
            for ord in (2, 1, 0, np.inf, -np.inf, 3):
                for axis in (None, 1, (0, 2), (2, 0, 1)):
                    for keepdims in (False, True):
                        exact(np.linalg.vector_norm(dt, axis=axis, keepdims=keepdims, ord=ord),
                              np.asarray(np.linalg.vector_norm(full, axis=axis,
                                                               keepdims=keepdims, ord=ord)))
            for ord in ("fro", 1, -1, np.inf, -np.inf):
                exact(np.linalg.matrix_norm(dt, ord=ord, keepdims=True),
                      np.linalg.matrix_norm(full, ord=ord, keepdims=True))
    mesh = mesh_of((W,))
    empty = np.zeros((0, 3))
    de = make(empty, mesh, (S0,))
    for ord in (np.inf, -np.inf, 2):
        for axis in (None, (0, 1), 0):
            matches_or_raises_alike(lambda: np.linalg.vector_norm(de, axis=axis, ord=ord),
                                    lambda: np.asarray(np.linalg.vector_norm(empty, axis=axis,
                                                                             ord=ord)),
                                    compare=exact)


def test_array_equiv():
    for mesh, pls in corner_layouts(2):
        full = np.tile(np.arange(4.0), (5, 1))
        dt = make(full, mesh, pls)
        row = make(np.arange(4.0), mesh, (R,) * mesh.ndim)
        assert np.array_equiv(dt, row) is True
        assert np.array_equiv(dt, make(np.arange(5.0), mesh, (R,) * mesh.ndim)) is False
        other = full.copy()
        other[4, 3] = -1
        assert np.array_equiv(dt, make(other, mesh, pls)) is False


def test_bad_arguments_raise_numpys_types():
    mesh = mesh_of((W,))
    a2, a3, v = ints((4, 3)), ints((2, 4, 3)), ints((4,))
    d2, d3, dv = (make(x, mesh, (S0,)) for x in (a2, a3, v))
    cases = [
        (lambda x, y: np.linalg.outer(x, y), (d2, dv), (a2, v)),
        (lambda x, y: np.linalg.vecdot(x, y), (d2, dv), (a2, v)),
        (lambda x, y: np.linalg.cross(x, y), (dv, dv), (v, v)),
        (lambda x, y: np.cross(x, y), (dv, dv), (v, v)),
        (lambda x, y: np.cross(x, y, axisc=3), (d2, d2), (a2, a2)),
        (lambda x, y: np.cross(x, y), (d2 > 0, d2 > 0), (a2 > 0, a2 > 0)),
        (lambda x, y: np.linalg.multi_dot([x, y, x]), (d3, d2), (a3, a2)),
        (lambda x, y: np.linalg.multi_dot([x]), (d2, d2), (a2, a2)),
        (lambda x, y: np.matrix_transpose(x), (dv, dv), (v, v)),
        (lambda x, y: np.linalg.matrix_norm(x), (dv, dv), (v, v)),
    ]
    for func, ours, theirs in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            matches_or_raises_alike(lambda: func(*ours), lambda: func(*theirs),
                                    compare=exact)
