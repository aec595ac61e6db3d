"""Bad input raises a clear exception of the right type on every rank, before any
communication, and leaves every rank in step: never a crash, an abort or a hang.

Three tables: CASES (each call raises), WORKS (unusual but valid arrays, such as
non-contiguous, read-only, NaN and empty ones, give what NumPy gives) and DISAGREE
(one rank passes something else to a run_check=True call: every rank raises)."""

import re
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import (DTensor, DeviceMesh, Partial, Replicate, Shard, distribute_tensor,
                       init_device_mesh)
from mpi_helpers import bits_equal, raised

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
X = np.ones((2, 2))


@pytest.fixture(scope="module")
def m():
    world = init_device_mesh("cpu", (N,))
    grid = init_device_mesh("cpu", (1, N), mesh_dim_names=("a", "b"))
    return SimpleNamespace(
        world=world, grid=grid, unnamed=init_device_mesh("cpu", (1, N)),
        dt=distribute_tensor(np.arange(8.0).reshape(4, 2), world, [Shard(0)]),
        on_grid=distribute_tensor(np.arange(8.0).reshape(4, 2), grid,
                                  [Replicate(), Shard(0)]),
        other=distribute_tensor(np.ones((3, 2)), world, [Shard(0)]),
    )


def from_local(*args, **kw):
    return DTensor.from_local(*args, **kw)


