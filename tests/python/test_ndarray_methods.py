"""numpy.ndarray's methods on DTensors: every method and attribute an ndarray has is
one a DTensor has, or is on the short list below of those left out on purpose;
each answers with NumPy's value on every rank, in every layout (uneven shards,
a Partial, a 2-D mesh at np 4). The in-place ones (sort, partition, put) write
into the DTensor and keep its placements."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import DTensor, Partial, Replicate, Shard
from mpitensor import GatherWarning
from ops_helpers import W, assert_matches, make, mesh_of

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")

# What an ndarray has and a DTensor does not, each for a reason: its memory as one
# buffer (base, data, ctypes, flags, strides: a DTensor has stride() as torch),
# a write to a file from every rank (tofile, dump: mpitensor.save writes one file),
# pickling by NumPy's protocol (dumps, __setstate__), byte-level views
# (byteswap, getfield, setfield, setflags), resize in place (a new global shape),
# and NumPy's subclassing hooks.
LEFT_OUT = {"base", "data", "ctypes", "flags", "strides", "tofile", "dump", "dumps",
            "__setstate__", "byteswap", "getfield", "setfield", "setflags", "resize",
            "__array_finalize__", "__array_interface__", "__array_priority__",
            "__array_struct__", "__array_wrap__", "__class_getitem__", "__deepcopy__",
            "__delitem__"}


def layouts():
    out = [((W,), [p]) for p in (R, S0, S1, PS)]
    return out + ([((2, 2), [S0, S1]), ((2, 2), [S1, PS])] if W == 4 else [])


def full():
    return np.random.default_rng(7).standard_normal((5, 7))


def test_every_ndarray_method_is_there_or_left_out_on_purpose():
    missing = {n for n in dir(np.ndarray) if n not in dir(DTensor)} - LEFT_OUT
    assert not missing, f"ndarray methods a DTensor lacks: {sorted(missing)}"
    assert not LEFT_OUT & set(dir(DTensor)), "left out, yet defined"


@pytest.mark.parametrize("mesh_shape, pls", layouts(), ids=str)
def test_function_methods_match_numpy(mesh_shape, pls):
    a = full()
    d = make(a, mesh_of(mesh_shape), pls)
    assert_matches(d.clip(-0.5, 0.5), a.clip(-0.5, 0.5))
    assert_matches(d.clip(min=0), a.clip(min=0))
    assert_matches(d.take([0, 2, -1], axis=1), a.take([0, 2, -1], axis=1))
    assert_matches(d.take([3, 20]), a.take([3, 20]))
    keep = [True, False, True, True, False]
    assert_matches(d.compress(keep, axis=0), a.compress(keep, axis=0))
    for got, want in zip((d > 0).nonzero(), (a > 0).nonzero()):
        assert_matches(got, want)
    assert_matches(d.repeat(2, axis=1), a.repeat(2, axis=1))
    assert_matches(d.repeat(2), a.repeat(2))
    assert_matches(d[:1].squeeze(0), a[:1].squeeze(0))
    assert_matches(d.diagonal(1), a.diagonal(1))
    assert_matches(d.trace(), a.trace())
    assert_matches(d.dot(d.T), a.dot(a.T))
    assert_matches(np.sort(d.argpartition(2, axis=1)[:, :3], axis=1),
                   np.sort(a.argpartition(2, axis=1)[:, :3], axis=1))
    assert_matches((d * 1j).conjugate(), (a * 1j).conjugate())
    row = make(np.sort(a[0]), mesh_of(mesh_shape), [S0 if p.is_shard() else p for p in pls])
    assert_matches(row.searchsorted(0.1), np.sort(a[0]).searchsorted(0.1))
    assert d.itemsize == a.itemsize and d.astype(np.float32).itemsize == 4
    # A Partial's parts sum to a value within rounding of a's: ask for d's own.
    assert (float(d.full_tensor()[2, 3]) in d) and (99.0 not in d)


def test_choose_takes_dtensor_choices():
    mesh = mesh_of((W,))
    idx = np.array([0, 1, 1, 0, 2])
    choices = [np.zeros(5), np.ones(5), np.full(5, 2.0)]
    d = make(idx, mesh, [S0])
    assert_matches(d.choose([make(c, mesh, [S0]) for c in choices]), idx.choose(choices))


@pytest.mark.parametrize("mesh_shape, pls", layouts(), ids=str)
def test_in_place_methods_write_and_keep_placements(mesh_shape, pls):
    a = full()
    for method, args in (("sort", ()), ("sort", (0,)), ("partition", (3,)),
                         ("put", ([0, 5, -1], [1.0, 2.0, 3.0]))):
        d, b = make(a, mesh_of(mesh_shape), pls), a.copy()
        placements = d.placements
        assert getattr(d, method)(*args) is None
        getattr(b, method)(*args)
        assert d.placements == placements
        if method == "partition":  # only the kth element's place is defined
            assert_matches(d[:, 3], b[:, 3])
        else:
            assert_matches(d, b)


def test_tobytes_is_the_whole_array_gathered_and_warned():
    a = full()
    d = make(a, mesh_of((W,)), [S0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = d.tobytes()
    assert got == a.tobytes()
    assert W == 1 or any(issubclass(w.category, GatherWarning) for w in caught)
    assert d.tobytes("F") == a.tobytes("F")
