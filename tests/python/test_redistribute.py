"""DTensor.redistribute and full_tensor: every placement change on 1-D, 2-D and 3-D
meshes against NumPy ground truth, with exact communication counts (the C
executor's, via CommDebugMode, equal to the plan's) and bytes never above torch's
per-mesh-dim plan (the time model chooses among the plans within them);
uneven, empty, 0-d, 1-element and non-contiguous shards; every NumPy numeric dtype
and reduction; the rules for same placements, other meshes and Partial targets;
forward_dtype; async_op.

Every rank runs every redistribute; failed expectations are collected and asserted
after the last collective, so a failure never leaves a rank waiting."""

from __future__ import annotations

import gc
import itertools
import mmap

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import DTensor, DeviceMesh, Partial, Replicate, Shard, init_device_mesh
from mpitensor._layout import plan as plan_for
from mpitensor.debug import CommDebugMode, peak_rss_growth
from mpi_helpers import Problems, gather_global, raised, ref_box, ref_index
from redistribute_ref import (KINDS, PLACEMENTS, expected_local, name, needed_elements,
                              mixed_partials, reduce_order_case, reduced_dims, single_step,
                              single_step_bytes, source_local, strides, targets_for,
                              torch_plan)

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
R, S0, S1 = Replicate(), Shard(0), Shard(1)
PSUM, PMAX, PAVG = Partial("sum"), Partial("max"), Partial("avg")

_MESHES: dict = {}


def mesh_of(shape) -> DeviceMesh:
    """One mesh per shape for the whole module (collective on first use, which
    every rank reaches in the same test)."""
    shape = tuple(shape)
    if shape not in _MESHES:
        _MESHES[shape] = init_device_mesh("cpu", shape)
    return _MESHES[shape]


def matrix_meshes():
    shapes = [(W,)]
    if W == 4:
        shapes += [(2, 2), (4, 1), (1, 4), (2, 2, 1), (2, 1, 2), (1, 2, 2)]
    elif W == 2:
        shapes += [(2, 1), (1, 2), (2, 1, 1), (1, 2, 1), (1, 1, 2)]
    elif W == 3:
        shapes += [(3, 1), (1, 3)]
    else:
        shapes += [(1, 1), (1, 1, 1)]
    return shapes


def two_d_meshes():
    return [(2, 2)] if W == 4 else [(W, 1), (1, W)]


def base_array(shape) -> np.ndarray:
    """int64 global array, distinct small values (exact in every dtype used)."""
    return (np.arange(int(np.prod(shape)), dtype=np.int64) % 97 + 1).reshape(shape)


def make_source(base, mesh, src, dtype=np.float64) -> DTensor:
    """The DTensor whose reduction over its Partial dims is `base` (cast)."""
    coord = mesh.get_coordinate()
    if coord is None:  # a non-member: any local of the tensor's ndim
        local = np.zeros((0,) * base.ndim, dtype)
    else:
        local = source_local(base, mesh.shape, coord, src, dtype)
    return DTensor.from_local(local, mesh, src, shape=base.shape, stride=strides(base.shape))


def pair_list(mesh_shape):
    """(src, dst) pairs: all of them over two mesh dims (the non-trivial ones
    first); further mesh dims cycle through every placement and target."""
    nd = len(mesh_shape)
    order = sorted(range(nd), key=lambda m: mesh_shape[m] == 1)
    full, cycled = sorted(order[:2]), sorted(order[2:])
    per_dim = [(s, d) for s in PLACEMENTS for d in targets_for(s)]
    pairs = []
    for i, combo in enumerate(itertools.product(per_dim, repeat=len(full))):
        src, dst = [None] * nd, [None] * nd
        for m, (s, d) in zip(full, combo):
            src[m], dst[m] = s, d
        for j, m in enumerate(cycled):
            s, d = per_dim[(i * 5 + j * 7) % len(per_dim)]
            src[m], dst[m] = s, d
        if not mixed_partials(src):
            pairs.append((tuple(src), tuple(dst)))
    return pairs


def run_matrix(mesh_shape, shape, pairs, dtype=np.float64, torch_bound=None):
    """Redistributes every pair; returns the problems found (same list on every
    rank after the combining collective). Every pair is checked for values and
    exact counts; `torch_bound(mesh_shape, src, dst)` picks the pairs whose calls
    and bytes must not exceed torch's plan (default: all)."""
    if torch_bound is None:
        torch_bound = lambda *a: True  # noqa: E731
    mesh = mesh_of(mesh_shape)
    base = base_array(shape)
    truth = base.astype(dtype)
    itemsize = np.dtype(dtype).itemsize
    coord = mesh.get_coordinate()
    problems = Problems()
    sent = np.zeros((len(pairs), len(KINDS)), dtype=np.int64)
    counts_seen = []
    for i, (src, dst) in enumerate(pairs):
        what = f"{name(src)}->{name(dst)} shape {shape} mesh {mesh_shape}"
        dt = make_source(base, mesh, src, dtype)
        with CommDebugMode() as mode:
            out = dt.redistribute(mesh, dst)
        counts = dict(mode.get_comm_counts())
        nbytes = mode.get_comm_bytes()
        sent[i] = [nbytes[k] for k in KINDS]
        counts_seen.append(counts)
        full = out.full_tensor()
        problems.expect(out.placements == tuple(dst) and out.shape == shape
                        and out.dtype == dtype, f"{what}: metadata {out!r}")
        problems.expect(full.dtype == dtype and full.shape == shape
                        and np.array_equal(full, truth),
                        f"{what}: full_tensor {full} != {truth}")
        want = expected_local(base, mesh_shape, coord, src, dst, dtype)
        local = out.to_local()
        problems.expect(type(local) is np.ndarray and local.shape == want.shape
                        and np.array_equal(local, want),
                        f"{what}: rank {RANK} local {local} != {want}")
        exact = single_step(mesh_shape, src, dst)
        if exact is not None:
            problems.expect(counts == exact, f"{what}: counts {counts} != {exact}")
    total = np.zeros_like(sent)
    COMM.Allreduce(sent, total, op=MPI.SUM)
    for i, (src, dst) in enumerate(pairs):
        what = f"{name(src)}->{name(dst)} shape {shape} mesh {mesh_shape}"
        calls = sum(counts_seen[i].values())
        moved = int(total[i].sum())
        t_calls, t_bytes = torch_plan(shape, mesh_shape, src, dst, itemsize)
        if torch_bound(mesh_shape, src, dst):
            problems.expect(calls <= t_calls, f"{what}: {calls} calls > torch's {t_calls}")
            problems.expect(moved <= t_bytes, f"{what}: {moved} bytes > torch's {t_bytes}")
        if single_step(mesh_shape, src, dst) is not None:
            want = single_step_bytes(shape, mesh_shape, src, dst, itemsize)
            problems.expect(moved == want, f"{what}: {moved} bytes sent, expected {want}")
        plan = plan_for(mesh, shape, src, dst, np.dtype(dtype))
        problems.expect(moved == plan.bytes, f"{what}: {moved} bytes sent, the plan "
                        f"counts {plan.bytes}")
        if not any(mesh_shape[m] > 1 for m in reduced_dims(mesh_shape, src, dst)):
            # Shard/Replicate changes only: at least the part of each target box
            # its rank lacks, and (above) at most torch's bytes; which plan in
            # between is the time model's choice.
            need = needed_elements(shape, mesh_shape, src, dst) * itemsize
            problems.expect(need <= moved, f"{what}: {moved} bytes moved, needed {need}")
            kinds = {k for k, v in counts_seen[i].items() if v}
            problems.expect(kinds <= {"all_gather_into_tensor", "all_to_all_single"},
                            f"{what}: reductions {kinds} without a Partial")
    return problems


