"""The mesh-bound calls of the C comm library, bound through ctypes (:mod:`._clib`)
to the very ``_C`` shared object that runs the executor, so they share its state
(the block pool, the watchdog, the direct-read state, the counters): a mesh's
collectives, distribute and the selection exchange of basic indexing, the ring
exchanges of context parallelism, the agreement primitive, the watchdog, the
block pool's limit, the counters and the time models.

Each is argument conversion around a C function that takes plain C arguments;
ctypes releases the GIL while it runs, as the extension did around every
collective, and a failing status raises what ``_C`` raises (:mod:`._clib`).
A collective first checks that it runs on the thread that created the mesh
(``mt_mesh_check``), which raises on every rank alike before any communication.
"""

from __future__ import annotations

import functools
import itertools
import operator

import numpy as np

from . import _C
from ._clib import (MAX_MESH_NDIM, MAX_NDIM, Error, I, I64, D, P, _Box, _int64s, _Layout,
                    _Selection, call, capsule_pointer, check, dtype_code, exported, sizeof,
                    status_of, text_buffer, traceback_dumper)
from ._clib import message as _message
from ._bind.comm import (CommTotals as _Totals, MeshNodes as _Nodes, mpi_comm_bindings,
                         mt_coll_name, mt_mesh_ndim, mt_mesh_dim_size, mt_mesh_coordinate,
                         mt_mesh_bcast, mt_mesh_exscan, mt_mesh_alltoall_i64,
                         mt_mesh_alltoallv, mt_mesh_allgather_i64, mt_mesh_direct_read,
                         mt_mesh_nodes_of, mt_mesh_time_model, mt_mesh_set_time_model,
                         mt_agree, mt_agree_float_errors, mt_comm_counters_read,
                         mt_comm_live_count,
                         mt_mpi_library_version, mt_direct_fail_next, mt_mesh_slice,
                         mt_mesh_destroy, mt_mesh_check, mt_mesh_set_counters,
                         mt_watchdog_set_timeout, mt_watchdog_timeout, mt_watchdog_listen_mesh,
                         mt_watchdog_leave, mt_watchdog_set_work, mt_watchdog_tell,
                         mt_watchdog_failed, mt_watchdog_set_dump, mt_ring_shift_start,
                         mt_ring_allgatherv_start, mt_ring_allgather_int64, mt_pending_create,
                         mt_pending_wait, mt_pending_test, mt_pending_done,
                         mt_selection_exchange, mt_distribute_from, mt_pool_set_limit,
                         mt_pool_cached_bytes, mt_pool_trim as pool_trim)
from ._bind.core import (MemoStats as _MemoStats, TimeModel as _TimeModel, _placements,
                         mt_layout_init, mt_layout_local_box, mt_selection_image,
                         mt_time_model_default, mt_time_model_check, mt_plan_check,
                         mt_memo_stats_get, mt_layout_table_count, mt_layout_table_capacity,
                         mt_selection_check, mt_box_check_local)

__all__ = ["Mesh", "create", "slice_into", "sliced", "checked", "dim_groups", "mesh_shape",
           "coordinate", "bcast", "exscan", "alltoallv", "any_member", "any_bits",
           "allgather_int",
           "mesh_time_model", "set_mesh_time_model", "nodes", "direct_read",
           "Request", "agree", "comm_counters", "default_time_model", "mpi_library_version",
           "comm_live_count", "direct_fail_next", "plan_check",
           "set_collective_timeout", "collective_timeout", "watchdog_listen",
           "watchdog_leave", "watchdog_work", "watchdog_tell", "watchdog_failed",
           "ring_shift_start", "ring_allgatherv_start", "ring_allgather_int64",
           "distribute", "select_exchange", "pool_set_limit", "pool_cached_bytes",
           "pool_trim", "dispatch_stats"]

_COLLS = tuple(itertools.takewhile(lambda name: name != b"unknown",
                                   map(mt_coll_name, range(64))))  # mt_coll
# The module's counters, which every mesh counts into and comm_counters() reads.
_COUNTERS = exported(_C.COMM_COUNTERS, "mpitensor._C.comm_counters")

_NODE_KINDS = ("one", "blocks", "unequal", "interleaved")  # mt_nodes_kind


