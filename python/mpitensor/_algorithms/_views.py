"""Basic indexing's views where the picked elements had to move: NumPy's rule that
``dt[key]`` (ints, slices, None, ...) is a view, kept for the indexes that are
not a view of the local array.

Where a key cuts a dim a mesh dim shards, each rank's part of the result is an
exchange's new array (_indexing.py), not a view of the input's local memory.
Such a result is a *copy-view*: its local array is read-only (whatever writes
into it by a path that does not know it raises NumPy's "assignment destination
is read-only" on every rank instead of being lost), and a link from the array
that owns its memory records where it came from (the base DTensor and the key).
Every write entry point (item assignment, ``np.copyto`` and ``fill``, ``out=``
and the in-place operators, ``ufunc.at``, ``np.put`` and its kin) writes
through :func:`write`: it unlocks the memory, runs the write, locks it again and
writes the elements it wrote into the base (``base[key] = view`` restricted to
them: the view is Replicate on the cut dims, so each rank copies its own
intersection, without communication). The link belongs to the memory, not to
one DTensor, so every NumPy view of that memory (a local cut of the copy-view,
``v.T``, a reshape that is a view) writes through as well; a base that is a
copy-view itself passes the write on.

A write into the base is seen through its copy-views, as through NumPy's views:
the same write entry points, once the outermost write is done, exchange each live
copy-view of the written memory again (``base[key]``, the exchange that made it)
into the view's own memory. Whether a copy-view lives is decided by its owner's
reference count on each rank, and a cycle the collector has not yet broken on one
rank keeps it alive there only: so the ranks agree, view by view, whether any
holds it (one small all-reduce each, only for memory that has copy-views); one
that some rank holds is exchanged on every rank, and one that none holds is
forgotten everywhere. The records hold neither the base nor the view: the base's
local array is read again from the written memory, by its place in it. Writes
through a copy-view reach the base element by element, only those written. A view
of a strided DTensor is read through a plain copy of it; linked to the strided
DTensor itself, it writes through as well, and is made again through a new plain
copy. A view whose base changed layout in place (a Partial resolved by a write)
is made again by laying the base out as it was first.
"""

from __future__ import annotations

import functools
import operator
import weakref
from typing import Callable

import numpy as np

from .. import _comm, _modes, _registry, _strided
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec

__all__ = ["link", "keep", "keep_each", "shared", "fresh", "relink", "relink_plain", "release",
           "write", "writes", "written", "layout_changed", "CHANGED"]


class _Link:
    """Where a copy-view's memory came from: ``parent[key]`` read when the view
    was made, its spec, and the view's local array as (byte offset, shape,
    strides) within the owner (holding the array would keep the owner alive)."""

    __slots__ = ("parent", "key", "spec", "geometry", "ref", "record", "back")

    def __init__(self, parent, key, spec, geometry, ref, back=None):
        self.parent, self.key, self.spec, self.geometry, self.ref = (
            parent, key, spec, geometry, ref)
        self.record = None  # its _Record, when writes into the parent refresh it
        # The write into the parent for a view that no basic key relates to it:
        # back(parent, view, written); a link with neither refuses writes.
        self.back = back


# id(owner) -> its link, while the owner lives (a weak reference's callback drops
# it): ndarrays hash by value, so they cannot be keys themselves.
_links: dict[int, _Link] = {}

# write(..., region=CHANGED): the elements whose bytes the write changed.
CHANGED = object()
# The key of a copy-view that no basic key relates to its parent (keep).
_NO_KEY = object()


class _Record:
    """A copy-view to make again when its base's memory is written: its owner
    (weakly), the base's mesh, where the base's local array lies in that memory
    (byte offset, shape, strides, dtype), ``refill(local)``, the exchange that
    made the view, run on the base's local array (collective), and the records
    of copy-views of this view (whose memory is this owner). ``live``: not
    forgotten (released, relinked, held by no rank, or a layout changed in its
    base's memory)."""

    __slots__ = ("owner", "mesh", "geometry", "refill", "children", "live", "inner")

    def __init__(self, owner, refill):
        self.owner, self.refill = owner, refill
        self.mesh = self.geometry = None  # set by _register
        # Where the view's local array lies in its owner, (byte offset, shape,
        # strides, dtype, the owner's bytes), when the refill gives that array;
        # None when it gives the owner's contents.
        self.inner = None
        self.children, self.live = [], True


