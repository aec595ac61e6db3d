"""Running a NumPy operation on DTensors: decide, redistribute, compute, wrap.

Every supported operation is described by a dim map (see csrc/include/mpitensor/
prop.h) that the C engine turns into a decision: the placements each input must
have, and the output's placements and global shape. A decision is made once per
(operation, static arguments, input placements, shapes, dtypes) and kept on the
mesh, so a cached call costs one dict lookup before NumPy runs on the local arrays.
The operations register themselves in mpitensor._registry (``implements``).
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import _C, _modes, _trace
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._redistribute import check_targets, plan_for
from ..placement_types import from_code

# mt_label_kind, mt_partial_rule and mt_reduce_op (prop.h, layout.h).
KEEP, CONTRACT, REDUCE, REPLICATE = 0, 1, 2, 3
P_NONE, P_LINEAR_ALL, P_LINEAR_ONE, P_SAME_OP = 0, 1, 2, 3
R_SUM, R_AVG, R_PRODUCT, R_MAX, R_MIN = 0, 1, 2, 3, 4


def dimmap(in_labels, out_labels, kinds, *, in_bcast=None, reduce_ops=None,
           even_only=0, partial_rule=P_NONE, partial_inputs=0, partial_ops=0,
           sizes=None, out_sizes=None) -> "_C.DimMap":
    """A checked C dim map. ``kinds`` has one mt_label_kind per label;
    ``reduce_ops`` maps REDUCE labels to their op; ``sizes`` maps labels no input
    holds (keepdims' size-1 dims) to their size; ``out_sizes`` maps output dims
    resized from their label's size (reshape's groups) to their size."""
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


class Decision:
    """What an operation does on given inputs: a redistribute plan per input (None
    where the input is used as it is) and the output's placements, shape, strides."""

    __slots__ = ("plans", "out_placements", "out_shape", "out_stride", "local_only")

    def __init__(self, plans, out_placements, out_shape):
        self.plans = plans
        self.out_placements = out_placements
        self.out_shape = out_shape
        self.out_stride = contiguous_strides(out_shape)
        # No input is redistributed: the C fast path may run this decision.
        self.local_only = all(p is None for p in plans)


def _decide(mesh, inputs, dmap) -> Decision:
    specs = [x._spec for x in inputs]
    in_codes, out_codes, out_shape = _C.propagate(
        dmap, mesh.shape, [s.shape for s in specs],
        [tuple(p._code for p in s.placements) for s in specs],
        [s.dtype.itemsize for s in specs])
    plans = []
    for s, codes in zip(specs, in_codes):
        dst = tuple(from_code(c) for c in codes)
        if dst == s.placements:
            plans.append(None)
            continue
        check_targets(s.placements, dst, s.dtype)
        plans.append(plan_for(mesh, s.shape, s.placements, dst, s.dtype.itemsize))
    return Decision(tuple(plans), tuple(from_code(c) for c in out_codes), tuple(out_shape))


def same_mesh(op_name: str, inputs):
    mesh = inputs[0]._spec.mesh
    for x in inputs[1:]:
        m = x._spec.mesh
        if m is not mesh and m != mesh:
            raise ValueError(
                f"{op_name}: the DTensors live on different device meshes ({mesh} and "
                f"{m}); redistribute them onto one mesh first"
            )
    return mesh


def decide(key, mesh, inputs, build_map) -> Decision:
    """The cached decision for ``key``; ``build_map()`` makes the dim map on a miss."""
    dec = mesh._decisions.get(key)
    if dec is None:
        dec = mesh._decisions[key] = _decide(mesh, inputs, build_map())
        if _modes.tracing:
            _trace.decision(key, inputs, dec, False)
    elif _modes.tracing:
        _trace.decision(key, inputs, dec, True)
    return dec


def local_inputs(mesh, inputs, dec: Decision) -> list:
    """Each input's local array after the redistribution the decision needs.
    Collective on the mesh when a plan has steps."""
    if mesh._coordinate is None:
        # Not a member: no data; run on stand-ins only to learn the output dtype.
        return [np.zeros((1,) * x.ndim, x.dtype) for x in inputs]
    handle = mesh._handle
    if _modes.tracing:
        for x, p in zip(inputs, dec.plans):
            if p is not None:
                _trace.redistribute("operation", mesh, p, x._spec.shape, x._spec.dtype)
    return [x.to_local() if p is None else _C.redistribute(handle, p, x.to_local())
            for x, p in zip(inputs, dec.plans)]


def wrap(mesh, dec: Decision, local):
    """A DTensor of the decision's output spec around a local result."""
    if type(local) is not np.ndarray:
        local = np.asarray(local)
    if mesh._coordinate is None:
        local = np.empty((0,), local.dtype)
    return DTensor(local, DTensorSpec(mesh, dec.out_placements, dec.out_shape,
                                      local.dtype, dec.out_stride))


def input_key(op_key, inputs) -> tuple:
    """The cache key: the op's static key and each input's placements, shape, dtype."""
    if len(inputs) == 1:
        s = inputs[0]._spec
        return (op_key, s.placements, s.shape, s.dtype)
    s, t = inputs[0]._spec, inputs[1]._spec
    key = (op_key, s.placements, s.shape, s.dtype, t.placements, t.shape, t.dtype)
    for x in inputs[2:]:
        s = x._spec
        key += (s.placements, s.shape, s.dtype)
    return key


# -- operands ---------------------------------------------------------------------

def is_scalar(obj) -> bool:
    """Python and NumPy scalars and 0-d ndarrays: not inputs, passed to NumPy as is."""
    if isinstance(obj, (numbers.Number, np.generic)):
        return True
    return type(obj) is np.ndarray and obj.ndim == 0


def implicit(operands) -> tuple:
    """Inside ``implicit_replication()``, plain ndarrays (not 0-d) among the operands
    become Replicate DTensors on the mesh of the first DTensor operand (no
    communication: every rank is trusted to hold the same array); else unchanged."""
    if not _modes.implicit_replication:
        return tuple(operands)
    mesh = next((o._spec.mesh for o in operands if type(o) is DTensor), None)
    if mesh is None:
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
        f"mpitensor.distribute_tensor(array, mesh, placements) first"
    )