# ---- the full matrix -----------------------------------------------------------------


@pytest.mark.parametrize("mesh_shape", matrix_meshes(), ids=lambda s: "mesh" + "x".join(map(str, s)))
def test_matrix_uneven(mesh_shape):
    """5x7 on every mesh: uneven shards, empty ones at 4 ranks, [S0,S0] nesting."""
    problems = run_matrix(mesh_shape, (5, 7), pair_list(mesh_shape))
    assert problems == []


@pytest.mark.parametrize("mesh_shape", [s for s in matrix_meshes() if len(s) <= 2],
                         ids=lambda s: "mesh" + "x".join(map(str, s)))
def test_matrix_empty_shards(mesh_shape):
    """2x3: most shards empty once two mesh dims cut one tensor dim."""
    problems = run_matrix(mesh_shape, (2, 3), pair_list(mesh_shape))
    assert problems == []


@pytest.mark.parametrize("shape", [(5, 7), (8, 8)], ids=lambda s: "x".join(map(str, s)))
def test_two_partials_reduced_at_most_torch(shape):
    """Two Partial mesh dims reduced, the outer to a Shard: reduce-scatter first, so
    calls and bytes are never above torch's plan (the planner once all-reduced the
    inner dim first and moved 1.5x torch's bytes)."""
    problems = Problems()
    for ms in matrix_meshes():
        pairs = [p for p in pair_list(ms) if reduce_order_case(ms, *p)]
        problems += run_matrix(ms, shape, pairs, torch_bound=lambda *a: True)
    assert problems == []


def one_d_pairs():
    return [((s,), (d,)) for s in PLACEMENTS for d in targets_for(s)]


@pytest.mark.parametrize("shape", [(8, 4), (4, 1), (1, 1), (1, 5), (0, 3), (3, 0), (7, 9)],
                         ids=lambda s: "x".join(map(str, s)))
def test_one_d_shapes(shape):
    """Even, 1-element, empty-dim and odd shapes on the 1-D world mesh."""
    problems = run_matrix((W,), shape, one_d_pairs())
    assert problems == []


def test_one_d_vector_and_three_d_tensor():
    """1-d tensors (Shard(0) only) and 3-d tensors with Shard(2)."""
    pairs = [((s,), (d,)) for s in (R, S0, PSUM, PMAX, PAVG)
             for d in ([R, S0] + ([s] if isinstance(s, Partial) else []))]
    problems = run_matrix((W,), (5,), pairs)
    s2 = Shard(2)
    pairs3 = [((a,), (b,)) for a in (R, S0, s2, PSUM) for b in (R, S0, s2) if a != b]
    problems += run_matrix((W,), (3, 2, 5), pairs3)
    if W == 4:
        pairs3 = [((a, b), (c, d)) for a, b in [(S0, s2), (s2, s2), (PSUM, s2)]
                  for c, d in [(s2, S0), (R, s2), (s2, s2), (S1, R)]]
        problems += run_matrix((2, 2), (3, 2, 5), pairs3)
    assert problems == []


def test_zero_d_tensors():
    """0-d tensors: Replicate and Partial only, on 1-D and 2-D meshes."""
    problems = Problems()
    ops = ("sum", "avg", "max", "min")
    pairs = [((Partial(op),), (R,)) for op in ops] + [((R,), (R,)), ((PSUM,), (PSUM,))]
    problems += run_matrix((W,), (), pairs)
    for ms in two_d_meshes():
        pairs = [((Partial(a), Partial(b)), (R, R)) for a in ops for b in ops
                 if not mixed_partials((Partial(a), Partial(b)))]
        pairs += [((PSUM, PAVG), (PSUM, R)), ((PAVG, PSUM), (R, PSUM)), ((R, PAVG), (R, R))]
        problems += run_matrix(ms, (), pairs)
    assert problems == []


def test_shard_of_zero_d_is_refused():
    mesh = mesh_of((W,))
    x = DTensor.from_local(np.array(1.0), mesh, [R])
    assert raised(lambda: x.redistribute(mesh, [S0]), IndexError) is True


