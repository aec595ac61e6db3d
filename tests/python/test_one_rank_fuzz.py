"""One rank at a time passes an invalid or a different argument to a public entry
point (the DTensor calls, NumPy functions, an optimizer's step, fully_shard); the
other ranks make the good call. For a call that is collective by
contract, every rank must raise the same exception type, within the test's
timeout, and the next collective must pair and give the right values. For a call
that is local (a factory, from_local without run_check), the odd rank raises alone,
nothing is sent, and the next collective still pairs.

`make test` runs each mutation once, with the last rank as the odd one, on a 1-D
mesh; `make test-fuzz-ranks` (MT_FUZZ_LONG=1) makes every rank the odd one in turn
and adds a (1, N) mesh. What no agreement can cover, because it decides whether
the call communicates at all (run_check, src_data_rank=None, the mesh itself), is
left out: docs/reliability.md says so."""

from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import (DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh,
                       nn, optim)
from mpitensor.fsdp import MixedPrecisionPolicy, fully_shard
from mpitensor.nn.utils import clip_grad_norm_
from mpi_helpers import outcome

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
LONG = os.environ.get("MT_FUZZ_LONG") == "1"

pytestmark = pytest.mark.skipif(N < 2, reason="a rank that differs needs two of them")

A = np.arange(8.0 * N).reshape(4 * N, 2)
_DEFAULT = object()


class Ctx:
    """The mesh, a DTensor on it and a shared folder, the same on every rank."""

    def __init__(self, shape):
        self.mesh = init_device_mesh("cpu", shape)
        self.other_mesh = init_device_mesh("cpu", (N,) if len(shape) == 2 else (1, N))
        self.pl = [Shard(0)] if len(shape) == 1 else [Replicate(), Shard(0)]
        self.x = distribute_tensor(A, self.mesh, self.pl)
        # Made on every rank: a mutation must not itself be a collective.
        self.longer = distribute_tensor(np.ones((4 * N + 2, 2)), self.mesh, self.pl)
        self.replicated = self.x.redistribute(self.mesh, self.placements(Replicate()))
        self.narrow = self.replicated[:, :1]  # an index is a collective too
        self.dp = init_device_mesh("cpu", (N,), mesh_dim_names=("dp",))
        self.dir = COMM.bcast(tempfile.mkdtemp() if RANK == 0 else None)
        self.file = os.path.join(self.dir, "x.npy")
        mt.save(self.x, self.file)

    def placements(self, p):
        """`p` for the mesh's last dim, Replicate before it."""
        return [Replicate()] * (self.mesh.ndim - 1) + [p]


# -- the entry points: each takes the context and the arguments to change ---------------

def distribute(c, tensor=_DEFAULT, placements=_DEFAULT, src_data_rank=0):
    return distribute_tensor(A if tensor is _DEFAULT else tensor, c.mesh,
                             c.pl if placements is _DEFAULT else placements,
                             src_data_rank=src_data_rank)


def from_local_checked(c, local=_DEFAULT, placements=_DEFAULT, shape=None, stride=None):
    mine = c.x.to_local() if local is _DEFAULT else local
    return DTensor.from_local(mine, c.mesh, c.pl if placements is _DEFAULT else placements,
                              run_check=True, shape=shape, stride=stride)


def redistribute(c, device_mesh=_DEFAULT, placements=_DEFAULT, async_op=False,
                 forward_dtype=None):
    out = c.x.redistribute(c.mesh if device_mesh is _DEFAULT else device_mesh,
                           c.placements(Replicate()) if placements is _DEFAULT
                           else placements, async_op=async_op, forward_dtype=forward_dtype)
    return out.wait() if async_op else out


def full_tensor(c, x=_DEFAULT):
    return (c.x if x is _DEFAULT else x).full_tensor()


def save(c, obj=_DEFAULT, path=_DEFAULT):
    mt.save(c.x if obj is _DEFAULT else obj, c.file if path is _DEFAULT else path)


def load(c, path=_DEFAULT, placements=_DEFAULT, like=None):
    return mt.load(c.file if path is _DEFAULT else path, c.mesh,
                   c.pl if placements is _DEFAULT else placements, like=like)


def clip(c, max_norm=1.0, norm_type=2.0):
    p = distribute_tensor(A, c.mesh, c.pl, requires_grad=True)
    p.grad = distribute_tensor(A, c.mesh, c.pl)
    return clip_grad_norm_([p], max_norm, norm_type)


def np_sum(c, axis=0, dtype=None):
    return np.sum(c.x, axis=axis, dtype=dtype)


