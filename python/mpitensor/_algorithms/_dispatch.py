"""The op entries' side of the executor: dim maps and ``execute``.

Every operation is described by a dim map (csrc/include/mpitensor/core/prop.h). The
ufuncs and reductions register their signatures with the executor at import
(mt_dimmap_elementwise.py, _reductions.py), which builds their maps; the operations whose
arguments Python normalises (einsum, reshape, concatenate, softmax, ...) build
theirs here, on a memo miss only. An op entry normalises its arguments and calls
:func:`execute` once; the C executor (csrc/ext/ext_exec.c) decides (a memo hit,
or the map on a miss), moves the inputs, runs the entry's local function on the
local arrays, wraps the result, records it for autograd and emits the trace
events. A repeated call costs one lookup before NumPy runs on the local arrays.
"""

from __future__ import annotations


import numpy as np

from .. import _C, _args, _registry, _trace
from .._clib import CORE, MAX_NDIM, I, I64, call, dtype_code, struct
from .._dtensor import DTensor
from .._bind.core import (mt_dimmap_check, mt_dimmap_elementwise, mt_dimmap_matmul,
                          mt_partial_exact)

# The label kinds, partial rules and reduce ops of dim maps, from the core.
KEEP, CONTRACT, REDUCE, REPLICATE = (CORE.LABEL_KEEP, CORE.LABEL_CONTRACT,
                                     CORE.LABEL_REDUCE, CORE.LABEL_REPLICATE)
P_NONE, P_LINEAR_ALL, P_LINEAR_ONE, P_SAME_OP, P_ADDITIVE = (
    CORE.PARTIAL_NONE, CORE.PARTIAL_LINEAR_ALL, CORE.PARTIAL_LINEAR_ONE, CORE.PARTIAL_SAME_OP,
    CORE.PARTIAL_ADDITIVE)
R_SUM, R_AVG, R_PRODUCT, R_MAX, R_MIN = (CORE.REDUCE_SUM, CORE.REDUCE_AVG,
                                         CORE.REDUCE_PRODUCT, CORE.REDUCE_MAX,
                                         CORE.REDUCE_MIN)
# The most DTensor inputs one decision takes.
MAX_INPUTS = CORE.PROP_MAX_INPUTS

MAX_LABELS = CORE.PROP_MAX_LABELS


# An operation's dim map as the core reads it (the executor copies it on a memo
# miss and checks it again).
DimMap = struct("mt_dimmap")


def _fill(array, values, what: str) -> int:
    """``values`` into the ctypes ``array``; their count."""
    values = tuple(values)
    if len(values) > len(array):
        raise ValueError(f"{what} has {len(values)} entries; at most {len(array)} are "
                         "supported")
    array[:len(values)] = values
    return len(values)


def dimmap(in_labels, out_labels, kinds, *, in_bcast=None, reduce_ops=None,
           even_only=0, partial_rule=P_NONE, partial_inputs=0, partial_ops=0,
           sizes=None, out_sizes=None) -> DimMap:
    """A checked C dim map. ``kinds`` has one label kind per label; ``reduce_ops``
    maps REDUCE labels to their op; ``sizes`` maps labels no input holds
    (keepdims' size-1 dims) to their size; ``out_sizes`` maps output dims resized
    from their label's size (reshape's groups) to their size. Local.

    Example: ``dimmap([range(2)], [1, 0], [KEEP, KEEP])`` is a transpose's.
    """
    m, in_labels = DimMap(), tuple(in_labels)
    if len(in_labels) > MAX_INPUTS:
        raise ValueError(f"at most {MAX_INPUTS} inputs are supported")
    m.ninputs = len(in_labels)
    for i, labels in enumerate(in_labels):
        m.in_ndim[i] = _fill(m.in_labels[i], labels, "input labels")
    if in_bcast is not None and _fill(m.in_bcast, in_bcast, "in_bcast") != m.ninputs:
        raise ValueError("in_bcast needs one bitmask per input")
    m.out_ndim = _fill(m.out_labels, out_labels, "output labels")
    m.nlabels = _fill(m.label_kind, kinds, "label kinds")
    for label, op in (reduce_ops or {}).items():
        m.label_reduce_op[label] = op
    for label, size in (sizes or {}).items():
        m.label_size[label] = size
        m.sized_labels |= 1 << label
    for d, size in (out_sizes or {}).items():
        m.out_size[d] = size
        m.out_resized |= 1 << d
    m.even_only, m.partial_rule = even_only, partial_rule
    m.partial_inputs, m.partial_ops = partial_inputs, partial_ops
    call(mt_dimmap_check, m)
    return m


def dimmap_elementwise(kind: int, noperands: int, tensors: int, shapes) -> DimMap:
    """The core's dim map of an elementwise op (an ELEMENTWISE_* kind) of
    ``noperands`` operands, those in the bitmask ``tensors`` tensors of ``shapes``.
    Local."""
    shapes = tuple(tuple(s) for s in shapes)
    if len(shapes) > MAX_INPUTS:
        raise ValueError("too many shapes")
    nd, sh, m = (I * MAX_INPUTS)(), (I64 * MAX_NDIM * MAX_INPUTS)(), DimMap()
    for i, s in enumerate(shapes):
        nd[i] = _fill(sh[i], s, "shape")
    call(mt_dimmap_elementwise, kind, noperands, tensors, nd, sh, m)
    return m