@functools.cache
def _mpi():
    """mpi4py's MPI and the mesh functions that take or give an MPI_Comm, whose C
    type (an int or a pointer) is the MPI library's. Bound on the first mesh, not
    at import, so that `import mpitensor` and its layout math do not start MPI."""
    from mpi4py import MPI  # imported here so that `import mpitensor` does not start MPI
    comm = I if MPI._sizeof(MPI.Comm) == sizeof(I) else P
    return (MPI, *mpi_comm_bindings(comm))


def _comm_object(handle):
    """The mpi4py communicator of ``handle``, of the class its kind asks for (an
    Intracomm, a Cartcomm, ...), as mpi4py itself would make it."""
    MPI = _mpi()[0]
    comm = MPI.Comm.fromhandle(handle or 0)
    if comm == MPI.COMM_NULL:
        return comm
    if comm.Is_inter():
        return MPI.Intercomm.fromhandle(handle)
    kinds = {MPI.CART: MPI.Cartcomm, MPI.GRAPH: MPI.Graphcomm,
             MPI.DIST_GRAPH: MPI.Distgraphcomm}
    return kinds.get(comm.Get_topology(), MPI.Intracomm).fromhandle(handle)


def checked(mesh):
    """``mesh`` (a mesh: a ``_C.MeshBase``) for a collective, which ctypes passes
    as its ``mt_mesh *``: TypeError for another object; RuntimeError off the
    mesh's thread or on a freed mesh."""
    if not isinstance(mesh, _C.MeshBase):
        raise TypeError(f"expected a mesh, got {type(mesh).__name__}")
    call(mt_mesh_check, mesh)
    return mesh


def _buffer(obj, writable: bool, what: str) -> np.ndarray:
    """``obj`` when it is a C-contiguous ndarray (writable when asked): MPI moves it
    as flat bytes."""
    if not (isinstance(obj, np.ndarray) and obj.flags.c_contiguous
            and (obj.flags.writeable or not writable)):
        raise TypeError(f"{what} must be a{' writable' if writable else ''} "
                        "C-contiguous ndarray")
    return obj


def mesh_dim(obj) -> int:
    """A mesh dim argument; -1 for one out of range, which the comm call refuses on
    every rank alike."""
    d = operator.index(obj)
    return d if 0 <= d <= MAX_MESH_NDIM else -1


def _model_tuple(m: _TimeModel) -> tuple:
    return (m.alpha[0], m.beta[0], m.alpha[1], m.beta[1], m.call, m.copy, m.reduce,
            m.ranks_per_node)


def time_model(obj) -> _TimeModel:
    """The checked time model of its tuple (alpha_shm, beta_shm, alpha_net,
    beta_net, call, copy, reduce, ranks_per_node)."""
    if not isinstance(obj, tuple):
        raise TypeError("a time model is a tuple (alpha_shm, beta_shm, alpha_net, "
                        "beta_net, call, copy, reduce, ranks_per_node), got "
                        f"{type(obj).__name__}")
    if len(obj) != 8:
        raise TypeError(f"time model expected 8 arguments, got {len(obj)}")
    a0, b0, a1, b1, c, cp, r = (float(v) for v in obj[:7])
    m = _TimeModel(alpha=(D * 2)(a0, a1), beta=(D * 2)(b0, b1), call=c, copy=cp,
                   reduce=r, ranks_per_node=operator.index(obj[7]))
    call(mt_time_model_check, m)
    return m


class Mesh(_C.MeshBase):
    """A bare mesh of communicators, with no DeviceMesh around it (the collective
    checks' meshes). ``Mesh(comm, shape, ranks[, fingerprint, failure])`` is
    collective on ``comm``; every function here takes it, as a DeviceMesh.

    Example: ``any_member(Mesh(MPI.COMM_WORLD, (2,), np.arange(2, dtype=np.intc)), False)``.
    """

    def __new__(cls, comm, shape, ranks, fingerprint: int = 0,
                failure: BaseException | None = None):
        self = super().__new__(cls)
        create(self, comm, shape, ranks, fingerprint, failure)
        return self


