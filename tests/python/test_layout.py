"""Layout math: the local shape and global offset of every shard, for this rank
(compute_local_shape_and_global_offset) and as a pure function of a coordinate
(local_shape_and_global_offset), against worked examples and a
brute-force reference."""

import itertools
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard, init_device_mesh
from mpitensor._layout import plan
from mpitensor.placement_types import _StridedShard
from mpi_helpers import coordinates, ref_box

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
box_of = mt.local_shape_and_global_offset


# -- worked examples ----------------------------------------------------------------

def test_ten_rows_on_four_ranks():
    boxes = [box_of((10,), (4,), (i,), [Shard(0)]) for i in range(4)]
    assert [b[0] for b in boxes] == [(3,), (3,), (3,), (1,)]
    assert [b[1] for b in boxes] == [(0,), (3,), (6,), (9,)]


def test_five_rows_on_four_ranks_has_an_empty_shard():
    boxes = [box_of((5,), (4,), (i,), [Shard(0)]) for i in range(4)]
    assert [b[0] for b in boxes] == [(2,), (2,), (1,), (0,)]
    assert [b[1] for b in boxes] == [(0,), (2,), (4,), (5,)]


@pytest.mark.parametrize("n, k", [(10, 4), (5, 4), (0, 3), (7, 1), (3, 5), (12, 4)])
def test_chunk_sizes_are_the_shards_of_local_box(n, k):
    # _bind.core.chunk_sizes (nn.attention's head check, parallel's annotate) is mt_chunk,
    # the rule local_box follows.
    sizes = mt._bind.core.chunk_sizes(n, k)
    assert sizes == tuple(box_of((n,), (k,), (i,), [Shard(0)])[0][0] for i in range(k))
    assert sum(sizes) == n


def test_31_by_3_on_two_by_two():
    pl = [Shard(0), Shard(1)]
    got = {c: box_of((31, 3), (2, 2), c, pl) for c in coordinates((2, 2))}
    assert got == {
        (0, 0): ((16, 2), (0, 0)),
        (0, 1): ((16, 1), (0, 2)),
        (1, 0): ((15, 2), (16, 0)),
        (1, 1): ((15, 1), (16, 2)),
    }


def test_nested_shards_of_one_dim():
    pl = [Shard(0), Shard(0)]
    got = [box_of((5, 3), (2, 2), c, pl) for c in coordinates((2, 2))]
    assert [b[0] for b in got] == [(2, 3), (1, 3), (1, 3), (1, 3)]
    assert [b[1] for b in got] == [(0, 0), (2, 0), (3, 0), (4, 0)]


def test_replicate_and_partial_hold_everything():
    for pl in ([Replicate()], [Partial()], [Partial("max")]):
        assert box_of((4, 5), (3,), (2,), pl) == ((4, 5), (0, 0))


def test_zero_dim_tensor():
    assert box_of((), (2, 2), (1, 1), [Replicate(), Partial()]) == ((), ())


def test_negative_shard_dims_are_normalised():
    assert box_of((7, 9), (2,), (1,), [Shard(-1)]) == box_of((7, 9), (2,), (1,), [Shard(1)])
    assert box_of((7, 9), (2,), (1,), [Shard(-2)]) == ((3, 9), (4, 0))


def test_an_empty_dim_reports_offset_equal_to_its_size():
    # Every shard of an empty dim is empty, and so is the tail of a short dim.
    assert box_of((0, 4), (3,), (1,), [Shard(0)]) == ((0, 4), (0, 0))
    assert box_of((4, 0), (3,), (2,), [Shard(0)]) == ((0, 0), (4, 0))
    assert box_of((2, 6), (3, 2), (2, 1), [Shard(0), Shard(1)]) == ((0, 3), (2, 3))


def test_the_pure_function_needs_no_mpi():
    """Importing mpitensor and asking for a box must not initialise MPI."""
    code = (
        "import mpitensor as mt\n"
        "print(mt.local_shape_and_global_offset((5,), (4,), (3,), [mt.Shard(0)]))\n"
        "import mpi4py\n"
        "mpi4py.rc.initialize = False\n"
        "from mpi4py import MPI\n"
        "print(MPI.Is_initialized())\n"
    )
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["((0,), (5,))", "False"]


# -- brute-force reference ---------------------------------------------------------