def np_cumsum(c, axis=0):
    return np.cumsum(c.x, axis=axis)


def np_sort(c, axis=0, kind=None):
    return np.sort(c.x, axis=axis, kind=kind)


def np_histogram(c, bins=4, range=None):  # noqa: A002 - NumPy's keyword
    return np.histogram(c.x, bins=bins, range=range)


def np_percentile(c, q=50.0, method="linear"):
    return np.percentile(c.x, q, method=method)


# DTensor's NumPy methods: agreed as NumPy's functions are.
def m_cumsum(c, axis=0):
    return c.x.cumsum(axis=axis)


def m_astype(c, dtype=np.float64):
    return c.x.astype(dtype)


def m_reshape(c, shape=(-1,)):
    return c.x.reshape(shape)


def m_transpose(c, axes=(1, 0)):
    return c.x.transpose(axes)


def m_clip(c, lo=0.0):
    return c.x.clip(lo, 5.0)


def m_round(c, decimals=0):
    return c.x.round(decimals)


def m_take(c, indices=(0, 1)):
    return c.x.take(list(indices), axis=0)


def m_repeat(c, repeats=2):
    return c.x.repeat(repeats, axis=0)


def _reduction_method(name):
    """``c.x.<name>(axis=..., keepdims=...)``: a reduction method of the C base."""
    def method(c, axis=0, keepdims=False, other=None):
        return getattr(c.x, other or name)(axis=axis, keepdims=keepdims)
    method.__name__ = f"m_{name}"
    return method


# The reduction methods the C base runs, each mutated alike: another axis or
# keepdims, an axis out of range, or another method on the odd rank.
REDUCTION_METHODS = [
    (_reduction_method(name), True, {
        "other_axis": lambda c: dict(axis=1),
        "other_keepdims": lambda c: dict(keepdims=True),
        "axis_out_of_range": lambda c: dict(axis=5),
        "other_method": lambda c, name=name: dict(other="min" if name == "max" else "max"),
    }) for name in ("sum", "mean", "prod", "max", "min", "all", "any", "std", "var")]


def _method(name, **base):
    """``c.x.<name>(**base)``, the odd rank calling another method (``other``) or
    with other arguments."""
    def method(c, other=None, **changes):
        if other is not None:  # another method, called with its own defaults
            return getattr(c.x, other)()
        return getattr(c.x, name)(**{**base, **changes})
    method.__name__ = f"m_{name}"
    return method


# DTensor's other NumPy methods that the door agrees: each against another method on
# the odd rank, and, where it takes one, another argument. (conj and conjugate are
# ufuncs, which the executor runs unagreed, as it runs a + b.)
OTHER_METHODS = [
    (_method(name, **base), True, {
        "other_method": lambda c, name=name: dict(other="copy" if name != "copy" else "ravel"),
        **{f"other_{k}": (lambda c, k=k, v=v: {k: v}) for k, v in changes.items()}})
    for name, base, changes in (
        ("argmax", dict(axis=0), dict(axis=1)),
        ("argmin", dict(axis=0), dict(axis=1)),
        ("argsort", dict(axis=0), dict(axis=1)),
        ("sort", dict(axis=0), dict(axis=1)),
        ("argpartition", dict(kth=1, axis=0), dict(kth=0)),
        ("partition", dict(kth=1, axis=0), dict(kth=0)),
        ("cumprod", dict(axis=0), dict(axis=1)),
        ("diagonal", dict(offset=0), dict(offset=1)),
        ("trace", dict(offset=0), dict(offset=1)),
        ("swapaxes", dict(axis1=0, axis2=1), dict(axis1=1)),
        ("squeeze", dict(), dict(axis=0)),
        ("compress", dict(condition=[True, False], axis=1), dict(condition=[False, True])),
        ("searchsorted", dict(v=3.0), dict(v=4.0)),
        ("dot", dict(b=np.ones(2)), dict(b=np.full(2, 2.0))),
        ("copy", dict(), dict()), ("flatten", dict(), dict(order="F")),
        ("ravel", dict(), dict(order="F")), ("nonzero", dict(), dict()))]


# Indexing, read and written: every key form, agreed as NumPy's calls are.
def index(c, key=0):
    return c.x[key]


def index_replicated(c, key=0):
    return c.replicated[key]


def index_write(c, key=0, value=1.0):
    x = distribute_tensor(A, c.mesh, c.pl)  # every rank, before the odd call
    x[key] = value
    return x