def create(mesh, comm, shape, ranks, fingerprint: int = 0,
           failure: BaseException | None = None) -> None:
    """Gives ``mesh`` (a new ``_C.MeshBase``: a DeviceMesh or a :class:`Mesh`) its
    communicators: the ranks ``ranks`` (of ``comm``) in a mesh of ``shape``.
    ``failure``, this rank's failure from its own checks, is agreed on with the
    shape, the ranks and the fingerprint, so that every rank raises the first
    failing rank's error. The thread that makes it is the one that may run its
    collectives. Collective on ``comm``.

    Example: ``create(self, comm, (2,), np.arange(2, dtype=np.intc))``.
    """
    MPI, make, _ = _mpi()
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"expected a Comm, got {type(comm).__name__}")
    shape, ndim = _int64s(shape, MAX_MESH_NDIM, "mesh shape")
    ranks = np.asarray(ranks).astype(np.intc, casting="safe", copy=False)
    if ranks.ndim != 1:
        raise ValueError("the ranks of a mesh are a 1-D array")
    ranks, numel = np.ascontiguousarray(ranks), int(np.prod(shape[:ndim]))
    err = Error()
    if failure is not None:
        err.code, err.msg = status_of(type(failure)), _message(str(failure))
    elif ranks.size != numel:
        err.code = status_of(ValueError)
        err.msg = f"the mesh has {ranks.size} ranks but its shape needs {numel}".encode()
    made = P()
    check(make(MPI._handleof(comm), ndim, shape, ranks, err.code,
               operator.index(fingerprint) & 0xFFFFFFFFFFFFFFFF, made, err), err)
    _adopted(mesh, made)
    # Every mesh (and its slices) counts into the module's counters, which
    # comm_counters() reads.
    mt_mesh_set_counters(mesh, _COUNTERS)


def _adopted(mesh, made) -> None:
    """``mesh`` owns the ``mt_mesh`` the ctypes pointer ``made`` holds (destroyed
    here if it cannot)."""
    try:
        mesh._adopt(made)
    except BaseException:
        mt_mesh_destroy(made)
        raise


def slice_into(sub, mesh, dims) -> None:
    """Gives ``sub`` (a new ``_C.MeshBase``) the mesh over mesh dims ``dims``
    (ascending) of ``mesh``, sharing its communicators. Local."""
    checked(mesh)
    dims, n = _int64s(dims, MAX_MESH_NDIM, "dims")
    made = P()
    call(mt_mesh_slice, mesh, n, (I * max(n, 1))(*dims[:n]), made)
    _adopted(sub, made)


def sliced(mesh, dims) -> Mesh:
    """A bare :class:`Mesh` over mesh dims ``dims`` (ascending) of ``mesh``,
    sharing its communicators. Local.

    Example: ``any_member(sliced(mesh, [1]), flag)``.
    """
    sub = _C.MeshBase.__new__(Mesh)
    slice_into(sub, mesh, dims)
    return sub


def dim_groups(mesh) -> tuple:
    """One mpi4py communicator per mesh dim (COMM_NULL on a non-member). They
    share the mesh's handles, which the mesh frees: they are made once and kept
    on the mesh. Local."""
    groups = getattr(checked(mesh), "_dim_groups", None)
    if groups is None:
        _, _, dim_comm = _mpi()
        groups = mesh._dim_groups = tuple(_comm_object(dim_comm(mesh, d))
                                          for d in range(mt_mesh_ndim(mesh)))
    return groups


def mesh_shape(mesh) -> tuple[int, ...]:
    """The mesh shape. Local."""
    return tuple(mt_mesh_dim_size(mesh, d) for d in range(mt_mesh_ndim(mesh)))


def coordinate(mesh) -> tuple[int, ...] | None:
    """This rank's coordinate, or None for a non-member. Local."""
    coord = (I64 * MAX_MESH_NDIM)()
    return tuple(coord[:mt_mesh_ndim(mesh)]) if mt_mesh_coordinate(mesh, coord) else None


def bcast(mesh, array: np.ndarray, dim: int) -> None:
    """Broadcasts ``array`` in place from coordinate 0 of mesh dim ``dim``.
    Collective on the dim."""
    a = _buffer(array, True, "bcast: array")
    call(mt_mesh_bcast, checked(mesh), mesh_dim(dim), a, a.nbytes)


