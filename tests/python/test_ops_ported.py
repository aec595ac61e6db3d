"""What torch's own DTensor tests (test_dtensor, test_tensor_ops, test_view_ops,
test_math_ops, test_pointwise_ops, test_comm_mode) check, ported to NumPy where it
applies (issue 33): DTensor.device, CommDebugMode's "Global" entry, np.split /
np.array_split and np.diag, a one-element ndarray mixed with DTensors, a
histogram with range= on a Replicate input, log-sum-exp along a sharded axis and
cumsum of the flattened array. Values equal NumPy's on the full arrays (uneven
shards included), placements and collective counts as stated."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, make, mesh_of, mesh_shapes

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")


def counts(mode) -> dict:
    return {k: v for k, v in mode.get_comm_counts().items() if v}


# -- DTensor.device (test_dtensor) ----------------------------------------------------

def test_device_is_an_object_with_type_cpu():
    d = make(np.ones((4, 2)), mesh_of((W,)), [S0])
    assert d.device.type == "cpu" and d.device.index is None
    assert str(d.device) == "cpu" and repr(d.device) == "device(type='cpu')"
    assert d.device == "cpu" and d.device == mt.device("cpu") and d.device == mt.device(d.device)
    assert hash(d.device) == hash(mt.device("cpu"))
    assert pickle.loads(pickle.dumps(d.device)) == d.device
    with pytest.raises(ValueError, match="cpu"):
        mt.device("cuda")
    with pytest.raises(AttributeError):
        d.device.type = "cuda"


# -- CommDebugMode (test_comm_mode) ---------------------------------------------------

def test_comm_module_counts_has_global_from_entry():
    d = make(np.ones((4, 2)), mesh_of((W,)), [S0])
    with CommDebugMode() as mode:
        assert mode.comm_module_counts == {"Global": {"forward": {}, "backward": {}}}
        d.full_tensor()
    want = {"all_gather_into_tensor": 1} if W > 1 else {}
    assert dict(mode.comm_module_counts["Global"]["forward"]) == want
