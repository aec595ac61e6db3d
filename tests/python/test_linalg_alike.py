"""Results every rank computes for itself from the same bytes (TSQR's R, the SVD of
R or of the stacked R factors, lstsq's solution) are made alike, so that no
rank is ever wrong: ranks whose LAPACK rounds or picks signs differently, as on nodes with
other CPUs, all take the first rank's result, with a RuntimeWarning, instead of
Replicate results whose replicas differ or a U assembled from two SVDs. The
difference is made by patching LAPACK's answer on every rank but the first. Run
under mpiexec at 1 to 4 ranks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor._lapack
from mpitensor import Replicate, Shard, distribute_tensor
from mpitensor.device_mesh import init_device_mesh

COMM = MPI.COMM_WORLD
P = COMM.size

pytestmark = pytest.mark.skipif(P == 1, reason="one rank cannot disagree with itself")


def _same_on_every_rank(x) -> bool:
    mine = x.to_local().tobytes()
    return all(b == mine for b in COMM.allgather(mine))


@pytest.fixture
def other_signs(monkeypatch):
    """np.linalg.svd whose first singular pair has the other sign on every rank but
    the first: a valid SVD on each rank, a different one on two."""
    svd = np.linalg.svd

    def flipped(a, *args, **kwargs):
        out = svd(a, *args, **kwargs)
        # LAPACK's answer only: a DTensor's call comes back through here too.
        if COMM.rank == 0 or type(a) is not np.ndarray or not isinstance(out, tuple) \
                or 0 in out[1].shape:
            return out
        u, s, vh = out
        u, vh = u.copy(), vh.copy()
        u[..., :, 0] *= -1
        vh[..., 0, :] *= -1
        return type(out)(u, s, vh)

    monkeypatch.setattr(np.linalg, "svd", flipped)


@pytest.mark.parametrize("shape", [(20 * P, 5), (4 * P, 4 * P)], ids=["tsqr", "stacked R"])
def test_svds_that_differ_by_rank_give_one_svd(other_signs, shape):
    a = np.random.default_rng(0).standard_normal(shape)
    mesh = init_device_mesh("cpu", (P,))
    dt = distribute_tensor(a, mesh, [Shard(0)])
    with pytest.warns(RuntimeWarning, match="different results"):
        u, s, vh = np.linalg.svd(dt, full_matrices=False)
    whole_u, whole_vh = u.full_tensor(), vh.full_tensor()
    assert np.linalg.norm((whole_u * s.full_tensor()) @ whole_vh - a) <= 1e-12 * np.linalg.norm(a)
    if vh.placements[0].is_replicate():
        assert _same_on_every_rank(vh) and _same_on_every_rank(s)


def test_tsqr_r_that_differs_by_rank_is_the_first_ranks(monkeypatch):
    tsqr = mpitensor._lapack.tsqr

    def rounded(*args, **kwargs):
        q, r = tsqr(*args, **kwargs)
        return q, r if COMM.rank == 0 else r * (1 + 1e-15)

    monkeypatch.setattr(mpitensor._lapack, "tsqr", rounded)
    a = np.random.default_rng(1).standard_normal((16 * P, 4))
    mesh = init_device_mesh("cpu", (P,))
    with pytest.warns(RuntimeWarning, match="first rank's"):
        q, r = np.linalg.qr(distribute_tensor(a, mesh, [Shard(0)]))
    assert _same_on_every_rank(r)
    assert np.linalg.norm(q.full_tensor() @ r.full_tensor() - a) <= 1e-12 * np.linalg.norm(a)


def test_alike_results_cost_no_warning():
    a = np.random.default_rng(2).standard_normal((20 * P, 5))
    mesh = init_device_mesh("cpu", (P,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        np.linalg.svd(distribute_tensor(a, mesh, [Shard(0)]), full_matrices=False)


@pytest.mark.world(4, reason="replica groups need a mesh dim the grid leaves out")
def test_scalapack_replica_groups_give_one_result(monkeypatch):
    """A matrix replicated over a mesh dim its grid does not use is factored by
    each replica group: groups that round differently (made so here by patching
    the second group's singular values and U) still give Replicate results of the
    same bytes, and U the same along that dim, silently: the first group's."""
    from mpitensor._algorithms import _scalapack_rect

    mesh = init_device_mesh("cpu", (2, 2))
    second = mesh.get_coordinate()[1] == 1
    call = _scalapack_rect.call

    def rounded(f, *args):
        out = call(f, *args)
        if f is _scalapack_rect.mt_scalapack_svd and second:
            for x in (args[8], args[9]):  # s and U, as the driver wrote them
                x *= 1 + 1e-15
        return out

    monkeypatch.setattr(_scalapack_rect, "call", rounded)
    a = np.random.default_rng(3).standard_normal((6, 12))
    dt = distribute_tensor(a, mesh, [Shard(1), Replicate()])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        u, s, vh = np.linalg.svd(dt, full_matrices=False)
    assert _same_on_every_rank(s)
    along = MPI.COMM_WORLD.allgather((mesh.get_coordinate()[0], u.to_local().tobytes()))
    assert all(b == dict(along)[c] for c, b in along)
    assert np.linalg.norm((u.full_tensor() * s.full_tensor()) @ vh.full_tensor() - a) \
        <= 1e-12 * np.linalg.norm(a)