def exscan(mesh, array: np.ndarray, dim: int, op: int) -> None:
    """The exclusive prefix (MPI_Exscan) of ``array`` by reduce op ``op`` over
    the ranks before this one on mesh dim ``dim``, in place; coordinate 0 keeps
    its array. Collective on the dim; counted as an exscan."""
    m = checked(mesh)
    a = _buffer(array, True, "exscan: array")
    d, code = mesh_dim(dim), dtype_code(a.dtype)
    if code < 0:
        raise TypeError("exscan of an unsupported dtype")
    call(mt_mesh_exscan, m, d, a, a.size, code, operator.index(op))


def alltoallv(mesh, array: np.ndarray, counts, dim: int):
    """(rows, counts received): ``counts[q]`` rows of C-contiguous ``array`` (in
    order) go to coordinate q of mesh dim ``dim``. Collective on the dim;
    counted as two all-to-alls (the counts, then the rows)."""
    m = checked(mesh)
    a = _buffer(array, False, "alltoallv: array")
    if not 1 <= a.ndim <= MAX_NDIM:
        raise ValueError("alltoallv needs an array of at least one dim")
    d = mesh_dim(dim)
    if not 0 <= d < mt_mesh_ndim(m):
        raise IndexError(f"mesh dim {dim!r} is out of range")
    n = mt_mesh_dim_size(m, d)
    send = [operator.index(c) for c in counts]
    if len(send) > n:
        raise ValueError(f"alltoallv: counts has {len(send)} entries; at most {n} "
                         "are supported")
    if len(send) != n or sum(send) != a.shape[0]:
        raise ValueError(f"alltoallv: {len(send)} counts adding up to {sum(send)} "
                         f"rows, for a mesh dim of size {n} and an array of "
                         f"{a.shape[0]} rows")
    send, recv = (I64 * n)(*send), (I64 * n)()
    call(mt_mesh_alltoall_i64, m, d, send, recv)
    out = np.empty((sum(recv),) + a.shape[1:], a.dtype)
    # Rows of zero bytes (a dim of size 0) have nothing to move.
    row = a.itemsize * int(np.prod(a.shape[1:]))
    if row > 0:
        call(mt_mesh_alltoallv, m, d, a, send, out, recv, row)
    return out, tuple(recv)


def any_member(mesh, flag) -> bool:
    """The OR of ``flag`` over all members. Collective on the mesh."""
    return bool(any_bits(mesh, bool(flag)))


def any_bits(mesh, bits: int) -> int:
    """The bitwise OR of ``bits`` (an int of up to 31 bits) over all members:
    several yes-or-no questions in one all-reduce. Collective on the mesh.

    Example: ``moved, copies = divmod(any_bits(mesh, 2 * moved + copies), 2)``.
    """
    if not isinstance(mesh, _C.MeshBase):
        raise TypeError(f"expected a mesh, got {type(mesh).__name__}")
    return mesh._any_bits(operator.index(bits))


def allgather_int(mesh, value: int, dim: int) -> tuple[int, ...]:
    """Every member's int on mesh dim ``dim``, by coordinate. Collective on the
    dim; counted as an all-gather."""
    m = checked(mesh)
    value, d = operator.index(value), mesh_dim(dim)
    out = (I64 * (mt_mesh_dim_size(m, d) if 0 <= d < mt_mesh_ndim(m) else 1))()
    call(mt_mesh_allgather_i64, m, d, value, out)
    return tuple(out)


def mesh_time_model(mesh) -> tuple:
    """(alpha_shm, beta_shm, alpha_net, beta_net, call, copy, reduce,
    ranks_per_node): how plans on ``mesh`` are ranked; ranks_per_node from
    MPI_Comm_split_type (0: one node). Local."""
    return _model_tuple(mt_mesh_time_model(mesh).contents)


def set_mesh_time_model(mesh, model: tuple) -> None:
    """The costs of a calibrated table (ValueError when invalid);
    ranks_per_node stays what the mesh learnt. Local."""
    call(mt_mesh_set_time_model, mesh, time_model(model))
    mesh._time_model_changed()


def nodes(mesh) -> tuple[str, int, int, int]:
    """(kind, count, smallest, largest) of the nodes the members lie on, as the
    mesh learnt when it was made ('one', 'blocks', 'unequal', 'interleaved').
    Local."""
    n = _Nodes()
    mt_mesh_nodes_of(mesh, n)
    return _NODE_KINDS[n.kind], n.count, n.smallest, n.largest