# ---- counts, spelled out -------------------------------------------------------------


def counted(dt, mesh, dst, **kw):
    with CommDebugMode() as mode:
        out = dt.redistribute(mesh, dst, **kw)
    return out, dict(mode.get_comm_counts()), dict(mode.get_comm_bytes())


def test_counts_one_d_spelled_out():
    """Every 1-D transition's collectives, one by one, with bytes summed over ranks; a world of one
    rank is a mesh dim of size 1: no communication at all."""
    mesh = mesh_of((W,))
    base = base_array((6, 4))
    n = base.size * 8
    shard0 = [ref_box(base.shape, (W,), (r,), [S0])[0] for r in range(W)]
    cases = [
        ((S0,), (R,), {"all_gather_into_tensor": 1}, (W - 1) * n),
        ((R,), (S0,), {}, 0),
        ((S0,), (S1,), {"all_to_all_single": 1},
         needed_elements(base.shape, (W,), [S0], [S1]) * 8),
        ((PSUM,), (R,), {"all_reduce": 1}, 2 * (W - 1) * n),  # the ring model
        ((PMAX,), (S1,), {"reduce_scatter_tensor": 1}, (W - 1) * n),
        ((PAVG,), (S0,), {"reduce_scatter_tensor": 1}, (W - 1) * n),
    ]
    problems = Problems()
    for src, dst, want, want_bytes in cases:
        out, counts, nbytes = counted(make_source(base, mesh, src), mesh, dst)
        total = COMM.allreduce(sum(nbytes.values()))
        if W == 1:
            want, want_bytes = {}, 0
        problems.expect(counts == want, f"{src}->{dst}: {counts} != {want}")
        problems.expect(total == want_bytes, f"{src}->{dst}: {total} bytes != {want_bytes}")
        problems.expect(np.array_equal(out.full_tensor(), base), f"{src}->{dst}: values")
    # Shard -> Replicate: every rank receives the global size minus its own shard.
    # (bytes are counted where they are sent: each rank's shard to W-1 others)
    _, _, nbytes = counted(make_source(base, mesh, (S0,)), mesh, (R,))
    got = COMM.allgather(nbytes.get("all_gather_into_tensor", 0))
    for r in range(W):
        mine = int(np.prod(shard0[r])) * 8
        problems.expect(got[r] == mine * (W - 1), f"rank {r} sent {got[r]}")
    assert problems == []


@pytest.mark.parametrize("case", ["S0S1_to_S0S0", "S0S1_to_S1S0", "S0S0_to_S1S1"])
def test_two_d_at_most_torch(case):
    """Three 2-D cases that torch's per-dim steps take: at most 1, 2, 2 collectives, bytes <= torch's."""
    src, dst, most = {"S0S1_to_S0S0": ((S0, S1), (S0, S0), 1),
                      "S0S1_to_S1S0": ((S0, S1), (S1, S0), 2),
                      "S0S0_to_S1S1": ((S0, S0), (S1, S1), 2)}[case]
    ms = (2, 2) if W == 4 else (W, 1)
    mesh = mesh_of(ms)
    problems = Problems()
    for shape in [(4, 4), (5, 7), (2, 3), (8, 6)]:
        base = base_array(shape)
        out, counts, nbytes = counted(make_source(base, mesh, src), mesh, dst)
        total = COMM.allreduce(sum(nbytes.values()))
        t_calls, t_bytes = torch_plan(shape, ms, src, dst, 8)
        calls = sum(counts.values())
        problems.expect(calls <= most and calls <= t_calls,
                        f"{shape}: {counts} (torch {t_calls}, at most {most})")
        problems.expect(total <= t_bytes, f"{shape}: {total} bytes > torch's {t_bytes}")
        problems.expect(counts.get("all_gather_into_tensor", 0) == 0 or case == "S0S0_to_S1S1",
                        f"{shape}: a gather in {counts}")
        problems.expect(np.array_equal(out.full_tensor(), base), f"{shape}: values")
    assert problems == []


def test_nested_shard_to_replicate_on_one_dim_within_torch():
    """[S0,S0] -> [R,S0] cannot be one gather (mesh dim 1 cuts dim 0 again); it
    moves at least the missing elements and no more than torch's chain."""
    ms = (2, 2) if W == 4 else (W, 1)
    mesh = mesh_of(ms)
    base = base_array((6, 3))
    out, counts, nbytes = counted(make_source(base, mesh, (S0, S0)), mesh, (R, S0))
    total = COMM.allreduce(sum(nbytes.values()))
    need = needed_elements(base.shape, ms, (S0, S0), (R, S0)) * 8
    got, problems = gather_global(out)
    assert problems == []
    assert np.array_equal(got, base)
    assert need <= total <= torch_plan(base.shape, ms, (S0, S0), (R, S0), 8)[1]


# ---- dtypes and reductions -------------------------------------------------------------

INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOATS = [np.float16, np.float32, np.float64]
COMPLEX = [np.complex64, np.complex128]
ALL_DTYPES = [np.bool_] + INTS + FLOATS + COMPLEX


def rank_values(dtype, rank, shape, op):
    """Rank `rank`'s contribution (its whole partial array) for dtype and op."""
    rng = np.random.default_rng(1000 + 17 * rank)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.3
    if op in ("max", "min"):
        if dt.kind in "iu":
            info = np.iinfo(dt)
            return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
        vals = rng.integers(-50, 50, size=shape).astype(dt)
        if dt.kind == "f" and vals.size:
            flat = vals.reshape(-1)
            flat[(rank * 3) % flat.size] = np.nan   # NaN propagates, as numpy.maximum
            flat[-1] = np.inf if rank == 0 else -np.inf
        return vals
    if op == "product":
        lo, hi = (1, 3) if dt.kind == "u" else (-2, 3)
        vals = rng.integers(lo, hi, size=shape)
    else:  # sum, avg: small integers, exact in every dtype including float16
        vals = rng.integers(0 if dt.kind == "u" else -8, 9, size=shape)
    if dt.kind == "c":
        return (vals + 1j * rng.integers(-8, 9, size=shape)).astype(dt)
    return vals.astype(dt)