# id(memory) -> the records of copy-views of DTensors whose local arrays are views
# of that array (its memory's owner), in the order they were made, which is every
# rank's. An entry goes with its memory (weakref.finalize); only a written memory
# is looked up, and it lives on every rank. The executor writes into a DTensor
# itself only when this holds no records for its memory (the modes'
# ``copy_views`` is this dict). The entry's finalizer runs no Python code: it runs
# wherever a memory dies, which is not the same point on every rank.
_records: dict[int, list[_Record]] = {}
_modes.state.copy_views = _records

# The memories with records that the outermost write in progress wrote into, in
# the order it did (every rank's), and how deep in writes the program is: a write
# runs others (a copy-view's write-back, the outputs of one ufunc), and the views
# are made again once all of them are done.
_written: list = []
_depth = 0
# The refresh in progress, counted: the copy-views of one call (a split's pieces)
# made again in one refresh share the exchange that makes them all.
_pass = 0


_memory = _registry.memory_of


def _at(memory: np.ndarray, shape, dtype, offset: int, strides) -> np.ndarray:
    """The array of ``shape``, ``dtype`` and ``strides`` at byte ``offset`` of
    ``memory``; an empty one holds no byte of it (NumPy would check the strides of
    an empty shape against the memory's size), so it is a new empty array."""
    if 0 in shape:
        return np.empty(shape, dtype)
    return np.ndarray(shape, dtype, memory, offset, strides)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def link(owner: np.ndarray, local: np.ndarray, parent: DTensor, key, spec,
         refill=None, back=None, gives_local=False) -> None:
    """Makes ``DTensor(local, spec)`` a copy-view of ``parent[key]``: ``owner``
    (the new array the exchange filled, of which ``local`` is a view) becomes
    read-only and remembers where its elements live. ``refill(parent_local)``,
    when given, makes ``owner``'s contents again from the parent's local array
    (``local``'s with ``gives_local``; collective): a write into the parent's
    memory is then seen through the view (:func:`write`). ``back(parent, view,
    written)``, for a view no basic key relates to its parent (``key`` is
    _NO_KEY), writes the view's written elements into the parent; such a link
    without it refuses writes. Local.

    Example: ``link(got, got.reshape(shape), dt, key, spec, refill)`` in getitem.
    """
    owner.flags.writeable = False
    local.flags.writeable = False
    k = id(owner)
    ref = weakref.ref(owner, lambda _, k=k: _links.pop(k, None))
    _links[k] = _Link(parent, key, spec,
                      (_address(local) - _address(owner), local.shape, local.strides), ref,
                      back)
    if refill is not None:
        record = _links[k].record = _Record(ref, refill)
        if gives_local:
            record.inner = (_address(local) - _address(owner), local.shape,
                            local.strides, local.dtype, owner.nbytes)
        _register(record, parent)


def keep(parent: DTensor, out: DTensor, redo, back=None, copies: bool = False) -> DTensor:
    """``out``, which ``redo(parent)`` gave where NumPy's result is a view of
    ``parent`` (a reshape, a flip, a diagonal), made one where its local array is
    new memory (the elements moved): a copy-view that ``redo`` makes again when
    ``parent`` is written, and whose writes reach ``parent`` through
    ``back(parent, view, written)`` (``written``: a boolean DTensor of the view's
    layout, True where the write went); without ``back`` it refuses writes, as
    NumPy's read-only views do. Returns ``out``, a copy where ``copies`` on some
    rank (see :func:`keep_each`). Collective on the mesh: where a result may be a
    view on some ranks and new memory on others, one small all-reduce says which,
    and new memory it is everywhere.

    Example: ``keep(a, out, lambda p: np.flip(p, 0), back)``.
    """
    return keep_each(parent, [(out, redo, back)], copies)[0]


