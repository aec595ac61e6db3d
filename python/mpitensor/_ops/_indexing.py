"""Basic indexing of DTensors: ``dt[...]`` with ints, slices (any step), ``None``
and ``...`` (a boolean mask or an integer array alone, or one integer array among
slices: _advanced_index.py).

Placements follow torch's rules for select, slice and unsqueeze: a Shard of a dim
that the key keeps whole (``:``) follows that dim; a Shard of a dim that an int or
a partial slice cuts becomes Replicate; Replicate and every Partial stay (indexing
only picks elements). Only what the key picks moves: each rank cuts its local
array first, and when some sharded dim was cut, one exchange in C
(``_comm.select_exchange``) brings each rank exactly the picked elements its output
box lacks; an int index on a sharded dim is sent by its owner alone. Cutting
replicated or whole dims is local.

A basic index is a view, as NumPy's, whatever it cuts: a local cut is a NumPy
view of the local array; an exchange's result is new memory, made a copy-view of
``dt`` (_views.py: read-only, and a write into it reaches ``dt``).

Every index is agreed, a read (``dt[key]``) as a write (``dt[key] = value``,
:func:`agree_write`), at any size: a key that differs by rank (``dt[rank]`` of a
Replicate DTensor, whose result must be the same on every rank; a slice that cuts
a sharded dim on one rank only, which would leave the others in an exchange it
never joins) raises the same ValueError on every rank, and a key that is invalid
on one rank raises its error on every rank, before anything moves. One small
all-reduce (the agreement primitive) per index, and none more where the key cuts
a sharded dim: the exchange's own agreement carries the key's fingerprint. A
rank that takes the exchange and one that does not pair the two agreements, so
their different fingerprints fail both.
"""

from __future__ import annotations

import functools
import operator

import numpy as np

from .. import _C, _clib, _comm, _modes, _registry, _strided, _trace
from .._bind import core
from .._call_agreement import call_fingerprint
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._fingerprint import fingerprint
from .._layout import local_shape_and_global_offset
from ..placement_types import Partial, Replicate, Shard
from .._algorithms import _advanced_index as A
from .._algorithms import _views
from .._algorithms._pick import pick_rows


def _advanced_error(what, cls=TypeError) -> TypeError:
    return cls(
        f"DTensor indexing supports ints, slices, None and ..., a boolean mask alone, "
        f"or one integer array (a list or 1-D ndarray) alone or among slices, None "
        f"and ..., not {what} (other "
        f"advanced indexing); index dt.full_tensor() for the whole array, or "
        f"dt.to_local() for this rank's shard")


def _as_int(obj):
    """The int of an integer index (Python/NumPy ints, 0-d integer arrays), else None."""
    if isinstance(obj, (bool, np.bool_)):
        return None
    if isinstance(obj, np.ndarray):
        return int(obj) if obj.ndim == 0 and obj.dtype.kind in "iu" else None
    try:
        return operator.index(obj)
    except TypeError:
        return None


# The slice that keeps a whole dim, as keys compare with it.
WHOLE = slice(None)


def _parse(key, shape):
    """(per input dim (start, step, count, is_int), output dims) for a basic key;
    an output dim is ('new',) for None or ('in', d) for a kept input dim."""
    if not isinstance(key, tuple):
        key = (key,)
    n = len(shape)
    used = 0
    for k in key:
        if k is None or k is Ellipsis:
            continue
        if isinstance(k, slice) or _as_int(k) is not None:
            used += 1
            continue
        # An array index NumPy takes (advanced indexing this rule has no algorithm
        # for) runs on the gathered arrays; anything else is a bad key.
        cls = _registry.NoRule if isinstance(k, (DTensor, np.ndarray, list)) else TypeError
        raise _advanced_error(f"an index of type {type(k).__name__}", cls)
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if used > n:
        raise IndexError(f"too many indices for DTensor: it is {n}-dimensional, but "
                         f"{used} were indexed")
    # Found by identity: == on a 0-d array index would compare elementwise.
    at = next((j for j, k in enumerate(key) if k is Ellipsis), None)
    if at is not None:
        key = key[:at] + (slice(None),) * (n - used) + key[at + 1:]
    else:
        key = key + (slice(None),) * (n - used)
    sel, out, d = [], [], 0
    for k in key:
        if k is None:
            out.append(("new",))
            continue
        size = shape[d]
        if isinstance(k, slice):
            start, stop, step = k.indices(size)
            sel.append((start, step, len(range(start, stop, step)), False))
            out.append(("in", d))
        else:
            i = _as_int(k)
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for axis {d} with size "
                                 f"{size}")
            sel.append((i % size, 1, 1, True))
        d += 1
    return sel, out