def direct_read(mesh) -> bool:
    """Whether large steps copy parts straight between the members' arrays
    (mt_mesh_direct_read). Local."""
    return bool(mt_mesh_direct_read(mesh))


def agree(mesh, ok, fingerprint: int, message: str, error: type = ValueError) -> None:
    """Raises on every member when some member passed ``ok=False`` (the first such
    member's ``error``, mapped to ValueError, TypeError, IndexError, MemoryError,
    NotImplementedError, OverflowError, OSError or else RuntimeError, with its
    message) or when the members' fingerprints (ints, taken mod 2**64) differ
    (ValueError with the first member's message). Ranks outside the mesh take no
    part and raise only their own failure. Collective on the mesh.

    Example: ``agree(mesh, buf is not None, hash(shape), 'no memory',
    MemoryError)``.
    """
    m = checked(mesh)
    ok = bool(ok)
    fp = operator.index(fingerprint) & (2**64 - 1)
    if not isinstance(message, str):
        raise TypeError("agree: message must be a str")
    if not (isinstance(error, type) and issubclass(error, Exception)):
        raise TypeError("agree: error must be an exception class")
    err = Error()
    err.msg = _message(message)
    check(mt_agree(m, 0 if ok else status_of(error), fp, err), err)


def agree_float_errors(mesh, error: BaseException | None) -> None:
    """Raises on every member the first failing member's ``error`` (this rank's
    floating-point error of a computation, or what the program's error callback
    raised; None: none), mapped as :func:`agree` maps it, with FloatingPointError
    kept; or ValueError when the members' NumPy error states differ (a member
    whose state does not raise makes its next agreement instead of this one). The
    agreement the executor makes on an operation's result where NumPy's error state
    raises. Collective on the mesh.

    Example: ``agree_float_errors(mesh, None if ok else FloatingPointError("overflow"))``.
    """
    m = checked(mesh)
    err = Error()
    if error is not None:
        err.msg = _message(str(error))
    check(mt_agree_float_errors(m, 0 if error is None else status_of(type(error)), err), err)


def dispatch_stats(tables) -> dict[str, int]:
    """{hits, misses, decisions, plans, layouts, and their limits} of a mesh's
    decision memo and layout table, whose capsules ``tables`` holds
    (``DeviceMesh._tables``). Local.

    Example: ``dispatch_stats(mesh._tables)["hits"]``.
    """
    memo = exported(tables[0], "mpitensor._C.memo")
    layouts = exported(tables[1], "mpitensor._C.layout_table")
    st = _MemoStats()
    mt_memo_stats_get(memo, st)
    return {"hits": st.hits, "misses": st.misses, "decisions": st.decisions,
            "plans": st.plans, "layouts": mt_layout_table_count(layouts),
            "decision_limit": st.decision_limit, "plan_limit": st.plan_limit,
            "layout_limit": mt_layout_table_capacity(layouts)}


def comm_counters() -> dict[str, tuple[int, int]]:
    """{collective name: (calls, bytes sent)} of every mesh of this process. Local."""
    t = _Totals()
    mt_comm_counters_read(_COUNTERS, t)
    return {name.decode(): (t.calls[k], t.bytes[k]) for k, name in enumerate(_COLLS)}


def default_time_model() -> tuple:
    """The built-in time model (alpha_shm, beta_shm, alpha_net, beta_net, call,
    copy, reduce, ranks_per_node): one node. Local."""
    return _model_tuple(mt_time_model_default())


def mpi_library_version() -> str:
    """The MPI_Get_library_version string of the libmpi the extension links.
    Local."""
    text = text_buffer(8192)
    call(mt_mpi_library_version, text, len(text))
    return text.value.decode(errors="replace")


def comm_live_count() -> int:
    """Communicators mpitensor created and has not freed yet. Local."""
    return mt_comm_live_count()


def direct_fail_next(n: int) -> int:
    """For tests: the next ``n`` direct copies of this process fail; returns the
    failures asked before and not yet taken (mt_direct_fail_next). Local."""
    return mt_direct_fail_next(operator.index(n))


def plan_check(src, dst, dtype) -> None:
    """Raises what redistributing ``src`` to ``dst`` placement codes of ``dtype``
    refuses (RuntimeError: creating a Partial; TypeError: a reduction the dtype
    lacks). Local, no communication.

    Example: ``plan_check([(2, 0, 0)], [(0, 0, 0)], np.float64)``.
    """
    layouts = [_Layout(), _Layout()]
    for layout, codes in zip(layouts, (src, dst)):
        layout.placements, layout.mesh_ndim = _placements(codes)
    call(mt_plan_check, layouts[0], layouts[1], dtype_code(dtype))


