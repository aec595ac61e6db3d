"""Placements: Shard, Replicate and Partial are frozen, hashable, equal by value,
with torch's predicates, reprs and short strings. Local: no communication."""

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpitensor as mt
from mpitensor import Partial, Placement, Replicate, Shard
from mpitensor.placement_types import Partial as Partial2

# Local values, no communication: the same at every rank count.
pytestmark = pytest.mark.np(1)

REDUCE_OPS = ["sum", "avg", "product", "max", "min"]

placements = st.one_of(
    st.builds(Shard, st.integers(-4, 4)),
    st.just(Replicate()),
    st.builds(Partial, st.sampled_from(REDUCE_OPS)),
)


def test_reexported_at_top_level():
    assert mt.Partial is Partial2
    for cls in (Shard, Replicate, Partial):
        assert issubclass(cls, Placement)


@pytest.mark.parametrize("p, attr", [(Shard(0), "dim"), (Replicate(), "dim"),
                                     (Partial(), "reduce_op")])
def test_frozen(p, attr):
    with pytest.raises(AttributeError):
        setattr(p, attr, 1)
    with pytest.raises(AttributeError):
        p.other = 1
    if hasattr(p, attr):
        with pytest.raises(AttributeError):
            delattr(p, attr)


def test_frozen_value_unchanged_after_failed_assignment():
    s = Shard(1)
    with pytest.raises(AttributeError):
        s.dim = 0
    assert s.dim == 1 and s == Shard(1)


def test_equal_by_value_and_hashable():
    assert Shard(0) == Shard(0) and hash(Shard(0)) == hash(Shard(0))
    assert Shard(0) != Shard(1)
    assert Replicate() == Replicate() and hash(Replicate()) == hash(Replicate())
    assert Partial() == Partial("sum") and hash(Partial()) == hash(Partial("sum"))
    assert Partial("max") != Partial("min")
    assert Shard(0) != Replicate() and Replicate() != Partial() and Shard(0) != Partial()
    assert Shard(0) != 0 and Replicate() != "R" and Partial() != "sum"
    assert len({Shard(0), Shard(0), Replicate(), Replicate(), Partial(), Partial("sum"),
                Partial("avg")}) == 4
    assert {Shard(1): "a"}[Shard(1)] == "a"


def test_default_arguments():
    assert Shard() == Shard(0)
    assert Partial().reduce_op == "sum"


def test_shard_accepts_numpy_integers():
    assert Shard(np.int64(1)) == Shard(1)
    assert type(Shard(np.int32(1)).dim) is int


@pytest.mark.parametrize("bad", [True, False, "0", 1.0, None, np.bool_(True)])
def test_shard_rejects_non_int_dims(bad):
    with pytest.raises(TypeError):
        Shard(bad)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_partial_accepts_each_reduce_op(op):
    p = Partial(op)
    assert p.reduce_op == op and p.is_partial(op)


@pytest.mark.parametrize("bad", ["mean", "SUM", "", None, "prod", "add"])
def test_partial_rejects_unknown_reduce_ops(bad):
    with pytest.raises(ValueError):
        Partial(bad)


def test_predicates():
    assert Shard(1).is_shard() and Shard(1).is_shard(1) and not Shard(1).is_shard(0)
    assert not Shard(1).is_replicate() and not Shard(1).is_partial()
    assert Replicate().is_replicate()
    assert not Replicate().is_shard() and not Replicate().is_shard(0)
    assert not Replicate().is_partial() and not Replicate().is_partial("sum")
    assert Partial().is_partial() and Partial().is_partial("sum")
    assert not Partial().is_partial("max") and Partial("max").is_partial("max")
    assert not Partial().is_shard() and not Partial().is_replicate()


@pytest.mark.parametrize("p, text, short", [
    (Shard(0), "Shard(dim=0)", "S(0)"),
    (Shard(-1), "Shard(dim=-1)", "S(-1)"),
    (Shard(3), "Shard(dim=3)", "S(3)"),
    (Replicate(), "Replicate()", "R"),
    (Partial(), "Partial(sum)", "P(sum)"),
    (Partial("avg"), "Partial(avg)", "P(avg)"),
    (Partial("max"), "Partial(max)", "P(max)"),
])
def test_repr_and_str(p, text, short):
    assert repr(p) == text
    assert str(p) == short
    assert repr([p]) == f"[{text}]"


@given(placements)
@settings(max_examples=100)
def test_pickle_and_copy_round_trip(p):
    for q in (pickle.loads(pickle.dumps(p)), copy.copy(p), copy.deepcopy(p)):
        assert q == p and hash(q) == hash(p) and type(q) is type(p)
        assert repr(q) == repr(p) and str(q) == str(p)


@given(placements, placements)
@settings(max_examples=200)
def test_equality_is_by_type_and_value(a, b):
    assert (a == b) == (repr(a) == repr(b))
    assert (a != b) == (repr(a) != repr(b))
    if a == b:
        assert hash(a) == hash(b)