# (id, call taking the meshes, exception type, regex the message must contain)
CASES = [
    # DTensor.from_local
    ("placements_too_many", lambda m: from_local(X, m.world, [Shard(0), Replicate()]),
     ValueError, "placements"),
    ("placements_too_few", lambda m: from_local(X, m.grid, [Shard(0)]), ValueError,
     "placements"),
    ("shard_dim_too_large", lambda m: from_local(X, m.world, [Shard(2)]), IndexError, None),
    ("shard_dim_too_negative", lambda m: from_local(X, m.world, [Shard(-3)]), IndexError, None),
    ("shard_a_0d_local", lambda m: from_local(np.array(1.0), m.world, [Shard(0)]),
     IndexError, None),
    ("local_is_a_list", lambda m: from_local([[1.0, 2.0]], m.world), TypeError, "ndarray"),
    ("local_is_a_float", lambda m: from_local(3.0, m.world), TypeError, "ndarray"),
    ("local_object_dtype", lambda m: from_local(np.array([object()]), m.world), TypeError,
     "object"),
    ("local_str_dtype", lambda m: from_local(np.array(["a"]), m.world), TypeError, None),
    ("local_bytes_dtype", lambda m: from_local(np.array([b"a"]), m.world), TypeError, None),
    ("local_structured_dtype",
     lambda m: from_local(np.zeros(2, dtype=[("a", "f8")]), m.world), TypeError, None),
    ("placement_is_a_string", lambda m: from_local(X, m.world, ["S(0)"]), TypeError, None),
    ("device_mesh_is_a_string", lambda m: from_local(X, "cpu"), TypeError, "DeviceMesh"),
    ("shape_without_stride", lambda m: from_local(X, m.world, shape=(2, 2)), ValueError,
     "both"),
    ("stride_without_shape", lambda m: from_local(X, m.world, stride=(2, 1)), ValueError,
     "both"),
    ("shape_of_wrong_length",
     lambda m: from_local(X, m.world, shape=(4,), stride=(1,)), ValueError, None),
    ("float_shape", lambda m: from_local(X, m.world, [Shard(0)], shape=(2.5, 2),
                                         stride=(2, 1)), TypeError, "ints"),
    ("float_stride", lambda m: from_local(X, m.world, [Shard(0)], shape=(2 * N, 2),
                                          stride=(2.0, 1)), TypeError, "ints"),
    ("bool_shape", lambda m: from_local(X, m.world, shape=(True, 2), stride=(2, 1)),
     TypeError, "ints"),
    ("masked_local", lambda m: from_local(np.ma.masked_array(X, mask=X > 0), m.world),
     TypeError, "MaskedArray"),
    # sizes that overflow int64, dtypes the core cannot move
    ("shape_elements_overflow", lambda m: from_local(
        X, m.world, [Shard(0)], shape=(2**62, 2**62), stride=(2**62, 1)),
     OverflowError, "more than"),
    ("shape_elements_overflow_to_negative", lambda m: from_local(
        X, m.world, [Shard(0)], shape=(2**63 - 1, 2), stride=(2, 1)),
     OverflowError, "more than"),
    ("shape_bytes_overflow", lambda m: from_local(
        X, m.world, [Shard(0)], shape=(2**61, 2), stride=(2, 1)), OverflowError, "bytes"),
    ("stride_reach_overflow", lambda m: from_local(
        X, m.world, [Shard(0)], shape=(4, 2), stride=(2**62, 1)), OverflowError, "stride"),
    ("zeros_bytes_overflow", lambda m: mt.zeros(2**62, device_mesh=m.world), OverflowError,
     "bytes"),
    ("local_big_endian", lambda m: from_local(X.astype(">f8"), m.world), TypeError,
     "byte order"),
    ("local_float128", lambda m: from_local(X.astype(np.longdouble), m.world), TypeError,
     "float64"),
    ("local_complex256", lambda m: from_local(X.astype(np.clongdouble), m.world), TypeError,
     "complex128"),
    ("zeros_float128", lambda m: mt.zeros(2, dtype=np.longdouble, device_mesh=m.world),
     TypeError, "native byte order"),
    ("distribute_big_endian", lambda m: distribute_tensor(X.astype(">i4"), m.world),
     TypeError, "int32"),
    ("distribute_float128", lambda m: distribute_tensor(X.astype(np.longdouble), m.world),
     TypeError, "float64"),
    # factories
    ("zeros_negative_size", lambda m: mt.zeros(-1, device_mesh=m.world), ValueError,
     "negative"),
    ("ones_negative_size", lambda m: mt.ones(3, -2, device_mesh=m.world), ValueError, None),
    ("empty_negative_size", lambda m: mt.empty([-3], device_mesh=m.world), ValueError, None),
    ("full_negative_size", lambda m: mt.full((2, -1), 0.0, device_mesh=m.world), ValueError,
     None),
    ("rand_negative_size", lambda m: mt.rand(-1, device_mesh=m.world), ValueError, None),
    ("randn_negative_size", lambda m: mt.randn((2, -2), device_mesh=m.world), ValueError, None),
    ("float_size", lambda m: mt.zeros(2.5, device_mesh=m.world), TypeError, None),
    ("object_dtype_factory", lambda m: mt.zeros(3, dtype=object, device_mesh=m.world),
     TypeError, None),
    ("str_dtype_factory", lambda m: mt.ones(3, dtype=str, device_mesh=m.world), TypeError, None),
    ("full_string_fill", lambda m: mt.full((3,), "a", device_mesh=m.world), TypeError, None),
    ("factory_shard_dim_out_of_range",
     lambda m: mt.zeros(4, device_mesh=m.world, placements=[Shard(1)]), IndexError, None),
    ("factory_wrong_number_of_placements",
     lambda m: mt.zeros(4, device_mesh=m.grid, placements=[Shard(0)]), ValueError, None),
    ("zeros_partial", lambda m: mt.zeros(4, device_mesh=m.world, placements=[Partial()]),
     ValueError, "Partial"),
    ("ones_partial", lambda m: mt.ones(4, device_mesh=m.world, placements=[Partial("max")]),
     ValueError, "Partial"),
    ("empty_partial", lambda m: mt.empty(4, device_mesh=m.grid,
                                         placements=[Replicate(), Partial()]),
     ValueError, "Partial"),
    ("full_partial", lambda m: mt.full((4,), 1.0, device_mesh=m.world, placements=[Partial()]),
     ValueError, "Partial"),
    ("rand_partial", lambda m: mt.rand(4, device_mesh=m.world, placements=[Partial()]),
     ValueError, "Partial"),
    ("randn_partial", lambda m: mt.randn(4, device_mesh=m.world, placements=[Partial()]),
     ValueError, "Partial"),
    ("rand_int_dtype", lambda m: mt.rand(4, dtype=np.int64, device_mesh=m.world), TypeError,
     None),
    ("randn_bool_dtype", lambda m: mt.randn(4, dtype=bool, device_mesh=m.world), TypeError,
     None),
    # device meshes
    ("init_device_mesh_cuda", lambda m: init_device_mesh("cuda", (N,)), ValueError, "cpu"),
    ("device_mesh_cuda", lambda m: DeviceMesh("cuda", list(range(N))), ValueError, "cpu"),
    ("init_mesh_larger_than_comm", lambda m: init_device_mesh("cpu", (N + 1,)), RuntimeError,
     "bigger"),
    ("mesh_larger_than_comm", lambda m: DeviceMesh("cpu", np.arange(N + 1)), RuntimeError,
     "bigger"),
    ("mesh_larger_than_comm_self",
     lambda m: init_device_mesh("cpu", (2,), comm=MPI.COMM_SELF), RuntimeError, "bigger"),
    ("mesh_shape_zero", lambda m: init_device_mesh("cpu", (0,)), ValueError, None),
    ("mesh_shape_negative", lambda m: init_device_mesh("cpu", (N, -2)), ValueError, None),
    # -1 takes the ranks the other sizes leave, when they divide them.
    ("mesh_shape_that_does_not_divide_the_ranks",
     lambda m: init_device_mesh("cpu", (-1, N + 1)), ValueError,
     rf"mesh_shape \(-1, {N + 1}\): .* do not divide the {N} ranks"),
    ("mesh_shape_two_minus_ones", lambda m: init_device_mesh("cpu", (-1, -1)), ValueError,
     "at most one -1"),
    ("mesh_shape_of_a_zero_quotient",
     lambda m: init_device_mesh("cpu", (N // (N + 1), N + 1)), ValueError, "a size of 0"),
    ("mesh_rank_out_of_range", lambda m: DeviceMesh("cpu", [N]), ValueError, None),
    ("mesh_rank_negative", lambda m: DeviceMesh("cpu", [-1]), ValueError, None),
    ("mesh_of_floats", lambda m: DeviceMesh("cpu", [0.0]), TypeError, None),
    ("mesh_without_ranks", lambda m: DeviceMesh("cpu", []), ValueError, None),
    ("duplicate_mesh_dim_names",
     lambda m: init_device_mesh("cpu", (1, N), mesh_dim_names=("a", "a")), RuntimeError,
     "unique"),
    ("duplicate_mesh_dim_names_device_mesh",
     lambda m: DeviceMesh("cpu", [list(range(N))], mesh_dim_names=("a", "a")), RuntimeError,
     "unique"),
    ("too_few_mesh_dim_names",
     lambda m: init_device_mesh("cpu", (1, N), mesh_dim_names=("a",)), RuntimeError, None),
    ("too_many_mesh_dim_names",
     lambda m: DeviceMesh("cpu", list(range(N)), mesh_dim_names=("a", "b")), RuntimeError, None),
    ("mesh_dim_names_a_string",
     lambda m: init_device_mesh("cpu", (N,), mesh_dim_names="a"), TypeError, None),
    ("unknown_name_slice", lambda m: m.grid["zz"], KeyError, r"zz.*'a', 'b'"),
    ("unknown_name_in_several", lambda m: m.grid["a", "zz"], KeyError, r"zz.*'a', 'b'"),
    ("unknown_name_size", lambda m: m.grid.size("zz"), KeyError, r"\('a', 'b'\)"),
    ("unknown_name_get_group", lambda m: m.grid.get_group("zz"), KeyError, r"\('a', 'b'\)"),
    ("unknown_name_local_rank", lambda m: m.grid.get_local_rank("zz"), KeyError,
     r"\('a', 'b'\)"),
    ("slice_names_out_of_order", lambda m: m.grid["b", "a"], KeyError, None),
    ("slice_without_names", lambda m: m.unnamed["a"], RuntimeError, "mesh_dim_names"),
    ("get_local_rank_nd_without_dim", lambda m: m.grid.get_local_rank(), RuntimeError,
     "mesh_dim"),
    ("get_group_nd_without_dim", lambda m: m.grid.get_group(), RuntimeError, "mesh_dim"),
    ("mesh_dim_out_of_range", lambda m: m.grid.size(2), IndexError, None),
    ("get_group_dim_out_of_range", lambda m: m.grid.get_group(-3), IndexError, None),
    # placements and layout
    ("partial_mean", lambda m: Partial("mean"), ValueError, "mean"),
    ("shard_bool", lambda m: Shard(True), TypeError, None),
    ("shard_str", lambda m: Shard("0"), TypeError, None),
    ("layout_shard_dim_out_of_range",
     lambda m: mt.compute_local_shape_and_global_offset((5,), m.world, [Shard(1)]),
     IndexError, None),
    ("layout_negative_size",
     lambda m: mt.compute_local_shape_and_global_offset((-5,), m.world, [Shard(0)]),
     ValueError, None),
    ("layout_mesh_is_a_string",
     lambda m: mt.compute_local_shape_and_global_offset((4,), "cpu", [Shard(0)]),
     TypeError, "DeviceMesh"),
    ("layout_placement_is_a_string",
     lambda m: mt.compute_local_shape_and_global_offset((4,), m.world, ["S(0)"]),
     TypeError, "Shard, Replicate or Partial"),
    # distribute_tensor
    ("distribute_object_dtype",
     lambda m: distribute_tensor(np.array([object()] * 4), m.world, [Shard(0)]), TypeError,
     "object"),
    ("distribute_str_dtype", lambda m: distribute_tensor(np.array(["a", "b"]), m.world),
     TypeError, None),
    ("distribute_masked",
     lambda m: distribute_tensor(np.ma.masked_array(X, mask=X > 0), m.world, [Shard(0)]),
     TypeError, "MaskedArray"),
    ("distribute_shard_dim_out_of_range",
     lambda m: distribute_tensor(X, m.world, [Shard(2)]), IndexError, None),
    ("distribute_wrong_number_of_placements",
     lambda m: distribute_tensor(X, m.grid, [Shard(0)]), ValueError, "placements"),
    ("distribute_placement_is_a_string",
     lambda m: distribute_tensor(X, m.world, ["R"]), TypeError, None),
    ("distribute_mesh_is_a_string", lambda m: distribute_tensor(X, "cpu"), TypeError,
     "DeviceMesh"),
    # DTensor.redistribute
    ("redistribute_too_many_placements",
     lambda m: m.dt.redistribute(m.world, [Shard(0), Replicate()]), ValueError, "placements"),
    ("redistribute_placement_is_a_string",
     lambda m: m.dt.redistribute(m.world, ["R"]), TypeError, None),
    ("redistribute_shard_dim_out_of_range",
     lambda m: m.dt.redistribute(m.world, [Shard(2)]), IndexError, None),
    ("redistribute_async_shard_dim_out_of_range",
     lambda m: m.dt.redistribute(m.world, [Shard(-3)], async_op=True), IndexError, None),
    ("redistribute_to_partial",
     lambda m: m.dt.redistribute(m.world, [Partial()]), RuntimeError, "Partial"),
    ("redistribute_to_another_mesh",
     lambda m: m.dt.redistribute(m.grid, [Replicate(), Replicate()]),
     NotImplementedError, "different device meshes"),
    # operators: mismatched meshes and shapes, wrong types, as NumPy would refuse them
    ("op_mismatched_meshes", lambda m: m.dt + m.on_grid, ValueError, "device meshes"),
    ("op_mismatched_shapes", lambda m: m.dt + m.other, ValueError, "broadcast"),
    ("op_with_a_string", lambda m: np.add(m.dt, "a"), TypeError, None),
    ("op_with_none", lambda m: m.dt + None, TypeError, None),
    ("op_with_object_array", lambda m: m.dt + np.array([object(), object()]), TypeError,
     None),
    ("matmul_inner_dims_differ", lambda m: m.dt @ m.dt, ValueError, None),
    ("reduction_axis_out_of_range", lambda m: np.sum(m.dt, axis=5), np.exceptions.AxisError,
     None),
    ("transpose_repeated_axis", lambda m: np.transpose(m.dt, (0, 0)), ValueError, None),
    # manual_seed
    ("seed_negative", lambda m: mt.manual_seed(-1), ValueError, None),
    ("seed_too_large", lambda m: mt.manual_seed(2**64), ValueError, None),
    ("seed_float", lambda m: mt.manual_seed(1.5), TypeError, None),
    ("seed_str", lambda m: mt.manual_seed("3"), TypeError, None),
    ("seed_none", lambda m: mt.manual_seed(None), TypeError, None),
    ("seed_bool", lambda m: mt.manual_seed(True), TypeError, None),
]
if N >= 2:
    CASES.append(("duplicate_ranks", lambda m: DeviceMesh("cpu", [0, 0]), ValueError,
                  "distinct"))
    CASES.append(("duplicate_ranks_2d", lambda m: DeviceMesh("cpu", [[0, 1], [1, 0]]),
                  ValueError if N >= 4 else RuntimeError, None))

IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_raises_on_every_rank(case, m, comm):
    _, call, exc, match = case
    outcome = raised(lambda: call(m), exc, match)
    # Every rank came back, and all ranks see every rank's outcome.
    outcomes = comm.allgather(outcome)
    assert outcome is True
    assert outcomes == [True] * N


# Cases that create a mesh on MPI.COMM_WORLD, and the good call the other ranks
# make: creating a mesh is collective, and every rank checks every rank's arguments
# before any communicator is made, so a bad argument on one rank raises its error
# on every rank.
MESH_CASES = {
    "init_device_mesh_cuda", "init_mesh_larger_than_comm", "mesh_shape_zero",
    "mesh_shape_negative", "duplicate_mesh_dim_names", "too_few_mesh_dim_names",
    "mesh_dim_names_a_string", "device_mesh_cuda", "mesh_larger_than_comm",
    "mesh_rank_out_of_range", "mesh_rank_negative", "mesh_of_floats", "mesh_without_ranks",
    "duplicate_mesh_dim_names_device_mesh", "too_many_mesh_dim_names", "duplicate_ranks",
    "duplicate_ranks_2d", "mesh_shape_that_does_not_divide_the_ranks",
    "mesh_shape_two_minus_ones", "mesh_shape_of_a_zero_quotient"}


def good_mesh(case_id):
    if case_id.startswith(("init", "mesh_shape")) or case_id in (
            "duplicate_mesh_dim_names", "too_few_mesh_dim_names", "mesh_dim_names_a_string"):
        return init_device_mesh("cpu", (1, N), mesh_dim_names=None)
    return DeviceMesh("cpu", list(range(N)))


# Cases of calls that are collective by contract (distribute_tensor, redistribute),
# and the good call the other ranks make: the bad rank's failure goes into the
# agreement their first collective enters, so every rank raises it.
# NumPy's functions are calls every rank makes, agreed on before their rule runs
# (_call_agreement): another argument on one rank is a ValueError on every rank.
NUMPY_GOOD = {
    "reduction_axis_out_of_range": lambda m: np.sum(m.dt, axis=0),
    "transpose_repeated_axis": lambda m: np.transpose(m.dt, (1, 0)),
}
AGREED = {i for i in IDS if i.startswith(("distribute_", "redistribute_"))
          and i != "distribute_mesh_is_a_string"} | (set(NUMPY_GOOD) if N >= 2 else set())


def good_call(case_id, m):
    if case_id in NUMPY_GOOD:
        return NUMPY_GOOD[case_id](m)
    if case_id == "distribute_wrong_number_of_placements":  # on the grid, as the bad one
        return distribute_tensor(X, m.grid, [Replicate(), Shard(0)])
    if case_id.startswith("distribute_"):
        return distribute_tensor(np.arange(8.0).reshape(4, 2), m.world, [Shard(0)])
    return m.dt.redistribute(m.world, [Replicate()])


@pytest.mark.timeout(30)
@pytest.mark.skipif(N < 2, reason="needs a second rank to disagree with")
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in AGREED],
                         ids=[i for i in IDS if i in AGREED])
def test_a_bad_argument_of_a_collective_call_on_one_rank_raises_everywhere(case, m, comm):
    """Only the last rank passes the bad argument; the others make the good call and
    get the last rank's exception, and the next collective pairs."""
    case_id, call, exc, match = case
    if case_id in NUMPY_GOOD:
        exc, match = ValueError, "made different calls"
    bad = RANK == N - 1
    outcome = raised(lambda: call(m) if bad else good_call(case_id, m), exc, match)
    assert comm.allgather(outcome) == [True] * N
    # The next distribute_tensor pairs: before, it gave rank 0's previous array.
    b = np.arange(10.0, 18.0).reshape(4, 2)
    assert np.array_equal(distribute_tensor(b, m.world, [Shard(0)]).full_tensor(), b)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", [c for c in CASES if c[0] not in MESH_CASES | AGREED],
                         ids=[i for i in IDS if i not in MESH_CASES | AGREED])