def np_concatenate(c, other=_DEFAULT, axis=0):
    return np.concatenate([c.x, c.x if other is _DEFAULT else other], axis=axis)


def np_add_reduce(c, axis=0):
    return np.add.reduce(c.x, axis=axis)


def np_kron(c, b=_DEFAULT):
    """A function without a distributed rule: the gather fallback's agreement."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        return np.kron(c.x, np.ones(2) if b is _DEFAULT else b)


def optimizer_step(c, kind="SGD", hyper=None, grad=True, group_lr=None):
    """A step after a construction that is Local: what differs on the odd rank is
    the optimizer's hyperparameters or the gradients it holds."""
    p = distribute_tensor(A, c.mesh, c.pl, requires_grad=True)
    if grad:
        p.grad = distribute_tensor(A, c.mesh, c.pl)
    opt = getattr(optim, kind)([p], **(hyper or {"lr": 0.1}))
    if group_lr is not None:  # as a scheduler that ran on one rank only would
        opt.param_groups[0]["lr"] = group_lr
    opt.step()
    return p


def shard_module(c, out_features=4, reshard_after_forward=True, mp_policy=_DEFAULT):
    model = nn.Linear(2, out_features)
    fully_shard(model, mesh=c.dp, reshard_after_forward=reshard_after_forward,
                mp_policy=MixedPrecisionPolicy() if mp_policy is _DEFAULT else mp_policy)
    return model


def zeros(c, size=(4 * N, 2), dtype=None, placements=_DEFAULT):
    return mt.zeros(*size, dtype=dtype, device_mesh=c.mesh,
                    placements=c.pl if placements is _DEFAULT else placements)


def arange(c, stop=4 * N, step=1):
    return mt.arange(0, stop, step, device_mesh=c.mesh, placements=c.placements(Shard(0)))


def from_local_unchecked(c, local=_DEFAULT, placements=_DEFAULT):
    mine = c.x.to_local() if local is _DEFAULT else local
    return DTensor.from_local(mine, c.mesh, c.pl if placements is _DEFAULT else placements)


