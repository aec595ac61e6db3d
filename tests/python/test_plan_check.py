"""_comm.plan_check: what a redistribution refuses from its arguments alone, before
any communication, with torch's exception types and messages. Checked against
the rule as torch states it, for every pair of placements on 1- and 2-D meshes and
every dtype class. Local: no MPI involved."""

import itertools

import numpy as np
import pytest

from mpitensor import Partial, Replicate, Shard, _comm
from mpitensor._layout import _codes

PLACEMENTS = [Replicate(), Shard(0), Shard(1)] + [
    Partial(op) for op in ("sum", "avg", "product", "max", "min")]
DTYPES = [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16, np.float32,
          np.float64, np.complex64, np.complex128]


def expected(src, dst, dtype):
    """(type, message) torch's redistribute raises, mesh dim by mesh dim, or None."""
    dtype = np.dtype(dtype)
    for m, (s, d) in enumerate(zip(src, dst)):
        if s == d or not (isinstance(s, Partial) or isinstance(d, Partial)):
            continue
        if isinstance(d, Partial):
            return RuntimeError, (
                f"Can not redistribute from {s} to {d} on mesh dim {m}: redistributing "
                f"to Partial is for internal use only! Partial tensors come from "
                f"DTensor.from_local and from operators.")
        if dtype.kind == "c" and s.reduce_op in ("max", "min"):
            return TypeError, (f"Partial({s.reduce_op}) of {dtype} values: complex "
                               f"numbers have no order")
        if dtype.kind in "biu" and s.reduce_op == "avg":
            return TypeError, (f"Partial(avg) of {dtype} values: an average is not a "
                               f"{dtype}; cast to a float dtype first (forward_dtype=)")
    return None


def got(src, dst, dtype):
    try:
        _comm.plan_check(_codes(src), _codes(dst), np.dtype(dtype))
    except Exception as e:  # noqa: BLE001 - compared with the expectation
        return type(e), str(e)
    return None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_every_pair_1d(dtype):
    for s, d in itertools.product(PLACEMENTS, repeat=2):
        assert got([s], [d], dtype) == expected([s], [d], dtype), (s, d)


@pytest.mark.parametrize("dtype", [np.int16, np.float32, np.complex64],
                         ids=lambda t: np.dtype(t).name)
def test_every_pair_2d(dtype):
    for src in itertools.product(PLACEMENTS, repeat=2):
        for dst in itertools.product(PLACEMENTS, repeat=2):
            assert got(src, dst, dtype) == expected(src, dst, dtype), (src, dst)


def test_arguments():
    assert _comm.plan_check(_codes([Partial()]), _codes([Replicate()]), "float32") is None
    with pytest.raises(ValueError, match="placements"):
        _comm.plan_check(_codes([Replicate()]), _codes([Replicate(), Replicate()]), "f8")
    with pytest.raises(TypeError):
        _comm.plan_check(_codes([Replicate()]), _codes([Replicate()]), "not a dtype")
    with pytest.raises(TypeError):
        _comm.plan_check(_codes([Replicate()]), _codes([Replicate()]))
