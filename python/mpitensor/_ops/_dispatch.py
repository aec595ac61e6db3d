"""The Python entry of NumPy operations on DTensors: decide, redistribute, compute,
wrap.

Every operation is described by a dim map (csrc/include/mpitensor/prop.h). The
ufuncs and reductions register their signatures with the C dispatch at import
(_elementwise.py, _reductions.py), which builds their maps; the operations driven
from Python (einsum, reshape, concatenate, softmax, ...) build theirs here, on a
miss only. Either way the decision lives in the mesh's C memo, keyed by the
operation and the identity of the inputs' layouts: a repeated call costs one
lookup before NumPy runs on the local arrays, and an operation decided by the C
path is decided for its Python entry too.
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import _C, _modes, _redistribute, _trace, device_mesh as _device_mesh
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec

# The label kinds, partial rules and reduce ops of dim maps, from the core.
KEEP, CONTRACT, REDUCE, REPLICATE = (_C.LABEL_KEEP, _C.LABEL_CONTRACT, _C.LABEL_REDUCE,
                                     _C.LABEL_REPLICATE)
P_NONE, P_LINEAR_ALL, P_LINEAR_ONE, P_SAME_OP = (
    _C.PARTIAL_NONE, _C.PARTIAL_LINEAR_ALL, _C.PARTIAL_LINEAR_ONE, _C.PARTIAL_SAME_OP)
R_SUM, R_AVG, R_PRODUCT, R_MAX, R_MIN = (_C.REDUCE_SUM, _C.REDUCE_AVG, _C.REDUCE_PRODUCT,
                                         _C.REDUCE_MAX, _C.REDUCE_MIN)
# The most DTensor inputs one decision takes.
MAX_INPUTS = _C.PROP_MAX_INPUTS


def dimmap(in_labels, out_labels, kinds, *, in_bcast=None, reduce_ops=None,
           even_only=0, partial_rule=P_NONE, partial_inputs=0, partial_ops=0,
           sizes=None, out_sizes=None) -> "_C.DimMap":
    """A checked C dim map. ``kinds`` has one label kind per label; ``reduce_ops``
    maps REDUCE labels to their op; ``sizes`` maps labels no input holds
    (keepdims' size-1 dims) to their size; ``out_sizes`` maps output dims resized
    from their label's size (reshape's groups) to their size. Local.

    Example: ``dimmap([range(2)], [1, 0], [KEEP, KEEP])`` is a transpose's.
    """
    n = len(kinds)
    ops = [0] * n
    for label, op in (reduce_ops or {}).items():
        ops[label] = op
    label_size, sized = [0] * n, 0
    for label, size in (sizes or {}).items():
        label_size[label] = size
        sized |= 1 << label
    bcast = tuple(in_bcast) if in_bcast is not None else (0,) * len(in_labels)
    args = (tuple(tuple(l) for l in in_labels), bcast, tuple(out_labels), tuple(kinds),
            tuple(ops), even_only, partial_rule, partial_inputs, partial_ops, sized,
            tuple(label_size))
    if out_sizes:
        out_size = [-1] * len(args[2])
        for d, size in out_sizes.items():
            out_size[d] = size
        args += (tuple(out_size),)
    return _C.DimMap(*args)


def same_mesh(op_name: str, inputs):
    """The mesh of the DTensor inputs, which must be one (ValueError otherwise)."""
    mesh = inputs[0]._spec.mesh
    for x in inputs[1:]:
        m = x._spec.mesh
        if m is not mesh and m != mesh:
            raise ValueError(
                f"{op_name}: the DTensors live on different device meshes ({mesh} and "
                f"{m}); redistribute them onto one mesh first"
            )
    return mesh


def _traced(op_key, operands, dec):
    if _modes.gather_report and not _modes.tracing:
        _trace._current_op = _trace.op_name(op_key)  # names a gather it reports
    if _modes.tracing:
        _trace.decision(op_key, [o for o in operands if type(o) is DTensor], dec,
                        dec.cached)
    return dec


def decide(op_key, operands, build_map) -> "_C.Decision":
    """The decision of the operation ``op_key`` (hashable: the function and its
    static arguments) on ``operands`` (DTensors of one mesh, and scalars whose
    types matter); ``build_map()`` makes its dim map on a miss. Local."""
    return _traced(op_key, operands, _C.decide(_C.op_id(op_key), operands, build_map))


def decide_ufunc(ufunc, operands) -> "_C.Decision":
    """The decision of a ufunc on DTensors and scalars: the C path's own. Local."""
    return _traced(ufunc, operands, _C.decide_ufunc(ufunc, operands))


def decide_reduction(func, a, axis, keepdims) -> "_C.Decision":
    """The decision of a registered reduction over ``axis`` (None, an int or a
    normalised tuple): the C path's own. Local."""
    return _traced(func, (a,), _C.decide_reduction(func, a, axis, keepdims))


