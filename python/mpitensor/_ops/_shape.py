"""Shape operations on DTensors: permutations, reshape, squeeze, expand_dims,
broadcast_to, concatenate, stack, tile and atleast_1d/2d/3d.

Permutations (``np.transpose``, ``DTensor.T``/``.transpose``, ``np.swapaxes``,
``np.moveaxis``) are maps of KEEP labels in another order: every Shard follows its
dim, Replicate and every Partial stay, and no rank communicates. A strided shard
follows its dim too, with its split factor (``_strided.permuted``).

The others are dim maps with one label per input dim (KEEP, shared by the inputs
on the dims they have in common) and ``P_LINEAR_ALL`` (they are linear, so a
Partial(sum|avg) carried by every input stays; concatenate and stack take
``P_ADDITIVE``, torch's additive rules, so a Replicate input joins a Partial too): a new output dim (expand_dims,
broadcast_to's leading dims, stack's axis) is a sized REPLICATE label; a size-1
dim that broadcast_to widens, a dim squeeze removes and each input's concatenate
axis are REPLICATE labels of their own (a Shard of them is gathered first), and
concatenate's output axis is a sized REPLICATE label of the summed length. Along
an axis a mesh dim shards, concatenate instead re-chunks the rows by one exchange
(``_join.py``) and the result stays sharded along it.

reshape splits the two shapes into groups of dims with equal products (the
core's mt_reshape_groups, bound as ``mpitensor._strided.reshape_groups``); a
group's leftmost input dim keeps its label on the group's leftmost output dim,
resized to that dim's length, and the engine lets a Shard through only where
every rank's share of both is the same part of the group (prop.h: out_resized).
Every Partial passes: reshape moves elements, it does not combine them.
"""

from __future__ import annotations

import math
import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from .. import _C, _call_agreement, _comm, _modes, _registry
from .. import _strided as _layouts
from .._dtensor import DTensor
from .._algorithms import _dispatch as D
from .._algorithms import _flatten, _views
from . import _join
from ._strided import expanded, is_strided, permuted, restride
from ..placement_types import Partial, Replicate, Shard
from .._registry import memory_of as _memory_of



def _dtensor(name, a):
    if type(a) is not DTensor:
        raise TypeError(f"numpy.{name}: expected a DTensor, got {type(a).__name__}")
    return a


# -- permutations ---------------------------------------------------------------------

def permute(a, perm):
    """``a`` with its dims in the order ``perm`` (output dim j is input dim
    perm[j]): every Shard follows its dim, every Partial stays; local, no
    communication."""
    n = a.ndim
    if is_strided(a):
        return permuted(a, perm)
    # A view, as NumPy's and torch's transposes are: copying here would cost a full
    # pass over the weight in every `x @ w.T` (nn.functional.linear). Consumers that
    # need contiguous memory (the C redistribute) make it themselves.
    return D.execute(("transpose", perm), (a,), lambda: D.dimmap(
        [range(n)], perm, [D.KEEP] * n, partial_rule=D.P_SAME_OP, partial_ops=ALL_OPS),
        np.transpose, extra=(perm,))


@_registry.implements(np.transpose, takes_strided=True)
def transpose(a, axes=None):
    a = _dtensor("transpose", a)
    n = a.ndim
    if axes is None:
        perm = tuple(range(n - 1, -1, -1))
    else:
        perm = normalize_axis_tuple(axes, n, "axes")
        if len(perm) != n:
            raise ValueError("numpy.transpose: axes don't match array")
    return permute(a, perm)


@_registry.implements(np.swapaxes, takes_strided=True)
def swapaxes(a, axis1, axis2):
    a = _dtensor("swapaxes", a)
    n = a.ndim
    i, j = normalize_axis_index(axis1, n), normalize_axis_index(axis2, n)
    perm = list(range(n))
    perm[i], perm[j] = j, i
    return permute(a, tuple(perm))