def test_raises_before_any_communication(case, m, comm):
    """Only the last rank makes the bad call. Had it communicated before raising,
    it would wait for ranks that never join, while they wait in the allgather."""
    _, call, exc, _ = case
    outcome = raised(lambda: call(m), exc) if RANK == N - 1 else None
    assert comm.allgather(outcome)[-1] is True


@pytest.mark.timeout(30)
@pytest.mark.skipif(N < 2, reason="needs a second rank to disagree with")
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in MESH_CASES],
                         ids=[i for i in IDS if i in MESH_CASES])
def test_a_bad_mesh_on_one_rank_raises_on_every_rank(case, m, comm):
    """Only the last rank passes the bad arguments; the others create a good mesh
    (of another shape for init_device_mesh's cases), and get the last rank's error."""
    case_id, call, exc, match = case
    if case_id in NUMPY_GOOD:
        exc, match = ValueError, "made different calls"
    bad = RANK == N - 1
    outcome = raised(lambda: call(m) if bad else good_mesh(case_id), exc, match)
    assert comm.allgather(outcome) == [True] * N


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


NAN = np.array([1.0, np.nan, -np.inf, np.nan])
Y = np.arange(24.0).reshape(4, 6)

# (id, call taking the meshes, NumPy's result): valid but unusual input gives what
# NumPy gives, bit for bit (NaNs included), on every rank.
WORKS = [
    ("distribute_non_contiguous",
     lambda m: distribute_tensor(Y.T, m.world, [Shard(0)]).full_tensor(), Y.T),
    ("distribute_strided_view",
     lambda m: distribute_tensor(Y[:, ::2], m.world, [Shard(1)]).full_tensor(), Y[:, ::2]),
    ("distribute_read_only",
     lambda m: distribute_tensor(_readonly(Y), m.world, [Shard(1)]).full_tensor(), Y),
    ("distribute_nans", lambda m: distribute_tensor(NAN, m.world, [Shard(0)]).full_tensor(),
     NAN),
    ("distribute_empty",
     lambda m: distribute_tensor(np.zeros((0, 3)), m.world, [Shard(0)]).full_tensor(),
     np.zeros((0, 3))),
    ("from_local_non_contiguous",
     lambda m: DTensor.from_local(Y.T, m.world, [Replicate()]).full_tensor(), Y.T),
    ("from_local_read_only",
     lambda m: DTensor.from_local(_readonly(Y), m.world, [Replicate()]).full_tensor(), Y),
    ("redistribute_nans",
     lambda m: distribute_tensor(NAN, m.world, [Shard(0)]).redistribute(
         m.world, [Replicate()]).to_local(), NAN),
    ("partial_sum_of_nans",
     lambda m: DTensor.from_local(NAN, m.world, [Partial()]).full_tensor(), NAN * N),
    ("partial_max_of_nans",
     lambda m: DTensor.from_local(NAN, m.world, [Partial("max")]).full_tensor(), NAN),
    ("op_on_non_contiguous_local",
     lambda m: (DTensor.from_local(Y.T, m.world, [Replicate()]) * 2.0).full_tensor(),
     Y.T * 2.0),
    ("op_on_empty", lambda m: (distribute_tensor(np.zeros((0, 2)), m.world, [Shard(0)]) + 1.0)
     .full_tensor(), np.zeros((0, 2)) + 1.0),
    ("sum_of_empty",
     lambda m: np.sum(distribute_tensor(np.zeros((0, 2)), m.world, [Shard(0)])).full_tensor(),
     np.sum(np.zeros((0, 2)))),
    ("max_with_nan",
     lambda m: np.max(distribute_tensor(NAN, m.world, [Shard(0)])).full_tensor(), np.max(NAN)),
    ("list_like_input",
     lambda m: distribute_tensor([[1.0, 2.0]], m.world, [Shard(1)]).full_tensor(),
     np.array([[1.0, 2.0]])),
]