# ---- the collective watchdog (mpitensor/comm/watchdog.h) ----------------------------

_DEFAULT_TIMEOUT = 1800.0  # MT_WATCHDOG_DEFAULT_SECONDS: torch's, for gloo


def _reason(text: str) -> bytes:
    """A reason as the watchdog's notices carry it: at most 255 bytes of UTF-8."""
    return text.encode()[:255].decode(errors="ignore").encode()


def set_collective_timeout(seconds: float | None) -> None:
    """A process that waits in one of mpitensor's blocking collectives (or in a
    ScaLAPACK routine mpitensor runs) for this long, with no other call entered,
    prints where it waits and the stack of each of its threads, and aborts the
    job; 0 turns the watchdog off, None restores the default (1800 s). MPI must be
    initialised. Local.

    Example: ``set_collective_timeout(600.0)``.
    """
    dumper = traceback_dumper()
    if dumper is not None:  # the stacks of a stuck process, in the watchdog's report
        mt_watchdog_set_dump(*dumper)
    call(mt_watchdog_set_timeout, _DEFAULT_TIMEOUT if seconds is None else float(seconds))


def collective_timeout() -> float:
    """The watchdog's timeout in seconds, 0.0 when off. Local."""
    return mt_watchdog_timeout()


def watchdog_listen(mesh) -> bool:
    """Starts listening for ranks that leave the job, after the creation of
    ``mesh`` (a :class:`Mesh`); whether this process listens. Collective on the mesh
    when it holds every rank of MPI_COMM_WORLD, else Local."""
    if not isinstance(mesh, _C.MeshBase):
        raise TypeError(f"expected a mesh, got {type(mesh).__name__}")
    listening = I()
    call(mt_watchdog_listen_mesh, mesh, listening)
    return bool(listening.value)


def watchdog_leave(reason: str | None) -> None:
    """This process leaves the job, for ``reason`` (None: only stop listening):
    waits up to a second for the others to leave too, else tells them and waits
    for them."""
    call(mt_watchdog_leave, None if reason is None else _reason(reason))


def watchdog_work(tag: int) -> None:
    """The tag of the work (an engine's cell) this process runs now; notices of
    failures in the same work count. Local."""
    mt_watchdog_set_work(operator.index(tag))


def watchdog_tell(reason: str, tag: int) -> None:
    """Tells every other process that this one failed in work ``tag`` (an engine's
    cell), without leaving."""
    call(mt_watchdog_tell, _reason(reason), operator.index(tag))


def watchdog_failed(tag: int) -> int:
    """How many other processes said they failed in work ``tag``. Local."""
    return mt_watchdog_failed(operator.index(tag))


# ---- the ring exchanges of context parallelism (mpitensor/comm/ring.h) --------------

_RING_MAX_BLOCKS = 4  # MT_RING_MAX_BLOCKS


def _pending(request) -> int:
    """The ``mt_pending *`` its capsule owns, for a ctypes call."""
    return capsule_pointer(request._pending, b"mpitensor.pending")


class Request:
    """An exchange in flight (an asynchronous redistribute, a ring shift or
    all-gather): ``wait()`` completes it and returns its result, safely from
    several threads at once. The comm library's ``mt_pending`` is owned by a
    capsule (``_pending``) that also holds what the exchange reads and writes:
    freed, it completes the exchange first, so MPI never touches memory freed
    meanwhile. The executor makes those of asynchronous redistributes.

    Example: ``ring_shift_start(mesh, 0, [k], [k2]).wait()``.
    """

    __slots__ = ("_pending", "_result")

    def wait(self):
        """Completes the exchange (collective on the mesh for a redistribute) and
        returns its result."""
        pending = _pending(self)
        if not mt_pending_done(pending):
            call(mt_pending_wait, pending)
        return self._result

    def test(self) -> bool:
        """Lets MPI progress the exchange (MPI_Test); True once it has completed,
        so that wait() no longer blocks. Local."""
        done = I()
        call(mt_pending_test, _pending(self), done)
        return bool(done.value)

    @property
    def done(self) -> bool:
        """True once wait() has completed it."""
        return bool(mt_pending_done(_pending(self)))


