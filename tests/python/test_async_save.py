"""mpitensor.async_save: the values saved are those of the call; the
program's collectives go on while the worker writes; the future's result() leaves
what save leaves, in every format, and raises save's error on every rank; saves
run in the order they were made."""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, distribute_tensor, init_device_mesh
from mpi_helpers import outcome

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
A = np.arange(24.0 * N).reshape(6 * N, 4)


@pytest.fixture(scope="module")
def mesh():
    return init_device_mesh("cpu", (N,))


@pytest.fixture
def folder(tmp_path_factory):
    return COMM.bcast(str(tmp_path_factory.mktemp("async")) if RANK == 0 else None)


def test_saves_the_values_of_the_call_while_the_program_communicates(mesh, folder):
    x = distribute_tensor(A, mesh, [Shard(0)])
    path = os.path.join(folder, "x.npy")
    fut = mt.async_save(x, path)
    assert isinstance(fut, concurrent.futures.Future)
    x.to_local()[...] = -1.0  # after the call: not saved
    for _ in range(20):  # the program's collectives, beside the worker's
        assert np.array_equal(x.redistribute(mesh, [Replicate()]).to_local()[:1],
                              np.full((1, 4), -1.0))
    assert fut.result() is None
    assert np.array_equal(np.load(path), A)
    assert np.array_equal(mt.load(path, mesh, [Shard(1)]).full_tensor(), A)


def test_a_nested_state_dict_round_trips(mesh, folder):
    w = distribute_tensor(A, mesh, [Shard(1)])
    state = {"model": {"w": w, "b": np.arange(3.0)}, "optim": [{"step": 7}], "epoch": 2}
    path = os.path.join(folder, "ckpt")
    mt.async_save(state, path).result()
    got = mt.load(path, mesh, [Shard(0)])
    assert np.array_equal(got["model"]["w"].full_tensor(), A)
    assert np.array_equal(got["model"]["b"], np.arange(3.0))
    assert got["optim"] == [{"step": 7}] and got["epoch"] == 2


@pytest.mark.parametrize("suffix, kwargs", [(".h5", {"dataset": "u"}), (".zarr", {})])
def test_hdf5_and_zarr(mesh, folder, suffix, kwargs):
    x = distribute_tensor(A, mesh, [Shard(0)])
    path = os.path.join(folder, "x" + suffix)
    mt.async_save(x, path, attrs={"units": "m"}, **kwargs).result()
    got = mt.load(path, mesh, [Replicate()], **kwargs)
    assert np.array_equal(got.to_local(), A)


def test_saves_run_in_the_order_they_were_made(mesh, folder):
    path = os.path.join(folder, "x.npy")
    futures = [mt.async_save(distribute_tensor(A + i, mesh, [Shard(0)]), path)
               for i in range(4)]
    for f in futures:
        f.result()
    assert np.array_equal(np.load(path), A + 3)


def test_a_sliced_mesh(folder):
    if N % 2:
        pytest.skip("a (2, N/2) mesh")
    grid = init_device_mesh("cpu", (2, N // 2), mesh_dim_names=("dp", "tp"))
    x = distribute_tensor(A, grid["tp"], [Shard(0)])
    path = os.path.join(folder, "sd")
    mt.async_save({"x": x}, path, device_mesh=grid).result()
    assert np.array_equal(mt.load(path, grid["tp"], [Replicate()])["x"].to_local(), A)


def test_a_failing_save_raises_on_every_rank_and_the_next_one_works(mesh, folder):
    x = distribute_tensor(A, mesh, [Shard(0)])
    fut = mt.async_save(x, os.path.join(folder, "missing", "x.npy"))
    got = outcome(fut.result)
    assert got is not None and COMM.allgather(got[0]) == [got[0]] * N, got
    path = os.path.join(folder, "y.npy")
    mt.async_save(x, path).result()
    assert np.array_equal(np.load(path), A)


def test_refuses_what_save_refuses_at_the_call(mesh):
    with pytest.raises(TypeError, match="DTensor or a dict"):
        mt.async_save([1, 2], "x.npy")
