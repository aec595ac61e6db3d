"""np.einsum (explicit "->" subscripts) and its instances np.tensordot, np.inner,
np.outer on DTensors: full_tensor() equals NumPy on the full arrays for random
subscripts, shapes (uneven shards) and placements; the placement outcomes of the
key cases."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpitensor import GatherWarning, Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make, mesh_of,
                         mesh_shapes, next_layout, placements)

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")


@st.composite
def einsum_case(draw):
    letters = "abcde"
    sizes = {ch: draw(st.integers(1, 5)) for ch in letters}
    k = draw(st.integers(1, 3))
    terms = []
    for _ in range(k):
        n = draw(st.integers(0, 3))
        terms.append("".join(draw(st.lists(st.sampled_from(letters), min_size=n,
                                           max_size=n))))
    used = sorted(set("".join(terms)))
    out = "".join(draw(st.permutations(used))[:draw(st.integers(0, len(used)))])
    return terms, out, sizes


@settings(max_examples=60)
@given(data=st.data())
def test_einsum_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    terms, out, sizes = data.draw(einsum_case())
    dtype = data.draw(st.sampled_from([np.float64, np.int64]))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    fulls = [rng.integers(-4, 5, size=[sizes[c] for c in t]).astype(dtype) for t in terms]
    dts = [make(f, mesh, placements(data.draw, f.ndim, mesh.ndim)) for f in fulls]
    sub = ",".join(terms) + "->" + out
    assert_matches(np.einsum(sub, *dts), np.einsum(sub, *fulls))


@settings(max_examples=50)
@given(data=st.data())
def test_tensordot_inner_outer_match_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    common = tuple(data.draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
    sa = tuple(data.draw(st.lists(st.integers(1, 4), max_size=2))) + common
    sb = common + tuple(data.draw(st.lists(st.integers(1, 4), max_size=2)))
    if not sa or not sb:
        sa, sb = sa + (3,), (3,) + sb
        common = common + (3,) if not common else common
    a = rng.integers(-4, 5, size=sa).astype(np.float64)
    b = rng.integers(-4, 5, size=sb).astype(np.float64)
    da = make(a, mesh, placements(data.draw, a.ndim, mesh.ndim))
    db = make(b, mesh, placements(data.draw, b.ndim, mesh.ndim))
    n = len(common) if sa[len(sa) - len(common):] == sb[:len(common)] else 0
    assert_matches(np.tensordot(da, db, axes=n), np.tensordot(a, b, axes=n))
    pairs = ([0], [0]) if a.shape[0] == b.shape[0] else ([], [])
    assert_matches(np.tensordot(da, db, axes=pairs), np.tensordot(a, b, axes=pairs))
    if a.shape[-1] == b.shape[-1]:
        assert_matches(np.inner(da, db), np.inner(a, b))
    u = rng.integers(-4, 5, size=data.draw(st.integers(1, 7))).astype(np.float64)
    v = rng.integers(-4, 5, size=data.draw(st.integers(1, 7))).astype(np.int64)
    du = make(u, mesh, placements(data.draw, 1, mesh.ndim))
    dv = make(v, mesh, placements(data.draw, 1, mesh.ndim))
    assert_matches(np.outer(du, dv), np.outer(u, v))


# Subscripts for each number of dims of a corner shape: sums over each dim, a
# transpose, a product kept or contracted.
CORNER_SUBSCRIPTS = {
    1: ["i->", "i->i", "i,i->", "i,i->i"],
    2: ["ij->i", "ij->j", "ij->ji", "ij,ij->i", "ij,kj->ik", "ij,ik->jk"],
    3: ["ijk->k", "ijk->ik", "ijk,ijk->j", "ijk,ljk->il"],
}


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_einsum_and_tensordot_match_numpy_on_empty_shards(shape):
    """The corners the property tests may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included),
    with a second operand laid out otherwise; contracted dims of size 0 give
    zeros."""
    ndim = len(shape)
    a = np.arange(float(np.prod(shape))).reshape(shape) % 5 - 2
    b = a[::-1] + 1
    for mesh, pls in corner_layouts(ndim):
        da, db = make(a, mesh, pls), make(b, mesh, next_layout(pls, ndim))
        for sub in CORNER_SUBSCRIPTS[ndim]:
            ops = (da, db) if "," in sub else (da,)
            assert_matches(np.einsum(sub, *ops), np.einsum(sub, *(a, b)[:len(ops)]))
        assert_matches(np.tensordot(da, db, axes=ndim), np.tensordot(a, b, axes=ndim))
        assert_matches(np.tensordot(da, db, axes=([0], [0])),
                       np.tensordot(a, b, axes=([0], [0])))


@pytest.mark.parametrize("sub,pa,pb,expect", [
    ("ij,jk->ik", S1, S0, PS), ("ij,jk->ik", S0, R, S0), ("ij,jk->ki", R, S1, S0),
    ("ij,jk->ik", PS, R, PS), ("bij,bjk->bik", S0, S0, S0), ("ij,ij->i", S0, S0, S0),
    ("ij,ij->", S1, S1, PS)])
def test_placement_outcomes_without_communication(sub, pa, pb, expect):
    mesh = mesh_of((W,))
    nd = len(sub.split(",")[0])
    a = np.arange(4.0 * 8 * 8)[: (4 * 8 * 8 if nd == 3 else 64)].reshape(
        (4, 8, 8) if nd == 3 else (8, 8)) / 7
    b = a[::-1].copy() / 3
    da, db = make(a, mesh, [pa]), make(b, mesh, [pb])
    with CommDebugMode() as mode:
        z = np.einsum(sub, da, db)
    assert mode.get_total_counts() == 0
    assert z.placements == (expect,)
    assert_matches(z, np.einsum(sub, a, b))


@pytest.mark.usefixtures("strict_numpy")
def test_errors():
    mesh = mesh_of((W,))
    dx = make(np.ones((4, 4)), mesh, [S0])
    # a plain operand is replicated once the ranks agree on it
    np.testing.assert_array_equal(np.einsum("ij,jk->ik", dx, np.ones((4, 4))).full_tensor(),
                                  np.full((4, 4), 4.0))
    with pytest.raises(TypeError, match="1-D"):
        np.outer(dx, dx)


ELLIPSIS_CASES = [("...j,...j->...", 2), ("...j,...j", 2), ("ijk", 1), ("kji", 1),
                  ("i...,i...->...", 2), ("...j,j->...", "vector"), ("ij...->...ji", 1),
                  ("a...c,a...c", 2), ("ij,jk", "matrix")]


@pytest.mark.parametrize("subscripts, operands", ELLIPSIS_CASES, ids=str)
@pytest.mark.parametrize("pls", [[R], [S0], [S1], [Shard(2)], [PS]], ids=str)
def test_einsum_spells_ellipsis_and_implicit_output(subscripts, operands, pls):
    """'...' and the implicit output (no '->'), as xarray's dot writes them, run
    distributed with NumPy's values; '...' dims left out of an explicit output are
    NumPy's ValueError."""
    rng = np.random.default_rng(len(subscripts))
    a, b = rng.standard_normal((4, 5, 3)), rng.standard_normal((4, 5, 3))
    mesh = mesh_of((W,))
    da = make(a, mesh, pls)
    if operands == "vector":
        full, ours = (a, b[0, 0]), (da, make(b[0, 0], mesh, [R]))
    elif operands == "matrix":
        full, ours = (a[0], b[0].T), (make(a[0], mesh, [R]), make(b[0].T, mesh, [S0]))
    else:
        full = (a, b)[:operands]
        ours = (da, make(b, mesh, [R] if pls[0].is_partial() else pls))[:operands]
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        assert_matches(np.einsum(subscripts, *ours), np.einsum(subscripts, *full))
    with pytest.raises(ValueError):
        np.einsum("i...->i", a)
    with pytest.raises(ValueError):
        np.einsum("i...->i", da)