def _started(start, keep, result, *args) -> Request:
    """A :class:`Request` for the exchange ``start(*args)`` begins: ``keep`` stays
    referenced until it completes, and wait() returns ``result``."""
    made, pending = P(), P()
    call(start, *args, made)
    # A handle that cannot be made completes the exchange before it fails.
    call(mt_pending_create, None, made, pending)
    owner = _C.adopt(pending, "pending", keep)
    out = object.__new__(Request)
    out._pending, out._result = owner, result
    return out


def _blocks(seq, writable: bool, what: str) -> tuple:
    """1 to MT_RING_MAX_BLOCKS arrays, checked as MPI moves them."""
    arrays = tuple(seq)
    if not 1 <= len(arrays) <= _RING_MAX_BLOCKS:
        raise ValueError(f"a shift moves 1 to {_RING_MAX_BLOCKS} arrays, got {len(arrays)}")
    return tuple(_buffer(a, writable, what) for a in arrays)


def ring_shift_start(mesh, dim: int, sends, recvs) -> Request:
    """The arrays of ``sends`` go to the next rank on mesh dim ``dim``, those of
    ``recvs`` are filled from the previous one, pairwise; wait() gives ``recvs``.
    Collective on the dim.

    Example: ``ring_shift_start(mesh, 0, [k, v], [k2, v2]).wait()``.
    """
    m, d = checked(mesh), mesh_dim(dim)
    # Tuples, so the arrays MPI is reading and writing cannot leave them meanwhile.
    sends, recvs = _blocks(sends, False, "every send"), _blocks(recvs, True, "every recv")
    if len(sends) != len(recvs):
        raise ValueError(f"{len(sends)} sends but {len(recvs)} recvs")
    n = len(sends)
    ptrs = [(P * n)(*(a.ctypes.data for a in arrays)) for arrays in (sends, recvs)]
    sizes = [(I64 * n)(*(a.nbytes for a in arrays)) for arrays in (sends, recvs)]
    return _started(mt_ring_shift_start, (mesh, sends, recvs), recvs, m, d, n, ptrs[0], sizes[0],
                    ptrs[1], sizes[1])


def ring_allgatherv_start(mesh, dim: int, send, recv, byte_counts) -> Request:
    """``recv`` receives every rank's block (``byte_counts`` by coordinate) in
    coordinate order; wait() gives ``recv``. Collective on the dim."""
    m, d = checked(mesh), mesh_dim(dim)
    send, recv = _buffer(send, False, "send"), _buffer(recv, True, "recv")
    counts, n = _int64s(byte_counts, 1024, "byte counts")
    return _started(mt_ring_allgatherv_start, (mesh, send, recv), recv, m, d, send, send.nbytes,
                    recv, recv.nbytes, counts, n)


def ring_allgather_int64(mesh, dim: int, values) -> tuple[int, ...]:
    """``len(values)`` ints of every rank on mesh dim ``dim``, in coordinate order.
    Collective on the dim."""
    m, d = checked(mesh), mesh_dim(dim)
    mine, n = _int64s(values, 64, "values")
    total = max(mt_mesh_dim_size(m, d), 1) * max(n, 1)
    out = (I64 * total)()
    call(mt_ring_allgather_int64, m, d, mine, n, out)
    return tuple(out[:mt_mesh_dim_size(m, d) * n])


# ---- whole tensors: distribute and the selection exchange of basic indexing ---------


def _layout_on(m: int, shape, codes) -> _Layout:
    """The layout of ``shape`` placed by ``codes`` on the mesh's shape."""
    pl, n = _placements(codes)
    nm = mt_mesh_ndim(m)
    if n != nm:
        raise ValueError(f"{n} placements for a {nm}-D mesh")
    sh, nd = _int64s(shape, MAX_NDIM + 1, "shape")
    out = _Layout()
    call(mt_layout_init, out, nd, sh, nm,
         (I64 * MAX_MESH_NDIM)(*(mt_mesh_dim_size(m, d) for d in range(nm))), pl)
    return out