@pytest.mark.parametrize("case", WORKS, ids=[c[0] for c in WORKS])
def test_works_like_numpy(case, m, comm):
    _, call, expected = case
    try:
        got = call(m)
        outcome = True if bits_equal(got, expected) else f"got {got!r}"
    except Exception as e:  # noqa: BLE001 - reported to the test
        outcome = f"{type(e).__name__}: {e}"
    assert comm.allgather(outcome) == [True] * N


# (id, call taking the meshes and whether this rank is the odd one out): with
# run_check=True every rank raises ValueError when one rank's local tensor does
# not fit the others'.
DISAGREE = [
    ("local_shape", lambda m, odd: DTensor.from_local(
        np.ones((3 if odd else 2, 2)), m.world, [Shard(0)], run_check=True)),
    ("local_ndim", lambda m, odd: DTensor.from_local(
        np.ones((2, 2, 1) if odd else (2, 2)), m.world, [Shard(0)], run_check=True)),
    ("local_dtype", lambda m, odd: DTensor.from_local(
        np.ones((2, 2), np.float32 if odd else np.float64), m.world, [Shard(0)],
        run_check=True)),
    ("empty_on_one_rank", lambda m, odd: DTensor.from_local(
        np.ones((0 if odd else 2, 2)), m.world, [Shard(0)], run_check=True)),
    ("given_shape", lambda m, odd: DTensor.from_local(
        np.ones((2, 2)), m.world, [Shard(0)], run_check=True, shape=(2 * N + odd, 2),
        stride=(2, 1))),
    ("placements", lambda m, odd: DTensor.from_local(
        np.ones((2, 2)), m.world, [Shard(1) if odd else Shard(0)], run_check=True)),
    ("partial_op", lambda m, odd: DTensor.from_local(
        np.ones((2, 2)), m.world, [Partial("max" if odd else "sum")], run_check=True)),
    ("replicate_shape_on_2d_mesh", lambda m, odd: DTensor.from_local(
        np.ones((3 if odd else 2, 2)), m.grid, [Replicate(), Shard(1)], run_check=True)),
]


