"""The fft family on sharded arrays, every function on every placement: equal to
NumPy on the full array (values and dtype); transforms over every axis of a
sharded array run by the pencil method (local transforms and all-to-alls, never
an all-gather), and transforms along unsharded axes move nothing."""

from __future__ import annotations

import numpy as np
import pytest

from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, make, mesh_of, mesh_shapes

R, S0, S1, S2, PS = Replicate(), Shard(0), Shard(1), Shard(2), Partial("sum")
FFT = np.fft
MANY = [FFT.fft2, FFT.ifft2, FFT.rfft2, FFT.irfft2, FFT.fftn, FFT.ifftn, FFT.rfftn,
        FFT.irfftn]
ONE = [FFT.fft, FFT.ifft, FFT.rfft, FFT.irfft, FFT.hfft, FFT.ihfft]


def layouts(mesh, ndim):
    if mesh.ndim == 1:
        return [(R,), (PS,)] + [(Shard(d),) for d in range(ndim)]
    out = [(Shard(d), Shard(e)) for d in range(ndim) for e in range(ndim)]
    return out + [(S0, PS), (PS, S1), (R, R)]


def close(got, expect):
    full = got.full_tensor()
    assert full.shape == expect.shape and full.dtype == expect.dtype, (
        full.shape, expect.shape, full.dtype, expect.dtype)
    np.testing.assert_allclose(full, expect, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("shape", [(2 * W + 1, 3 * W), (W, 5, 2 * W + 2), (3, 1)])
@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_every_transform_on_every_placement_matches_numpy(shape, norm):
    full = np.random.default_rng(len(shape)).normal(size=shape)
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        for pls in layouts(mesh, len(shape)):
            dt = make(full, mesh, pls)
            ref = dt.full_tensor()
            for func in MANY:
                if func in (FFT.irfft2, FFT.irfftn) and shape[-1] == 1:
                    continue  # no output points (ValueError in NumPy too)
                close(func(dt, norm=norm), func(ref, norm=norm))
            for func in ONE:
                for axis in range(len(shape)):
                    if func in (FFT.irfft, FFT.hfft) and shape[axis] == 1:
                        continue
                    close(func(dt, axis=axis, norm=norm), func(ref, axis=axis, norm=norm))
            close(FFT.fftn(dt, axes=(0,)), FFT.fftn(ref, axes=(0,)))
            close(FFT.fftn(dt, s=(4, 3), axes=(0, 1)), FFT.fftn(ref, s=(4, 3), axes=(0, 1)))


@pytest.mark.parametrize("dtype", [np.float32, np.complex64, np.float64, np.complex128])
def test_transforms_over_every_axis_use_the_pencil_method(dtype):
    rows, cols = 4 * W + 3, 2 * W + 2
    full = np.random.default_rng(5).normal(size=(rows, cols)).astype(dtype)
    mesh = mesh_of((W,))
    for pls, func in [((S0,), FFT.fft2), ((S1,), FFT.fft2), ((S0,), FFT.ifftn),
                      ((S0,), FFT.rfft2), ((S1,), FFT.irfft2)]:
        if func in (FFT.rfft2,) and dtype in (np.complex64, np.complex128):
            continue
        dt = make(full, mesh, pls)
        with CommDebugMode() as mode:
            got = func(dt)
        counts = mode.get_comm_counts()
        if W > 1:
            # One all-to-all per sharded axis (a real transform's half-length axis
            # may need one more); nothing is gathered.
            assert set(counts) == {"all_to_all_single"}, counts
            assert counts["all_to_all_single"] <= 2
            assert got.placements[0].is_shard()
        expect = func(full)
        full_got = got.full_tensor()
        assert full_got.dtype == expect.dtype
        np.testing.assert_allclose(full_got, expect, rtol=1e-4, atol=1e-3)


def test_transforms_along_unsharded_axes_move_nothing():
    full = np.random.default_rng(6).normal(size=(2 * W + 1, 4, 6))
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        pls = (S0,) if mesh.ndim == 1 else (S0, S0)
        dt = make(full, mesh, pls)
        with CommDebugMode() as mode:
            outs = [FFT.fft2(dt), FFT.rfftn(dt, axes=(1, 2)), FFT.irfft(dt, axis=2),
                    FFT.ifft(dt, axis=1)]
        assert mode.get_total_counts() == 0
        for got in outs:
            assert got.placements == pls
        close(outs[1], FFT.rfftn(full, axes=(1, 2)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_vector_fft_by_the_four_step_method(dtype, norm):
    mesh = mesh_of((W,))
    for n in (W * W * 6, W * W * 35, 5 * W + 1):
        full = np.random.default_rng(n).normal(size=n).astype(dtype)
        if full.dtype.kind == "c":
            full = full + 1j * full[::-1]
        dt = make(full, mesh, [S0])
        item = np.dtype(np.result_type(dtype, np.complex64)).itemsize
        for func in (FFT.fft, FFT.ifft, FFT.rfft):
            if func is FFT.rfft and full.dtype.kind == "c":
                continue
            with CommDebugMode() as mode:
                got = func(dt, norm=norm)
            expect = func(full, norm=norm)
            full_got = got.full_tensor()
            assert full_got.dtype == expect.dtype
            tol = 1e-4 if dtype is np.float32 else 1e-9
            np.testing.assert_allclose(full_got, expect, rtol=tol, atol=tol)
            if W > 1 and n % (W * W) == 0:
                # Three all-to-alls of the complex shard (rfft: and the picked rows);
                # nothing is gathered.
                assert got.placements == (S0,)
                counts = mode.get_comm_counts()
                assert set(counts) == {"all_to_all_single"}, counts
                assert counts["all_to_all_single"] == (3 if func is not FFT.rfft else 5)
                assert mode.get_comm_bytes()["all_to_all_single"] <= (
                    3 * n // W * item + n // W * item + 4 * 8 * W)
