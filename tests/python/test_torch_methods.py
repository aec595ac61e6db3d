"""torch's tensor methods where they do not clash with NumPy's: view, contiguous,
float/double/half, type_as, pow, expand, flatten(start_dim, end_dim),
transpose(d0, d1) on more than 2 dims, swapaxes, real/imag (and np.real/np.imag),
conj, device, keepdim=; from_local strides of a permuted local layout; the local
array of ranks outside a sub-mesh after a reduction. Values equal NumPy's on the
full arrays (uneven shards), placements and communication as stated."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_tensor
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, make, mesh_of

R, S0, S1, S2, PS = Replicate(), Shard(0), Shard(1), Shard(2), Partial("sum")
COMM = MPI.COMM_WORLD


@pytest.mark.parametrize("pls", [[S0], [S1], [S2], [R], [PS]], ids=str)
def test_shape_methods_match_numpy(pls):
    mesh = mesh_of((W,))
    a = np.arange(5.0 * 3 * 7).reshape(5, 3, 7)
    d = make(a, mesh, pls)
    assert_matches(d.view(15, 7), a.reshape(15, 7))
    assert_matches(d.view((-1,)), a.reshape(-1))
    assert_matches(d.flatten(1), a.reshape(5, 21))
    assert_matches(d.flatten(0, 1), a.reshape(15, 7))
    assert_matches(d.flatten(-2, -1), a.reshape(5, 21))
    assert_matches(d.flatten(), a.ravel())
    with CommDebugMode() as mode:
        t = d.transpose(0, 2)
        s = d.swapaxes(1, 2)
    assert mode.get_total_counts() == 0
    assert_matches(t, a.swapaxes(0, 2))
    assert_matches(s, a.swapaxes(1, 2))
    assert_matches(d.transpose(2, 0, 1), a.transpose(2, 0, 1))
    assert_matches(d.pow(2), a ** 2)
    b = np.arange(4.0).reshape(1, 4)
    assert_matches(make(b, mesh, [S1]).expand(3, -1), np.broadcast_to(b, (3, 4)))
    assert_matches(make(b, mesh, [S1]).expand((2, 3, 4)), np.broadcast_to(b, (2, 3, 4)))
    with pytest.raises(ValueError):
        make(b, mesh, [R]).expand(4)


def test_two_d_transpose_keeps_numpy_meaning():
    """On 2 dims transpose(0, 1) is NumPy's identity permutation, not torch's swap
    (the porting guide lists the clash)."""
    mesh = mesh_of((W,))
    a = np.arange(12.0).reshape(3, 4)
    d = make(a, mesh, [S0])
    assert_matches(d.transpose(0, 1), a)
    assert_matches(d.transpose(1, 0), a.T)


def test_dtype_methods_and_pow_and_device():
    mesh = mesh_of((W,))
    a = np.arange(10.0).reshape(5, 2)
    d = make(a, mesh, [S0])
    assert d.float().dtype == np.float32 and d.double().dtype == np.float64
    assert d.half().dtype == np.float16
    assert d.type_as(make(a.astype(np.int32), mesh, [R])).dtype == np.int32
    assert d.float().placements == (S0,)
    assert_matches(d.pow(3), a ** 3)
    assert_matches(d.pow(d), a ** a)
    assert d.device == "cpu"


def test_contiguous():
    mesh = mesh_of((W,))
    d = make(np.arange(12.0).reshape(3, 4), mesh, [S0])
    assert d.contiguous() is d
    t = DTensor.from_local(np.arange(24.0).reshape(4, 6).T, mesh, [S0])
    c = t.contiguous()
    assert c.to_local().flags.c_contiguous and c.stride() == (4, 1)
    assert np.array_equal(c.full_tensor(), t.full_tensor())


def test_real_imag_keep_placements_and_partials():
    mesh = mesh_of((W,))
    a = np.arange(12.0).reshape(3, 4)
    z = a * (1 + 2j) - 1j
    for pls in ([S1], [R], [PS]):
        d = make(z, mesh, pls)
        with CommDebugMode() as mode:
            re, im = d.real, np.imag(d)
            re2 = np.real(d)
        assert mode.get_total_counts() == 0
        assert re.placements == tuple(pls) and im.placements == tuple(pls)
        assert_matches(re, z.real.copy())
        assert_matches(re2, z.real.copy())
        assert_matches(im, z.imag.copy())
        assert_matches(d.conj(), z.conj())
    r = make(a, mesh, [S0])
    assert r.real is r
    assert_matches(r.imag, np.zeros_like(a))


@pytest.mark.parametrize("pls", [[S0], [S1], [R]])
def test_real_and_imag_are_views_as_numpys(pls):
    """``z.real`` and ``z.imag`` (and np.real, np.imag) of a complex DTensor are
    views: a write into either reaches ``z``, a write into ``z`` shows in them. A
    real DTensor's imag is read-only zeros, as NumPy's."""
    mesh = mesh_of((W,))
    z = np.arange(12.0).reshape(3, 4) * (1 + 2j)
    d = make(z, mesh, pls)
    re, im = d.real, np.imag(d)
    re[1, :] = -5.0
    im += 1.0
    np.real(d)[0, 0] = 9.0
    z.real[1, :] = -5.0
    z.imag[...] += 1.0
    z.real[0, 0] = 9.0
    assert_matches(d, z)
    d *= 2
    z *= 2
    assert_matches(re, z.real.copy())
    assert_matches(im, z.imag.copy())
    r = make(np.ones((3, 4)), mesh, pls)
    with pytest.raises(ValueError, match="read-only"):
        r.imag[0, 0] = 1.0


def test_real_and_imag_attributes_are_read_in_any_order_on_each_rank():
    """Reading an attribute is local: libraries probe ``real`` and ``imag`` in an
    order that differs by rank (typing's Protocol checks, xarray's, walk a set of
    names), which an agreed call would refuse as different calls."""
    d = make(np.arange(6.0).reshape(3, 2) * 1j, mesh_of((W,)), [S0])
    names = ("real", "imag") if MPI.COMM_WORLD.Get_rank() % 2 else ("imag", "real")
    with CommDebugMode() as mode:
        parts = {n: getattr(d, n) for n in names}
    assert mode.get_total_counts() == 0
    assert_matches(parts["imag"], np.arange(6.0).reshape(3, 2))


def test_keepdim_alias():
    mesh = mesh_of((W,))
    a = np.arange(24.0).reshape(2, 3, 4)
    d = make(a, mesh, [S1])
    assert_matches(d.sum(1, keepdim=True), a.sum(1, keepdims=True))
    assert_matches(d.mean(axis=2, keepdim=True), a.mean(2, keepdims=True))
    assert_matches(d.max(0, keepdim=True), a.max(0, keepdims=True))
    assert_matches(d.var(1, keepdim=True), a.var(1, keepdims=True))
    assert_matches(d.argmax(1, keepdim=True), a.argmax(1, keepdims=True))
    with pytest.raises(TypeError, match="not both"):
        d.sum(1, keepdim=True, keepdims=True)


def test_from_local_stride_of_a_permuted_local_layout_is_torchs():
    """torch's from_local scales each stride at least the shard dim's by the mesh
    dim's size: a permuted local layout gives the permuted global one."""
    mesh = mesh_of((W,))
    local = np.zeros((4, 32, 8)).transpose(0, 2, 1)  # (4, 8, 32), strides (256, 1, 8)
    want = {0: (256, 1, 8), 1: (256 * W, 1, 8 * W), 2: (256 * W, 1, 8)}
    for dim, stride in want.items():
        dt = DTensor.from_local(local, mesh, [Shard(dim)])
        assert dt.stride() == stride, (dim, dt.stride())
    assert DTensor.from_local(np.zeros((4, 3)), mesh, [S0]).stride() == (3, 1)