def keep_each(parent: DTensor, results: list, copies: bool = False) -> list:
    """:func:`keep` of several results of one call, ``(out, redo, back)`` each (a
    split's pieces), with one all-reduce. ``copies``: this rank judges, from its
    own local array, that NumPy's result is a copy (a transpose reshaped); where
    any rank does, the results are copies on every rank (:func:`fresh`).
    Collective on the mesh.

    Example: ``keep_each(a, [(piece, redo_i, back_i) for ...])``.
    """
    mesh = parent._spec.mesh
    outs = [r[0] for r in results]
    if mesh._coordinate is None or any(type(o) is not DTensor for o in outs):
        return outs
    plocal = parent._data()
    memory = _memory(plocal)
    for o in outs:
        _empty_in(o, plocal, memory)
    here = [_memory(o._data()) is memory for o in outs]
    # A read-only view takes memory of its own even where it could be a local
    # view: a write into a local view would reach the parent.
    bits = (not all(here) or any(r[2] is None for r in results)) | copies << 1
    bits = _comm.any_bits(mesh, bits)
    if bits & 2:
        return [fresh(parent, o) for o in outs]
    if not bits & 1:
        return outs
    pspec, owned = parent._spec, set()
    for (out, redo, back), viewed in zip(results, here):
        local = out._data()
        # A view on this rank (new memory on another), or memory another result
        # shares (one exchange's buffer): memory of its own, which it owns.
        if viewed or id(_memory(local)) in owned:
            local = out._local_tensor = local.copy()
        owned.add(id(_memory(local)))
        link(_memory(local), local, parent, _NO_KEY, out._spec,
             lambda plocal, redo=redo: redo(DTensor(plocal, pspec)).to_local(), back,
             gives_local=True)
    return outs


def _empty_in(out: DTensor, plocal: np.ndarray, memory: np.ndarray) -> None:
    """An empty block of ``out`` made an empty view of its parent's memory: it holds
    no element, so it is a view of anything, and then it follows the other ranks
    (a view where theirs are) and keeps the views of it on every rank filed under
    the same memory as the others'. Local."""
    local = out._data()
    if (local.size == 0 and _memory(local) is not memory and local.dtype == plocal.dtype
            and plocal.ndim):
        out._local_tensor = plocal[(slice(0, 0),) * plocal.ndim].reshape(local.shape)


def fresh(parent: DTensor, out: DTensor) -> DTensor:
    """``out``, where NumPy's result is a new array: its local array copied where
    it is a view of ``parent``'s memory on this rank, so that no write into one
    reaches the other. Local. Returns ``out``.

    Example: ``fresh(a, reshaped)`` for a reshape NumPy copies (a transpose's).
    """
    if type(out) is DTensor and type(parent) is DTensor:
        local = out._data()
        if _memory(local) is _memory(parent._data()):
            out._local_tensor = local.copy()
    return out


def shared(make_all: Callable[[DTensor], list]) -> Callable[[int], Callable]:
    """Refills for the results of one call that one exchange makes together (a
    split's pieces): ``shared(make_all)(i)`` is the redo of result ``i`` for
    :func:`keep_each`; in one refresh the first live result runs
    ``make_all(parent)`` and the others take their part of it. Collective as
    ``make_all`` is, alike on every rank (the same results live everywhere).

    Example: ``redo = shared(lambda p: np.split(p, 3))`` and ``redo(i)`` per piece.
    """
    made: dict = {}

    def redo_of(i: int) -> Callable:
        def redo(p):
            if made.get("pass") != _pass:
                made.clear()
                made["pass"], made["all"] = _pass, dict(enumerate(make_all(p)))
            return made["all"].pop(i)
        return redo
    return redo_of


def _marked(mask: np.ndarray, spec) -> DTensor:
    """The elements a write covered, a boolean DTensor of ``spec``'s layout."""
    return DTensor(mask, DTensorSpec(spec.mesh, spec.placements, spec.shape,
                                     np.dtype(bool), spec.stride))


def _register(record: _Record, parent: DTensor) -> None:
    """Files ``record`` under the memory of ``parent``'s local array, where it lies
    in it, and among the records of the copy-view that memory is, if any."""
    plocal = parent._data()
    memory = _memory(plocal)
    records = _records.get(id(memory))
    if records is None:
        records = _records[id(memory)] = []
        weakref.finalize(memory, _records.pop, id(memory), None)
    record.geometry = (_address(plocal) - _address(memory), plocal.shape,
                       plocal.strides, plocal.dtype)
    record.mesh = parent._spec.mesh
    records.append(record)
    up = _links.get(id(memory))  # the parent is a copy-view: refreshed with it
    if up is not None and up.record is not None:
        up.record.children.append(record)


def _through_plain(spec, plain, then=None):
    """A refill for a view read through the plain copy of a strided DTensor: the
    strided local array (of ``spec``) made plain (``plain``'s placements) again,
    then ``then`` on the plain local array when given. Collective on the mesh."""
    def refill(local):
        made = DTensor(local, spec).redistribute(spec.mesh, plain).to_local()
        return made if then is None else then(made)
    return refill