def _whole(s, size):
    """Whether a slice picks every index in order (so a Shard of it can stay)."""
    start, step, count, is_int = s
    return not is_int and count == size and (size <= 1 or (start == 0 and step == 1))


def _local_cut(s, lo, k0, k1):
    """The slice of a local extent that starts at global index ``lo`` picking the
    elements k0 <= k < k1 of selection ``s``, consecutive there (the positions
    :func:`mpitensor._clib.selection_image` finds, as the exchange does)."""
    if k1 == k0:
        return slice(0, 0)
    start, step = s[0], s[1]
    first = start + k0 * step - lo
    stop = first + (k1 - k0) * step
    return slice(first, stop if stop >= 0 else None, step)


def local_cuts(sel, loff, lshape) -> tuple:
    """The local key that picks selection ``sel``'s elements from the local array
    of global offset ``loff`` and shape ``lshape``, one slice per dim, and what
    each picks as (k0, k1). Local.

    Example: ``local_cuts(((0, 2, 5, False),), (3,), (4,)) == ((slice(1, 5, 2),),
    ((2, 4),))``.
    """
    ks = core.selection_image(sel, loff, lshape)
    return tuple(_local_cut(s, loff[d], *ks[d]) for d, s in enumerate(sel)), ks


class _Plan:
    """What ``dt[key]`` does for one key and input spec on this rank: the local cut,
    the exchange (None when nothing moves) and the output spec. Kept in the mesh's
    bounded cache of parsed keys (the oldest goes first), so a repeated key
    costs one dict lookup before NumPy cuts the local array."""

    __slots__ = ("cut", "exchange", "counts", "mid", "outdims", "spec", "fp", "out_local",
                 "view", "write")

    def __init__(self, dt, key):
        spec = dt._spec
        mesh, shape = spec.mesh, spec.shape
        sel, self.outdims = _parse(key, shape)
        pos = {o[1]: j for j, o in enumerate(self.outdims) if o[0] == "in"}
        mid, out, moves = [], [], False
        for m, p in enumerate(spec.placements):
            if isinstance(p, Shard) and _whole(sel[p.dim], shape[p.dim]):
                mid.append(p)
                out.append(Shard(pos[p.dim]))
            elif isinstance(p, Shard):
                mid.append(Replicate())
                out.append(Replicate())
                moves = moves or mesh.shape[m] > 1
            else:
                mid.append(p)
                out.append(p)
        self.counts = counts = tuple(s[2] for s in sel)
        self.mid = tuple(mid)
        out_shape = tuple(1 if o[0] == "new" else counts[o[1]] for o in self.outdims)
        self.spec = DTensorSpec(mesh, tuple(out), out_shape, spec.dtype,
                                contiguous_strides(out_shape))
        # What every rank must pick alike: the input's layout and the parsed key
        # (so that keys NumPy reads alike, -1 and n - 1, agree).
        self.fp = fingerprint(("index", repr(spec.placements), shape, spec.dtype.str,
                               tuple(sel), tuple(self.outdims)))
        # Nothing picked is the same on every rank: then nobody joins an exchange.
        self.exchange = None
        if moves and 0 not in counts:
            self.exchange = (shape, tuple(p._code for p in spec.placements),
                             tuple(p._code for p in mid), tuple(s[0] for s in sel),
                             tuple(s[1] for s in sel), counts)
        # The shape of the result's local array, found at its first use: the piece
        # this rank picks has the same shape every time (the layout fixes it).
        self.out_local = None
        # What C's basic_view needs to make the view again, once this rank made it
        # without a move: (fp, cut, local shape, spec, the words of a mismatch).
        self.view = None
        self.cut = None
        # What C's basic_write needs to write a number through this key: (fp, cut,
        # the words of a mismatch), on a member of the mesh.
        self.write = None
        if mesh._coordinate is not None:
            lshape, loff = local_shape_and_global_offset(
                shape, mesh.shape, mesh._coordinate, spec.placements)
            self.cut = local_cuts(sel, loff, lshape)[0]
            self.write = (self.fp, self.cut or ..., _DIFFERENT_KEYS)


# The words every rank raises when the ranks index with different keys (the
# exchange's agreement, in C, says "different keys" too).
_DIFFERENT_KEYS = _clib.message(
    "DTensor indexing: the ranks of the mesh passed different keys (or indexed "
    "DTensors of different placements, shapes or dtypes, or assigned different "
    "values); every rank of the mesh must make the same index")