# (entry, collective by contract, {case id: (argument changes on the odd rank, taking
# the context)}); every case of a collective entry must raise on every rank.
MUTATIONS = [
    (distribute, True, {
        "masked": lambda c: dict(tensor=np.ma.masked_array(A, mask=A > 3)),
        "object_dtype": lambda c: dict(tensor=A.astype(object)),
        "big_endian": lambda c: dict(tensor=A.astype(">f8")),
        "float128": lambda c: dict(tensor=A.astype(np.longdouble)),
        "structured": lambda c: dict(tensor=np.zeros(4 * N, dtype=[("a", "f8")])),
        "ragged_list": lambda c: dict(tensor=[[1.0], [1.0, 2.0]]),
        "other_shape": lambda c: dict(tensor=np.ones((4 * N + 1, 2))),
        "other_dtype": lambda c: dict(tensor=A.astype(np.float32)),
        "shard_dim_out_of_range": lambda c: dict(placements=c.placements(Shard(5))),
        "placement_is_a_string": lambda c: dict(placements=["S0"] * c.mesh.ndim),
        "too_many_placements": lambda c: dict(placements=c.pl + [Replicate()]),
        "other_placements": lambda c: dict(placements=c.placements(Shard(1))),
        "src_data_rank_out_of_range": lambda c: dict(src_data_rank=N + 3),
        "src_data_rank_a_string": lambda c: dict(src_data_rank="0"),
        "other_src_data_rank": lambda c: dict(src_data_rank=1),
    }),
    (from_local_checked, True, {
        "big_endian": lambda c: dict(local=c.x.to_local().astype(">f8")),
        "float128": lambda c: dict(local=c.x.to_local().astype(np.longdouble)),
        "a_list": lambda c: dict(local=c.x.to_local().tolist()),
        "object_dtype": lambda c: dict(local=c.x.to_local().astype(object)),
        "masked": lambda c: dict(local=np.ma.masked_array(c.x.to_local())),
        "other_local_shape": lambda c: dict(local=np.ones((5, 2))),
        "other_dtype": lambda c: dict(local=c.x.to_local().astype(np.float32)),
        "shard_dim_out_of_range": lambda c: dict(placements=c.placements(Shard(5))),
        "placement_is_a_string": lambda c: dict(placements=["R"] * c.mesh.ndim),
        "other_placements": lambda c: dict(placements=c.placements(Shard(1))),
        "float_shape": lambda c: dict(shape=(2.5, 2), stride=(2, 1)),
        "overflowing_shape": lambda c: dict(shape=(2**62, 2**62), stride=(2**62, 1)),
        "other_shape": lambda c: dict(shape=(4 * N + 1, 2), stride=(2, 1)),
    }),
    (redistribute, True, {
        "shard_dim_out_of_range": lambda c: dict(placements=c.placements(Shard(5))),
        "placement_is_a_string": lambda c: dict(placements=["R"] * c.mesh.ndim),
        "too_few_placements": lambda c: dict(placements=[]),
        "to_partial": lambda c: dict(placements=c.placements(Partial())),
        "other_placements": lambda c: dict(placements=c.placements(Shard(1))),
        "no_move_on_one_rank": lambda c: dict(placements=c.pl),
        "other_mesh": lambda c: dict(device_mesh=c.other_mesh),
        "async_on_one_rank": lambda c: dict(async_op=True),
        "forward_dtype_on_one_rank": lambda c: dict(forward_dtype=np.float32),
        "forward_dtype_not_a_dtype": lambda c: dict(forward_dtype="no such dtype"),
    }),
    (full_tensor, True, {
        "other_tensor_shape": lambda c: dict(x=c.longer),
    }),
    (save, True, {
        "other_path": lambda c: dict(path=os.path.join(c.dir, "y.npy")),
        "path_is_a_number": lambda c: dict(path=42),
    }),
    (load, True, {
        "other_path": lambda c: dict(path=os.path.join(c.dir, "missing.npy")),
        "shard_dim_out_of_range": lambda c: dict(placements=c.placements(Shard(5))),
        "other_placements": lambda c: dict(placements=c.placements(Shard(1))),
        "other_like": lambda c: dict(like=c.replicated),
    }),
    (clip, True, {
        "other_max_norm": lambda c: dict(max_norm=0.5),
        "other_norm_type": lambda c: dict(norm_type=3.0),
        "max_norm_not_a_number": lambda c: dict(max_norm="one"),
    }),
    # NumPy's functions, each a call every rank makes: agreed before they run.
    (np_sum, True, {
        "other_axis": lambda c: dict(axis=1),
        "axis_out_of_range": lambda c: dict(axis=5),
        "axis_a_string": lambda c: dict(axis="0"),
        "other_dtype": lambda c: dict(dtype=np.float32),
    }),
    (np_cumsum, True, {
        "other_axis": lambda c: dict(axis=1),
        "axis_out_of_range": lambda c: dict(axis=-3),
    }),
    (np_sort, True, {
        "other_axis": lambda c: dict(axis=1),
        "unknown_kind": lambda c: dict(kind="no such kind"),
    }),
    (np_histogram, True, {
        "other_bins": lambda c: dict(bins=5),
        "bins_an_array_of_this_rank": lambda c: dict(bins=np.linspace(0.0, 8.0 * N, 4)),
        "negative_bins": lambda c: dict(bins=-1),
        "other_range": lambda c: dict(range=(0.0, 1.0)),
    }),
    (np_percentile, True, {
        "other_q": lambda c: dict(q=25.0),
        "q_out_of_range": lambda c: dict(q=150.0),
        "unknown_method": lambda c: dict(method="no such method"),
    }),
    (m_cumsum, True, {
        "other_axis": lambda c: dict(axis=1),
        "axis_out_of_range": lambda c: dict(axis=3),
    }),
    (m_astype, True, {"other_dtype": lambda c: dict(dtype=np.float32)}),
    (m_reshape, True, {
        "other_shape": lambda c: dict(shape=(2, -1)),
        "impossible_shape": lambda c: dict(shape=(7, -1)),
    }),
    (m_transpose, True, {"identity": lambda c: dict(axes=(0, 1))}),
    (m_clip, True, {"other_bound": lambda c: dict(lo=1.0)}),
    (m_round, True, {"other_decimals": lambda c: dict(decimals=2)}),
    (m_take, True, {"other_indices": lambda c: dict(indices=(1, 0))}),
    (m_repeat, True, {"other_repeats": lambda c: dict(repeats=3)}),
    (index, True, {
        "other_int": lambda c: dict(key=1),
        "int_out_of_bounds": lambda c: dict(key=4 * N + 3),
        "other_slice": lambda c: dict(key=slice(0, 3)),
        "whole_slice": lambda c: dict(key=slice(None)),
        "empty_slice": lambda c: dict(key=slice(0, 0)),
        "ellipsis": lambda c: dict(key=(Ellipsis, 1)),
        "none": lambda c: dict(key=(None, 0)),
        "mask": lambda c: dict(key=A > 3),
        "int_array": lambda c: dict(key=[1, 0]),
        "mixed": lambda c: dict(key=(slice(None), [1, 0])),
        "not_an_index": lambda c: dict(key="a"),
    }),
    (index_replicated, True, {
        "other_int": lambda c: dict(key=1),
        "other_slice": lambda c: dict(key=slice(0, 2)),
        "none": lambda c: dict(key=(0, None)),
        "mask": lambda c: dict(key=A > 3),
        "int_array": lambda c: dict(key=[0, 0]),
    }),
    (index_write, True, {
        "other_int": lambda c: dict(key=1),
        "other_value": lambda c: dict(value=2.0),
        "other_slice": lambda c: dict(key=slice(0, 3)),
        "ellipsis": lambda c: dict(key=(Ellipsis, 1)),
        "mask": lambda c: dict(key=A > 3),
        "int_array": lambda c: dict(key=[1, 0]),
        "int_out_of_bounds": lambda c: dict(key=4 * N + 3),
    }),
    (np_concatenate, True, {
        "other_axis": lambda c: dict(axis=1),
        "other_tensor": lambda c: dict(other=c.longer),
        "tensor_of_another_shape": lambda c: dict(other=c.narrow),
    }),
    (np_add_reduce, True, {
        "other_axis": lambda c: dict(axis=1),
    }),
    (np_kron, True, {
        "other_operand": lambda c: dict(b=np.ones(3)),
        "other_operand_values": lambda c: dict(b=np.full(2, 2.0)),
    }),
    (optimizer_step, True, {
        "other_lr": lambda c: dict(hyper={"lr": 0.5}),
        "lr_changed_in_group": lambda c: dict(group_lr=0.2),
        "other_momentum": lambda c: dict(hyper={"lr": 0.1, "momentum": 0.9}),
        "no_gradient": lambda c: dict(grad=False),
        "other_optimizer": lambda c: dict(kind="Adam"),
    }),
    (shard_module, True, {
        "other_parameter_shape": lambda c: dict(out_features=5),
        "other_reshard_after_forward": lambda c: dict(reshard_after_forward=False),
        "other_mp_policy": lambda c: dict(
            mp_policy=MixedPrecisionPolicy(param_dtype=np.float32)),
        "mp_policy_of_an_unknown_dtype": lambda c: dict(
            mp_policy=MixedPrecisionPolicy(param_dtype=np.int8)),
    }),
    # Local entry points: nothing is sent, so only the odd rank raises.
    (zeros, False, {
        "negative_size": lambda c: dict(size=(-1, 2)),
        "overflowing_size": lambda c: dict(size=(2**62, 4)),
        "float128": lambda c: dict(dtype=np.longdouble),
        "partial": lambda c: dict(placements=c.placements(Partial())),
    }),
    (arange, False, {
        "zero_step": lambda c: dict(step=0),
    }),
    (from_local_unchecked, False, {
        "big_endian": lambda c: dict(local=c.x.to_local().astype(">f8")),
        "shard_dim_out_of_range": lambda c: dict(placements=c.placements(Shard(5))),
    }),
]