def numpy_reduce(stack, dtype, op):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return (np.logical_or.reduce(stack, axis=0) if op in ("sum", "max")
                else np.logical_and.reduce(stack, axis=0))
    if op == "sum":
        return np.add.reduce(stack, axis=0, dtype=dt)
    if op == "product":
        return np.multiply.reduce(stack, axis=0, dtype=dt)
    if op == "max":
        return np.maximum.reduce(stack, axis=0)
    if op == "min":
        return np.minimum.reduce(stack, axis=0)
    if op == "avg":
        # Each real component correctly rounded (NumPy's complex64 division is not).
        total = np.add.reduce(stack, axis=0, dtype=dt)
        if dt.kind == "c":
            part = total.real.dtype.type(len(stack))
            out = np.empty_like(total)
            out.real, out.imag = total.real / part, total.imag / part
            return out
        return total / dt.type(len(stack))
    raise ValueError(op)


def refused(dtype, op):
    dt = np.dtype(dtype)
    return (dt.kind == "c" and op in ("max", "min")) or (dt.kind in "biu" and op == "avg")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtype_moves_are_bit_exact(dtype):
    """Shard/Replicate moves copy bytes: every dtype arrives bit for bit."""
    mesh = mesh_of((W,))
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(5, 3, np.dtype(dtype).itemsize), dtype=np.uint8)
    full = raw.view(dtype).reshape(5, 3)
    if np.dtype(dtype).kind == "b":
        full = (raw[..., 0] & 1).astype(bool)
    problems = Problems()
    for src, dst in [(S0, R), (S0, S1), (S1, S0), (R, S1), (S1, R)]:
        local = full[ref_index(full.shape, (W,), (RANK,), [src])]
        dt = DTensor.from_local(np.ascontiguousarray(local), mesh, [src], shape=full.shape,
                                stride=strides(full.shape))
        out = dt.redistribute(mesh, [dst])
        got, gp = gather_global(out)
        problems.expect(gp == [] and got.tobytes() == full.tobytes(), f"{src}->{dst}: {gp}")
        ft = out.full_tensor()
        problems.expect(ft.dtype == full.dtype and ft.tobytes() == full.tobytes(),
                        f"{src}->{dst}: full_tensor")
    assert problems == []