def test_from_local_stride_equals_torch():
    torch = pytest.importorskip("torch")
    from torch.distributed.tensor._utils import compute_global_tensor_info
    from torch.distributed.tensor import Shard as TS

    class Sizes:  # compute_global_tensor_info reads only the mesh's sizes
        ndim = 1

        @staticmethod
        def size(mesh_dim=0):
            return W

    mesh = mesh_of((W,))
    base = np.zeros((3, 5, 2))
    for perm in ((0, 2, 1), (2, 1, 0), (1, 0, 2)):
        local = base.transpose(perm)
        for dim in range(3):
            _, stride = compute_global_tensor_info(torch.from_numpy(base).permute(perm),
                                                   Sizes(), [TS(dim)])
            assert DTensor.from_local(local, mesh, [Shard(dim)]).stride() == tuple(stride)


@pytest.mark.skipif(W == 1, reason="needs a rank outside the sub-mesh")
def test_reduction_on_a_sub_mesh_gives_outsiders_a_0d_array():
    sub = DeviceMesh("cpu", list(range(W - 1)))
    d = distribute_tensor(np.arange(12.0).reshape(3, 4), sub, [S0])
    for total in (d.sum(), np.sum(d), d.var(), d.argmax(), d.max()):
        if sub.get_coordinate() is None:
            assert total.to_local().shape == ()
        else:
            assert total.shape == ()
    rows = d.sum(axis=1)
    if sub.get_coordinate() is None:
        assert rows.to_local().shape == (0,)