def _forget(owner: np.ndarray) -> None:
    """Stops refreshing the copy-view whose memory is ``owner``: it is nobody's
    view any more, or it cannot be made again. Called alike on every rank."""
    got = _links.get(id(owner))
    if got is not None and got.record is not None:
        got.record.live = False


def layout_changed(dt: DTensor, before) -> Callable[[], None]:
    """``dt`` changed its layout in place from the spec ``before`` (a Partial
    resolved before a write), its local arrays keeping their shapes: the
    copy-views of its memory are made again from now on by laying the base out
    as ``before`` first, then the exchange that made them. Returns the undo, for
    a change that did not happen after all. Local; called alike on every rank.

    Example: ``undo = layout_changed(dst, spec)`` after ``dst._spec = resolved._spec``.
    """
    records = [r for r in _records.get(id(_memory(dt._data())), ()) if r.live]
    old = [r.refill for r in records]
    for r in records:
        r.refill = _partial_again(dt._spec, before, r.refill)

    def undo():
        for r, refill in zip(records, old):
            r.refill = refill
    return undo


# The local array of a Partial whose value is a replicated one, on a rank that is
# not the first of the mesh dim: the op's identity where the op adds up copies.
_IDENTITY = {"sum": 0, "product": 1}


def _partial_again(spec, before, then):
    """A refill for a base resolved from ``before``'s Partials to ``spec``'s
    Replicates: its local array laid out as ``before`` again (a Replicate is a
    Partial of its value: the identity of a sum or product on all but the first
    rank of the mesh dim, the value itself for avg, max and min), then ``then``.
    Local but for ``then``."""
    coordinate = spec.mesh._coordinate
    fills = [_IDENTITY.get(q.reduce_op) for m, (p, q) in
             enumerate(zip(spec.placements, before.placements))
             if q.is_partial() and not p.is_partial() and coordinate[m] != 0]

    def refill(local):
        fill = next((f for f in fills if f is not None), None)
        return then(local if fill is None else np.full_like(local, fill))
    return refill


def _touch(dst: DTensor) -> None:
    """Notes that the write in progress wrote into ``dst``'s memory. Local."""
    if not _records:
        return
    memory = _memory(dst._data())
    if id(memory) in _records and not any(m is memory for m in _written):
        _written.append(memory)


def written(dst: DTensor) -> None:
    """``dst``'s memory was written by NumPy directly, outside :func:`write` (a
    strided DTensor's plain copy written back): its copy-views are made again,
    now or when the outermost write in progress is done. Collective on the meshes
    of those views.

    Example: ``written(orig)`` after ``np.copyto(orig._data(), back._data())``.
    """
    _touch(dst)
    if _depth == 0 and _written:
        _refresh_written()


def _refresh_written() -> None:
    """Every live copy-view of the memories the write wrote into made again from
    its base, and the copy-views of those views after them. Collective on the
    meshes of those views."""
    global _pass
    _pass += 1
    memories = list(_written)
    _written.clear()
    done: set[int] = set()
    for memory in memories:
        records = _records.get(id(memory))
        if records:
            _refresh(records, memory, done)


def _refresh(records: list, memory: np.ndarray, done: set) -> None:
    """``records`` (copy-views of DTensors over ``memory``, in every rank's order)
    made again: each that any rank of its mesh holds is exchanged on every rank,
    one that none holds is forgotten. Where this rank no longer holds a view, its
    exchange's result stands in for the memory of the views of that view.
    Collective on each record's mesh."""
    kept = []
    for r in records:
        if not r.live:
            continue
        if id(r) in done or r.mesh._coordinate is None:
            kept.append(r)
            continue
        done.add(id(r))
        owner = r.owner()
        if not _comm.any_member(r.mesh, owner is not None):
            r.live = False
            continue
        kept.append(r)
        off, shape, strides, dtype = r.geometry
        fresh = r.refill(_at(memory, shape, dtype, off, strides))
        if r.inner is None:  # the refill gives the whole memory, in order
            if owner is not None:
                owner.flags.writeable = True
                try:
                    owner[...] = fresh.reshape(owner.shape)
                finally:
                    owner.flags.writeable = False
            if r.children:
                _refresh(r.children, owner if owner is not None else fresh, done)
            continue
        # The refill gives the view's local array, which goes where it lies in its
        # memory (any view of it: a transpose's); where this rank let the view go,
        # into a stand-in of that memory, which the views of the view read.
        at, vshape, vstrides, vdtype, nbytes = r.inner
        target = owner if owner is not None else np.empty(nbytes, np.uint8)
        target.flags.writeable = True
        try:
            _at(target, vshape, vdtype, at, vstrides)[...] = fresh
        finally:
            target.flags.writeable = owner is None
        if r.children:
            _refresh(r.children, target, done)
    records[:] = kept


