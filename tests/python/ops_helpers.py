"""Shared strategies and builders for the NumPy-operation tests: meshes, DTensors of
any placements (Partial ones built with from_local from parts that reduce exactly to
the full array), and the comparison with NumPy on the full arrays."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from mpi4py import MPI

from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh

W = MPI.COMM_WORLD.Get_size()
_MESHES: dict = {}


def mesh_of(shape):
    if shape not in _MESHES:
        _MESHES[shape] = init_device_mesh("cpu", shape)
    return _MESHES[shape]


def mesh_shapes():
    return [(W,), (2, 2)] if W == 4 else [(W,)]


def placements(draw, ndim, mesh_ndim, partial=True):
    """One placement per mesh dim: Replicate, Shard of any dim, or Partial(sum)."""
    options = [Replicate()] + [Shard(d) for d in range(ndim)]
    if partial:
        options.append(Partial("sum"))
    return tuple(draw(st.sampled_from(options)) for _ in range(mesh_ndim))


def make(full: np.ndarray, mesh, pls) -> DTensor:
    """A DTensor whose global value is `full`, laid out by `pls`. A Partial(sum) mesh
    dim gets parts that sum exactly to the value: K on coordinates > 0, the value
    less (n-1)*K on coordinate 0."""
    full = np.asarray(full)
    plain = [Replicate() if p.is_partial() else p for p in pls]
    local = distribute_tensor(full, mesh, plain).to_local().copy()
    coord = mesh.get_coordinate()
    for m, p in enumerate(pls):
        if p.is_partial():
            n = mesh.shape[m]
            k = np.ones_like(local) * 3
            local = np.asarray(k if coord[m] > 0 else local - (n - 1) * k)
    strides = tuple(int(np.prod(full.shape[d + 1:])) for d in range(full.ndim))
    return DTensor.from_local(local, mesh, pls, shape=full.shape, stride=strides)


def assert_matches(result: DTensor, expect):
    expect = np.asarray(expect)
    got = result.full_tensor()
    assert got.shape == expect.shape, (got.shape, expect.shape)
    assert got.dtype == expect.dtype, (got.dtype, expect.dtype)
    if expect.dtype.kind in "fc":
        np.testing.assert_allclose(got, expect, rtol=1e-10, atol=1e-10)
    else:
        np.testing.assert_array_equal(got, expect)