def _agrees(mesh) -> bool:
    """Whether this rank takes part in an index's agreement: a member of a mesh of
    more than one rank."""
    return mesh._coordinate is not None and mesh._mesh.size > 1


def agree_index(mesh, fp: int, error: Exception | None = None, what=None) -> None:
    """The agreement of one index among the members of ``mesh``: ``fp``, the
    fingerprint of what this rank indexes, or ``error``, what it raised reading
    the key. Every member raises the first failing member's error (its type and
    words), else ValueError when the fingerprints differ. A rank outside the mesh,
    or the one rank of a one-rank mesh, raises only its own ``error``. Under the
    collective checks the checker compares the index instead (``what()``, its
    description, and the fingerprint; RuntimeError on every rank when they
    differ). Collective on the mesh.

    Example: ``agree_index(mesh, plan.fp)``; ``agree_index(mesh, 0, IndexError(...))``.
    """
    if error is None and not _modes.state.checks:
        # Every key pays for this: the C call skips a rank outside the mesh and a
        # mesh of one rank itself.
        mesh._agree_call(fp, _DIFFERENT_KEYS)
        return
    if not _agrees(mesh):
        if error is not None:
            raise error
        return
    if _modes.state.checks:
        text = what() if what is not None else "DTensor indexing"
        _modes.checker(f"{text}: raised {type(error).__name__}: {error}" if error is not None
                       else f"{text}, key {fp & (2**64 - 1):016x}", mesh)
        if error is not None:
            raise error
        return
    _comm.agree(mesh, False, 0, str(error), type(error))
    raise error  # not reached: the agreement raised on every member


def _read_text():
    return "DTensor.__getitem__"


def _write_text():
    return "DTensor.__setitem__"


def _raw(what: str, dt, key, value=None) -> int:
    """The fingerprint of an index by its values: DTensors by layout and mesh,
    arrays by their bytes, a basic key's plan by its own fingerprint."""
    # A mesh by its ranks (its communicator's handle is this process's own).
    meshes = tuple((m._mesh.shape, m._mesh.tobytes(), m._names)
                   for m in (v._spec.mesh for v in (key, value) if type(v) is DTensor))
    return call_fingerprint(what, (dt, key, value, meshes), {})


def agree_write(dt, key, value) -> None:
    """Agrees on ``dt[key] = value`` before anything moves (see the module
    docstring): the key (parsed, when basic), ``dt``'s layout and the value (a
    DTensor's layout, an ndarray's bytes, a scalar). A key that is invalid on some
    rank raises its error on every rank; a key or value that differs by rank, the
    same ValueError on every rank. The write's entry calls it first. Collective on
    the mesh of ``dt``.

    Example: ``agree_write(dt, (0, slice(1, 3)), 0.0)`` before the write.
    """
    mesh = dt._spec.mesh
    if not _agrees(mesh):
        return
    try:
        fp = _write_fingerprint(dt, key, value)
    except Exception as e:  # noqa: BLE001 - agreed, then raised on every rank
        agree_index(mesh, 0, e, _write_text)
    agree_index(mesh, fp, what=_write_text)


def write_number(dt, key, value) -> bool:
    """``dt[key] = value`` for a Python number ``value`` and a key of ints,
    slices, None and ... into a DTensor without Partials, the loop's common write:
    agreed as :func:`agree_write` agrees (the same fingerprint), then each rank
    writes its own cut of the key, from the mesh's cached plan, through the one
    write door (_views.write). False, with nothing done, for any other write.
    Collective on the mesh (the agreement).

    Example: ``write_number(dt, (0, slice(1, 3)), 0.0)``.
    """
    if type(value) not in _NUMBERS:
        return False
    for p in dt._spec.placements:
        if type(p) is Partial:
            return False
    ck = _cache_key(key)
    if ck is None:
        return False
    mesh = dt._spec.mesh
    try:
        plan = _plan(dt, key, ck)
    except Exception as e:  # noqa: BLE001 - agreed, then raised on every rank
        agree_index(mesh, 0, e, _write_text)
    agree_index(mesh, _number_write(plan.fp, value), what=_write_text)
    if plan.cut is not None:
        dest, cut = dt._data(), plan.cut or ...
        _views.write(dt, lambda: dest.__setitem__(cut, value), cut)
    return True


# The values write_number takes; agree_write fingerprints them alike.
_NUMBERS = (float, int, bool)