def relink(dt: DTensor, via: DTensor, parent: DTensor, key) -> None:
    """Makes ``dt``, which ``via[key]`` gave, a view of ``parent[key]`` instead:
    ``via`` is a copy of ``parent`` in new memory on every rank that nobody reads
    back (the plain layout of a strided ``parent``), so a write into ``dt`` must
    reach ``parent``. Local.

    Example: ``relink(plain[key], plain, strided, key)``.
    """
    local = dt._data()
    owner = _owner(local)
    plain = via._spec.placements
    if owner is not None:  # an exchange's copy-view of ``via``
        got = _links[id(owner)]
        if got.parent is via:
            got.parent = parent
            record = got.record
            if record is not None:  # refreshed from ``parent``'s memory instead
                mine = _records.get(id(_memory(via._data())), [])
                if record in mine:
                    mine.remove(record)
                record.refill = _through_plain(parent._spec, plain, record.refill)
                _register(record, parent)
        return
    owner = _memory(local)  # a view of ``via``'s memory (or new memory, empty)
    # ``via``'s own memory, all of it in C order (as _registry.plain_copy makes
    # it on every rank, so that every rank files the record), is the plain local
    # array made again; new memory stays as it is
    vlocal = via._data()
    whole = owner is _memory(vlocal) and _registry.owns_all(vlocal)
    link(owner, local, parent, key, dt._spec,
         _through_plain(parent._spec, plain) if whole else None)


def relink_plain(res, pairs: list) -> None:
    """The results of a call on the plain copies of strided DTensors (``pairs``:
    (original, copy) each) made views of the originals, as NumPy's results are
    views of its arguments: a copy-view of a copy is linked to the original
    instead (:func:`relink`); a NumPy view of a copy's memory (a flip of it, a
    piece) is read-only, and the copy itself is linked to the original as a whole,
    so that a write into the view reaches the original and a write into the
    original is seen in the view. A result NumPy makes read-only stays so. Whether
    any rank's results view a copy's memory is agreed (one small all-reduce on the
    original's mesh, for calls on strided DTensors only), so that every rank
    files the same records. Collective on the originals' meshes.

    Example: ``relink_plain(np.flip(plain, 0), [(strided, plain)])``.
    """
    items = res if type(res) in (tuple, list) else (res,)
    items = [r for r in items if type(r) is DTensor]
    for orig, copy in pairs:
        spec = orig._spec
        if (spec.mesh._coordinate is None
                or not _strided.copies(spec.placements, spec.mesh.shape)):
            continue  # the copy is ``orig``'s own memory: its views are views already
        memory = _memory(copy._data())
        viewing = []
        for r in items:
            local = r._data()
            owner = _owner(local)
            if owner is not None and _links[id(owner)].parent is copy:
                relink(r, copy, orig, _links[id(owner)].key)
            elif _memory(local) is memory and local.flags.writeable:
                viewing.append(local)
        if not _comm.any_bits(spec.mesh, bool(viewing)):
            continue
        relink(copy, copy, orig, Ellipsis)
        for local in viewing:
            local.flags.writeable = False


def release(dt: DTensor) -> DTensor:
    """``dt`` given its memory for itself when it is a copy-view of a base that is
    nobody's (an advanced index's copy, read through a basic key): unlinked and
    writable, as NumPy's copy is. Local.

    Example: ``release(getitem(np.take(dt, idx, axis=0), rest))``.
    """
    local = dt._data()
    owner = _owner(local)
    if owner is not None:
        _links.pop(id(owner), None)
        _forget(owner)
        owner.flags.writeable = True
        local.flags.writeable = True
    return dt


def _owner(local: np.ndarray):
    """The linked array whose memory ``local`` is (itself or its base: NumPy
    points a view's base at the array that owns the memory), else None."""
    if id(local) in _links:
        return local
    base = local.base
    return base if type(base) is np.ndarray and id(base) in _links else None


