"""The fingerprint of a call that the ranks agree on (mpitensor._call_agreement):
equal on every rank for the same call, whatever each process salts its own hashes
with, and different for calls that differ in any argument the agreement must
catch: a value, a keyword, a DTensor's placements, shape or dtype, an ndarray's
bytes. Runs at 1..4 ranks."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor._call_agreement import call_fingerprint

COMM = MPI.COMM_WORLD
N = COMM.Get_size()


@pytest.fixture(scope="module")
def dt():
    mesh = mt.init_device_mesh("cpu", (N,))
    return mt.distribute_tensor(np.arange(12.0).reshape(6, 2), mesh, [Shard(0)])


def _calls(dt):
    """Pairs (args, kwargs) that are each a different call of one function."""
    mesh = dt.device_mesh
    return [
        ((dt,), {}),
        ((dt,), {"axis": 0}),
        ((dt,), {"axis": 1}),
        ((dt, 0), {}),
        ((dt,), {"axis": -0.0}),
        ((dt,), {"axis": 0.0}),
        ((dt,), {"axis": True}),
        ((dt,), {"axis": None}),
        ((dt,), {"axis": (0, 1)}),
        ((dt,), {"axis": [0, 1]}),
        ((dt,), {"axis": (1, 0)}),
        ((dt,), {"axis": 2 ** 70}),
        ((dt,), {"axis": 1j}),
        ((dt,), {"axis": "a"}),
        ((dt,), {"axis": b"a"}),
        ((dt,), {"axis": slice(1, None)}),
        ((dt,), {"axis": Ellipsis}),
        ((dt,), {"axis": np.float32(0)}),
        ((dt,), {"axis": np.float64(0)}),
        ((dt,), {"axis": np.dtype("f4")}),
        ((dt,), {"axis": np.dtype(">f4")}),
        ((dt,), {"axis": np.sum}),
        ((dt,), {"axis": np.mean}),
        ((dt,), {"axis": float}),
        ((dt,), {"axis": np.arange(3)}),
        ((dt,), {"axis": np.arange(3)[::-1]}),
        ((dt,), {"axis": np.arange(3.0)}),
        ((dt,), {"axis": np.array([{"k": 1}, None], dtype=object)}),
        ((dt,), {"dtype": 0}),
        ((dt.redistribute(mesh, [Replicate()]),), {}),
        ((dt.astype(np.float32),), {}),
        ((mt.distribute_tensor(np.ones((6, 3)), mesh, [Shard(0)]),), {}),
        ((mt.DTensor.from_local(dt.to_local(), mesh, [Partial()], shape=dt.shape,
                                stride=dt.stride()),), {}),
        ((dt, dt), {}),
        (([dt, dt],), {}),
        (((dt, dt),), {}),
    ]


def test_different_calls_have_different_fingerprints(dt):
    prints = [call_fingerprint("numpy.sum", a, k) for a, k in _calls(dt)]
    assert len(set(prints)) == len(prints)
    assert call_fingerprint("numpy.sum", (dt,), {}) != call_fingerprint("numpy.mean", (dt,), {})


def test_a_call_has_one_fingerprint_whatever_the_keyword_order(dt):
    a = call_fingerprint("numpy.sum", (dt,), {"axis": 0, "keepdims": True})
    b = call_fingerprint("numpy.sum", (dt,), {"keepdims": True, "axis": 0})
    assert a == b
    # an equal array, another object: the same call
    assert (call_fingerprint("f", (dt, np.arange(3)), {})
            == call_fingerprint("f", (dt, np.arange(3).copy()), {}))


def test_the_same_call_has_the_same_fingerprint_on_every_rank(dt):
    """Strings and objects whose Python hash each process salts."""
    prints = [call_fingerprint("numpy.sum", a, k) for a, k in _calls(dt)]
    prints.append(call_fingerprint("numpy.einsum", ("ij,jk->ik", dt, dt), {"optimize": "greedy"}))
    everyone = COMM.allgather(prints)
    assert all(p == everyone[0] for p in everyone)