@_registry.implements(np.moveaxis, takes_strided=True)
def moveaxis(a, source, destination):
    a = _dtensor("moveaxis", a)
    n = a.ndim
    src = normalize_axis_tuple(source, n, "source")
    dst = normalize_axis_tuple(destination, n, "destination")
    if len(src) != len(dst):
        raise ValueError("numpy.moveaxis: `source` and `destination` arguments must "
                         "have the same number of elements")
    order = [d for d in range(n) if d not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return permute(a, tuple(order))


# -- maps ----------------------------------------------------------------------------

# Every mt_reduce_op (layout.h): a rule keeping Partials of any op.
ALL_OPS = (1 << 5) - 1

def _run(name, key, inputs, build, compute):
    # The executor checks that the inputs share a mesh (its "mesh" error names
    # numpy.<name> as this would).
    return D.execute(key, inputs, build, compute)


@_registry.implements(np.squeeze)
def squeeze(a, axis=None):
    a = _dtensor("squeeze", a)
    shape, n = a.shape, a.ndim
    if axis is None:
        axes = tuple(d for d in range(n) if shape[d] == 1)
    else:
        axes = normalize_axis_tuple(axis, n)
        for d in axes:
            if shape[d] != 1:
                raise ValueError("numpy.squeeze: cannot select an axis to squeeze out "
                                 "which has size not equal to one")

    def build():
        kinds = [D.REPLICATE if d in axes else D.KEEP for d in range(n)]
        return D.dimmap([range(n)], [d for d in range(n) if d not in axes], kinds,
                        partial_rule=D.P_LINEAR_ALL)

    return _run("squeeze", ("squeeze", axes), (a,), build,
                lambda x: np.squeeze(x, axis=axes))


@_registry.implements(np.expand_dims)
def expand_dims(a, axis):
    a = _dtensor("expand_dims", a)
    n = a.ndim
    nout = n + (len(axis) if isinstance(axis, (tuple, list)) else 1)
    axes = normalize_axis_tuple(axis, nout)

    def build():
        kinds, out, sizes, src = [D.KEEP] * n, [], {}, iter(range(n))
        for j in range(nout):
            if j in axes:
                sizes[len(kinds)] = 1
                out.append(len(kinds))
                kinds.append(D.REPLICATE)
            else:
                out.append(next(src))
        return D.dimmap([range(n)], out, kinds, partial_rule=D.P_LINEAR_ALL, sizes=sizes)

    return _run("expand_dims", ("expand_dims", axes), (a,), build,
                lambda x: np.expand_dims(x, axes))


@_registry.implements(np.broadcast_to)
def broadcast_to(array, shape, subok=False):
    a = _dtensor("broadcast_to", array)
    shape = (operator.index(shape),) if np.ndim(shape) == 0 else tuple(
        operator.index(s) for s in shape)
    np.broadcast_shapes(a.shape, shape)  # NumPy's error for shapes that do not fit
    if len(shape) < a.ndim or np.broadcast_shapes(a.shape, shape) != shape:
        raise ValueError(f"numpy.broadcast_to: cannot broadcast a DTensor of shape "
                         f"{a.shape} to {shape}")
    n, nout = a.ndim, len(shape)
    first = nout - n
    widened = tuple(d for d in range(n) if a.shape[d] == 1 and shape[first + d] != 1)

    def build():
        kinds = [D.REPLICATE if d in widened else D.KEEP for d in range(n)]
        out, sizes = [], {}
        for j in range(nout):
            d = j - first
            if d >= 0 and d not in widened:
                out.append(d)
            else:
                sizes[len(kinds)] = shape[j]
                out.append(len(kinds))
                kinds.append(D.REPLICATE)
        return D.dimmap([range(n)], out, kinds, partial_rule=D.P_LINEAR_ALL, sizes=sizes)

    def compute(local):
        target = tuple(local.shape[j - first] if j >= first and j - first not in widened
                       else shape[j] for j in range(nout))
        # np.ascontiguousarray would make a 0-d result 1-d.
        return np.array(np.broadcast_to(local, target), order="C", copy=True)

    out = _run("broadcast_to", ("broadcast_to", shape), (a,), build, compute)
    # NumPy's result is a read-only view: a write into this copy would be lost
    # without a word, so it raises NumPy's read-only ValueError instead.
    out.to_local().flags.writeable = False
    return out


def _sequence(name, arrays):
    arrays = list(D.implicit(arrays))
    if not arrays:
        raise ValueError(f"numpy.{name}: need at least one array")
    for x in arrays:
        if type(x) is not DTensor:
            if isinstance(x, np.ndarray) or D.is_scalar(x):
                raise D.mixed_error(f"numpy.{name}", x)
            raise TypeError(f"numpy.{name}: expected DTensors, got {type(x).__name__}")
    return arrays


def _groups(arrays) -> list:
    """The arrays in groups of as many as a dim map takes: a join of more joins
    each group, then the groups (a join of joins is the join)."""
    return [arrays[i:i + D.MAX_INPUTS] for i in range(0, len(arrays), D.MAX_INPUTS)]


def _check_kwargs(name, out, kwargs):
    if out is not None:
        raise _registry.NoRule(f"numpy.{name}: out= is not supported on DTensors")
    for k, v in kwargs.items():
        if v is not None and not (k == "casting" and v == "same_kind"):
            raise _registry.NoRule(f"numpy.{name}: the keyword argument {k}= is not supported "
                                   f"on DTensors")


def _flat(x):
    """The flattened DTensor ``x``, in torch.chunk's blocks where a mesh dim shards
    it (also one of a single rank: a plain Shard, never a strided one)."""
    m = _flatten.sharding_dim(x)
    if m is None:
        m = next((i for i, p in enumerate(x._spec.placements) if p.is_shard()), None)
    return np.ravel(x) if m is None else _flatten.flatten("numpy.concatenate", x, m)[0]


@_registry.implements(np.concatenate)
def concatenate(arrays, axis=0, out=None, **kwargs):
    if out is not None or kwargs:
        _check_kwargs("concatenate", out, kwargs)
    if type(axis) is int and axis >= 0 and type(arrays) in _SEQUENCES and \
            1 < len(arrays) <= _MAX_INPUTS:
        # The common call, DTensors of one mesh joined along an axis no mesh dim
        # shards, goes straight to the executor; build() checks their ranks and the
        # axis, on a miss of the memo (keyed by their layouts).
        mesh = arrays[0]._spec.mesh if type(arrays[0]) is DTensor else None
        for x in arrays:
            if type(x) is not DTensor or x._spec.mesh is not mesh:
                break
        else:
            if _join.joining_mesh_dim(arrays, axis) is None:
                return _joined(tuple(arrays), axis)
    arrays = _sequence("concatenate", arrays)
    if axis is None:
        # NumPy joins the flattened arrays: each sharded one reaches flat order by
        # one exchange (``_flatten``), then they join along the flat axis.
        flat = [x if x.ndim == 1 else _flat(x) for x in arrays]
        return concatenate(flat, 0, out, **kwargs)
    n = _rank_of(arrays)
    mesh = arrays[0]._spec.mesh
    for x in arrays:
        if x._spec.mesh is not mesh:
            D.same_mesh("numpy.concatenate", arrays)  # equal meshes pass; else its error
    ax = axis if type(axis) is int and 0 <= axis < n else normalize_axis_index(axis, n)
    if len(arrays) > D.MAX_INPUTS:
        _same_other_dims(arrays, ax)
        return concatenate([concatenate(g, ax) for g in _groups(arrays)], ax)
    m = _join.joining_mesh_dim(arrays, ax)
    if m is not None:
        _same_other_dims(arrays, ax)
        # Along a sharded axis the rows are re-chunked by one exchange, not gathered.
        return _join.concatenate_sharded("numpy.concatenate", arrays, ax, m)
    return _joined(tuple(arrays), ax)


_SEQUENCES = (tuple, list)
_MAX_INPUTS = D.MAX_INPUTS


def _rank_of(arrays) -> int:
    """The number of dims of the arrays np.concatenate joins: one, not 0, for all
    (NumPy's ValueError otherwise)."""
    n = len(arrays[0].shape)
    if n == 0:
        raise ValueError("numpy.concatenate: zero-dimensional arrays cannot be "
                         "concatenated")
    if any(len(x.shape) != n for x in arrays):
        raise ValueError("numpy.concatenate: all the input arrays must have the "
                         "same number of dimensions")
    return n


def _same_other_dims(arrays, ax: int) -> None:
    """NumPy's ValueError where the arrays np.concatenate joins along ``ax`` differ
    in another dim."""
    first = arrays[0].shape
    for x in arrays:
        if any(x.shape[d] != first[d] for d in range(len(first)) if d != ax):
            raise ValueError("numpy.concatenate: all the input array dimensions except "
                             "for the concatenation axis must match exactly")


def _joined(arrays: tuple, ax: int):
    """np.concatenate of DTensors along axis ``ax``, which no mesh dim shards: the
    executor's join (_C.register_join below), local where the layouts agree,
    after NumPy's checks of the ranks, the axis and the other dims."""
    first = arrays[0]._spec.shape
    n = len(first)
    if not 0 <= ax < n:
        normalize_axis_index(ax, _rank_of(arrays))  # NumPy's ValueError or AxisError
    head, tail = first[:ax], first[ax + 1:]
    for x in arrays:
        shape = x._spec.shape
        if len(shape) != n or shape[:ax] != head or shape[ax + 1:] != tail:
            _rank_of(arrays)  # NumPy's ValueError, of the ranks or of the other dims
            _same_other_dims(arrays, ax)
    return D.execute(np.concatenate, arrays, axis=ax)


# np.concatenate of DTensors of one mesh along an axis that no mesh dim shards,
# without Partials, is the executor's, taken in C before the entry runs: each
# input's axis is whole on its rank, so the blocks join where they lie. The dim
# map is the core's mt_dimmap_join (each input's axis a label of its own, the
# output's as long as theirs together; joining is linear, so Partials pass).
_C.register_join(np.concatenate, _C.concatenate_blocks, _registry.call_label(np.concatenate))


@_registry.implements(np.stack)
def stack(arrays, axis=0, out=None, **kwargs):
    _check_kwargs("stack", out, kwargs)
    arrays = _sequence("stack", arrays)
    shape = arrays[0]._spec.shape
    n = len(shape)
    for x in arrays:
        if x._spec.shape != shape:
            raise ValueError("numpy.stack: all input arrays must have the same shape")
    ax = normalize_axis_index(axis, n + 1)
    if len(arrays) > D.MAX_INPUTS:
        D.same_mesh("numpy.stack", arrays)
        return concatenate([stack(g, ax) for g in _groups(arrays)], ax)
    return D.execute(np.stack, arrays, axis=ax)


# np.stack of DTensors of one mesh, of one shape, without Partials, is the
# executor's, taken in C before the entry runs: each rank stacks its blocks. The
# dim map is the core's mt_dimmap_stack (the inputs' dims shared, the new one as
# long as the inputs are many; stacking is linear, so Partials pass).
_C.register_join(np.stack, _C.stack_blocks, _registry.call_label(np.stack), True)


@_registry.implements(np.tile)
def tile(A, reps):
    """numpy.tile of a DTensor: a dim repeated more than once is made whole first
    (its Shard moves to another dim by one all-to-all, or is gathered when no dim
    can take it; torch's ``repeat`` replicates it); every other dim keeps its Shard, new leading dims are Replicate, and a Partial(sum|avg)
    stays, since tiling is linear. Collective on the mesh only when a repeated dim
    is sharded.

    Example (``mpiexec -n 2``)::

        >>> dt = distribute_tensor(np.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
        >>> t = np.tile(dt, (1, 3))
        >>> t.shape, t.placements
        ((4, 6), (Shard(dim=0),))
    """
    a = _dtensor("tile", A)
    reps = tuple(operator.index(r) for r in (reps if np.ndim(reps) else (reps,)))
    if any(r < 0 for r in reps):
        raise ValueError("numpy.tile: negative repetitions are not allowed")
    n = a.ndim
    nout = max(n, len(reps))
    reps = (1,) * (nout - len(reps)) + reps
    lead = nout - n

    def build():
        # Output dim lead + d is label d; a repeated dim reads its input through
        # a label of its own, so the input's Shard of it is gathered.
        kinds, in_labels, sizes = [D.KEEP] * n, list(range(n)), {}
        for d in range(n):
            if reps[lead + d] != 1:
                kinds[d] = D.REPLICATE
                sizes[d] = a.shape[d] * reps[lead + d]
                in_labels[d] = len(kinds)
                kinds.append(D.REPLICATE)
        out = []
        for j in range(lead):
            sizes[len(kinds)] = reps[j]
            out.append(len(kinds))
            kinds.append(D.REPLICATE)
        return D.dimmap([in_labels], out + list(range(n)), kinds,
                        partial_rule=D.P_LINEAR_ALL, sizes=sizes)

    return _run("tile", ("tile", reps), (a,), build, lambda x: np.tile(x, reps))


def _atleast(name, arrays, axes_for):
    out = []
    for a in arrays:
        a = _dtensor(name, a)
        axes = axes_for(a.ndim)
        out.append(expand_dims(a, axes) if axes else a)
    return out[0] if len(out) == 1 else tuple(out)


@_registry.implements(np.atleast_1d)
def atleast_1d(*arys):
    """numpy.atleast_1d of DTensors: a 0-d one gains a Replicate dim of length 1;
    the others are returned as they are. Local.

    Example::

        >>> np.atleast_1d(dt0).shape    # dt0 a 0-d DTensor
        (1,)
    """
    return _atleast("atleast_1d", arys, lambda n: (0,) if n == 0 else ())


@_registry.implements(np.atleast_2d)
def atleast_2d(*arys):
    """numpy.atleast_2d of DTensors: dims of length 1 are added in front, as
    NumPy, and every Shard follows its dim. Local.

    Example (``mpiexec -n 2``)::

        >>> np.atleast_2d(distribute_tensor(np.arange(4.0), mesh, [Shard(0)])).placements
        (Shard(dim=1),)
    """
    return _atleast("atleast_2d", arys, lambda n: tuple(range(2 - n)) if n < 2 else ())


@_registry.implements(np.atleast_3d)
def atleast_3d(*arys):
    """numpy.atleast_3d of DTensors: NumPy's shapes, (1, N, 1) for a 1-D input and
    (M, N, 1) for a 2-D one; every Shard follows its dim. Local.

    Example (``mpiexec -n 2``)::

        >>> np.atleast_3d(distribute_tensor(np.arange(4.0), mesh, [Shard(0)])).shape
        (1, 4, 1)
    """
    where = {0: (0, 1, 2), 1: (0, 2), 2: (2,)}
    return _atleast("atleast_3d", arys, lambda n: where.get(n, ()))


# -- reshape -------------------------------------------------------------------------

def _target_shape(size, shape, order):
    if order not in ("C", "A"):
        raise _registry.NoRule(f"numpy.reshape: order={order!r} is not supported on DTensors; "
                               f"only order='C' (and 'A', which is 'C' for them)")
    try:
        shape = (shape,) if operator.index(shape) is not None else ()
    except TypeError:
        shape = tuple(shape)
    if any(isinstance(n, (bool, np.bool_)) for n in shape):
        raise TypeError("numpy.reshape: the shape must be integers, not booleans")
    shape = tuple(operator.index(n) for n in shape)
    unknown = [d for d, n in enumerate(shape) if n == -1]
    if len(unknown) > 1:
        raise ValueError("numpy.reshape: can only specify one unknown dimension")
    if any(n < -1 for n in shape):
        raise ValueError("numpy.reshape: negative dimensions not allowed")
    known = math.prod(n for n in shape if n != -1)
    if unknown and known != 0 and size % known == 0:
        shape = shape[:unknown[0]] + (size // known,) + shape[unknown[0] + 1:]
    if math.prod(shape) != size or -1 in shape:
        raise ValueError(f"numpy.reshape: cannot reshape a DTensor of size {size} "
                         f"into shape {tuple(shape)}")
    return shape


def _reshape_map(src, dst):
    n = len(src)
    kinds, out, resized = [D.REPLICATE] * n, [None] * len(dst), {}
    sizes = {}

    def new_dim(j):
        sizes[len(kinds)] = dst[j]
        out[j] = len(kinds)
        kinds.append(D.REPLICATE)

    # An empty array has nothing to keep sharded: every output dim is new.
    groups = (_layouts.reshape_groups(src, dst) if math.prod(src)
              else [((), tuple(range(len(dst))))])
    for ins, outs in groups:
        if ins and outs:
            kinds[ins[0]] = D.KEEP
            out[outs[0]] = ins[0]
            if src[ins[0]] != dst[outs[0]]:
                resized[outs[0]] = dst[outs[0]]
            outs = outs[1:]
        for j in outs:
            new_dim(j)
    return D.dimmap([range(n)], out, kinds, partial_rule=D.P_SAME_OP,
                    partial_ops=ALL_OPS, sizes=sizes, out_sizes=resized)


@_registry.implements(np.reshape, takes_strided=True, views=True)
def reshape(a, shape=None, order="C", *, newshape=None, copy=None):
    """numpy.reshape of a DTensor (also ``dt.reshape``). Collective on the mesh
    when the input must move: a group of dims that reshape merges or splits keeps
    a Shard of its leftmost input dim on its leftmost output dim when every rank's
    share of both is the same part of the group (always for even shards);
    elsewhere the cheapest redistribution comes first. Partials pass through.

    Example (``mpiexec -n 2``)::

        >>> dt = distribute_tensor(np.arange(24.0).reshape(4, 6), mesh, [Shard(0)])
        >>> np.reshape(dt, (8, 3)).placements      # rows 0-1 are 12 elements
        (Shard(dim=0),)
    """
    a = _dtensor("reshape", a)
    program = _registry.program_call(np.reshape)
    if shape is None:
        shape = newshape
    ints = shape if type(shape) is int else _ints(shape)
    if (program & _call_agreement.CONTIGUOUS and ints is not None and copy is None
            and order == "C" and not _modes.tracing):
        spec = a._spec
        hit = spec.mesh._block_reshapes.get((ints, spec.placements, spec.shape, spec.dtype))
        if hit is not None:
            # This layout's reshape reshaped each rank's block in place before: with
            # every block C-contiguous (agreed), it does again, a view everywhere.
            local = a._data()
            if local.shape == hit[2]:
                return DTensor(local.reshape(hit[1]), hit[0])
    if shape is None:
        raise TypeError("numpy.reshape: the shape is required")
    if copy is False:
        raise ValueError("numpy.reshape: copy=False is not supported on DTensors (the "
                         "local result is a new array whenever the layout changes)")
    src = a._spec.shape
    # The shape as given names the operation when it is plain ints (the input's
    # shape, in its layout, fixes the target); anything else is parsed first, so
    # that 2.0 or True meet NumPy's errors rather than hash like 2 and 1.
    given = ints
    if given is None:
        given = _target_shape(math.prod(src), shape, order)
    elif order not in ("C", "A"):
        _target_shape(math.prod(src), shape, order)  # raises NumPy's error

    out = _reshaped(a, given, shape, order, copy)
    if not program:
        return out
    return _as_numpy_gives(a, out, copy, program, ints if order == "C" else None)


def _remember_block_reshape(a, given, out) -> None:
    """Files the reshape of ``a`` to ``given`` that reshaped each rank's block in
    place, for the next one of this layout (the mesh's bounded FIFO). Local."""
    spec = a._spec
    cache = spec.mesh._block_reshapes
    if len(cache) >= _BLOCK_RESHAPES:
        del cache[next(iter(cache))]
    cache[(given, spec.placements, spec.shape, spec.dtype)] = (
        out._spec, out._data().shape, a._data().shape, _registry.call_label(np.reshape))


# The reshapes of blocks in place each mesh keeps.
_BLOCK_RESHAPES = 256


def _ints(shape):
    """``shape`` as a tuple when it is a tuple or list of plain ints, else None."""
    if type(shape) is not tuple and type(shape) is not list:
        return None
    for n in shape:
        if type(n) is not int:
            return None
    return tuple(shape)


def _reshaped(a, given, shape, order, copy):
    """The reshape itself: a view of the local array where no element moves and
    NumPy's local reshape is one."""
    src = a._spec.shape
    plain = not _layouts.has_strided(a._spec.placements)
    if not plain:
        a = expanded(a)
        src = a._spec.shape
    view = _view(a, src, shape, order, copy, plain)
    if view is not None:
        return view

    def build():
        return _reshape_map(src, _target_shape(math.prod(src), shape, order))

    # The engine lets a Shard through only where the shares scale, so this rank's
    # elements are exactly its box of the output.
    return D.execute(("reshape", given), (a,), build,
                     _reshape_copy if copy else np.ndarray.reshape, box=True)


def _as_numpy_gives(a, out, copy, program: int, given=None):
    """A program's reshape as NumPy gives it: a view of ``a`` where NumPy's is one,
    which a write reaches ``a`` through and which shows the writes into ``a`` even
    where the elements moved; else a copy that shares no memory with ``a``.
    ``program``: the agreement's flags; ``given``: the shape as the call gave it,
    plain ints, under which a reshape of each rank's block in place is filed for
    the next call. Collective on the mesh (one small all-reduce) but for
    ``copy=True`` and a reshape of each rank's block in place."""
    if copy:
        return _views.fresh(a, out)
    if program & _call_agreement.CONTIGUOUS and _blocks_reshaped(a, out):
        if given is not None:
            _remember_block_reshape(a, given, out)
        return out
    target = out.shape

    def redo(p):
        return _reshaped(p, target, target, "C", False)

    def back(p, view, written):
        np.copyto(p, np.reshape(view, p.shape), where=np.reshape(written, p.shape))
    return _views.keep(a, out, redo, back, copies=_numpy_copies(a, target))


def _blocks_reshaped(a, out) -> bool:
    """Whether ``out`` is, on every rank, NumPy's view of the rank's block of ``a``,
    given that every rank's block is C-contiguous (agreed): so on this rank, where
    no layout is strided and no rank's block of ``a`` is empty. Then no element
    moved anywhere (a move gives every rank new memory), and NumPy's reshape of a
    C-contiguous block is a view on each rank alike. Local."""
    if type(out) is not DTensor or _memory_of(out._data()) is not _memory_of(a._data()):
        return False
    spec = a._spec
    shape, sharded, mesh_shape = spec.shape, 0, None
    if 0 in shape:
        return False
    for m, p in enumerate(spec.placements):
        kind = type(p)
        if kind is Shard:
            d = p.dim
            if sharded >> d & 1:
                return False  # a dim two mesh dims shard: its blocks are nested
            sharded |= 1 << d
            if mesh_shape is None:
                mesh_shape = spec.mesh._mesh.shape
            n, k = shape[d], mesh_shape[m]
            if -(-n // -(-n // k)) < k:  # torch.chunk leaves the last ranks empty
                return False
        elif kind is not Replicate and kind is not Partial:
            return False
    for p in out._spec.placements:
        kind = type(p)
        if kind is not Shard and kind is not Replicate and kind is not Partial:
            return False
    return True


def _numpy_copies(a, target) -> bool:
    """Whether NumPy's reshape of ``a`` to ``target`` is a copy, judged from the
    order and direction of this rank's local axes in memory (a transpose's are
    reversed, a flip's run backwards): asked of an array of ``a``'s global shape
    laid out so, over a single byte that is never read."""
    local = a._data()
    if local.flags.c_contiguous or local.ndim != a.ndim:
        return False
    order = sorted(range(local.ndim), key=lambda d: -abs(local.strides[d]))
    strides, step = [0] * a.ndim, 1
    for d in reversed(order):
        # a flipped dim keeps its sign: NumPy copies to merge it with another
        strides[d] = step if local.strides[d] >= 0 else -step
        step *= a.shape[d]
    layout = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), a.shape, strides)
    try:
        layout.reshape(target, copy=False)
    except ValueError:
        return True
    return False


def _view(a, src, shape, order, copy, plain):
    """The reshape as a view, no data moved, where torch's is one: of a ``plain``
    input, when a merge takes a Shard that is not on its group's first dim (a
    _StridedShard, mpitensor._strided); of a strided input's plain expansion, any
    view the core finds. None otherwise."""
    placements = a._spec.placements
    if plain:
        for p in placements:
            if type(p) is Shard and p.dim > 0:
                break
        else:
            return None
    target = _target_shape(math.prod(src), shape, order)
    if plain and len(target) >= len(src):
        return None
    view = _layouts.view_placements(src, placements, target, a._spec.mesh.shape)
    if view is None or (plain and not _layouts.has_strided(view)):
        return None
    return restride(a, target, view, bool(copy))


def _reshape_copy(local, box):
    return local.reshape(box).copy()


@_registry.implements(np.ravel, takes_strided=True, views=True)
def ravel(a, order="C"):
    """numpy.ravel of a DTensor (also ``dt.ravel()`` and ``dt.flatten()``), which is
    ``reshape(a, -1)``: a Shard of the leading dim stays where every rank's share
    scales (always for even shards), otherwise the input moves first. Collective on
    the mesh when the input must move.

    Example (``mpiexec -n 2``)::

        >>> dt = distribute_tensor(np.arange(24.0).reshape(4, 6), mesh, [Shard(0)])
        >>> np.ravel(dt).placements
        (Shard(dim=0),)
    """
    a = _dtensor("ravel", a)
    program = _registry.program_call(np.ravel)
    if order not in ("C", "F", "A", "K"):
        raise _registry.NoRule(f"numpy.ravel: order={order!r}")  # NumPy's error, gathered
    if a.ndim > 1 and order in ("A", "K"):
        order = _memory_order(a, order)
    if a.ndim > 1 and order == "F":
        return _ravel_reversed(a, program)
    out = reshape(a, -1)
    return _as_numpy_gives(a, out, None, program) if program else out


def _memory_order(a, order: str) -> str:
    """"C" or "F": the order NumPy's ravel reads ``a`` in for ``order`` "A" (F where
    the array is Fortran- and not C-contiguous) or "K" (the order its memory runs:
    C where the dims' strides fall, F where they rise, as a transpose's), judged
    from every rank's local array; dims of one element count for neither.
    ValueError, on every rank, for a "K" whose memory runs the dims in another
    order. Collective on the mesh: one small all-reduce."""
    local = a._data()
    # The dims of more than one element globally: a rank's block may hold one
    # element of such a dim, whose stride still says where the dim runs.
    steps = [abs(s) for s, n in zip(local.strides, a.shape) if n > 1]
    bits = 0
    if local.ndim == a.ndim and local.size:  # an empty block has no memory to judge
        bits = (any(x < y for x, y in zip(steps, steps[1:]))
                | any(x > y for x, y in zip(steps, steps[1:])) << 1
                | (not local.flags.f_contiguous) << 2 | (not local.flags.c_contiguous) << 3)
    bits = _comm.any_bits(a._spec.mesh, bits)
    if order == "A":
        return "F" if not bits & 4 and bits & 8 else "C"
    if not bits & 1:
        return "C"
    if not bits & 2:
        return "F"
    raise ValueError("numpy.ravel(order='K') of a DTensor whose memory runs its dims in "
                     "an order neither C nor reversed: np.ravel(np.transpose(dt, axes)) "
                     "with the axes in the order wanted")


def _ravel_reversed(a, program: bool):
    """``np.ravel(a, order="F")``: the ravel of ``a``'s transpose, a view of ``a``
    for the program where NumPy's is one (``a``'s memory Fortran-contiguous)."""
    out = reshape(transpose(a), -1)
    if not program:
        return out

    def redo(p):
        return reshape(transpose(p), -1)

    def back(p, view, written):
        shape = p.shape[::-1]
        np.copyto(p, np.transpose(np.reshape(view, shape)),
                  where=np.transpose(np.reshape(written, shape)))
    local = a._data()
    return _views.keep(a, out, redo, back,
                       copies=not (local.flags.f_contiguous or local.size <= 1))