@pytest.mark.parametrize("op", ["sum", "avg", "product", "max", "min"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_reductions_per_dtype(dtype, op):
    """Partial(op) -> Replicate and -> Shard for every dtype, against NumPy: bool
    sum/max is logical or (product/min: and), float16 sums small integers exactly,
    max/min propagate NaN like numpy.maximum; complex max/min and integer or bool
    avg raise TypeError on every rank, at every mesh size."""
    mesh = mesh_of((W,))
    shape = (6, 3)
    mine = rank_values(dtype, RANK, shape, op)
    stack = np.stack([rank_values(dtype, r, shape, op) for r in range(W)])
    want = numpy_reduce(stack, dtype, op)
    problems = Problems()
    for dst, dim in [(R, None), (S0, 0), (S1, 1)]:
        dt = DTensor.from_local(mine, mesh, [Partial(op)])
        if refused(dtype, op):
            for call in (lambda: dt.redistribute(mesh, [dst]), dt.full_tensor):
                r = raised(call, TypeError, "complex|avg|average|float")
                problems.expect(r is True, f"{op} of {np.dtype(dtype)} -> {dst}: {r}")
            continue
        out = dt.redistribute(mesh, [dst])
        expect_local = want[ref_index(shape, (W,), (RANK,), [dst])]
        local = out.to_local()
        problems.expect(local.dtype == np.dtype(dtype), f"{dst}: dtype {local.dtype}")
        problems.expect(np.array_equal(local, expect_local, equal_nan=local.dtype.kind in "fc"),
                        f"{op} -> {dst}: rank {RANK} {local} != {expect_local}")
        full = out.full_tensor()
        problems.expect(np.array_equal(full, want, equal_nan=full.dtype.kind in "fc"),
                        f"{op} -> {dst}: full_tensor {full} != {want}")
    assert problems == []


def test_float16_sum_is_exact_for_small_integers():
    """float16 has no MPI type: the user-defined sum must be exact where float16
    is (integers up to 2048)."""
    mesh = mesh_of((W,))
    part = np.full((4, 4), 2 ** 9, np.float16) + np.arange(16, dtype=np.float16).reshape(4, 4)
    out = DTensor.from_local(part, mesh, [PSUM]).redistribute(mesh, [R]).to_local()
    want = (part.astype(np.float64) * W).astype(np.float16)
    assert out.dtype == np.float16
    assert np.array_equal(out, want)


def test_max_min_nan_like_numpy():
    mesh = mesh_of((W,))
    problems = Problems()
    for dtype in (np.float16, np.float32, np.float64):
        vals = [np.array([np.nan if r == 0 else 1.0, 2.0 + r, -np.inf, np.nan if r == W - 1 else -r],
                         dtype) for r in range(W)]
        for op, ufunc in [("max", np.maximum), ("min", np.minimum)]:
            out = DTensor.from_local(vals[RANK], mesh, [Partial(op)]).full_tensor()
            want = ufunc.reduce(np.stack(vals), axis=0)
            problems.expect(np.array_equal(out, want, equal_nan=True),
                            f"{dtype.__name__} {op}: {out} != {want}")
    assert problems == []


# Partial -> Shard of 256 KiB and more reduces by pairwise exchanges in chunks of
# 1 MiB (csrc/comm/pairwise.c); the shapes below cross several chunks and end
# mid-chunk, with uneven shards and, for Shard(1) of W - 1 columns, an empty one.
def large_partial_shape(dtype, cols):
    rows = (2600 * 1024) // (cols * np.dtype(dtype).itemsize) + 2 * W + 1
    return (rows, cols)


@pytest.mark.parametrize("op", ["sum", "avg", "product", "max", "min"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_large_partial_to_shard_per_dtype(dtype, op):
    """Partial(op) -> Shard(0) and Shard(1) of 2.5 MiB for every dtype and reduction,
    against NumPy, on uneven and empty shards."""
    if refused(dtype, op):
        pytest.skip("refused dtype and reduction (test_reductions_per_dtype)")
    mesh = mesh_of((W,))
    problems = Problems()
    for dst, cols in [(S0, 7), (S1, 7), (S1, max(W - 1, 1))]:
        shape = large_partial_shape(dtype, cols)
        stack = np.stack([rank_values(dtype, r, shape, op) for r in range(W)])
        want = numpy_reduce(stack, dtype, op)
        dt = DTensor.from_local(stack[RANK], mesh, [Partial(op)])
        local = dt.redistribute(mesh, [dst]).to_local()
        expect_local = want[ref_index(shape, (W,), (RANK,), [dst])]
        problems.expect(local.dtype == np.dtype(dtype) and local.shape == expect_local.shape,
                        f"{op} -> {dst} {shape}: {local.dtype} {local.shape}")
        problems.expect(np.array_equal(local, expect_local, equal_nan=local.dtype.kind in "fc"),
                        f"{op} -> {dst} {shape}: rank {RANK} differs from NumPy")
    assert problems == []


def large_inner_cases():
    """(global shape, source placements, target, mesh shape) of all-gathers along an
    inner dim of at least 256 KiB, which run by pairwise exchanges in chunks: blocks
    cut along their first dim of extent above 1 (the 1 x 5 x n case), many chunks
    and one chunk, uneven shards, an empty shard (W - 1 columns), and on a 2-D mesh
    a group that is one mesh dim of several."""
    cases = [((48000, 7), (S1,), (R,), (W,)),
             ((3, 2000, 11), (Shard(2),), (R,), (W,)),
             ((1, 5, 9001), (Shard(2),), (R,), (W,)),
             ((40000, max(W - 1, 1)), (S1,), (R,), (W,))]
    if W == 4:
        cases.append(((6000, 10), (R, S1), (R, R), (2, 2)))
        cases.append(((6000, 10), (S1, S0), (R, S0), (2, 2)))
    return cases


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_large_inner_gather_bit_exact(dtype):
    """Shard(inner) -> Replicate of 256 KiB and more arrives bit for bit in every
    dtype, on every case of large_inner_cases."""
    problems = Problems()
    rng = np.random.default_rng(11)
    for shape, src, dst, ms in large_inner_cases():
        mesh = mesh_of(ms)
        isz = np.dtype(dtype).itemsize
        raw = rng.integers(0, 256, size=shape + (isz,), dtype=np.uint8)
        full = raw.view(dtype).reshape(shape)
        if np.dtype(dtype).kind == "b":
            full = (raw[..., 0] & 1).astype(bool)
        local = full[ref_index(shape, ms, mesh.get_coordinate(), list(src))]
        dt = DTensor.from_local(np.ascontiguousarray(local), mesh, list(src), shape=shape,
                                stride=strides(shape))
        out = dt.redistribute(mesh, list(dst)).to_local()
        want = full[ref_index(shape, ms, mesh.get_coordinate(), list(dst))]
        problems.expect(out.shape == want.shape and out.tobytes() == want.tobytes(),
                        f"{name(src)}->{name(dst)} {shape} on {ms}: rank {RANK} differs")
    assert problems == []


def _can_reset_peak_rss() -> bool:
    try:
        peak_rss_growth(lambda: None)
        return True
    except OSError:
        return False


def _fresh_pages(nbytes: int):
    """`nbytes` of new anonymous memory, every page touched: what no allocator's
    cache can serve."""
    m = mmap.mmap(-1, nbytes)
    np.frombuffer(m, dtype=np.uint8)[:] = 1
    return m


def test_peak_rss_growth_counts_what_a_call_allocates():
    """The probe the peak-memory tests and benchmarks share sees 32 MiB of new
    pages, and next to nothing for a call that allocates none."""
    if not _can_reset_peak_rss():
        pytest.skip("the peak RSS cannot be reset here (/proc/self/clear_refs)")
    grown = peak_rss_growth(lambda: _fresh_pages(32 << 20))
    assert 32 << 20 <= grown < 40 << 20, grown
    assert peak_rss_growth(lambda: None) < 4 << 20


def test_peak_rss_growth_sees_what_the_pool_kept():
    """A block the pool keeps for reuse does not hide the allocation it would
    serve: the probe empties the pool first, so the second of two equal
    redistributes grows the process by its 4 MiB output again (the probe read
    nothing for it before)."""
    if W == 1:
        pytest.skip("a lone rank's Replicate -> Shard(0) keeps its array: nothing to allocate")
    ok = COMM.allreduce(_can_reset_peak_rss(), MPI.LAND)
    if not ok:
        pytest.skip("the peak RSS cannot be reset here (/proc/self/clear_refs)")
    mesh = mesh_of((W,))
    dt = DTensor.from_local(np.ones((W * 512, 1024)), mesh, [R])
    out = dt.redistribute(mesh, [S0]).to_local()
    nbytes = out.nbytes
    del out  # its block goes back to the pool
    grown = peak_rss_growth(lambda: dt.redistribute(mesh, [S0]).to_local())
    assert COMM.allreduce(grown - nbytes, MPI.MIN) >= 0


def _check_peak_growth(src, dst, out_bytes_of):
    """The redistribute of 40 MiB per rank (above glibc's largest mmap threshold, so
    a temporary of that size always shows) from `src` to `dst` grows the process
    by at most its output (out_bytes_of(local input bytes)) and 4 MiB of staging
    chunks, on every rank, and 8 MiB besides: the blocks' page rounding and what
    Open MPI allocates and touches of its own for an exchange of that size (up to
    0.8 MiB per rank at 4 ranks when run alone, 6 MiB once in the full suite),
    well below the input- or output-sized temporary the test is there to catch."""
    ok = COMM.allreduce(_can_reset_peak_rss(), MPI.LAND)
    if not ok:
        pytest.skip("the peak RSS cannot be reset here (/proc/self/clear_refs)")
    mesh = mesh_of((W,))
    rows, cols = 40 * 1024 * 1024 // (8 * 512), 512
    local = np.full((rows, cols), float(RANK + 1))
    dt = DTensor.from_local(local, mesh, [src])
    COMM.Barrier()
    grown = peak_rss_growth(lambda: dt.redistribute(mesh, [dst]).to_local())
    limit = out_bytes_of(local.nbytes) + 12 * 1024 * 1024
    worst = COMM.allreduce(grown, MPI.MAX)
    assert worst <= limit, f"peak grew by {worst / 2**20:.1f} MiB, limit {limit / 2**20:.1f}"


@pytest.mark.parametrize("dst", [S0, S1], ids=["S0", "S1"])
def test_partial_to_shard_peak_memory(dst):
    """Partial -> Shard grows the process by the output and the staging chunks
    only, Shard(1) (packed chunk by chunk) as Shard(0): MPI_Reduce_scatter's ring
    took another input-sized temporary, and Shard(1) packed the whole input
    before it."""
    _check_peak_growth(PSUM, dst, lambda nbytes: nbytes // W)


def test_inner_gather_peak_memory():
    """Shard(1) -> Replicate stays within the output and the staging chunks: no
    output-sized staging buffer (the blocks used to be gathered into one and
    placed in a second pass)."""
    _check_peak_growth(S1, R, lambda nbytes: nbytes * W)


# ---- non-contiguous local arrays ------------------------------------------------------


def non_contiguous(local: np.ndarray, how: str) -> np.ndarray:
    """The same values as `local` in a non-contiguous view."""
    if how == "transposed":
        view = np.ascontiguousarray(local.T).T
    else:
        big = np.zeros((local.shape[0] * 2 + 1, local.shape[1] * 3 + 1), local.dtype)
        view = big[1::2, ::3][: local.shape[0], : local.shape[1]]
        view[...] = local
    assert np.array_equal(view, local)
    return view


@pytest.mark.parametrize("how", ["transposed", "strided"])
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_non_contiguous_locals(how, async_op):
    problems = Problems()
    base = base_array((9, 6))
    for ms in [(W,)] + two_d_meshes():
        mesh = mesh_of(ms)
        nd = len(ms)
        cases = [((S0,) + (R,) * (nd - 1), (R,) * nd), ((S0,) + (R,) * (nd - 1), (S1,) + (R,) * (nd - 1)),
                 ((PSUM,) * nd, (S0,) * nd), ((PMAX,) + (S1,) * (nd - 1), (R,) * nd),
                 ((R,) * nd, (S1,) * nd), ((S1,) * nd, (S0,) * nd)]
        for src, dst in cases:
            local = source_local(base, ms, mesh.get_coordinate(), src, np.float64)
            view = non_contiguous(local, how)
            if min(view.shape) > 1:
                problems.expect(not view.flags.c_contiguous, "the view is contiguous")
            dt = DTensor.from_local(view, mesh, src, shape=base.shape, stride=strides(base.shape))
            out = dt.redistribute(mesh, dst, async_op=async_op)
            want = expected_local(base, ms, mesh.get_coordinate(), src, dst, np.float64)
            problems.expect(np.array_equal(out.to_local(), want),
                            f"{ms} {name(src)}->{name(dst)}: local")
            problems.expect(np.array_equal(out.full_tensor(), base), f"{name(src)}: full")
            problems.expect(np.array_equal(dt.full_tensor(), base), f"{name(src)}: source full")
    assert problems == []


# ---- same placements, None, other meshes ---------------------------------------------


def test_same_placements_share_the_local_array_without_communication():
    problems = Problems()
    base = base_array((6, 5))
    for ms in [(W,)] + two_d_meshes():
        mesh = mesh_of(ms)
        nd = len(ms)
        for pl in [(R,) * nd, (S0,) * nd, (S1,) + (S0,) * (nd - 1), (PSUM,) * nd,
                   (PMAX,) + (S1,) * (nd - 1)]:
            dt = make_source(base, mesh, pl)
            for dst in [pl, tuple(Shard(-1) if p == S1 else p for p in pl)]:
                out, counts, _ = counted(dt, mesh, dst)
                problems.expect(out is not dt, f"{pl}: the same object")
                problems.expect(out.placements == pl, f"{pl}: placements {out.placements}")
                mine, theirs = out.to_local(), dt.to_local()
                problems.expect(mine is theirs or np.shares_memory(mine, theirs),
                                f"{pl}: a copy")
                problems.expect(sum(counts.values()) == 0, f"{pl}: {counts}")
                _, counts, _ = counted(dt, None, list(dst))
                problems.expect(sum(counts.values()) == 0, f"{pl} mesh=None: {counts}")
    assert problems == []


def test_placements_none_raises_as_torch():
    """torch's redistribute needs placements; full_tensor still replicates."""
    problems = Problems()
    base = base_array((5, 4))
    for ms in [(W,)] + two_d_meshes():
        mesh = mesh_of(ms)
        nd = len(ms)
        for src in [(S0,) * nd, (PSUM,) + (S1,) * (nd - 1), (R,) * nd]:
            dt = make_source(base, mesh, src)
            for call in (lambda: dt.redistribute(), lambda: dt.redistribute(mesh),
                         lambda: dt.redistribute(None, None)):
                with pytest.raises(RuntimeError, match="placements is needed"):
                    call()
            problems.expect(np.array_equal(dt.full_tensor(), base), f"{src}: values")
    assert problems == []


def test_other_mesh_is_not_implemented():
    mesh = mesh_of((W,))
    dt = make_source(base_array((4, 4)), mesh, (S0,))
    column = mesh_of((W, 1))
    named = init_device_mesh("cpu", (W,), mesh_dim_names=("x",))
    same = init_device_mesh("cpu", (W,))  # equal to `mesh`: allowed
    problems = Problems()
    for other in (column, named):
        r = raised(lambda: dt.redistribute(other, [R] * other.ndim), NotImplementedError, "mesh")
        problems.expect(r is True, f"{other}: {r}")
    out = dt.redistribute(same, [R])
    problems.expect(np.array_equal(out.to_local(), base_array((4, 4))), "an equal mesh")
    assert problems == []


def test_non_members_get_an_empty_local():
    """A mesh of all ranks but the last: the last rank holds an empty array and
    takes no part; the members' results are right."""
    sub = DeviceMesh("cpu", list(range(max(W - 1, 1))))
    member = sub.get_coordinate() is not None
    base = base_array((5, 3))
    problems = Problems()
    for src, dst in [((S0,), (R,)), ((S0,), (S1,)), ((PSUM,), (S0,)), ((R,), (S1,))]:
        dt = make_source(base, sub, src)
        for async_op in (False, True):
            out = dt.redistribute(sub, dst, async_op=async_op)
            problems.expect(out.shape == base.shape and out.placements == dst, "metadata")
            full = out.full_tensor()
            if member:
                want = expected_local(base, sub.shape, sub.get_coordinate(), src, dst, np.float64)
                problems.expect(np.array_equal(out.to_local(), want), f"{src}->{dst}: local")
                problems.expect(np.array_equal(full, base), f"{src}->{dst}: full")
            else:
                problems.expect(out.to_local().shape == (0,) and full.shape == (0,),
                                f"non-member: {out.to_local().shape} {full.shape}")
    assert problems == []


# ---- Partial targets ------------------------------------------------------------------


def test_partial_targets_refused_with_the_reason():
    problems = Problems()
    base = base_array((4, 4))
    for ms in [(W,)] + two_d_meshes():
        mesh = mesh_of(ms)
        nd = len(ms)
        rest = (R,) * (nd - 1)
        cases = [((R,) + rest, (PSUM,) + rest), ((S0,) + rest, (PSUM,) + rest),
                 ((PSUM,) + rest, (PMAX,) + rest), ((PSUM,) + rest, (PAVG,) + rest),
                 ((PMAX,) + rest, (Partial("min"),) + rest), ((S1,) + rest, (PMAX,) + rest)]
        if nd == 2:
            cases += [((PSUM, R), (R, PSUM)), ((PSUM, PSUM), (PSUM, PAVG))]
        for src, dst in cases:
            dt = make_source(base, mesh, src)
            for kw in ({}, {"async_op": True}):
                r = raised(lambda: dt.redistribute(mesh, dst, **kw), RuntimeError, "Partial")
                problems.expect(r is True, f"{ms} {name(src)}->{name(dst)} {kw}: {r}")
    assert problems == []


def test_partial_kept_while_another_mesh_dim_changes():
    problems = Problems()
    base = base_array((5, 6))
    for ms in two_d_meshes():
        mesh = mesh_of(ms)
        for src, dst in [((PSUM, S0), (PSUM, R)), ((PSUM, S0), (PSUM, S1)),
                         ((S1, PMAX), (R, PMAX)), ((PSUM, PAVG), (PSUM, R)),
                         ((PAVG, R), (PAVG, S1)), ((PSUM, PSUM), (PSUM, S0))]:
            dt = make_source(base, mesh, src)
            out = dt.redistribute(mesh, dst)
            want = expected_local(base, ms, mesh.get_coordinate(), src, dst, np.float64)
            problems.expect(out.placements == dst and np.array_equal(out.to_local(), want),
                            f"{ms} {name(src)}->{name(dst)}: local")
            problems.expect(np.array_equal(out.full_tensor(), base), f"{name(dst)}: full")
    assert problems == []


# ---- forward_dtype ----------------------------------------------------------------------


def test_forward_dtype_casts_before_communicating():
    mesh = mesh_of((W,))
    base = base_array((6, 4))
    problems = Problems()
    for src, dst in [((S0,), (R,)), ((S0,), (S1,)), ((PSUM,), (R,)), ((PSUM,), (S0,))]:
        dt = make_source(base, mesh, src, np.float64)
        _, counts64, bytes64 = counted(dt, mesh, dst)
        out, counts32, bytes32 = counted(dt, mesh, dst, forward_dtype=np.float32)
        problems.expect(out.dtype == np.float32 and out.to_local().dtype == np.float32,
                        f"{src}: dtype {out.dtype}")
        problems.expect(counts32 == counts64, f"{src}: counts {counts32} != {counts64}")
        total64 = COMM.allreduce(sum(bytes64.values()))
        total32 = COMM.allreduce(sum(bytes32.values()))
        problems.expect(2 * total32 == total64 or total64 == total32 == 0,
                        f"{src}: {total32} bytes in float32, {total64} in float64")
        full = out.full_tensor()
        problems.expect(full.dtype == np.float32 and np.array_equal(full, base),
                        f"{src}: values")
        problems.expect(dt.dtype == np.float64, "the source changed dtype")
    assert problems == []


def test_forward_dtype_cases():
    mesh = mesh_of((W,))
    problems = Problems()
    ints = np.full((4, 2), 3, np.int64)
    # Partial(avg) of integers needs a float: forward_dtype casts first.
    dt = DTensor.from_local(ints + RANK, mesh, [PAVG])
    out = dt.redistribute(mesh, [R], forward_dtype=np.float64)
    want = np.full((4, 2), 3 + (W - 1) / 2)
    problems.expect(out.dtype == np.float64 and np.array_equal(out.to_local(), want),
                    f"avg via float64: {out.to_local()}")
    # Same placements: no communication, the cast is the result.
    src = DTensor.from_local(np.arange(6, dtype=np.float64).reshape(3, 2) + 0.25, mesh, [S0])
    same, counts, _ = counted(src, mesh, [S0], forward_dtype="float16")
    problems.expect(same.dtype == np.float16 and same.to_local().dtype == np.float16
                    and sum(counts.values()) == 0, f"same placements: {counts} {same.dtype}")
    problems.expect(np.array_equal(same.to_local(), src.to_local().astype(np.float16)),
                    "same placements: values")
    # float -> int truncates as astype does, before the sum.
    half = DTensor.from_local(np.full((2, 2), 1.75), mesh, [PSUM])
    got = half.redistribute(mesh, [R], forward_dtype=np.int32).to_local()
    problems.expect(got.dtype == np.int32 and (got == W).all(), f"int32 sum: {got}")
    # async and forward_dtype together.
    dt = make_source(base_array((5, 3)), mesh, (S1,))
    out = dt.redistribute(mesh, [R], forward_dtype=np.complex64, async_op=True)
    problems.expect(out.dtype == np.complex64 and out.to_local().dtype == np.complex64
                    and np.array_equal(out.to_local(), base_array((5, 3))), "async cast")
    for bad in (object, "U3", np.dtype("M8[s]")):
        r = raised(lambda: dt.redistribute(mesh, [R], forward_dtype=bad), TypeError)
        problems.expect(r is True, f"forward_dtype={bad!r}: {r}")
    assert problems == []


# ---- async_op ---------------------------------------------------------------------------


def async_cases():
    cases = [((W,), (S0,), (R,)), ((W,), (S0,), (S1,)), ((W,), (PSUM,), (R,)),
             ((W,), (PAVG,), (S1,)), ((W,), (R,), (S0,)), ((W,), (S1,), (S1,))]
    for ms in two_d_meshes():
        cases += [(ms, (S0, S1), (S1, S0)), (ms, (S0, S0), (S1, S1)),
                  (ms, (PSUM, S0), (S0, S0)), (ms, (PMAX, PMAX), (R, R)),
                  (ms, (R, R), (S0, S1)), (ms, (S0, S0), (R, S0))]
    return cases


def test_async_returns_a_dtensor_completed_on_first_use():
    problems = Problems()
    base = base_array((7, 5))
    for ms, src, dst in async_cases():
        mesh = mesh_of(ms)
        what = f"{ms} {name(src)}->{name(dst)}"
        want = expected_local(base, ms, mesh.get_coordinate(), src, dst, np.float64)
        dt = make_source(base, mesh, src)
        out = dt.redistribute(mesh, dst, async_op=True)
        problems.expect(isinstance(out, DTensor) and out.placements == dst
                        and out.shape == base.shape and out.dtype == np.float64,
                        f"{what}: {type(out)}")
        local = out.to_local()
        problems.expect(type(local) is np.ndarray and np.array_equal(local, want),
                        f"{what}: to_local {type(local)}")
        problems.expect(out.to_local() is local, f"{what}: to_local again is another object")
        # full_tensor straight from a pending result
        pending = dt.redistribute(mesh, dst, async_op=True)
        problems.expect(np.array_equal(pending.full_tensor(), base), f"{what}: full_tensor")
        # explicit wait returns self
        pending = dt.redistribute(mesh, dst, async_op=True)
        problems.expect(pending.wait() is pending, f"{what}: wait() is not self")
        problems.expect(pending.wait() is pending, f"{what}: second wait()")
        problems.expect(type(pending.to_local()) is np.ndarray
                        and np.array_equal(pending.to_local(), want), f"{what}: after wait")
        # a pending result redistributed again
        pending = dt.redistribute(mesh, dst, async_op=True)
        again = pending.redistribute(mesh, src if not any(isinstance(p, Partial) for p in src)
                                     else (R,) * len(ms))
        problems.expect(np.array_equal(again.full_tensor(), base), f"{what}: chained")
    assert problems == []


def test_async_counts_equal_blocking_counts():
    problems = Problems()
    base = base_array((7, 5))
    for ms, src, dst in async_cases():
        mesh = mesh_of(ms)
        dt = make_source(base, mesh, src)
        _, counts, nbytes = counted(dt, mesh, dst)
        with CommDebugMode() as mode:
            out = dt.redistribute(mesh, dst, async_op=True)
            out.wait()
        problems.expect(dict(mode.get_comm_counts()) == counts,
                        f"{ms} {name(src)}->{name(dst)}: {dict(mode.get_comm_counts())} != {counts}")
        problems.expect(dict(mode.get_comm_bytes()) == nbytes,
                        f"{ms} {name(src)}->{name(dst)}: bytes {dict(mode.get_comm_bytes())}")
    assert problems == []


def test_async_dropped_without_wait_does_not_hang():
    """All ranks drop pending results at the same point; later collectives work."""
    base = base_array((6, 6))
    problems = Problems()
    for ms, src, dst in async_cases():
        mesh = mesh_of(ms)
        dt = make_source(base, mesh, src)
        pending = dt.redistribute(mesh, dst, async_op=True)
        del pending
        dt.redistribute(mesh, dst, async_op=True)  # never even bound to a name
        gc.collect()
        problems.expect(np.array_equal(dt.full_tensor(), base), f"{ms} {name(src)}: after drop")
    COMM.Barrier()
    assert problems == []


def test_async_same_placements_shares_memory():
    mesh = mesh_of((W,))
    dt = make_source(base_array((4, 3)), mesh, (S0,))
    with CommDebugMode() as mode:
        out = dt.redistribute(mesh, [S0], async_op=True)
    assert mode.get_total_counts() == 0
    mine, theirs = out.to_local(), dt.to_local()
    assert type(mine) is np.ndarray
    assert mine is theirs or np.shares_memory(mine, theirs)
