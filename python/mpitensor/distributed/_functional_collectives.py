"""Functional collectives on local arrays, differentiable, as torch 2.13's
``torch.distributed._functional_collectives``.

Each takes this rank's array (a NumPy array, or the local DTensor that
``to_local()`` gives of a tensor that requires grad, as inside ``local_map``) and a
group: a 1-D :class:`~mpitensor.DeviceMesh`, ``(mesh, dim)`` for one dim of an N-D
mesh, or an mpi4py communicator (torch's ProcessGroup; a mesh's own
``get_group()`` is used in place, any other is given a mesh once, collectively). It
returns a new array of the same kind: a local DTensor whose gradient flows back
through the collective's reverse, as torch's registered backwards do (the backward
of an all-gather is a sum reduce-scatter, of a reduce-scatter an all-gather, of an
all-reduce a sum all-reduce, of an all-to-all the all-to-all with the splits
swapped; a reduction other than sum has no backward: RuntimeError when the
backward runs, as torch's).

They run as DTensor redistributions on the group's 1-D mesh, so the executor moves
the bytes and CommDebugMode counts them under torch's names. MPI completes them
before they return: ``wait_tensor`` is the identity. The arguments are agreed first
(one small all-reduce): a shape, dtype or argument that differs by rank raises the
same exception on every rank, torch's type where torch raises one.

Example (``mpiexec -n 2``)::

    >>> import mpitensor.distributed._functional_collectives as funcol
    >>> funcol.all_gather_single(np.full(2, rank), 0, mesh).tolist()
    [0, 0, 1, 1]
"""

from __future__ import annotations

import operator
import warnings

import numpy as np

from .. import _comm
from .._dtensor import DTensor
from .._fingerprint import fingerprint
from ..autograd import Function
from ..autograd._grad_mode import no_grad
from ..device_mesh import DeviceMesh, local_mesh, mesh_of_group
from ..placement_types import Partial, Replicate, Shard

__all__ = ["all_gather_single", "all_gather_single_autograd", "all_gather_tensor",
           "all_gather_tensor_autograd", "reduce_scatter_single",
           "reduce_scatter_single_autograd", "reduce_scatter_tensor",
           "reduce_scatter_tensor_autograd", "all_reduce", "all_to_all_single",
           "all_to_all_single_autograd", "wait_tensor"]

_REDUCE_OPS = ("sum", "avg", "product", "min", "max")
# The exceptions an agreed failure is raised as on every rank (by name).
_KINDS = {e.__name__: e for e in (AssertionError, ValueError, TypeError, IndexError,
                                  RuntimeError, NotImplementedError)}


# -- groups ------------------------------------------------------------------------

def _resolve_group(group, tag: str = "") -> DeviceMesh:
    """The 1-D mesh of ``group``, with torch's errors for what it refuses."""
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise AssertionError("Only 1D mesh is supported, pass in (DeviceMesh, int) "
                                 "together if mesh > 1D")
        return group
    if isinstance(group, tuple):
        if (len(group) == 2 and isinstance(group[0], DeviceMesh)
                and isinstance(group[1], int) and not isinstance(group[1], bool)):
            return group[0]._dim_mesh(group[1])
        raise ValueError(f"Invalid tuple for group must be (DeviceMesh, int). Instead "
                         f"got {tuple(type(g) for g in group[:2])}")
    if isinstance(group, (list, str)):
        raise ValueError(f"Unsupported group type: {type(group)}, {group}: mpitensor's "
                         f"groups are a DeviceMesh, (DeviceMesh, dim) or an mpi4py "
                         f"communicator")
    return mesh_of_group(group)


# -- the arrays ----------------------------------------------------------------------

def _local_array(x, what: str) -> np.ndarray:
    """The ndarray of ``x`` (an ndarray or a local DTensor), C-contiguous."""
    if type(x) is DTensor:
        if x.device_mesh is not local_mesh():
            raise TypeError(f"{what} takes this rank's local array (to_local()), got a "
                            f"DTensor on {x.device_mesh}")
        x = x._data()
    elif not isinstance(x, np.ndarray):
        raise TypeError(f"{what} takes a NumPy array or the local DTensor of to_local(), "
                        f"got {type(x).__name__}")
    return _contiguous(x)