@pytest.mark.skipif(N < 2, reason="needs a second rank to disagree with")
@pytest.mark.parametrize("case", DISAGREE, ids=[c[0] for c in DISAGREE])
def test_run_check_raises_on_every_rank_when_ranks_disagree(case, m, comm):
    _, call = case
    outcome = raised(lambda: call(m, RANK == N - 1), ValueError, "run_check")
    assert comm.allgather(outcome) == [True] * N


# (id, call taking the meshes and whether this rank is the odd one out, exception
# type, regex of the message): arguments that one rank passes differently to a
# collective call that checks them, whatever the size (a mesh's creation,
# distribute_tensor, from_local's run_check): every rank raises the same exception
# with the same message, where it used to hang, fill garbage or fail on one rank.
RANK_DEPENDENT = [
    ("mesh_shape", lambda m, odd: init_device_mesh("cpu", (N,) if odd else (1, N)),
     ValueError, "different meshes"),
    ("mesh_rank_list",
     lambda m, odd: DeviceMesh("cpu", list(range(N))[::-1] if odd else list(range(N))),
     ValueError, "different meshes"),
    ("mesh_rank_count", lambda m, odd: DeviceMesh("cpu", [0] if odd else list(range(N))),
     ValueError, "different meshes"),
    ("mesh_dim_names", lambda m, odd: init_device_mesh(
        "cpu", (N,), mesh_dim_names=("b" if odd else "a",)), ValueError, "different meshes"),
    ("mesh_dim_names_on_one_rank", lambda m, odd: init_device_mesh(
        "cpu", (N,), mesh_dim_names=("a",) if odd else None), ValueError, "different meshes"),
    ("distribute_global_shape",
     lambda m, odd: distribute_tensor(np.ones((4 * N + odd, 2)), m.world, [Shard(0)]),
     ValueError, r"different shapes or dtypes.*shape \(\d+, 2\)"),
    ("distribute_dtype", lambda m, odd: distribute_tensor(
        np.ones((4 * N, 2), np.float32 if odd else np.float64), m.world, [Shard(0)]),
     ValueError, "different shapes or dtypes"),
    ("distribute_dtype_of_one_size", lambda m, odd: distribute_tensor(
        np.ones((4 * N, 2), np.int32 if odd else np.float32), m.world, [Shard(0)]),
     ValueError, "different shapes or dtypes"),
    ("distribute_transposed", lambda m, odd: distribute_tensor(
        np.ones((4 * N, 3) if odd else (3, 4 * N)), m.world, [Shard(0)]),
     ValueError, "different shapes or dtypes"),
    ("distribute_replicated_shape", lambda m, odd: distribute_tensor(
        np.ones((2, 2 + odd)), m.grid, [Replicate(), Replicate()]),
     ValueError, "different shapes or dtypes"),
    ("distribute_placements", lambda m, odd: distribute_tensor(
        np.ones((4 * N, 4 * N)), m.world, [Shard(1) if odd else Shard(0)]),
     ValueError, "different shapes or dtypes, or different placements"),
    ("from_local_uneven_shards_run_check", lambda m, odd: DTensor.from_local(
        np.ones((3 if odd else 4, 2)), m.world, [Shard(0)], run_check=True),
     ValueError, "pass shape= and stride="),
]