def dimmap_matmul(a_shape, b_shape, transpose_b: bool) -> DimMap:
    """The core's dim map of a @ b (or a @ b.T with ``transpose_b``). Local."""
    a, b, m = (I64 * MAX_NDIM)(), (I64 * MAX_NDIM)(), DimMap()
    na, nb = _fill(a, a_shape, "a_shape"), _fill(b, b_shape, "b_shape")
    call(mt_dimmap_matmul, na, a, nb, b, bool(transpose_b), m)
    return m


def keeps_partial(reduce_op: str, dtype, result, *, arithmetic=False) -> bool:
    """Whether a pending ``Partial(reduce_op)`` of ``dtype`` values stays exact
    through an operation whose local result has dtype ``result`` (the executor's
    rule, the core's mt_partial_exact): not where the cast is not linear (float to
    int, to or from bool, a wider int), where ints would average (they floor), nor,
    with ``arithmetic`` (negating or adding to a Partial(max|min)), for ints, which
    wrap. Local.

    Example: ``keeps_partial("sum", np.float64, np.int64)`` is False.
    """
    op = CORE.REDUCE_OPS.index(reduce_op)
    return bool(mt_partial_exact(op, dtype_code(dtype), dtype_code(result), bool(arithmetic)))


def same_mesh(op_name: str, inputs):
    """The mesh of the DTensor inputs, which must be one (ValueError otherwise)."""
    mesh = inputs[0]._spec.mesh
    for x in inputs[1:]:
        m = x._spec.mesh
        if m is not mesh and m != mesh:
            raise _registry.mesh_error(op_name, mesh, m)
    return mesh


# execute(key, operands, build=None, local=None, *, extra=(), kwargs=None,
# box=False, axis=None, keepdims=False): runs an operation through the executor:
# ``key`` is a registered ufunc or reduction (its dim map is the core's) or a
# hashable key naming the operation and its static arguments, whose dim map
# ``build()`` gives on a memo miss; ``operands`` are DTensors of one mesh and
# scalars (ndarrays under implicit replication). ``local(*local_operands, *extra,
# **kwargs)`` computes on this rank's arrays (the registered ufunc or reduction
# method when None; a reduction gets ``axis`` first); with ``box`` it also gets
# this rank's output shape last. Returns a DTensor, or a tuple of them for several
# results. Collective on the mesh when an input moves. The extension's function
# itself: every operation written in Python calls it, and a Python frame here
# would cost a small operation more than its own work. Example:
# ``execute(("squeeze", (0,)), (a,), build, lambda x: np.squeeze(x, 0))``.
execute = _C.execute


def decide(key, operands, build=None) -> tuple:
    """(output placements, output shape, bytes the inputs move) of an operation,
    from the mesh's memo (made there on a miss), without running it. Local.

    Example: ``decide(np.add, (a, b))[0] == (Shard(0),)``.
    """
    return _C.decide(key, tuple(operands), build)


# The local array of a rank outside the mesh (empty, a 0-d zero for a 0-d
# result): the executor's own rule, for the entries that wrap results themselves.
outside_local = _C.outside_local


# -- operands ---------------------------------------------------------------------

# Python numbers (exactly), NumPy scalars and 0-d ndarrays: not inputs, passed to
# NumPy as they are; the executor's own rule, so both sides take the same operands.
is_scalar = _C.is_scalar


def implicit(operands) -> tuple:
    """The operands with each plain ndarray (not 0-d) that the executor replicates
    made the Replicate DTensor it makes, on the mesh of the first DTensor operand
    (no communication: every rank is trusted to hold the same array): one of one
    element always, as torch replicates a one-element tensor, and any inside
    ``implicit_replication()`` or on the local mesh (one rank: where
    ``to_local()`` puts a tensor autograd follows, with nothing to trust). The
    executor's own rule (``_C.implicit``, csrc/ext/ext_decide.c). Local.

    Example: ``implicit((dt, np.ones(1)))[1].placements == (Replicate(),)``.
    """
    return _C.implicit(tuple(operands))


def split_operands(name: str, operands):
    """(DTensor inputs, pattern of which operands they are) of an elementwise call,
    after implicit replication; scalars stay operands, a plain numeric ndarray is a
    TypeError, one of values a DTensor cannot hold (dates, strings: xarray's
    coordinates) is NoRule, for NumPy on the gathered arrays, and anything else
    gives None (NotImplemented for ufuncs)."""
    inputs, pattern = [], []
    for obj in implicit(operands):
        if type(obj) is DTensor:
            inputs.append(obj)
            pattern.append(True)
        elif is_scalar(obj):
            pattern.append(False)
        elif isinstance(obj, np.ndarray):
            if not _args.holds(obj.dtype):
                raise _registry.NoRule(f"{name}: a DTensor beside an array of "
                                       f"{obj.dtype} values")
            raise mixed_error(name, obj)
        else:
            return None
    return inputs, tuple(pattern)


mixed_error = _registry.mixed_error  # the executor's words, for the rules here


def relayout(what: str, a, placements, *, records=False):
    """``a`` redistributed to ``placements`` by the executor for the operation named
    ``what``, which the logs and the collective checks name. A Shard that becomes
    Replicate is a gather the operation needs: reported by ``_trace.report_gather``
    unless ``records`` (``a`` is a few numbers per output element, as the merged
    reductions gather, not the operation's input). Collective on the mesh when
    anything moves.

    Example: ``relayout("numpy.sort", dt, (Replicate(),))``.
    """
    placements = tuple(placements)
    if placements == a._spec.placements:
        return a
    if not records:
        _trace.report_move(what, a._spec, placements)
    return _C.move(a, placements, what)

