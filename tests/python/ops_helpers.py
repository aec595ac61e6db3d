"""Shared strategies and builders for the NumPy-operation tests: meshes, DTensors of
any placements (Partial ones built with from_local from parts that reduce exactly to
the full array), and the comparison with NumPy on the full arrays."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import strategies as st
from mpi4py import MPI

from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh

W = MPI.COMM_WORLD.Get_size()
_MESHES: dict = {}


def mesh_of(shape):
    if shape not in _MESHES:
        _MESHES[shape] = init_device_mesh("cpu", shape)
    return _MESHES[shape]


def layout_id(layout) -> str:
    """A test id of ``(mesh shape, placements)``: ``2x1-S0,P``."""
    shape, pls = layout
    return "x".join(map(str, shape)) + "-" + ",".join(
        "P" if p.is_partial() else "R" if p.is_replicate() else f"S{p.dim}" for p in pls)


def layout_fixture(options, pairs=None):
    """A fixture of ``(mesh, placements)``: each of ``options`` on the (W,) mesh
    and, at an even W, each pair of ``pairs`` (``options`` unless given) on the
    (2, W // 2) mesh. Example: ``layout = layout_fixture((R, S0, S1, PS))``."""
    pairs = options if pairs is None else pairs
    layouts = [((W,), (p,)) for p in options] + (
        [((2, W // 2), pls) for pls in itertools.product(pairs, repeat=2)]
        if W % 2 == 0 else [])

    @pytest.fixture(params=layouts, ids=[layout_id(x) for x in layouts])
    def layout(request):
        shape, pls = request.param
        return mesh_of(shape), pls
    return layout


@pytest.fixture
def quiet():
    """Warnings ignored: a write with no distributed rule (into a Partial, say)
    gathers, with a warning. Use as ``pytestmark = pytest.mark.usefixtures("quiet")``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def mesh_shapes():
    return [(W,), (2, 2)] if W == 4 else [(W,)]


def mesh_shapes_1d_2d():
    """The 1-D mesh and 2-D meshes at every world size: (1, W) and (W, 1), and
    (2, 2) at 4 ranks."""
    return list(dict.fromkeys([(W,), (1, W), (W, 1)] + ([(2, 2)] if W == 4 else [])))


def mesh_layouts(*two_d):
    """(mesh shape, placements) pairs for a 2-D array: Replicate, Shard(0) and
    Shard(1) over every rank, then at np 4 each of ``two_d`` on the (2, 2) mesh."""
    out = [((W,), (p,)) for p in (Replicate(), Shard(0), Shard(1))]
    if W == 4:
        out += [((2, 2), tuple(pls)) for pls in two_d]
    return out


def placements(draw, ndim, mesh_ndim, partial=True):
    """One placement per mesh dim: Replicate, Shard of any dim, or Partial(sum)."""
    options = [Replicate()] + [Shard(d) for d in range(ndim)]
    if partial:
        options.append(Partial("sum"))
    return tuple(draw(st.sampled_from(options)) for _ in range(mesh_ndim))


# Shapes that leave some rank's shard empty, or holding one element, at every
# mesh the suite runs on: sizes 0 and 1, and dims shorter than the mesh. Property
# tests draw shapes at random, so these corners go through a deterministic test
# beside each of them instead of being left to the draw.
CORNER_SHAPES = ((0,), (1,), (3,), (0, 3), (3, 0), (1, 3), (2, 1), (1, 1, 2), (1, 2, 0))


def corner_layouts(ndim, partial=True):
    """Every (mesh, placements) of the suite's meshes whose mesh dims each are
    Replicate, a Shard of any dim or, when ``partial``, Partial(sum): with
    CORNER_SHAPES, every way a small dim can be cut into empty shards.

    Example: ``corner_layouts(1, False)`` at 4 ranks gives ``(mesh, (Replicate(),))``,
    ``(mesh, (Shard(0),))`` and the nine layouts of the (2, 2) mesh.
    """
    options = [Replicate()] + [Shard(d) for d in range(ndim)]
    if partial:
        options.append(Partial("sum"))
    return [(mesh_of(shape), pls) for shape in mesh_shapes()
            for pls in itertools.product(options, repeat=len(shape))]


def next_layout(pls, ndim, partial=True):
    """``pls`` with each mesh dim's placement moved on to the next of
    :func:`corner_layouts`' options: a second operand laid out otherwise, so that
    every layout meets another without trying every pair.

    Example: ``next_layout((Shard(0), Replicate()), 2)`` is ``(Shard(1), Shard(0))``.
    """
    options = [Replicate()] + [Shard(d) for d in range(ndim)]
    if partial:
        options.append(Partial("sum"))
    return tuple(options[(options.index(p) + 1) % len(options)] if p in options
                 else Replicate() for p in pls)


def matches_or_raises_alike(ours, numpys, compare=None):
    """Calls ``numpys()`` and ``ours()`` and compares: the same value (by
    ``compare``, :func:`assert_matches` unless given), or, where NumPy raises, an
    exception of the same type from ours, on every rank.

    Example: ``matches_or_raises_alike(lambda: np.argmax(dt), lambda: np.argmax(full))``.
    """
    try:
        expect = numpys()
    except Exception as e:  # noqa: BLE001 - any NumPy error is the one to match
        with pytest.raises(type(e)):
            ours()
        return
    (compare or assert_matches)(ours(), expect)


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