@st.composite
def layouts(draw, max_ndim=4, max_size=9, max_mesh_ndim=3, max_mesh_size=5):
    ndim = draw(st.integers(0, max_ndim))
    shape = tuple(draw(st.lists(st.integers(0, max_size), min_size=ndim, max_size=ndim)))
    mesh_ndim = draw(st.integers(1, max_mesh_ndim))
    mesh_shape = tuple(draw(st.lists(st.integers(1, max_mesh_size), min_size=mesh_ndim,
                                     max_size=mesh_ndim)))
    choices = [Replicate(), Partial()] + [Shard(d) for d in range(-ndim, ndim)]
    placements = tuple(draw(st.lists(st.sampled_from(choices), min_size=mesh_ndim,
                                     max_size=mesh_ndim)))
    return shape, mesh_shape, placements


@given(layouts(), st.data())
@settings(max_examples=200)
def test_matches_brute_force_reference(layout, data):
    shape, mesh_shape, placements = layout
    coord = tuple(data.draw(st.integers(0, s - 1)) for s in mesh_shape)
    assert box_of(shape, mesh_shape, coord, placements) == ref_box(
        shape, mesh_shape, coord, placements)


def replication(mesh_shape, placements):
    """How many coordinates hold each element: the product of non-Shard mesh dims."""
    return math.prod(s for s, p in zip(mesh_shape, placements) if not isinstance(p, Shard))


def check_tiling(shape, mesh_shape, placements):
    """The boxes of all coordinates lie inside the tensor and cover each element
    exactly `replication` times; empty extents sit at the end of their dim."""
    count = np.zeros(shape, np.int64)
    for c in coordinates(mesh_shape):
        local, offset = box_of(shape, mesh_shape, c, placements)
        assert len(local) == len(offset) == len(shape)
        for n, s, o in zip(shape, local, offset):
            assert 0 <= s and 0 <= o and o + s <= n
            if s == 0:
                assert o == n
        count[tuple(slice(o, o + s) for o, s in zip(offset, local))] += 1
    assert np.all(count == replication(mesh_shape, placements))


@given(layouts())
@settings(max_examples=150)
def test_boxes_tile_the_tensor(layout):
    check_tiling(*layout)


def test_exhaustive_small_sweep():
    """All 1-D and 2-D tensors up to 6 on all meshes up to (4, 4), every placement."""
    for shape in itertools.chain(((n,) for n in range(7)),
                                 itertools.product(range(0, 7, 3), range(5))):
        choices = [Replicate()] + [Shard(d) for d in range(len(shape))]
        for mesh_shape in itertools.chain(((k,) for k in range(1, 5)),
                                          itertools.product(range(1, 5), range(1, 5))):
            for pl in itertools.product(choices, repeat=len(mesh_shape)):
                for c in coordinates(mesh_shape):
                    assert box_of(shape, mesh_shape, c, pl) == ref_box(shape, mesh_shape, c, pl)


# -- this rank's box on real meshes ---------------------------------------------------

def world_meshes():
    shapes = [(N,), (1, N), (N, 1)] + ([(2, 2)] if N == 4 else [])
    return shapes


def placement_choices(mesh_ndim, ndim):
    choices = [Replicate(), Partial()] + [Shard(d) for d in range(-ndim, ndim)]
    return list(itertools.product(choices, repeat=mesh_ndim))


@pytest.mark.parametrize("mesh_shape", world_meshes(), ids=str)
def test_compute_for_this_rank_matches_reference_and_tiles(mesh_shape, comm):
    mesh = init_device_mesh("cpu", mesh_shape)
    coord = tuple(mesh.get_coordinate())
    problems = []
    for shape in [(10,), (5, 3), (31, 3), (0, 2), (3, 1, 2), ()]:
        for pl in placement_choices(len(mesh_shape), len(shape)):
            mine = mt.compute_local_shape_and_global_offset(shape, mesh, pl)
            if mine != ref_box(shape, mesh_shape, coord, pl):
                problems.append(f"{shape} {pl}: {mine}")
            # Every rank's answer, gathered, tiles the tensor.
            boxes = comm.allgather(mine)
            count = np.zeros(shape, np.int64)
            for local, offset in boxes:
                count[tuple(slice(o, o + s) for o, s in zip(offset, local))] += 1
            if not np.all(count == replication(mesh_shape, pl)):
                problems.append(f"{shape} {pl}: the boxes do not tile the tensor")
    assert problems == []


@pytest.mark.world(4, reason="needs 4 ranks")
def test_compute_worked_examples_on_four_ranks():
    line = init_device_mesh("cpu", (4,))
    grid = init_device_mesh("cpu", (2, 2))
    f = mt.compute_local_shape_and_global_offset
    assert f((10,), line, [Shard(0)]) == [((3,), (0,)), ((3,), (3,)), ((3,), (6,)),
                                          ((1,), (9,))][RANK]
    assert f((5,), line, [Shard(0)]) == [((2,), (0,)), ((2,), (2,)), ((1,), (4,)),
                                         ((0,), (5,))][RANK]
    assert f((31, 3), grid, [Shard(0), Shard(1)]) == [
        ((16, 2), (0, 0)), ((16, 1), (0, 2)), ((15, 2), (16, 0)), ((15, 1), (16, 2))][RANK]
    assert f((5, 3), grid, [Shard(0), Shard(0)]) == [
        ((2, 3), (0, 0)), ((1, 3), (2, 0)), ((1, 3), (3, 0)), ((1, 3), (4, 0))][RANK]


