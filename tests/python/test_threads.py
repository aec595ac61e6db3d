"""Threads and meshes: a mesh's collectives run on the thread that created it.

Two threads communicating on one mesh used to pair their collectives in whatever
order each rank's scheduler ran them: wrong data, then a hang. Every collective
entry (redistribute, distribute_tensor, full_tensor, operations that move data,
checkpoints, agreement, sub-meshes and process groups) now raises the same
RuntimeError on every rank, before communicating, when called from another thread;
the job goes on, and a mesh made in a thread works in that thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
MESSAGE = "must run on the thread that created it"


def in_thread(fn):
    """fn() on a new thread: (result, None) or (None, exception)."""
    box = []

    def run():
        try:
            box.append((fn(), None))
        except Exception as e:  # noqa: BLE001 - handed back to the test
            box.append((None, e))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return box[0]


def same_everywhere(text: str) -> bool:
    return len(set(COMM.allgather(text))) == 1


def collective_calls(mesh, dt, tmp_path):
    full = np.arange(4.0 * W).reshape(2 * W, 2)
    calls = {
        "full_tensor": dt.full_tensor,
        "redistribute": lambda: dt.redistribute(mesh, [Replicate()]),
        "redistribute_async": lambda: dt.redistribute(mesh, [Replicate()], async_op=True),
        "distribute_tensor": lambda: distribute_tensor(full, mesh, [Shard(0)]),
        "from_local_run_check": lambda: DTensor.from_local(
            dt.to_local(), mesh, [Shard(0)], run_check=True),
        "get_group": lambda: mesh.get_group(0),
        "save": lambda: mt.save(dt, str(tmp_path / "x.npy")),
    }
    if W > 1:  # operations whose decision moves data (on one rank nothing moves)
        calls["matmul_that_gathers"] = lambda: dt @ dt.T
        calls["concatenate"] = lambda: np.concatenate([dt, dt], axis=0)
        calls["cumsum_along_shards"] = lambda: np.cumsum(dt, axis=0)
    return calls


@pytest.fixture
def shared_dir(tmp_path):
    """One directory for every rank (rank 0's)."""
    from pathlib import Path
    return Path(COMM.bcast(str(tmp_path), root=0))


def test_another_thread_raises_the_same_error_everywhere(shared_dir):
    mesh = init_device_mesh("cpu", (W,))
    named = init_device_mesh("cpu", (1, W), mesh_dim_names=("a", "b"))
    full = np.arange(4.0 * W).reshape(2 * W, 2)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    problems = []
    calls = collective_calls(mesh, dt, shared_dir)
    calls["sub_mesh"] = lambda: named["b"]
    for what, call in calls.items():
        # two threads, one after the other, neither the creator
        for k in range(2):
            result, error = in_thread(call)
            text = f"{type(error).__name__}: {error}"
            if not (isinstance(error, RuntimeError) and MESSAGE in str(error)):
                problems.append(f"{what} #{k}: {text if error else result!r}")
            if not same_everywhere(text):
                problems.append(f"{what} #{k}: ranks differ")
    # the creating thread goes on with the same mesh
    assert np.array_equal(dt.full_tensor(), full)
    assert np.array_equal(dt.redistribute(mesh, [Replicate()]).to_local(), full)
    assert problems == []


def test_two_threads_at_once_never_give_wrong_data():
    mesh = init_device_mesh("cpu", (W,))
    full = np.arange(6.0 * W).reshape(3 * W, 2)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    results = [None, None]
    go = threading.Barrier(2)

    def work(i):
        go.wait()
        try:
            results[i] = [dt.full_tensor() for _ in range(20)]
        except RuntimeError as e:
            results[i] = str(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        assert isinstance(r, str) and MESSAGE in r, r
    assert np.array_equal(dt.full_tensor(), full)


def test_local_work_from_another_thread_is_allowed():
    mesh = init_device_mesh("cpu", (W,))
    dt = distribute_tensor(np.ones((2 * W, 3)), mesh, [Shard(0)])
    result, error = in_thread(lambda: (dt * 2 + 1).to_local())
    assert error is None, error
    assert np.array_equal(result, np.full((2, 3), 3.0))


@pytest.mark.skipif(MPI.Query_thread() != MPI.THREAD_MULTIPLE,
                    reason="MPI calls from a second thread need MPI_THREAD_MULTIPLE")
def test_a_mesh_made_in_a_thread_works_there_only():
    full = np.arange(8.0 * W).reshape(4 * W, 2)

    def make_and_use():
        mesh = init_device_mesh("cpu", (W,))
        dt = distribute_tensor(full, mesh, [Shard(0)])
        return mesh, dt, dt.redistribute(mesh, [Replicate()]).to_local()

    (mesh, dt, gathered), error = in_thread(make_and_use)
    assert error is None, error
    assert np.array_equal(gathered, full)
    # the main thread did not create it; a later thread (whose ident may be the
    # ended creator's) neither
    with pytest.raises(RuntimeError, match=MESSAGE):
        dt.full_tensor()
    _, error = in_thread(dt.full_tensor)
    assert isinstance(error, RuntimeError) and MESSAGE in str(error)


@pytest.mark.skipif(MPI.Query_thread() != MPI.THREAD_MULTIPLE,
                    reason="MPI calls from a second thread need MPI_THREAD_MULTIPLE")
def test_threads_reading_one_async_result_all_get_it():
    """Threads that read a pending async redistribute at once: one completes it,
    the others wait for it, and every one gets the whole result, every time."""
    mesh = init_device_mesh("cpu", (W,))
    full = np.arange(64.0 * W).reshape(16 * W, 4)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    wrong = 0
    for _ in range(100):
        pending = dt.redistribute(mesh, [Replicate()], async_op=True)
        go = threading.Barrier(4)
        sums = [None] * 4

        def read(i, pending=pending, go=go, sums=sums):
            go.wait()
            sums[i] = float(pending.to_local().sum())

        threads = [threading.Thread(target=read, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wrong += sum(s != full.sum() for s in sums)
    assert wrong == 0
    assert same_everywhere(wrong)