def _read_only_error() -> ValueError:
    return ValueError("assignment destination is read-only")


def write(dst: DTensor, run, key=Ellipsis, where=None, region=None):
    """``run()``, which writes into ``dst``'s local array, such that the write
    reaches ``dst``'s base when ``dst`` is a copy-view or a NumPy view of one:
    the memory is unlocked for the write, locked again, and the written elements
    (``local[key]``, of them ``where`` when given; all of ``local[key]``'s bytes
    the write changed with ``region=CHANGED``) are written into the base. A
    read-only ``dst`` that is no such view (a read-only array given to
    ``from_local``) raises NumPy's ValueError before anything runs. Returns
    ``run()``'s result. Collective as ``run`` is; the write into the base moves
    nothing.

    Example: ``write(dt, lambda: local.__setitem__(k, 0), key=k)``.
    """
    global _depth
    _depth += 1
    try:
        result = _write(dst, run, key, where, region)
    except BaseException:
        if _depth == 1:
            _written.clear()  # raised alike everywhere: what was written is unknown
        raise
    finally:
        _depth -= 1
    if _depth == 0 and _written:
        _refresh_written()
    return result


def _write(dst: DTensor, run, key, where, region):
    """:func:`write` without making the copy-views of what it wrote again."""
    local = dst._data()
    if local.flags.writeable:
        result = run()
        _touch(dst)
        return result
    owner = _owner(local)
    if owner is None or _links[id(owner)].key is _NO_KEY and _links[id(owner)].back is None:
        raise _read_only_error()  # no view, or a view NumPy makes read-only
    before = local.copy() if region is CHANGED else None
    owner.flags.writeable = True
    try:
        local.flags.writeable = True
        result = run()
    finally:
        local.flags.writeable = False
        owner.flags.writeable = False
    _write_back(owner, _touched(owner, local, key, where, before))
    _touch(dst)
    return result


def _touched(owner, local, key, where, before) -> np.ndarray:
    """The bytes of ``owner`` that the write into ``local`` covered, as a uint8
    array over the owner's bytes (any view of it maps there, dtype views too)."""
    marks = np.zeros(owner.nbytes, np.uint8)
    if local.size == 0:
        return marks
    mine = _over(marks, _address(local) - _address(owner), local)
    if before is not None:
        a = np.ascontiguousarray(local).reshape(-1).view(np.uint8)
        b = np.ascontiguousarray(before).reshape(-1).view(np.uint8)
        where = (a != b).reshape(local.shape + (local.itemsize,)).any(-1)
    part = mine[key]
    if where is None:
        part[...] = 1
    else:
        part[np.broadcast_to(where, part.shape[:-1])] = 1
    return marks


def _over(marks, offset, like) -> np.ndarray:
    """``marks`` (one byte per byte of an owner) seen as an array of ``like``'s
    shape and strides from ``offset``, each element's bytes along a last dim."""
    return _at(marks, like.shape + (like.itemsize,), np.uint8, offset, like.strides + (1,))


def _write_back(owner, marks) -> None:
    """``parent[key] = view`` for the elements of the copy-view that ``marks``
    covers: each rank writes its own part, the view being laid out as the base
    wants it (Replicate on the cut dims). Through the executor, so that a base
    that requires grad is refused in grad mode as any write into it."""
    link = _links[id(owner)]
    off, shape, strides = link.geometry
    view = _at(owner, shape, owner.dtype, off, strides)
    mask = (_over(marks, off, view).any(-1) if view.size
            else np.zeros(shape, bool))
    if link.back is not None:
        link.back(link.parent, DTensor(view, link.spec), _marked(mask, link.spec))
        return
    _registry.call(operator.setitem, link.parent, link.key, DTensor(view, link.spec),
                   where=mask)


def writes(entry):
    """Decorates the entry of a NumPy function that writes into its first argument
    (``np.put`` and its kin, ``ufunc.at``): through :func:`write`, the elements it
    changed reaching the base of a copy-view. Local as the entry is.

    Example::

        >>> @_registry.implements(np.put)
        ... @writes
        ... def put(a, ind, v, mode="raise"): ...
    """
    @functools.wraps(entry)
    def through(dst, *args, **kwargs):
        if type(dst) is not DTensor:
            return entry(dst, *args, **kwargs)
        return write(dst, lambda: entry(dst, *args, **kwargs),
                     region=None if dst._data().flags.writeable else CHANGED)
    return through