@pytest.mark.timeout(60)
@pytest.mark.skipif(N < 2, reason="needs a second rank to disagree with")
@pytest.mark.parametrize("case", RANK_DEPENDENT, ids=[c[0] for c in RANK_DEPENDENT])
def test_rank_dependent_arguments_raise_the_same_error_everywhere(case, m, comm):
    _, call, exc, match = case
    try:
        call(m, RANK == N - 1)
        got = None
    except Exception as e:  # noqa: BLE001 - compared across ranks below
        got = (type(e).__name__, str(e))
    every = comm.allgather(got)
    assert all(g == every[0] for g in every), every
    assert every[0] is not None and every[0][0] == exc.__name__, every[0]
    assert re.search(match, every[0][1]), every[0]
    x = distribute_tensor(np.arange(2.0 * N), m.world, [Shard(0)])
    assert x.full_tensor().tolist() == np.arange(2.0 * N).tolist()


def test_library_works_after_bad_input(m, comm):
    dt = DTensor.from_local(np.full((2,), float(RANK)), m.world, [Replicate()],
                            run_check=True)
    values = comm.allgather(dt.to_local().tolist())
    mesh = init_device_mesh("cpu", (N,), mesh_dim_names=("x",))
    total = mesh["x"].get_group().allreduce(1)
    assert values == [[0.0, 0.0]] * N
    assert total == N