def _number_write(plan_fp: int, value) -> int:
    """The fingerprint of writing the number ``value`` through the basic key whose
    plan has ``plan_fp``: the one C's basic_write agrees on too."""
    return call_fingerprint("DTensor.__setitem__", (plan_fp, value), {})


def _write_fingerprint(dt, key, value) -> int:
    name = "DTensor.__setitem__"
    if type(key) is DTensor or (isinstance(key, np.ndarray) and key.dtype == bool
                                and key.ndim > 0):
        return _raw(name, dt, key, value)
    try:
        plan = _plan(dt, key)
    except _registry.NoRule:
        return _raw(name + " (gathered)", dt, key, value)
    if type(value) in _NUMBERS:  # the common write, kept short
        return _number_write(plan.fp, value)
    return _raw(name, None, plan.fp, value)


def strided_view(out, plain, dt, key) -> None:
    """Links ``out = plain[key]``, ``plain`` the plain copy a strided ``dt`` is read
    through (DTensor.__getitem__), to ``dt`` when the key is basic, so that a
    write into the view reaches ``dt`` (the write back is a write into a strided
    DTensor, which the executor makes through a plain copy and copies back); an
    advanced key's result stays the copy it is. Local.

    Example: ``strided_view(out, plain, y, (slice(4, 20),))`` after
    ``out = plain[4:20]``, ``y`` a reshape of an inner shard.
    """
    items = key if type(key) is tuple else (key,)
    spec = dt._spec
    # Where the plain copy is ``dt``'s own memory, ``out`` is a view of it already.
    if _strided.copies(spec.placements, spec.mesh.shape) and type(out) is DTensor and all(
            k is None or k is Ellipsis or isinstance(k, slice) or _as_int(k) is not None
            for k in items):
        _views.relink(out, plain, dt, key)


_registry.strided_view = strided_view
_registry.written = _views.written
_registry.relink_plain = _views.relink_plain


# The parsed keys a mesh keeps (basic indexing repeats its keys in loops).
_INDEX_KEYS = 256


# A hashable stand-in for a key of ints, slices of ints, None and ..., else None
# (such keys take the uncached path, which also reports bad ones): in C, since
# every basic key pays for it.
_cache_key = _C.index_key


def _plan(dt, key, ck=None) -> _Plan:
    """The plan of a basic ``key`` for ``dt``, from the mesh's cache when the key
    is one it keeps (``ck``: its _cache_key, when known)."""
    spec = dt._spec
    if ck is None:
        ck = _cache_key(key)
    cache_key = (ck, spec.placements, spec.shape, spec.dtype)
    plans = spec.mesh._index_keys
    plan = plans.get(cache_key) if ck is not None else None
    if plan is None:
        plan = _Plan(dt, key)
        if ck is not None:
            if len(plans) >= _INDEX_KEYS:
                del plans[next(iter(plans))]
            plans[cache_key] = plan
    return plan


@_registry.implements(operator.getitem)
def getitem(dt, key):
    """``dt[key]``; see the module docstring. A basic key gives a view of ``dt``:
    a write into it reaches ``dt``. Collective on the mesh: the key is agreed
    (one small all-reduce), and where it cuts a sharded dim, one exchange of the
    picked elements carries that agreement."""
    mesh = dt._spec.mesh
    if type(key) is tuple and key and type(key[0]) is DTensor:
        key = _leading_array(key, len(dt._spec.shape))
    ck = _cache_key(key)
    if ck is not None:
        # Ints, slices, None and ... only: a basic key, whose plan the mesh keeps.
        try:
            plan = _plan(dt, key, ck)
        except Exception as e:  # noqa: BLE001 - agreed, then raised on every rank
            agree_index(mesh, 0, e, _read_text)
        return _basic(dt, key, plan, agreed=False)
    plan = kind = one = points = None
    try:
        kind = A.is_advanced(key)
        if kind is None:
            one = A.one_array(key, len(dt._spec.shape))
        if kind is None and one is None and not dt.requires_grad:
            points = A.point_arrays(key, len(dt._spec.shape))
        if kind is None and one is None and points is None and type(key) is not DTensor:
            plan = _plan(dt, key)
    except _registry.NoRule:
        # Every rank that gets here runs NumPy's indexing on the gathered arrays,
        # once the ranks agree on the key.
        agree_index(mesh, _raw("DTensor.__getitem__ (gathered)", dt, key), what=_read_text)
        raise
    except Exception as e:  # noqa: BLE001 - agreed, then raised on every rank
        agree_index(mesh, 0, e, _read_text)
    if plan is not None:
        return _basic(dt, key, plan, agreed=False)
    agree_index(mesh, _raw(f"DTensor.__getitem__ ({kind})", dt, key), what=_read_text)
    if kind == "mask":
        return A.getitem_mask(dt, key)
    if kind == "take":
        return A.getitem_take(dt, key)
    if points is not None:
        return A.getitem_points(dt, points)
    if one is not None:
        # its backward (autograd _getitem) undoes the same two steps
        dim, idx, rest, front = one
        # an advanced index is a copy: the rest of the key's view of np.take's
        # result is nobody's view, so it is the result's own memory
        taken = np.take(dt, idx, axis=dim)
        out = _views.release(_basic(taken, rest, _plan(taken, rest), agreed=True))
        return out if front is None else np.moveaxis(out, front, 0)
    if key.dtype.kind in "iu":
        return pick_rows("DTensor.__getitem__ (integer DTensor)", dt, key)
    raise _advanced_error("a DTensor that is not a boolean mask", _registry.NoRule)


