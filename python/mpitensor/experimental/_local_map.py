"""local_map: run a function written for NumPy arrays on the local shards of DTensors.

Port of ``torch.distributed.tensor.experimental.local_map`` (torch 2.8). Differences:

* the global shape of every output is computed from the local shapes of all ranks, so
  uneven shards (the last ranks holding fewer rows, as ``torch.chunk`` lays them out)
  get their true global shape, where torch assumes even shards. This makes the
  wrapped function **collective on the mesh** whenever an output has a Shard
  placement: one all-gather of the outputs' sizes per mesh dim that shards
  something, then one agreement (``any``) on whether the local shapes form a valid
  ``torch.chunk`` layout and the outputs have the same dtypes and numbers of dims on
  every rank (ValueError on every rank when they do not; an output that does not
  match ``out_placements`` on some rank raises there and on the others alike,
  torch's AssertionError arriving as a ValueError). Outputs with
  only Replicate/Partial placements communicate nothing (their global shape is the
  local shape);
* every input DTensor must live on ``device_mesh`` (AssertionError), as the torch
  documentation states (torch's code does not check it);
* ``out_placements`` given as a tuple of Placement objects (``(Shard(0),)``) is one
  output's placements, not one placement per output;
* NumPy arrays carry no autograd graph: an input that requires grad, in grad mode,
  reaches ``func`` as its local DTensor on the local mesh (``DTensor.to_local``),
  whose gradient comes back with ``in_grad_placements[i]`` (default: the input's
  placements, as torch); ``func``'s NumPy operations on it are recorded, and its
  outputs (local DTensors) become the output DTensors, so gradients flow through.
  An operation inside ``func`` with no backward rule raises NotImplementedError.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from .. import _comm
from .._dtensor import DTensor
from .._dtensor_spec import contiguous_strides
from .._fingerprint import fingerprint
from .._layout import compute_local_shape_and_global_offset
from ..device_mesh import _mesh_stack, local_mesh
from ..placement_types import Placement, Shard

__all__ = ["local_map"]


# -- a minimal pytree: tuples, lists and dicts are containers, the rest are leaves --
def _flatten(tree, leaves: list):
    if type(tree) in (tuple, list):
        return (type(tree), [_flatten(x, leaves) for x in tree])
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # namedtuple
        return (type(tree), [_flatten(x, leaves) for x in tree])
    if type(tree) is dict:
        return (dict, [(k, _flatten(v, leaves)) for k, v in tree.items()])
    leaves.append(tree)
    return None


def _unflatten(spec, it):
    if spec is None:
        return next(it)
    kind, children = spec
    if kind is dict:
        return {k: _unflatten(c, it) for k, c in children}
    values = [_unflatten(c, it) for c in children]
    if kind in (tuple, list):
        return kind(values)
    return kind(*values)  # namedtuple


def _is_placements(spec) -> bool:
    """One PlacementType: a non-empty sequence of Placement objects."""
    return (isinstance(spec, (list, tuple)) and len(spec) > 0
            and all(isinstance(p, Placement) for p in spec))


def _as_placements(spec, mesh, what: str) -> tuple:
    if not isinstance(spec, (list, tuple)) or not all(isinstance(p, Placement) for p in spec):
        raise TypeError(f"{what} must be a sequence of Placement objects, got {spec!r}")
    spec = tuple(spec)
    if len(spec) != mesh.ndim:
        raise ValueError(f"{what} {spec} has {len(spec)} placements for a "
                         f"{mesh.ndim}-d device mesh")
    return spec


def local_map(func: Callable | None = None, out_placements=None, in_placements=None,
              in_grad_placements=None, device_mesh=None, *,
              redistribute_inputs: bool = False):
    """Wrap ``func`` (written for ndarrays) so that it takes and returns DTensors.

    The wrapped function flattens its positional arguments (tuples, lists and dicts
    are walked), passes each DTensor's local ndarray to ``func`` and wraps every
    ndarray of ``func``'s flattened output as a DTensor with its entry of
    ``out_placements``; keyword arguments are passed through untouched.

    * ``out_placements``: for a single output, its placements (``[Shard(0)]``); for
      several outputs (tuple/list/dict output), a tuple with one entry per flattened
      output: placements for an ndarray, ``None`` for anything else.
    * ``in_placements``: one entry per flattened positional argument; a DTensor's
      entry must equal its placements (else ValueError) unless
      ``redistribute_inputs=True``, which redistributes it first (collective); a
      non-array argument's entry must be None; plain ndarrays pass unchecked.
    * ``device_mesh``: default the mesh of the first DTensor argument, else the
      ``with mesh:`` mesh. Every DTensor argument must be on it (AssertionError).
    * When no argument is a DTensor, ``func``'s output is returned unchanged.
    * ``in_grad_placements``: for inputs that require grad (in grad mode), the
      placements their local gradients come back with (default: the input's own).
      Such an input reaches ``func`` as a DTensor on the local mesh, so that its
      NumPy operations are recorded for autograd.

    Collective on the mesh when an output has a Shard placement (its global shape
    is assembled from every rank's local shape, so uneven shards are exact) or when
    an input is redistributed; otherwise local.

    Usable as a decorator: ``@local_map(out_placements=[Replicate()], ...)``.

    Example (``mpiexec -n 2``)::

        >>> def mm_allreduce(W, X):          # W: [Shard(1)], X: [Shard(0)]
        ...     return W @ X                 # this rank's partial product
        >>> f = local_map(mm_allreduce, out_placements=[Partial()],
        ...               in_placements=([Shard(1)], [Shard(0)]))
        >>> f(W_dt, X_dt).full_tensor()      # == W @ X
    """
    if func is None:
        return functools.partial(local_map, out_placements=out_placements,
                                 in_placements=in_placements,
                                 in_grad_placements=in_grad_placements,
                                 device_mesh=device_mesh,
                                 redistribute_inputs=redistribute_inputs)
    if not callable(func):
        raise TypeError(f"local_map needs a callable func, got {type(func).__name__}")

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        return _local_map_wrapped(func, out_placements, in_placements, in_grad_placements,
                                  device_mesh, redistribute_inputs, *args, **kwargs)

    return wrapped


def _local_map_wrapped(func, out_placements, in_placements, in_grad_placements,
                       device_mesh, redistribute_inputs, *args, **kwargs):
    flat_args: list = []
    args_spec = _flatten(args, flat_args)
    for name, given in (("in_placements", in_placements),
                        ("in_grad_placements", in_grad_placements)):
        if given is not None and len(given) != len(flat_args):
            raise AssertionError(f"{name} length {len(given)} does not match the number "
                                 f"of input args {len(flat_args)}!")
    mesh = device_mesh
    if mesh is None:
        mesh = next((a.device_mesh for a in flat_args if isinstance(a, DTensor)), None)
        if mesh is None and _mesh_stack:
            mesh = _mesh_stack[-1]
    flat_local: list = []
    seen_dtensor = False
    for idx, arg in enumerate(flat_args):
        if isinstance(arg, DTensor):
            seen_dtensor = True
            if arg.device_mesh != mesh:
                raise AssertionError(
                    f"local_map: input {idx} is on {arg.device_mesh!r}, not on the "
                    f"device mesh {mesh!r}; every DTensor input must be on the same mesh")
            if in_placements is not None:
                spec = in_placements[idx]
                if spec is None:
                    raise AssertionError(
                        f"DTensor input {idx} expects placements but received None!")
                spec = _as_placements(spec, mesh, f"in_placements[{idx}]")
                if arg.placements != spec:
                    if redistribute_inputs:
                        arg = arg.redistribute(mesh, spec)
                    else:
                        raise ValueError(
                            f"arg {idx} in local_map has mismatched placements: arg "
                            f"placements is {arg.placements} but the input placements "
                            f"is {spec}! If redistribute_inputs is wanted, set "
                            "redistribute_inputs=True to local_map.")
            if in_grad_placements is not None and in_grad_placements[idx] is None:
                raise AssertionError(
                    f"DTensor input {idx} expects in grad placements but received None!")
            grad_pl = None if in_grad_placements is None else \
                _as_placements(in_grad_placements[idx], mesh, f"in_grad_placements[{idx}]")
            flat_local.append(arg.to_local(grad_placements=grad_pl))
        else:
            if (in_placements is not None and not isinstance(arg, np.ndarray)
                    and in_placements[idx] is not None):
                raise AssertionError(f"Non-array input {idx} ({type(arg).__name__}) "
                                     f"expects None placements but received "
                                     f"{in_placements[idx]}!")
            flat_local.append(arg)
    out = func(*_unflatten(args_spec, iter(flat_local)), **kwargs)
    if not seen_dtensor:
        return out
    flat_out: list = []
    out_spec = _flatten(out, flat_out)
    if isinstance(out_placements, tuple) and not _is_placements(out_placements):
        specs = out_placements
    else:
        specs = (out_placements,)
    # The placements come from the arguments alone, so every rank makes the same
    # collectives; what func returned is checked into `problem`, which the ranks
    # agree on when the outputs' shapes are exchanged (a rank raising alone would
    # leave the others waiting there).
    placements = [None if spec is None else _as_placements(spec, mesh, f"out_placements[{i}]")
                  for i, spec in enumerate(specs)]
    problem = _output_problem(flat_out, specs)
    shapes = _global_shapes(flat_out, placements, mesh, problem)
    wrapped = [o if pl is None else
               DTensor.from_local(o, mesh, pl, shape=shp, stride=contiguous_strides(shp))
               for o, pl, shp in zip(flat_out, placements, shapes)]
    return _unflatten(out_spec, iter(wrapped))


def _output_problem(outs: Sequence[Any], specs: Sequence):
    """The AssertionError for outputs that do not match ``specs``, or None. Local."""
    if len(outs) != len(specs):
        return AssertionError(
            "local_map requires one PlacementType be provided for each output value, "
            f"received {len(specs)} out_placements but {len(outs)} is expected!")
    for i, (o, spec) in enumerate(zip(outs, specs)):
        local = isinstance(o, DTensor) and o.device_mesh is local_mesh()
        if isinstance(o, DTensor) and not local:
            return AssertionError(f"output {i}: a local ndarray is expected, "
                                  f"func returned a DTensor")
        if (isinstance(o, np.ndarray) or local) and spec is None:
            return AssertionError(f"ndarray output {i} expects placements but "
                                  "received None!")
        if not (isinstance(o, np.ndarray) or local) and spec is not None:
            return AssertionError(f"Non-array output {i} ({type(o).__name__}) expects "
                                  f"None placements but received {spec}!")
    return None


def _global_shapes(outs: Sequence[Any], placements: Sequence, mesh,
                   problem=None) -> list:
    """Global shape of every ndarray output (None for the others). Collective on the
    mesh when some output is sharded: one all-gather of the local sizes of the
    sharded tensor dims per mesh dim that shards something, summed (nested shards of
    one tensor dim sum over each of their mesh dims in turn), then one agreement on
    whether every rank's local shape is its torch.chunk shard of the result and
    every rank's outputs have the same dtypes and numbers of dims, which also
    carries ``problem`` (a rank's outputs that do not match the placements). Local
    when no output is sharded: ``problem`` is then raised here."""
    slots = [(i, p, d) for i, pl in enumerate(placements) if pl is not None
             for d, p in enumerate(pl) if isinstance(p, Shard)]
    coord = mesh.get_coordinate()
    if problem is not None and (not slots or coord is None):
        raise problem
    shapes: list = [None if pl is None or problem is not None else list(o.shape)
                    for o, pl in zip(outs, placements)]
    if coord is None or not slots:  # a non-member's from_local makes an empty DTensor
        return [None if s is None else tuple(s) for s in shapes]
    # (output, tensor dim, mesh dim) for every Shard placement, negative dims resolved;
    # a rank with a problem takes part with sizes of 0.
    resolved = []
    for i, p, d in slots:
        ndim = len(shapes[i]) if problem is None else 1
        t = p.dim + ndim if p.dim < 0 else p.dim
        if problem is None and not 0 <= t < ndim:
            problem = IndexError(f"out_placements[{i}]: {p} is out of range for a "
                                 f"{ndim}-d output")
        resolved.append((i, t if problem is None else None, d))
    for d in range(mesh.ndim):
        mine = [(i, t) for i, t, dd in resolved if dd == d]
        if not mine or mesh.shape[d] == 1:
            continue
        sizes = [0 if t is None else shapes[i][t] for i, t in mine]
        # The extension gathers at most 64 values a call; every rank has the same slots.
        total = []
        for k in range(0, len(sizes), 64):
            part = sizes[k:k + 64]
            got = _comm.ring_allgather_int64(mesh, d, part)
            total += [sum(got[j::len(part)]) for j in range(len(part))]
        if problem is None:
            for (i, t), n in zip(mine, total):
                shapes[i][t] = n
    for i, (o, pl) in enumerate(zip(outs, placements)):
        if pl is None or problem is not None:
            continue
        expect, _ = compute_local_shape_and_global_offset(tuple(shapes[i]), mesh, pl)
        if tuple(expect) != tuple(o.shape):
            problem = ValueError(
                f"local_map: the local outputs do not form one global tensor laid out as "
                f"torch.chunk shards: output {i}: local shape {o.shape} on rank "
                f"{mesh.get_rank()} is not its shard {tuple(expect)} of the global shape "
                f"{tuple(shapes[i])} under {pl}")
    kinds = [] if problem is not None else [
        (np.dtype(o.dtype).str, o.ndim) for o, pl in zip(outs, placements) if pl is not None]
    # An AssertionError travels as a ValueError: an agreement carries a status code,
    # whose Python exceptions do not include AssertionError.
    _comm.agree(mesh, problem is None, fingerprint(kinds),
             f"local_map: {problem}" if isinstance(problem, AssertionError) else
             str(problem) if problem is not None else
             f"local_map: the outputs differ in dtype or number of dims across the ranks "
             f"of the mesh ({kinds} on rank {mesh.get_rank()})",
             ValueError if isinstance(problem, AssertionError) else
             type(problem or ValueError()))
    return [None if s is None else tuple(s) for s in shapes]
