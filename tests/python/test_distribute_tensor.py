"""distribute_tensor: the copy on the mesh's first rank (coordinate 0 on every mesh
dim) is the source of truth, scattered along Shard dims and broadcast along
Replicate ones, while every rank passes DIFFERENT data; Partial placements;
src_data_rank=None (no communication, each rank cuts its own copy); DTensor
inputs; non-member ranks; bad arguments.

Failed expectations are collected and asserted after the last collective."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import DeviceMesh, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor.debug import CommDebugMode
from mpi_helpers import Problems, gather_global, raised, ref_box, ref_index

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
R, S0, S1 = Replicate(), Shard(0), Shard(1)

_MESHES: dict = {}


def mesh_of(shape) -> DeviceMesh:
    shape = tuple(shape)
    if shape not in _MESHES:
        _MESHES[shape] = init_device_mesh("cpu", shape)
    return _MESHES[shape]


def mesh_shapes():
    shapes = [(W,), (W, 1), (1, W)]
    if W == 4:
        shapes += [(2, 2), (2, 2, 1), (1, 2, 2), (2, 1, 2)]
    if W == 2:
        shapes += [(2, 1, 1), (1, 1, 2)]
    return shapes


def data_of(rank, shape, dtype=np.float64) -> np.ndarray:
    """What rank `rank` passes: different on every rank, integer valued."""
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.int64) % 89 + 1000 * rank + 1).reshape(shape).astype(dtype)


def first_rank(mesh) -> int:
    return int(mesh.mesh.flat[0])


def numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def torch_bytes(shape, mesh_shape, placements, itemsize, src=0) -> int:
    """Bytes torch's distribute_tensor receives in all, without padding: mesh dim by
    mesh dim, a scatter (Shard) or broadcast (Replicate, Partial) in every group,
    each receiver getting its box after that step."""
    total, cur = 0, [R] * len(mesh_shape)
    for m, p in enumerate(placements):
        nxt = list(cur)
        if isinstance(p, Shard):
            nxt[m] = p
        for c in itertools.product(*(range(s) for s in mesh_shape)):
            if c[m] != src:
                total += numel(ref_box(shape, mesh_shape, c, nxt)[0])
        cur = nxt
    return total * itemsize


def needed_bytes(shape, mesh_shape, placements, itemsize, src=0) -> int:
    """At least: every rank but the source receives its box, except ranks whose
    box is the identity of a Partial(sum|product) (they need nothing)."""
    total = 0
    for c in itertools.product(*(range(s) for s in mesh_shape)):
        if all(x == src for x in c):
            continue
        if any(isinstance(p, Partial) and p.reduce_op in ("sum", "product") and c[m] != src
               for m, p in enumerate(placements)):
            continue
        total += numel(ref_box(shape, mesh_shape, c, placements)[0])
    return total * itemsize


def expected_local(truth, mesh_shape, coord, placements):
    local = np.array(truth[ref_index(truth.shape, mesh_shape, coord, placements)])
    for m, p in enumerate(placements):
        if isinstance(p, Partial) and coord[m] != 0 and p.reduce_op in ("sum", "product"):
            local[...] = 0 if p.reduce_op == "sum" else 1
    return local


def placement_sets(nd):
    return list(itertools.product([R, S0, S1], repeat=nd))


# ---- src_data_rank=0: the first rank is the source of truth -------------------------


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=lambda s: "mesh" + "x".join(map(str, s)))
def test_first_rank_is_the_source_of_truth(mesh_shape):
    """Every Shard/Replicate combination (nested shards included) of uneven 5x7:
    each rank ends with its box of the first rank's data, through scatters and
    broadcasts only, moving no more than torch and at least what is needed."""
    mesh = mesh_of(mesh_shape)
    shape = (5, 7)
    truth = data_of(first_rank(mesh), shape)
    problems = Problems()
    sent = []
    for pl in placement_sets(len(mesh_shape)):
        with CommDebugMode() as mode:
            out = distribute_tensor(data_of(RANK, shape), mesh, list(pl))
        counts, nbytes = dict(mode.get_comm_counts()), mode.get_comm_bytes()
        sent.append(sum(nbytes.values()))
        got, gp = gather_global(out)
        problems.expect(gp == [] and np.array_equal(got, truth), f"{pl}: {gp} {got}")
        problems.expect(out.placements == pl and out.shape == shape and out.dtype == np.float64,
                        f"{pl}: metadata {out!r}")
        problems.expect(set(counts) <= {"scatter", "broadcast"}, f"{pl}: kinds {counts}")
        problems.expect(np.array_equal(out.full_tensor(), truth), f"{pl}: full_tensor")
    totals = COMM.allreduce(np.array(sent, dtype=np.int64), op=MPI.SUM)
    for pl, total in zip(placement_sets(len(mesh_shape)), totals):
        most, least = torch_bytes(shape, mesh_shape, pl, 8), needed_bytes(shape, mesh_shape, pl, 8)
        problems.expect(least <= total <= most, f"{pl}: {total} bytes, not in [{least}, {most}]")
    assert problems == []


def test_one_d_counts_exactly():
    """1-D: Shard is one scatter (the root sends everything but its own shard),
    Replicate one broadcast (W-1 copies)."""
    mesh = mesh_of((W,))
    shape = (6, 3)
    problems = Problems()
    for pl, kind, want_bytes in [
        ([S0], "scatter", (numel(shape) - numel(ref_box(shape, (W,), (0,), [S0])[0])) * 8),
        ([S1], "scatter", (numel(shape) - numel(ref_box(shape, (W,), (0,), [S1])[0])) * 8),
        ([R], "broadcast", (W - 1) * numel(shape) * 8),
    ]:
        with CommDebugMode() as mode:
            out = distribute_tensor(data_of(RANK, shape), mesh, pl)
        counts = dict(mode.get_comm_counts())
        total = COMM.allreduce(sum(mode.get_comm_bytes().values()))
        if W > 1:  # one rank: see test_size_one_mesh_dims_cost_nothing
            problems.expect(counts == {kind: 1}, f"{pl}: {counts} != {{{kind!r}: 1}}")
        problems.expect(total == want_bytes, f"{pl}: {total} bytes != {want_bytes}")
        problems.expect(np.array_equal(out.full_tensor(), data_of(0, shape)), f"{pl}: values")
    assert problems == []


def test_size_one_mesh_dims_cost_nothing():
    """A Shard on a mesh dim of size 1 cuts nothing and costs no scatter; only the
    mesh dim of size W communicates (a broadcast for Replicate, a scatter for Shard)."""
    mesh = mesh_of((1, W))
    bcast = {} if W == 1 else {"broadcast": 1}
    scatter = {} if W == 1 else {"scatter": 1}
    expected = [([S0, R], bcast), ([S1, R], bcast), ([R, R], bcast), ([S0, S1], scatter),
                ([R, S0], scatter)]
    counts = []
    for pl, _ in expected:
        with CommDebugMode() as mode:
            out = distribute_tensor(data_of(RANK, (4, 4)), mesh, pl)
        counts.append(dict(mode.get_comm_counts()))
        assert np.array_equal(out.full_tensor(), data_of(0, (4, 4))), pl
    assert counts == [e for _, e in expected], counts


# ---- Partial placements ---------------------------------------------------------------


def partial_cases(nd):
    ops = ["sum", "max", "avg", "min", "product"]
    out = [(Partial(op),) * nd for op in ops]
    if nd >= 2:
        out += [(Partial("sum"), S0) + (R,) * (nd - 2), (S1, Partial("max")) + (R,) * (nd - 2),
                (Partial("product"), Partial("product")) + (R,) * (nd - 2),
                (R, Partial("sum")) + (S0,) * (nd - 2)]
    return out


@pytest.mark.parametrize("mesh_shape", [(W,)] + ([(2, 2), (2, 1, 2)] if W == 4 else [(W, 1), (1, W)]),
                         ids=lambda s: "mesh" + "x".join(map(str, s)))
def test_partial_placements(mesh_shape):
    """Partial(sum) puts the first rank's value on coordinate 0 of that mesh dim and
    zeros elsewhere (product: ones); max/avg/min put it everywhere; full_tensor
    gives the input back."""
    mesh = mesh_of(mesh_shape)
    shape = (5, 3)
    truth = data_of(first_rank(mesh), shape)
    coord = mesh.get_coordinate()
    problems = Problems()
    for pl in partial_cases(len(mesh_shape)):
        with CommDebugMode() as mode:
            out = distribute_tensor(data_of(RANK, shape), mesh, list(pl))
        counts = dict(mode.get_comm_counts())
        want = expected_local(truth, mesh_shape, coord, pl)
        problems.expect(out.placements == pl, f"{pl}: placements")
        problems.expect(np.array_equal(out.to_local(), want), f"{pl}: rank {RANK} local "
                        f"{out.to_local()} != {want}")
        problems.expect(set(counts) <= {"scatter", "broadcast"}, f"{pl}: kinds {counts}")
        problems.expect(np.array_equal(out.full_tensor(), truth), f"{pl}: full_tensor")
    assert problems == []


# ---- src_data_rank=None --------------------------------------------------------------


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=lambda s: "mesh" + "x".join(map(str, s)))
def test_src_data_rank_none_cuts_the_own_copy_without_communication(mesh_shape):
    mesh = mesh_of(mesh_shape)
    nd = len(mesh_shape)
    shape = (5, 7)
    mine = data_of(RANK, shape)
    coord = mesh.get_coordinate()
    problems = Problems()
    for pl in placement_sets(nd) + partial_cases(nd):
        with CommDebugMode() as mode:
            out = distribute_tensor(mine, mesh, list(pl), src_data_rank=None)
        problems.expect(mode.get_total_counts() == 0, f"{pl}: {dict(mode.get_comm_counts())}")
        want = expected_local(mine, mesh_shape, coord, pl)
        local = out.to_local()
        problems.expect(local.shape == want.shape and np.array_equal(local, want),
                        f"{pl}: rank {RANK} {local} != {want}")
        cut = mine[ref_index(shape, mesh_shape, coord, pl)]
        identity = any(isinstance(p, Partial) and p.reduce_op in ("sum", "product")
                       and coord[m] != 0 for m, p in enumerate(pl))
        view = cut.flags.c_contiguous and cut.size > 0 and not identity
        problems.expect(np.shares_memory(local, mine) == view,
                        f"{pl}: a view of the input is expected: {view}")
        problems.expect(out.placements == pl and out.shape == shape, f"{pl}: metadata")
    assert problems == []


@pytest.mark.parametrize("rows", [1, 2, 5, 7, 13], ids=lambda r: f"rows{r}")
def test_src_data_rank_none_keeps_a_contiguous_cut_as_a_view(rows):
    """A dim-0 cut of a C-ordered array is a view of it, as in torch, on every
    rank that holds rows (uneven and empty shards too); a cut that is not
    C-contiguous, or of a read-only array, is copied into a C-ordered array of
    the same values."""
    mesh = mesh_of((W,))
    mine = data_of(RANK, (rows, 3))
    problems = Problems()
    local = distribute_tensor(mine, mesh, [S0], src_data_rank=None).to_local()
    want = mine[ref_index(mine.shape, (W,), (RANK,), [S0])]
    problems.expect(np.array_equal(local, want), f"rank {RANK}: {local} != {want}")
    problems.expect(np.shares_memory(local, mine) == (want.size > 0), f"rows {rows}: view")
    one_d = np.arange(rows * 4.0)
    local = distribute_tensor(one_d, mesh, [S0], src_data_rank=None).to_local()
    problems.expect(np.array_equal(local, one_d[ref_index(one_d.shape, (W,), (RANK,), [S0])])
                    and np.shares_memory(local, one_d) == (local.size > 0), "1-D view")
    frozen = mine.copy()
    frozen.flags.writeable = False
    fortran = np.asfortranarray(mine)
    strided = np.zeros((2 * rows, 6))
    strided[::2, ::2] = mine
    for name, given in (("read-only", frozen), ("Fortran", fortran),
                        ("strided", strided[::2, ::2])):
        for pl in ([S0], [S1], [R]):
            local = distribute_tensor(given, mesh, pl, src_data_rank=None).to_local()
            index = ref_index(mine.shape, (W,), (RANK,), pl)
            want, cut = mine[index], given[index]
            # A cut of one row (or one column of a Fortran array) is C-contiguous.
            view = cut.flags.c_contiguous and cut.size > 0 and given.flags.writeable
            problems.expect(np.array_equal(local, want) and local.flags.c_contiguous
                            and local.flags.writeable
                            and np.shares_memory(local, given) == view,
                            f"{name} {pl}: {local} != {want}, or a view: {not view}")
    assert problems == []


# ---- shapes and dtypes -----------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3), (1, 1), (0, 4), (4, 0), (9, 1), (3,)],
                         ids=lambda s: "x".join(map(str, s)))
def test_uneven_and_empty_shapes(shape):
    problems = Problems()
    for ms in [(W,)] + ([(2, 2)] if W == 4 else []):
        mesh = mesh_of(ms)
        truth = data_of(first_rank(mesh), shape)
        dims = [R, S0] + ([S1] if len(shape) > 1 else [])
        for pl in itertools.product(dims, repeat=len(ms)):
            out = distribute_tensor(data_of(RANK, shape), mesh, list(pl))
            got, gp = gather_global(out)
            problems.expect(gp == [] and np.array_equal(got, truth), f"{ms} {pl}: {gp}")
    assert problems == []


def test_zero_d_tensors():
    mesh = mesh_of((W,))
    problems = Problems()
    mine = np.array(float(RANK + 7))
    for pl, want in [([R], 7.0), ([Partial("sum")], 7.0 if RANK == 0 else 0.0),
                     ([Partial("max")], 7.0)]:
        out = distribute_tensor(mine, mesh, pl)
        local = out.to_local()
        problems.expect(local.shape == () and local == want, f"{pl}: {local}")
        problems.expect(out.shape == () and out.full_tensor() == 7.0, f"{pl}: full")
    r = raised(lambda: distribute_tensor(mine, mesh, [S0]), IndexError)
    problems.expect(r is True, f"Shard of 0-d: {r}")
    assert problems == []


DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_bit_exact(dtype):
    mesh = mesh_of((W,))
    rng = np.random.default_rng(100 + RANK)
    item = np.dtype(dtype).itemsize
    raw = rng.integers(0, 256, size=(5, 3, item), dtype=np.uint8)
    mine = (raw[..., 0] & 1).astype(bool) if dtype is np.bool_ else raw.view(dtype).reshape(5, 3)
    truth = COMM.bcast(mine, root=0)
    problems = Problems()
    for pl in ([S0], [S1], [R]):
        out = distribute_tensor(mine, mesh, pl)
        got, gp = gather_global(out)
        problems.expect(gp == [] and got.dtype == np.dtype(dtype)
                        and got.tobytes() == truth.tobytes(), f"{pl}: {gp}")
    assert problems == []


def test_non_contiguous_and_list_inputs():
    mesh = mesh_of((W,))
    truth = data_of(0, (6, 4))
    mine = np.asfortranarray(data_of(RANK, (6, 4)))
    strided = np.zeros((12, 8))
    strided[::2, ::2] = data_of(RANK, (6, 4))
    problems = Problems()
    for given in (mine, strided[::2, ::2], data_of(RANK, (6, 4)).tolist()):
        for pl in ([S0], [S1], [R]):
            got, gp = gather_global(distribute_tensor(given, mesh, pl))
            problems.expect(gp == [] and np.array_equal(got, truth), f"{type(given)} {pl}")
    assert problems == []


def test_placements_none_and_the_mesh_context():
    mesh = mesh_of((W,))
    truth = data_of(0, (3, 2))
    rep = distribute_tensor(data_of(RANK, (3, 2)), mesh)
    with mesh:
        out = distribute_tensor(data_of(RANK, (3, 2)), placements=[S0])
    full = out.full_tensor()
    assert rep.placements == (R,) and np.array_equal(rep.to_local(), truth)
    assert out.device_mesh is mesh and out.placements == (S0,)
    assert np.array_equal(full, truth)


# ---- DTensor inputs ----------------------------------------------------------------------


def test_dtensor_with_the_same_layout_is_returned_as_is():
    problems = Problems()
    for ms in [(W,), (1, W)]:
        mesh = mesh_of(ms)
        nd = len(ms)
        for pl in [(R,) * nd, (S0,) * nd, (S1,) + (R,) * (nd - 1), (Partial("sum"),) * nd]:
            dt = distribute_tensor(data_of(RANK, (4, 4)), mesh, list(pl))
            with CommDebugMode() as mode:
                same = distribute_tensor(dt, mesh, list(pl))
                again = distribute_tensor(dt, mesh, [Shard(-1) if p == S1 else p for p in pl])
            problems.expect(same is dt and again is dt, f"{ms} {pl}: not the same object")
            problems.expect(mode.get_total_counts() == 0, f"{pl}: communicated")
        rep = distribute_tensor(data_of(RANK, (4, 4)), mesh)
        problems.expect(distribute_tensor(rep, mesh) is rep, "placements=None on a replica")
        problems.expect(distribute_tensor(rep) is rep, "no mesh, no placements on a replica")
    assert problems == []


def test_dtensor_with_another_layout_points_to_redistribute():
    problems = Problems()
    mesh = mesh_of((W,))
    dt = distribute_tensor(data_of(RANK, (4, 4)), mesh, [S0])
    other = mesh_of((W, 1))
    for call in (lambda: distribute_tensor(dt, mesh, [S1]),
                 lambda: distribute_tensor(dt, mesh, [R]),
                 lambda: distribute_tensor(dt, mesh),          # None means Replicate
                 lambda: distribute_tensor(dt, mesh, [Partial()]),
                 lambda: distribute_tensor(dt, other, [S0, R])):
        r = raised(call, ValueError, "redistribute")
        problems.expect(r is True, f"{r}")
    assert problems == []


# ---- meshes that are not the whole world -------------------------------------------------


def test_non_members_get_an_empty_local_and_the_shape():
    sub = DeviceMesh("cpu", list(range(max(W - 1, 1))))
    member = sub.get_coordinate() is not None
    shape = (5, 3)
    truth = data_of(first_rank(sub), shape)
    problems = Problems()
    for pl in ([S0], [S1], [R], [Partial("sum")]):
        for src in (0, None):
            out = distribute_tensor(data_of(RANK, shape), sub, pl, src_data_rank=src)
            problems.expect(out.shape == shape and out.placements == tuple(pl), f"{pl}: metadata")
            if member:
                want = expected_local(truth if src == 0 else data_of(RANK, shape), sub.shape,
                                      sub.get_coordinate(), pl)
                problems.expect(np.array_equal(out.to_local(), want), f"{pl} {src}: local")
            else:
                problems.expect(out.to_local().shape == (0,), f"{pl}: {out.to_local().shape}")
    assert problems == []


def test_reversed_mesh_takes_its_first_rank_as_source():
    """The source of truth is the rank at coordinate 0, not world rank 0."""
    mesh = DeviceMesh("cpu", list(reversed(range(W))))
    truth = data_of(W - 1, (7, 2))
    problems = Problems()
    for pl in ([S0], [R], [S1], [Partial("max")]):
        got = distribute_tensor(data_of(RANK, (7, 2)), mesh, pl).full_tensor()
        problems.expect(np.array_equal(got, truth), f"{pl}: {got}")
    if W == 4:
        grid = DeviceMesh("cpu", [[3, 1], [2, 0]])
        for pl in itertools.product([R, S0, S1], repeat=2):
            got, gp = gather_global(distribute_tensor(data_of(RANK, (7, 2)), grid, list(pl)))
            problems.expect(gp == [] and np.array_equal(got, data_of(3, (7, 2))), f"{pl}: {gp}")
    assert problems == []


# ---- bad arguments -------------------------------------------------------------------------


def test_src_data_rank_any_rank_of_the_mesh():
    """src_data_rank=k: the copy at coordinate k of every mesh dim is the source
    (torch's group rank k on each mesh dim), moved by scatters and broadcasts only,
    no more bytes than torch and at least what is needed."""
    shapes = [(W,)] + ([(2, 2)] if W == 4 else [])
    problems = Problems()
    for mesh_shape in shapes:
        mesh = mesh_of(mesh_shape)
        for src in range(min(mesh_shape)):
            source = int(mesh.mesh[(src,) * len(mesh_shape)])
            truth = data_of(source, (5, 7))
            for pl in placement_sets(len(mesh_shape)) + [(Partial("sum"),) * len(mesh_shape)]:
                with CommDebugMode() as mode:
                    out = distribute_tensor(data_of(RANK, (5, 7)), mesh, list(pl),
                                            src_data_rank=src)
                got = out.full_tensor()
                problems.expect(np.array_equal(got, truth), f"{mesh_shape} {src} {pl}: {got}")
                total = COMM.allreduce(sum(mode.get_comm_bytes().values()))
                least = needed_bytes((5, 7), mesh_shape, pl, 8, src)
                most = torch_bytes((5, 7), mesh_shape, pl, 8, src)
                problems.expect(least <= total <= most,
                                f"{mesh_shape} {src} {pl}: {total} not in [{least}, {most}]")
                problems.expect(set(mode.get_comm_counts()) <= {"scatter", "broadcast"},
                                f"{pl}: {dict(mode.get_comm_counts())}")
    assert problems == []


@pytest.mark.parametrize("bad", [W, -1, W + 1, True, False, "0", 0.5, [0]], ids=repr)
def test_bad_src_data_rank(bad):
    mesh = mesh_of((W,))
    with CommDebugMode() as mode:
        r = raised(lambda: distribute_tensor(data_of(RANK, (4, 2)), mesh, [S0],
                                             src_data_rank=bad), ValueError, "src_data_rank")
    assert r is True
    assert mode.get_total_counts() == 0