def _leading_array(key: tuple, ndim: int):
    """``key[0]`` alone for a DTensor followed only by ``...`` and whole slices
    (``dt[idx, ...]``, as xarray's orthogonal indexing writes it): NumPy reads both
    alike. Else the key as it is. Local."""
    rest = key[1:]
    if not all(k is Ellipsis or (type(k) is slice and k == WHOLE) for k in rest):
        return key
    dots = sum(k is Ellipsis for k in rest)
    return key[0] if dots <= 1 and len(key) - dots <= ndim else key



def _basic(dt, key, plan, agreed):
    """``dt[key]`` for a basic key by its plan; ``agreed``: the ranks agreed on the
    key already. Collective on the mesh."""
    spec = dt._spec
    mesh = spec.mesh
    if not agreed and (plan.exchange is None or _modes.state.checks):
        # Where the key cuts a sharded dim, the exchange agrees on it (below).
        agree_index(mesh, plan.fp, what=lambda: (
            f"DTensor.__getitem__ {spec.placements} -> {plan.mid}, shape {spec.shape} -> "
            f"{plan.counts}, {spec.dtype}"))
    if plan.cut is None:
        return DTensor(np.empty((0,), spec.dtype), plan.spec)
    # Without an exchange the piece is a view of the local array, so that a write
    # into the result writes into ``dt``, as NumPy's and torch's basic slices do.
    piece = dt._data()[plan.cut or ...]  # a 0-d array's view is [...], not [()]
    owner = None
    if 0 in plan.counts:  # nothing picked: no element to leave unwritten
        piece = np.empty(local_shape_and_global_offset(
            plan.counts, mesh.shape, mesh._coordinate, plan.mid)[0], spec.dtype)
    elif plan.exchange is not None:
        # The exchange agrees on the selection and ``plan.fp`` first (every rank,
        # every size): a key that differs by rank raises alike instead of leaving
        # elements unwritten.
        _trace.report_move("DTensor.__getitem__", spec, plan.mid)
        piece = owner = _comm.select_exchange(mesh, *plan.exchange,
                                              np.ascontiguousarray(piece), plan.fp)
    # Int dims are 1 long here: dropping them and adding None's dims is a reshape.
    if plan.out_local is None:
        plan.out_local = tuple(1 if o[0] == "new" else piece.shape[o[1]]
                               for o in plan.outdims)
    local = piece.reshape(plan.out_local)
    if plan.view is None and plan.exchange is None and 0 not in plan.counts:
        plan.view = (plan.fp, plan.cut or ..., plan.out_local, plan.spec, _DIFFERENT_KEYS)
    if owner is not None:
        # New memory, not ``dt``'s: a copy-view, whose writes reach ``dt`` and
        # which sees the writes into ``dt`` (the same exchange, made again).
        _views.link(owner, local, dt, key, plan.spec,
                    refill=functools.partial(_refill, spec, plan))
    return DTensor(local, plan.spec)


def _refill(spec, plan, local):
    """The exchange of ``plan`` (a basic key's) made again on ``local``, the base's
    local array: the elements of a copy-view as its base holds them now.
    Collective on the mesh."""
    _trace.report_move("DTensor.__getitem__ (a view seeing a write into its base)",
                       spec, plan.mid)
    return _comm.select_exchange(spec.mesh, *plan.exchange,
                                 np.ascontiguousarray(local[plan.cut or ...]), plan.fp)
