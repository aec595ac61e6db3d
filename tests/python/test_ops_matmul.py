"""matmul (@, np.matmul) and np.dot on DTensors: full_tensor() equals NumPy for
random shapes (batch, broadcast and 1-D operands, uneven shards) and placements;
the placement outcomes and collective counts of the key cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make, mesh_of,
                         mesh_shapes, next_layout, placements)

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")


@st.composite
def matmul_shapes(draw):
    n, k, m = (draw(st.integers(1, 7)) for _ in range(3))
    a = [k] if draw(st.integers(0, 4)) == 0 else [n, k]
    b = [k] if draw(st.integers(0, 4)) == 0 else [k, m]
    if len(a) == 2 and draw(st.booleans()):
        batch = draw(st.integers(1, 4))
        a = [batch] + a
        if len(b) == 2 and draw(st.booleans()):
            b = [draw(st.sampled_from([1, batch]))] + b
    return tuple(a), tuple(b)


@settings(max_examples=50)
@given(data=st.data())
def test_matmul_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    sa, sb = data.draw(matmul_shapes())
    dtype = data.draw(st.sampled_from([np.float64, np.int64]))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    a = rng.integers(-5, 6, size=sa).astype(dtype)
    b = rng.integers(-5, 6, size=sb).astype(dtype)
    da = make(a, mesh, placements(data.draw, a.ndim, mesh.ndim))
    db = make(b, mesh, placements(data.draw, b.ndim, mesh.ndim))
    assert_matches(da @ db, a @ b)
    if a.ndim <= 2 and b.ndim <= 2:
        assert_matches(np.dot(da, db), np.dot(a, b))


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_matmul_matches_numpy_on_empty_shards(shape):
    """The corners the property test may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included),
    times a second operand laid out otherwise (vectors, matrices both ways round,
    a batch); a contraction over nothing is zeros."""
    ndim = len(shape)
    a = np.arange(float(np.prod(shape))).reshape(shape) % 5 - 2
    b = a[::-1] + 1
    for mesh, pls in corner_layouts(ndim):
        da, db = make(a, mesh, pls), make(b, mesh, next_layout(pls, ndim))
        bt, dbt = np.swapaxes(b, 0, -1), np.swapaxes(db, 0, -1)
        if ndim == 3:  # a batch of matrices times the batch transposed
            bt, dbt = np.swapaxes(b, -1, -2), np.swapaxes(db, -1, -2)
        assert_matches(da @ dbt, a @ bt)
        if ndim <= 2:
            assert_matches(np.dot(dbt, da), np.dot(bt, a))


def test_s0_at_s0_moves_the_smaller_operand_once():
    """What moves now decides (the rule: never more bytes than torch):
    a small x moves by one all-to-all and the output stays Partial(sum); a small
    y is gathered and the output is Shard(0)."""
    mesh = mesh_of((W,))
    x = np.arange(64.0).reshape(8, 8)
    y = np.arange(256.0).reshape(8, 32)
    dx, dy = make(x, mesh, [S0]), make(y, mesh, [S0])
    with CommDebugMode() as mode:
        z = dx @ dy
    assert dict(mode.get_comm_counts()) == ({"all_to_all_single": 1} if W > 1 else {})
    # each rank keeps 1/W of its x rows' shard: (W-1)/W of x leaves the ranks
    assert MPI.COMM_WORLD.allreduce(sum(mode.get_comm_bytes().values())) == \
        pytest.approx(x.nbytes * (W - 1) / W, abs=8 * W)
    assert z.placements == ((PS,) if W > 1 else (S0,))
    assert_matches(z, x @ y)
    dxl, dys = make(y.T.copy(), mesh, [S0]), make(x, mesh, [S0])
    with CommDebugMode() as mode:
        z = dxl @ dys
    assert dict(mode.get_comm_counts()) == ({"all_gather_into_tensor": 1} if W > 1 else {})
    assert z.placements == (S0,)
    assert_matches(z, y.T @ x)


@pytest.mark.parametrize("pa,pb,expect", [(S1, S0, PS), (S0, R, S0), (R, S1, S1),
                                          (PS, R, PS), (R, PS, PS)])
def test_placement_outcomes_without_communication(pa, pb, expect):
    mesh = mesh_of((W,))
    x = np.arange(48.0).reshape(6, 8) / 7
    y = np.arange(64.0).reshape(8, 8) / 5
    dx, dy = make(x, mesh, [pa]), make(y, mesh, [pb])
    with CommDebugMode() as mode:
        z = np.matmul(dx, dy)
    assert mode.get_total_counts() == 0
    assert z.placements == (expect,)
    assert_matches(z, x @ y)


@pytest.mark.parametrize("k", [2, 6])
def test_contraction_with_empty_shards_stays_local(k):
    """k features over W ranks (6 over 4 is 2, 2, 2, 0; 2 over 3 is 1, 1, 0): a rank
    with an empty shard contributes zeros to the Partial(sum) instead of gathering."""
    mesh = mesh_of((W,))
    x = np.arange(5.0 * k).reshape(5, k) / 7
    y = np.arange(3.0 * k).reshape(k, 3) / 5
    dx, dy = make(x, mesh, [S1]), make(y, mesh, [S0])
    with CommDebugMode() as mode:
        z = dx @ dy
        e = np.einsum("ik,kj->ij", dx, dy)
    assert mode.get_total_counts() == 0
    assert z.placements == (PS,) and e.placements == (PS,)
    assert_matches(z, x @ y)
    assert_matches(e, x @ y)


def test_errors():
    mesh = mesh_of((W,))
    dx = make(np.ones((4, 4)), mesh, [S0])
    # a plain operand is replicated once the ranks agree on it
    np.testing.assert_array_equal((dx @ np.ones((4, 4))).full_tensor(), np.full((4, 4), 4.0))
    with pytest.raises(TypeError, match="1-D and 2-D"):
        np.dot(make(np.ones((2, 4, 4)), mesh, [R]), dx)
    with pytest.raises(ValueError):
        dx @ make(np.ones((3, 4)), mesh, [R])