def local_inputs(mesh, inputs, dec) -> list:
    """Each input's local array after the redistribution the decision needs.
    Collective on the mesh when a plan has steps."""
    if mesh._coordinate is None:
        # Not a member: no data; run on stand-ins only to learn the output dtype.
        return [np.zeros((1,) * x.ndim, x.dtype) for x in inputs]
    handle = mesh._handle
    if _modes.gather_report:
        for x, p in zip(inputs, dec.plans):
            if p is not None:
                _report_plan_gather(mesh, x._spec, p)
    if _modes.tracing:
        for x, p in zip(inputs, dec.plans):
            if p is not None:
                _trace.redistribute("operation", mesh, p, x._spec.shape, x._spec.dtype)
    out = [x.to_local() if p is None else _C.redistribute(handle, p, x.to_local())
           for x, p in zip(inputs, dec.plans)]
    # A Replicate input partitioned into Partial(sum) counts on one rank only.
    return [np.zeros_like(a) if z else a for a, z in zip(out, dec.zeroed)]


def _report_plan_gather(mesh, spec, plan):
    """report_gather for an input whose decided plan turns a Shard into Replicate."""
    _, dst = _trace._plan_placements(mesh, plan, plan.steps())
    _trace.report_move(_trace._current_op or "an operation", spec, dst)


def outside_local(shape, dtype) -> np.ndarray:
    """The local array of a rank outside the mesh: empty, and 0-d (zero) for a 0-d
    result, as torch's op on an empty local gives. Local.

    Example: ``outside_local((), np.float64).shape == ()``.
    """
    return np.zeros((), dtype) if len(shape) == 0 else np.empty((0,), dtype)


def wrap(mesh, dec, local):
    """A DTensor of the decision's output spec around a local result."""
    if type(local) is not np.ndarray:
        local = np.asarray(local)
    if mesh._coordinate is None:
        local = outside_local(dec.out_shape, local.dtype)
    return DTensor(local, DTensorSpec(mesh, dec.out_placements, dec.out_shape,
                                      local.dtype, dec.out_stride))


# -- operands ---------------------------------------------------------------------

def is_scalar(obj) -> bool:
    """Python and NumPy scalars and 0-d ndarrays: not inputs, passed to NumPy as is."""
    if isinstance(obj, (numbers.Number, np.generic)):
        return True
    return type(obj) is np.ndarray and obj.ndim == 0


def implicit(operands) -> tuple:
    """Inside ``implicit_replication()``, plain ndarrays (not 0-d) among the operands
    become Replicate DTensors on the mesh of the first DTensor operand (no
    communication: every rank is trusted to hold the same array); else unchanged.
    On the local mesh (one rank: where ``to_local()`` puts a tensor autograd
    follows) an ndarray is always such a DTensor, with nothing to trust, so it
    mixes with local DTensors as it mixes with ndarrays."""
    if not _modes.implicit_replication and _device_mesh._local_mesh is None:
        return tuple(operands)
    mesh = next((o._spec.mesh for o in operands if type(o) is DTensor), None)
    if mesh is None or not (_modes.implicit_replication
                            or _device_mesh.is_local_mesh(mesh)):
        return tuple(operands)
    return tuple(DTensor.from_local(o, mesh) if type(o) is np.ndarray and o.ndim > 0
                 else o for o in operands)


def split_operands(name: str, operands):
    """(DTensor inputs, pattern of which operands they are) of an elementwise call,
    after implicit replication; scalars stay operands, a plain ndarray is a
    TypeError, and anything else gives None (NotImplemented for ufuncs)."""
    inputs, pattern = [], []
    for obj in implicit(operands):
        if type(obj) is DTensor:
            inputs.append(obj)
            pattern.append(True)
        elif is_scalar(obj):
            pattern.append(False)
        elif isinstance(obj, np.ndarray):
            raise mixed_error(name, obj)
        else:
            return None
    return inputs, tuple(pattern)


def mixed_error(op_name: str, obj) -> TypeError:
    what = (f"a plain ndarray of shape {obj.shape}" if isinstance(obj, np.ndarray)
            else f"a {type(obj).__name__}")
    return TypeError(
        f"{op_name}: mixing a DTensor with {what} is not supported; wrap it with "
        f"mpitensor.distribute_tensor(array, mesh, placements) first, or, when every "
        f"rank holds the same array, run the operation inside "
        f"mpitensor.experimental.implicit_replication()"
    )


def relayout(what: str, a, placements, *, records=False):
    """``a`` redistributed to ``placements`` for the operation named ``what``, which
    the logs and the collective checks name. A Shard that becomes Replicate is a
    gather the operation needs: reported by ``_trace.report_gather`` unless ``records``
    (``a`` is a few numbers per output element, as the merged reductions gather,
    not the operation's input). Collective on the mesh when anything moves.

    Example: ``relayout("numpy.sort", dt, (Replicate(),))``.
    """
    spec = a._spec
    placements = tuple(placements)
    if placements == spec.placements:
        return a
    mesh = spec.mesh
    plan = _redistribute.plan_for(mesh, spec.shape, spec.placements, placements,
                                  spec.dtype)
    if not records:
        _trace.report_move(what, spec, placements)
    out_spec = DTensorSpec(mesh, placements, spec.shape, spec.dtype, spec.stride)
    if mesh._coordinate is None:
        return DTensor(a.to_local(), out_spec)
    if _modes.tracing:
        _trace._current_op = what
        _trace.redistribute("operation", mesh, plan, spec.shape, spec.dtype)
    return DTensor(_redistribute.run(mesh, plan, a.to_local(), False), out_spec)

