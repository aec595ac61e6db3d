"""np.roll, np.diff, np.ediff1d, np.gradient, np.convolve, np.correlate, np.pad and
np.flip (fliplr, flipud) along a sharded axis: NumPy's value and dtype on every
rank for every layout of the suite's meshes (Partial included) on corner and
uneven lengths; nothing is gathered (strict mode, GatherWarning as an error); the
result stays sharded; and only the overlapping or wrapped rows move, in one
exchange (counts, then rows) whose bytes CommDebugMode bounds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor
from mpitensor import Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import (W, assert_matches, corner_layouts, make, matches_or_raises_alike,
                         mesh_of)

R, S0, S1 = Replicate(), Shard(0), Shard(1)
LENGTHS = (1, 2, 3, 5, 9, 13)


def strictly(check):
    with warnings.catch_warnings(), mpitensor.strict():
        warnings.simplefilter("error", GatherWarning)
        check()


@pytest.mark.parametrize("n", LENGTHS)
def test_roll_diff_gradient_1d(n):
    full = (np.arange(n, dtype=np.int64) ** 2) - 3
    for mesh, pls in corner_layouts(1):
        dt = make(full, mesh, pls)

        def check():
            for s in (0, 1, -2, n + 3):
                assert_matches(np.roll(dt, s), np.roll(full, s))
            for k in (0, 1, 2, n + 1):
                assert_matches(np.diff(dt, k), np.diff(full, k))
            for order in (1, 2):
                if n > order:
                    assert_matches(np.gradient(dt, 0.5, edge_order=order),
                                   np.gradient(full, 0.5, edge_order=order))
        strictly(check)


@pytest.mark.parametrize("n", LENGTHS + (0,))
def test_ediff1d_and_flip_1d(n):
    full = np.arange(n, dtype=np.float64) ** 2
    for mesh, pls in corner_layouts(1):
        dt = make(full, mesh, pls)

        def check():
            assert_matches(np.ediff1d(dt), np.ediff1d(full))
            assert_matches(np.ediff1d(dt, to_begin=[0, 1], to_end=-1),
                           np.ediff1d(full, to_begin=[0, 1], to_end=-1))
            assert_matches(np.flip(dt), np.flip(full))
            assert_matches(np.flipud(dt), np.flipud(full))
        strictly(check)
    mesh = mesh_of((W,))
    ints = make(np.arange(4), mesh, [S0])
    matches_or_raises_alike(lambda: np.ediff1d(ints, to_begin=[1.5]),
                            lambda: np.ediff1d(np.arange(4), to_begin=[1.5]))
    matches_or_raises_alike(lambda: np.fliplr(ints), lambda: np.fliplr(np.arange(4)))


def test_flip_of_a_vector_moves_each_row_once():
    mesh = mesh_of((W,))
    full = np.arange(1001.0)
    dt = make(full, mesh, [S0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        with CommDebugMode() as mode:
            got = np.flip(dt)
    assert_matches(got, full[::-1])
    assert sent_bytes(mode) <= dt.to_local().nbytes + 8 * W
    if W > 1:
        assert got.placements == (S0,)
        assert dict(mode.get_comm_counts()) == {"all_to_all_single": 2}


@pytest.mark.parametrize("shape", [(5, 3), (2, 4), (9, 1, 2)], ids=str)
def test_roll_diff_gradient_nd(shape):
    full = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) ** 2
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)

        def check():
            for axis in range(len(shape)):
                assert_matches(np.roll(dt, 2, axis=axis), np.roll(full, 2, axis=axis))
                assert_matches(np.diff(dt, 1, axis=axis), np.diff(full, 1, axis=axis))
            assert_matches(np.roll(dt, (1, -1), (0, 1)), np.roll(full, (1, -1), (0, 1)))
            assert_matches(np.fliplr(dt), np.fliplr(full))
            assert_matches(np.flipud(dt), np.flipud(full))
            assert_matches(np.ediff1d(dt), np.ediff1d(full))
            axes = tuple(k for k in range(len(shape)) if shape[k] > 1)
            for g, w in zip(np.gradient(dt, axis=axes), np.gradient(full, axis=axes)):
                assert_matches(g, w)
            matches_or_raises_alike(lambda: np.gradient(dt), lambda: np.gradient(full),
                                    compare=lambda g, w: [assert_matches(x, y)
                                                          for x, y in zip(g, w)])
        strictly(check)


@pytest.mark.parametrize("n", LENGTHS)
def test_convolve_correlate(n):
    signal = np.arange(n, dtype=np.float64) * 1.5 - 2
    for mesh, pls in corner_layouts(1):
        a = make(signal, mesh, pls)
        for k in (1, 2, 3, 4):
            if k > n:
                continue
            kernel = np.arange(1, k + 1, dtype=np.int64)
            v = make(kernel, mesh, pls[::-1])

            def check():
                for mode in ("full", "same", "valid"):
                    assert_matches(np.convolve(a, v, mode), np.convolve(signal, kernel, mode))
                    assert_matches(np.convolve(v, a, mode), np.convolve(kernel, signal, mode))
                    assert_matches(np.correlate(a, v, mode),
                                   np.correlate(signal, kernel, mode))
                assert_matches(np.correlate(a, v), np.correlate(signal, kernel))
            strictly(check)


def test_a_plain_kernel_is_taken_as_replicated():
    mesh = mesh_of((W,))
    signal, kernel = np.arange(10.0), np.array([1.0, -1.0, 2.0])
    a = make(signal, mesh, [S0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        with CommDebugMode() as mode:
            got = np.convolve(a, kernel)
            back = np.correlate(a, list(kernel), "same")
    assert_matches(got, np.convolve(signal, kernel))
    assert_matches(back, np.correlate(signal, kernel, "same"))
    assert mode.get_total_counts() == (4 if W > 1 else 0)


def test_complex_correlate_conjugates_the_kernel():
    mesh = mesh_of((W,))
    signal = np.arange(11) + 1j * np.arange(11)[::-1]
    kernel = np.array([1 - 2j, 3j, 0.5])
    a, v = make(signal, mesh, [S0]), make(kernel, mesh, [R])
    assert_matches(np.correlate(a, v, "full"), np.correlate(signal, kernel, "full"))


@pytest.mark.parametrize("n", LENGTHS)
def test_pad_1d(n):
    full = (np.arange(n) ** 2).astype(np.int32)
    for mesh, pls in corner_layouts(1):
        dt = make(full, mesh, pls)
        for mode in ("constant", "edge", "reflect", "symmetric", "wrap"):
            for width in (0, 1, 2, (0, 3), (4, 1), n - 1, n):
                b, e = np.broadcast_to(width, (2,))
                limit = {"reflect": n - 1, "symmetric": n, "wrap": n}.get(mode, 1 << 30)
                if max(b, e) > limit or (mode == "reflect" and n == 1 and max(b, e)):
                    continue
                strictly(lambda: assert_matches(np.pad(dt, width, mode),
                                                np.pad(full, width, mode)))
        strictly(lambda: assert_matches(np.pad(dt, 2, constant_values=7),
                                        np.pad(full, 2, constant_values=7)))


def test_pad_2d_and_what_falls_back():
    full = np.arange(15.0).reshape(5, 3)
    for mesh, pls in corner_layouts(2):
        dt = make(full, mesh, pls)
        for mode in ("constant", "edge", "wrap", "symmetric", "reflect"):
            strictly(lambda: assert_matches(np.pad(dt, ((1, 2), (2, 1)), mode),
                                            np.pad(full, ((1, 2), (2, 1)), mode)))
    mesh = mesh_of((W,))
    dt = make(full, mesh, [S0])
    # Forms without a rule give NumPy's answer through the fallback, never a wrong one.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GatherWarning)
        assert_matches(np.pad(dt, 7, "reflect"), np.pad(full, 7, "reflect"))
        assert_matches(np.pad(dt, 1, "linear_ramp"), np.pad(full, 1, "linear_ramp"))
    matches_or_raises_alike(lambda: np.pad(dt, -1), lambda: np.pad(full, -1))
    matches_or_raises_alike(lambda: np.pad(dt, 1, "edge", constant_values=3),
                            lambda: np.pad(full, 1, "edge", constant_values=3))
    empty = make(np.zeros((0, 3)), mesh, [S0])
    matches_or_raises_alike(lambda: np.pad(empty, 1, "edge"),
                            lambda: np.pad(np.zeros((0, 3)), 1, "edge"))


def test_bad_arguments_raise_numpys_errors():
    mesh = mesh_of((W,))
    dt = make(np.arange(6.0), mesh, [S0])
    matches_or_raises_alike(lambda: np.diff(dt, -1), lambda: np.diff(np.arange(6.0), -1))
    matches_or_raises_alike(lambda: np.gradient(make(np.arange(2.0), mesh, [S0]),
                                                edge_order=2),
                            lambda: np.gradient(np.arange(2.0), edge_order=2))
    matches_or_raises_alike(lambda: np.convolve(dt, dt, "bogus"),
                            lambda: np.convolve(np.arange(6.0), np.arange(6.0), "bogus"))


def sent_bytes(mode):
    return sum(mode.get_comm_bytes().values())


def test_only_the_edge_rows_move():
    n = 4000
    mesh = mesh_of((W,))
    full = np.arange(n, dtype=np.float64)
    dt, kernel = make(full, mesh, [S0]), make(np.ones(5), mesh, [R])
    cases = [
        # (call, NumPy's, the most rows this rank may send)
        (lambda x: np.roll(x, 3), lambda x: np.roll(x, 3), 3),
        (lambda x: np.diff(x, 2), lambda x: np.diff(x, 2), 2 + 2 * W),
        (lambda x: np.gradient(x, edge_order=2), lambda x: np.gradient(x, edge_order=2), 4),
        (lambda x: np.convolve(x, kernel if type(x) is not np.ndarray else np.ones(5), "same"),
         lambda x: np.convolve(x, np.ones(5), "same"), 8),
        (lambda x: np.pad(x, (3, 2), "reflect"), lambda x: np.pad(x, (3, 2), "reflect"),
         3 + 4 + 3 + 2 * W),
    ]
    for ours, numpys, rows in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            with CommDebugMode() as mode:
                got = ours(dt)
        assert_matches(got, numpys(full))
        # Rows, plus one count per rank: never the shard, let alone the whole.
        assert sent_bytes(mode) <= 8 * rows + 8 * W, (rows, mode.get_comm_bytes())
        if W > 1:
            assert got.placements == (S0,)
            assert dict(mode.get_comm_counts()) == {"all_to_all_single": 2}
        else:
            assert mode.get_total_counts() == 0


def test_along_an_unsharded_axis_nothing_moves():
    mesh = mesh_of((W,))
    full = np.arange(24.0).reshape(8, 3)
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        outs = [np.roll(dt, 1, axis=1), np.diff(dt, axis=1), np.pad(dt, ((0, 0), (1, 2))),
                np.gradient(dt, axis=1)]
    assert mode.get_total_counts() == 0
    wants = [np.roll(full, 1, axis=1), np.diff(full, axis=1), np.pad(full, ((0, 0), (1, 2))),
             np.gradient(full, axis=1)]
    for got, want in zip(outs, wants):
        assert got.placements == (S0,)
        assert_matches(got, want)


def test_pad_width_as_a_dtensor_falls_back():
    mesh = mesh_of((W,))
    full = np.arange(6.0)
    dt = make(full, mesh, [S0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GatherWarning)
        assert_matches(np.pad(dt, make(np.array([1, 2]), mesh, [R])), np.pad(full, [1, 2]))


@pytest.mark.parametrize("pls", [[R], [S0], [S1]], ids=str)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("extra", ["dtensor", "ndarray", "scalar"])
def test_diff_joins_array_prepend_and_append_as_numpy(pls, axis, extra):
    """prepend=/append= arrays (SciPy's rankdata appends one) are joined along the
    axis and differenced, distributed; NumPy's values and NumPy's error for a
    value of the wrong shape."""
    rng = np.random.default_rng(axis)
    full = rng.integers(0, 50, (9, 5)).astype(np.float64)
    edge = list(full.shape)
    edge[axis] = 2
    pre, app = rng.standard_normal(edge), rng.standard_normal(edge)
    mesh = mesh_of((W,))
    dt = make(full, mesh, pls)
    if extra == "dtensor":
        dpre, dapp = make(pre, mesh, pls), make(app, mesh, [R])
    elif extra == "ndarray":
        dpre, dapp = pre, app
    else:
        pre, app = dpre, dapp = 1.5, np.float64(-2.0)
    def check():
        for n in (1, 2):
            assert_matches(np.diff(dt, n, axis, prepend=dpre, append=dapp),
                           np.diff(full, n, axis, prepend=pre, append=app))
            assert_matches(np.diff(dt, n, axis, append=dapp),
                           np.diff(full, n, axis, append=app))
    strictly(check)
    if extra == "ndarray":
        matches_or_raises_alike(lambda: np.diff(dt, axis=axis, append=np.ones((3, 3, 3))),
                                lambda: np.diff(full, axis=axis, append=np.ones((3, 3, 3))))


@pytest.mark.parametrize("pls", [[R], [S0], [S1]], ids=str)
@pytest.mark.parametrize("edge_order", [1, 2])
@pytest.mark.parametrize("coords", ["uneven", "even", "int", "locally-even"])
def test_gradient_takes_coordinate_arrays_bit_for_bit(pls, edge_order, coords):
    """Coordinate arrays as spacings (xarray's differentiate) run distributed, with
    NumPy's bits: NumPy decides uniform spacing on the whole axis, so a window whose
    spacings happen to be equal must not take the uniform formula."""
    n0, n1 = 13, 6
    rng = np.random.default_rng(edge_order)
    full = rng.standard_normal((n0, n1))
    def axis_coords(n):
        if coords == "even":
            return np.arange(n) * 0.5
        if coords == "int":
            return np.cumsum(rng.integers(1, 4, n))
        if coords == "locally-even":
            return np.concatenate([np.arange(n - 2) * 1.0, [n + 1.5, n + 4.0]])
        return np.cumsum(rng.random(n) + 0.1)
    x0, x1 = axis_coords(n0), axis_coords(n1)
    dt = make(full, mesh_of((W,)), pls)

    def check():
        for axis, args in ((0, (x0,)), (1, (x1,)), (None, (x0, x1)), (None, (x0, 2.0))):
            got = np.gradient(dt, *args, axis=axis, edge_order=edge_order)
            expect = np.gradient(full, *args, axis=axis, edge_order=edge_order)
            for g, e in zip(got if isinstance(got, tuple) else (got,),
                            expect if isinstance(expect, tuple) else (expect,)):
                assert g.full_tensor().tobytes() == e.tobytes()
    strictly(check)
    for bad in (np.ones((n0, 2)), np.ones(n0 + 1)):
        matches_or_raises_alike(lambda: np.gradient(dt, bad, axis=0),
                                lambda: np.gradient(full, bad, axis=0))


@pytest.mark.parametrize("pls", [[R], [S0], [S1]], ids=str)
@pytest.mark.parametrize("window, axis", [(3, 0), (1, 0), (9, 0), (2, 1), ((3, 2), (0, 1)),
                                          ((2, 2), (0, 0)), ((3, 2), None)], ids=str)
def test_sliding_window_view_is_numpys_read_only_view(pls, window, axis):
    """xarray's rolling windows: NumPy's values and shape, placements kept, nothing
    gathered, and read-only as NumPy's view is."""
    from numpy.lib.stride_tricks import sliding_window_view as windows
    full = np.random.default_rng(2).standard_normal((9, 5))
    dt = make(full, mesh_of((W,)), pls)

    def check():
        got = windows(dt, window, axis=axis)
        assert_matches(got, windows(full, window, axis=axis))
        assert got.placements == dt.placements
        with pytest.raises(ValueError, match="read-only"):
            got[(0,) * got.ndim] = 1.0
    strictly(check)
    matches_or_raises_alike(lambda: windows(dt, 10, axis=0), lambda: windows(full, 10, axis=0))