CASES = [pytest.param(entry, collective, make, id=f"{entry.__name__}-{name}")
         for entry, collective, table in MUTATIONS + REDUCTION_METHODS + OTHER_METHODS
         for name, make in table.items()]
MESHES = [(N,), (1, N)] if LONG else [(N,)]
ODD = list(range(N)) if LONG else [N - 1]


@pytest.fixture(scope="module", params=MESHES, ids=lambda s: "x".join(map(str, s)))
def ctx(request):
    return Ctx(request.param)


def still_in_step(c):
    """The next collective pairs on every rank and gives the right values."""
    b = A + 100.0
    got = distribute_tensor(b, c.mesh, c.pl).redistribute(
        c.mesh, c.placements(Replicate())).to_local()
    assert np.array_equal(got, b)
    assert np.array_equal(c.x.full_tensor(), A)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("odd", ODD, ids=lambda r: f"odd{r}")
@pytest.mark.parametrize("entry, collective, make", CASES)
def test_one_rank_differs(ctx, entry, collective, make, odd):
    changes = make(ctx) if RANK == odd else {}
    got = outcome(lambda: entry(ctx, **changes))
    every = COMM.allgather(None if got is None else got[0])
    if collective:
        assert every[odd] is not None, f"the odd rank raised nothing: {every}"
        assert every == [every[odd]] * N, every
    else:
        assert every[odd] is not None and all(
            e is None for r, e in enumerate(every) if r != odd), every
    still_in_step(ctx)