def _contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray does not)."""
    return a if a.flags.c_contiguous else a.copy(order="C")


def _as_local_dtensor(a: np.ndarray) -> DTensor:
    return DTensor.from_local(a, local_mesh(), [Replicate()])


def _agree(mesh: DeviceMesh, failure, what) -> None:
    """Every member raises the first failing member's exception (its own type),
    or a ValueError when the members' ``what`` differ."""
    if mesh.get_coordinate() is None:
        if failure is not None:
            raise failure
        raise RuntimeError(f"{what[0]}: rank {mesh.get_rank()} is not a member of the "
                           f"group {mesh}")
    message = f"{type(failure).__name__}:{failure}" if failure is not None else \
        (f"ValueError:{what[0]}: the ranks of the group passed different arguments, "
         f"shapes or dtypes (this rank: {what[1:]})")
    try:
        _comm.agree(mesh, failure is None, fingerprint(repr(what)), message,
                    ValueError)
    except ValueError as e:
        kind, _, text = str(e).partition(":")
        if kind not in _KINDS:
            raise
        if failure is not None and text == str(failure):
            raise failure from None
        raise _KINDS[kind](text) from None


def _check_op(op, what: str) -> str:
    if not isinstance(op, str) or op.lower() not in _REDUCE_OPS:
        raise ValueError(f"{what}: reduceOp must be one of {', '.join(_REDUCE_OPS)}, got "
                         f"{op!r}")
    return op.lower()


def _dim(d, ndim: int, what: str) -> int:
    d = operator.index(d)
    if ndim == 0:
        raise IndexError(f"{what}: a 0-d array has no dim to gather or scatter along")
    if not -ndim <= d < ndim:
        raise IndexError(f"{what}: Dimension out of range (expected to be in range of "
                         f"[{-ndim}, {ndim - 1}], but got {d})")
    return d % ndim


def _run(x, what: tuple, checks, collective, backward):
    """The one path of every collective: the local array, the checks (``checks(a,
    n)`` returns the arguments the collective takes, raising for bad ones), their
    agreement, then ``collective(mesh, a, *args)``, recorded for autograd with
    ``backward`` when ``x`` is a local DTensor."""
    return _NODES[what[0]].apply(x, what, checks, collective, backward)