def _my_box(m: int, layout: _Layout) -> _Box:
    """This rank's box of ``layout``."""
    coord = (I64 * MAX_MESH_NDIM)()
    if not mt_mesh_coordinate(m, coord):
        raise RuntimeError("this rank is not a member of the mesh")
    box = _Box()
    call(mt_layout_local_box, layout, coord, box)
    return box


def _movable(obj) -> np.ndarray:
    """A C-contiguous ndarray of ``obj``'s elements, of a dtype MPI moves."""
    if not isinstance(obj, np.ndarray):
        raise TypeError(f"expected a NumPy ndarray, got {type(obj).__name__}")
    if dtype_code(obj.dtype) < 0 or not obj.dtype.isnative:
        raise TypeError(f"mpitensor does not move arrays of dtype {obj.dtype!r}")
    return obj if obj.flags.c_contiguous else obj.copy(order="C")  # 0-d stays 0-d


def _check_local(piece: np.ndarray, box: _Box) -> None:
    """A local array must be exactly this rank's box (the core's check and words,
    the executor's too)."""
    call(mt_box_check_local, box, piece.ndim, _int64s(piece.shape, 64, "shape")[0])


def _box_array(box: _Box, dtype):
    """A new array of ``box``'s shape, or None where there is no memory for it: the
    rank still takes part, with no buffer, in the agreement the exchange starts
    with, so that every rank raises MemoryError."""
    try:
        return _C.empty(box.shape[:box.ndim], dtype)
    except MemoryError:
        return None


def distribute(mesh, codes, full: np.ndarray, src: int = 0) -> np.ndarray:
    """This rank's box of ``full`` placed by ``codes``, whose copy at coordinate
    ``src`` of every mesh dim is the source of truth. Collective on the mesh."""
    src, m = operator.index(src), checked(mesh)
    full = _movable(full)
    layout = _layout_on(m, full.shape, codes)
    local = _box_array(_my_box(m, layout), full.dtype)
    call(mt_distribute_from, m, layout, dtype_code(full.dtype), src, full, local)
    return local


def select_exchange(mesh, shape, src_codes, dst_codes, starts, steps, counts,
                    piece: np.ndarray, key: int = 0) -> np.ndarray:
    """This rank's box, laid out by ``dst_codes``, of the selection (``starts``,
    ``steps``, ``counts`` per dim) of a tensor of ``shape`` laid out by
    ``src_codes``; ``piece`` is the rank's local array indexed by the selection.
    ``key``: a fingerprint of the rest of the index (the dims it drops or adds),
    agreed with the selection. Collective on the mesh."""
    m = checked(mesh)
    sh, ndim = _int64s(shape, MAX_NDIM, "shape")
    sel = _Selection(ndim=ndim)
    got = [_int64s(v, MAX_NDIM, what) for v, what in
           ((starts, "starts"), (steps, "steps"), (counts, "counts"))]
    if any(n != ndim for _, n in got):
        raise ValueError("starts, steps and counts need one entry per dim")
    sel.start[:ndim], sel.step[:ndim], sel.count[:ndim] = (v[:ndim] for v, _ in got)
    src = _layout_on(m, sh[:ndim], src_codes)
    dst = _layout_on(m, sel.count[:ndim], dst_codes)
    call(mt_selection_check, sel, ndim, sh)
    image, mine = _Box(), _my_box(m, src)
    tb = _my_box(m, dst)
    mt_selection_image(sel, mine, image)
    piece = _movable(piece)
    _check_local(piece, image)
    out = _box_array(tb, piece.dtype)
    call(mt_selection_exchange, m, src, sel, operator.index(key) & (2**64 - 1), dst,
         dtype_code(piece.dtype), piece, out)
    return out


# ---- the block pool (mpitensor/comm/pool.h) ------------------------------------------

pool_trim.__doc__ = ("pool_trim(): frees the pool's cached blocks and hands what the C heap "
                     "keeps free back to the system (glibc's malloc_trim). Local.")


def pool_set_limit(limit: int) -> int:
    """The most bytes of freed large blocks the pool keeps for reuse (0: none);
    returns the previous limit. Local."""
    limit = operator.index(limit)
    if limit < 0:
        raise OverflowError("can't convert negative int to unsigned")
    return mt_pool_set_limit(limit)


def pool_cached_bytes() -> int:
    """Bytes of freed blocks the pool holds for reuse. Local."""
    return mt_pool_cached_bytes()