@pytest.mark.skipif(N < 2, reason="needs a rank outside the mesh")
def test_compute_on_a_non_member_rank():
    mesh = init_device_mesh("cpu", (N - 1,))
    got = mt.compute_local_shape_and_global_offset((7, 2), mesh, [Shard(0)])
    if RANK == N - 1:
        assert got == ((0,), ())
    else:
        assert got == ref_box((7, 2), (N - 1,), (RANK,), [Shard(0)])


# -- bad input of the pure function -------------------------------------------------------

@pytest.mark.parametrize("args, exc", [
    (((5,), (4,), (4,), [Shard(0)]), IndexError),     # coordinate past the mesh
    (((5,), (4,), (-1,), [Shard(0)]), IndexError),    # negative coordinate
    (((5,), (4,), (0,), [Shard(1)]), IndexError),     # shard dim out of range
    (((5,), (4,), (0,), [Shard(-2)]), IndexError),
    (((), (4,), (0,), [Shard(0)]), IndexError),       # no dim to shard
    (((-1,), (4,), (0,), [Shard(0)]), ValueError),    # negative size
    (((5,), (4, 2), (0, 0), [Shard(0)]), ValueError),  # too few placements
    (((5,), (0,), (0,), [Shard(0)]), ValueError),     # empty mesh dim
    (((5,), (4,), (0, 0), [Shard(0)]), ValueError),   # coordinate of the wrong length
])
def test_bad_layouts_raise(args, exc):
    with pytest.raises(exc):
        box_of(*args)


def test_out_of_range_shard_dim_is_named_as_given():
    with pytest.raises(IndexError, match=r"Shard\(dim=-3\)"):
        box_of((5, 2), (4,), (0,), [Shard(-3)])
    with pytest.raises(IndexError, match=r"Shard\(dim=2\)"):
        box_of((5, 2), (4,), (0,), [Shard(2)])


def test_dtype_codes_are_the_cores_whatever_form_names_them():
    """_clib.dtype_code gives the core's code of a dtype, the same for a dtype
    object, its string and its type, on first and later calls; one the core does
    not know is -2 every time."""
    codes = {np.dtype(t).name: mt._clib._DTYPE_CODES[np.dtype(t).name]
             for t in ("f4", "f8", "i8", "c16", "bool")}
    for _ in range(2):
        for name, code in codes.items():
            assert mt._clib.dtype_code(np.dtype(name)) == code
            assert mt._clib.dtype_code(name) == code
            assert mt._clib.dtype_code(np.dtype(name).type) == code
        assert mt._clib.dtype_code(np.dtype([("a", "f8"), ("b", "i4")])) == -2
        assert mt._clib.dtype_code(np.dtype("U3")) == -2


def test_a_strided_plan_is_refused_by_the_core_in_its_words():
    # A plan is between plain layouts; the core, the one place that says so, names
    # the way out (the expansion).
    mesh = init_device_mesh("cpu", (N,))
    with pytest.raises(ValueError, match=r"no box of its own.*mt_strided_expand"):
        plan(mesh, (8 * N,), (_StridedShard(0, split_factor=2),), (Replicate(),),
             np.dtype("f8"))


# -- contiguous strides -------------------------------------------------------------

@given(st.lists(st.integers(0, 7), max_size=6))
@settings(max_examples=60, deadline=None)
def test_contiguous_strides_are_torchs(shape):
    """torch's strides of a contiguous tensor: each dim's the product of the later
    sizes, a size 0 counting as 1; a list, a tuple and NumPy's ints alike."""
    from mpitensor._bind.core import contiguous_strides
    want = tuple(math.prod(max(n, 1) for n in shape[k + 1:]) for k in range(len(shape)))
    assert contiguous_strides(tuple(shape)) == want
    assert contiguous_strides(shape) == want
    assert contiguous_strides([np.int64(n) for n in shape]) == want


def test_contiguous_strides_refuse_what_is_not_a_shape():
    from mpitensor._bind.core import contiguous_strides
    with pytest.raises(TypeError):
        contiguous_strides((2, 1.5))
    with pytest.raises(TypeError):
        contiguous_strides(3)
    with pytest.raises(ValueError, match="dims"):
        contiguous_strides((1,) * 17)