class _Collective(Function):
    """A collective on local arrays whose backward is another collective."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, x, what, checks, collective, backward):
        mesh, failure, args = None, None, ()
        a = _local_array(x, what[0])
        try:
            mesh = _resolve_group(what[1])
            args = checks(a, mesh.size())
        except (AssertionError, ValueError, TypeError, IndexError, RuntimeError,
                NotImplementedError) as e:
            if mesh is None:
                raise
            failure = e
        # Rows may differ by rank when all_to_all_single is given its splits, which
        # differ too: what the ranks send each other is checked after the counts.
        free_rows = what[0] == "all_to_all_single" and args and args[0] is not None
        _agree(mesh, failure, (what[0], a.shape[1:] if free_rows else a.shape,
                               a.dtype.str, None if free_rows else args))
        out = collective(mesh, a, *args)
        ctx.mesh, ctx.args, ctx.backward, ctx.what = mesh, args, backward, what[0]
        return _as_local_dtensor(out) if type(x) is DTensor else out

    @staticmethod
    def backward(ctx, g):
        out = ctx.backward(ctx.mesh, _local_array(g, ctx.what), *ctx.args)
        return _as_local_dtensor(out), None, None, None, None


# One Function per collective, so that autograd's graph names the node after it.
_NODES = {name: type(name, (_Collective,), {}) for name in
          ("all_gather_single", "reduce_scatter_single", "all_reduce", "all_to_all_single")}


def _moved(mesh: DeviceMesh, a: np.ndarray, src, dst) -> np.ndarray:
    """``a`` as this rank's part of ``src`` on ``mesh``, redistributed to ``dst``:
    the executor runs (and counts) the one collective between them."""
    with no_grad():
        dt = DTensor.from_local(a, mesh, [src])
        return _contiguous(dt.redistribute(mesh, [dst]).to_local())


# -- the collectives and their backwards ----------------------------------------------

def _gather(mesh, a, dim):
    return _moved(mesh, a, Shard(dim), Replicate())


def _scatter(mesh, a, op, dim):
    return _moved(mesh, a, Partial(op), Shard(dim))


def _reduce(mesh, a, op):
    return _moved(mesh, a, Partial(op), Replicate())


def _gather_back(mesh, g, dim):
    return _scatter(mesh, g, "sum", dim)


def _scatter_back(mesh, g, op, dim):
    if op != "sum":
        raise RuntimeError(f"reduce_scatter_tensor backward only supports 'sum' "
                           f"reduction, got '{op}'")
    return _gather(mesh, g, dim)


def _reduce_back(mesh, g, op):
    if op != "sum":
        raise RuntimeError(f"all_reduce backward only supports 'sum' reduction, got "
                           f"'{op}'")
    return _reduce(mesh, g, "sum")


def _all_to_all(mesh, a, out_splits, in_splits):
    n = mesh.size()
    if in_splits is None:
        # Block j of every rank's rows goes to rank j: a Shard(0) -> Shard(1) of the
        # ranks' arrays stacked along a new first dim.
        m = a.shape[0] // n
        got = _moved(mesh, a.reshape((1, n * m) + a.shape[1:]), Shard(0), Shard(1))
        return got.reshape((n * m,) + a.shape[1:])
    rows, received = _comm.alltoallv(mesh, a, in_splits, 0)
    bad = list(received) != list(out_splits)
    # What each rank expected is checked against what it was sent, on every rank,
    # before a result is returned.
    _agree(mesh, ValueError(f"all_to_all_single: output_split_sizes {list(out_splits)} "
                            f"on rank {mesh.get_rank()}, but the ranks send it "
                            f"{list(received)} rows") if bad else None,
           ("all_to_all_single",))
    return rows


def _all_to_all_back(mesh, g, out_splits, in_splits):
    return _all_to_all(mesh, g, in_splits, out_splits)


# -- torch's names --------------------------------------------------------------------

def all_gather_single(self, gather_dim: int, group, tag: str = ""):
    """Every rank's array, concatenated along ``gather_dim`` in rank order; the
    inputs must have the same shape. Differentiable (backward: a sum
    reduce-scatter). Collective on the group.

    Example (``mpiexec -n 2``)::

        >>> all_gather_single(np.ones((2, 3)), 0, mesh).shape
        (4, 3)
    """
    def checks(a, n):
        return (_dim(gather_dim, a.ndim, "all_gather_single"),)
    return _run(self, ("all_gather_single", group), checks, _gather, _gather_back)


def all_gather_single_autograd(self, gather_dim: int, group, tag: str = ""):
    """:func:`all_gather_single` (which propagates gradients, as torch's does now).

    Example: ``all_gather_single_autograd(x, 0, (mesh, 1))``.
    """
    return all_gather_single(self, gather_dim, group, tag)


def reduce_scatter_single(self, reduceOp: str, scatter_dim: int, group, tag: str = ""):
    """The reduction (``"sum"``, ``"avg"``, ``"product"``, ``"min"``, ``"max"``) of
    every rank's array, cut along ``scatter_dim`` into one block per rank: this
    rank's block. ``scatter_dim``'s size must be a multiple of the group's size
    (AssertionError, as torch). Differentiable for ``"sum"`` (backward: an
    all-gather). Collective on the group.

    Example (``mpiexec -n 2``)::

        >>> reduce_scatter_single(np.ones(4), "sum", 0, mesh).tolist()
        [2.0, 2.0]
    """
    def checks(a, n):
        op = _check_op(reduceOp, "reduce_scatter_single")
        d = _dim(scatter_dim, a.ndim, "reduce_scatter_single")
        if a.shape[d] % n != 0:
            raise AssertionError(f"input dimension 0 ({a.shape[0]} must be a multiple of "
                                 f"group_size {n})")
        return op, d
    return _run(self, ("reduce_scatter_single", group), checks, _scatter, _scatter_back)


def reduce_scatter_single_autograd(self, reduceOp: str, scatter_dim: int, group,
                                   tag: str = ""):
    """:func:`reduce_scatter_single` (which propagates gradients, as torch's does now).

    Example: ``reduce_scatter_single_autograd(x, "sum", 0, mesh)``.
    """
    return reduce_scatter_single(self, reduceOp, scatter_dim, group, tag)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`torch.distributed._functional_collectives.{old}` is deprecated. "
                  f"Please use `torch.distributed._functional_collectives.{new}` instead.",
                  FutureWarning, stacklevel=3)


def all_gather_tensor(self, gather_dim: int, group, tag: str = ""):
    """:func:`all_gather_single`, with torch's FutureWarning that the name is
    deprecated.

    Example: ``all_gather_tensor(x, 0, mesh)``.
    """
    _deprecated("all_gather_tensor", "all_gather_single")
    return all_gather_single(self, gather_dim, group, tag)


def all_gather_tensor_autograd(self, gather_dim: int, group, tag: str = ""):
    """:func:`all_gather_single`, with torch's FutureWarning that the name is
    deprecated.

    Example: ``all_gather_tensor_autograd(x, 0, mesh)``.
    """
    _deprecated("all_gather_tensor_autograd", "all_gather_single_autograd")
    return all_gather_single(self, gather_dim, group, tag)


def reduce_scatter_tensor(self, reduceOp: str, scatter_dim: int, group, tag: str = ""):
    """:func:`reduce_scatter_single`, with torch's FutureWarning that the name is
    deprecated.

    Example: ``reduce_scatter_tensor(x, "sum", 0, mesh)``.
    """
    _deprecated("reduce_scatter_tensor", "reduce_scatter_single")
    return reduce_scatter_single(self, reduceOp, scatter_dim, group, tag)


def reduce_scatter_tensor_autograd(self, reduceOp: str, scatter_dim: int, group,
                                   tag: str = ""):
    """:func:`reduce_scatter_single`, with torch's FutureWarning that the name is
    deprecated.

    Example: ``reduce_scatter_tensor_autograd(x, "sum", 0, mesh)``.
    """
    _deprecated("reduce_scatter_tensor_autograd", "reduce_scatter_single_autograd")
    return reduce_scatter_single(self, reduceOp, scatter_dim, group, tag)


def all_reduce(self, reduceOp: str, group, tag: str = ""):
    """The reduction (``"sum"``, ``"avg"``, ``"product"``, ``"min"``, ``"max"``) of
    every rank's array, on every rank; the input is left unmodified.
    Differentiable for ``"sum"`` (backward: a sum all-reduce). Collective on the
    group.

    Example (``mpiexec -n 2``)::

        >>> all_reduce(np.ones(2), "sum", mesh).tolist()
        [2.0, 2.0]
    """
    def checks(a, n):
        return (_check_op(reduceOp, "all_reduce"),)
    return _run(self, ("all_reduce", group), checks, _reduce, _reduce_back)


def all_to_all_single(self, output_split_sizes, input_split_sizes, group, tag: str = ""):
    """Rows of this rank's array (dim 0) split by ``input_split_sizes`` go to the
    ranks in order; the rows received, by ``output_split_sizes``, are concatenated
    in rank order. Both None: equal blocks (dim 0 a multiple of the group's size).
    Differentiable (backward: the all-to-all with the splits swapped). Collective
    on the group; with splits, the row counts are exchanged first (one more
    all-to-all) and a rank told other sizes than it is sent raises ValueError on
    every rank.

    Example (``mpiexec -n 2``)::

        >>> all_to_all_single(np.arange(4) + 4 * rank, None, None, mesh).tolist()
        [0, 1, 4, 5]          # on rank 0
    """
    def checks(a, n):
        for name, given in (("output_split_sizes", output_split_sizes),
                            ("input_split_sizes", input_split_sizes)):
            if given is not None and not all(
                    isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                    for s in given):
                raise AssertionError(f"All {name} must be int or SymInt, got {given}")
        if (output_split_sizes is None) != (input_split_sizes is None):
            raise AssertionError("output_split_sizes and input_split_sizes must either "
                                 "be specified together or both set to None")
        if a.ndim == 0:
            raise IndexError("all_to_all_single: a 0-d array has no rows to split")
        if output_split_sizes is None:
            if a.shape[0] % n:
                raise ValueError(f"all_to_all_single: {a.shape[0]} rows do not split "
                                 f"evenly among {n} ranks; pass split sizes")
            return None, None
        outs, ins = [int(s) for s in output_split_sizes], [int(s) for s in input_split_sizes]
        if len(outs) != n or len(ins) != n or min(outs + ins) < 0:
            raise ValueError(f"all_to_all_single: split sizes need {n} entries >= 0, "
                             f"got {outs} and {ins}")
        if sum(ins) != a.shape[0]:
            raise ValueError(f"all_to_all_single: input_split_sizes {ins} add up to "
                             f"{sum(ins)}, but the input has {a.shape[0]} rows")
        return tuple(outs), tuple(ins)
    return _run(self, ("all_to_all_single", group), checks, _all_to_all, _all_to_all_back)


def all_to_all_single_autograd(self, output_split_sizes, input_split_sizes, group,
                               tag: str = ""):
    """:func:`all_to_all_single` (which propagates gradients, as torch's does now).

    Example: ``all_to_all_single_autograd(x, None, None, mesh)``.
    """
    return all_to_all_single(self, output_split_sizes, input_split_sizes, group, tag)


def wait_tensor(tensor):
    """``tensor``: mpitensor's collectives have completed when they return (torch's
    waits for an asynchronous one). Local.

    Example: ``wait_tensor(all_reduce(x, "sum", mesh))``.
    """
    return tensor
