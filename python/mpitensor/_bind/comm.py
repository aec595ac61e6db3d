"""Meshes and what runs on them, from ``csrc/comm``: meshes made, sliced and read,
their small collectives, plan runs, the call agreement, ring exchanges, pending
requests, the watchdog, the counters, distribute and the selection exchange, the
block pool. Callers: :mod:`mpitensor._comm`, :mod:`mpitensor._plan`."""

from __future__ import annotations

import functools

from .._clib import SIZE, U64, A, D, E, I, I64, P, S, _Layout, _Selection, fn, ptr, struct
from .core import TimeModel

MeshNodes, CommTotals = struct("mt_mesh_nodes"), struct("mt_comm_totals")


@functools.cache
def mpi_comm_bindings(comm: type) -> tuple:
    """(mt_mesh_create_agreed, mt_mesh_dim_comm): the two functions that take or give
    an MPI_Comm, whose ctypes type ``comm`` (an int or a pointer) only the MPI
    library says; bound on the first mesh, not at import, so that importing
    mpitensor does not start MPI."""
    return (fn("mt_mesh_create_agreed", I, comm, I, P, A, I, U64, ptr(P), E),
            fn("mt_mesh_dim_comm", comm, P, I))

# Meshes and their small collectives
mt_coll_name = fn("mt_coll_name", S, I)
mt_mesh_ndim = fn("mt_mesh_ndim", I, P)
mt_mesh_dim_size = fn("mt_mesh_dim_size", I64, P, I)
mt_mesh_coordinate = fn("mt_mesh_coordinate", I, P, P)
mt_mesh_bcast = fn("mt_mesh_bcast", I, P, I, A, I64, E)
mt_mesh_exscan = fn("mt_mesh_exscan", I, P, I, A, I64, I, I, E)
mt_mesh_alltoall_i64 = fn("mt_mesh_alltoall_i64", I, P, I, P, P, E)
mt_mesh_alltoallv = fn("mt_mesh_alltoallv", I, P, I, A, P, A, P, I64, E)
mt_mesh_allgather_i64 = fn("mt_mesh_allgather_i64", I, P, I, I64, P, E)
mt_mesh_direct_read = fn("mt_mesh_direct_read", I, P)
mt_mesh_nodes_of = fn("mt_mesh_nodes_of", None, P, ptr(MeshNodes))
mt_mesh_time_model = fn("mt_mesh_time_model", ptr(TimeModel), P)
mt_mesh_set_time_model = fn("mt_mesh_set_time_model", I, P, TimeModel, E)
mt_agree = fn("mt_agree", I, P, I, U64, E)
mt_agree_float_errors = fn("mt_agree_float_errors", I, P, I, E)
mt_comm_counters_read = fn("mt_comm_counters_read", None, P, ptr(CommTotals))
mt_comm_live_count = fn("mt_comm_live_count", I64)
mt_mpi_library_version = fn("mt_mpi_library_version", I, S, I, E)
mt_direct_fail_next = fn("mt_direct_fail_next", I, I)
mt_mesh_slice = fn("mt_mesh_slice", I, P, I, P, ptr(P), E)
mt_mesh_destroy = fn("mt_mesh_destroy", None, P)
mt_mesh_check = fn("mt_mesh_check", I, P, E)
mt_mesh_set_counters = fn("mt_mesh_set_counters", None, P, P)

# The watchdog
mt_watchdog_set_timeout = fn("mt_watchdog_set_timeout", I, D, E)
mt_watchdog_timeout = fn("mt_watchdog_timeout", D)
mt_watchdog_listen_mesh = fn("mt_watchdog_listen_mesh", I, P, ptr(I), E)
mt_watchdog_leave = fn("mt_watchdog_leave", I, S, E)
mt_watchdog_set_work = fn("mt_watchdog_set_work", None, I64)
mt_watchdog_tell = fn("mt_watchdog_tell", I, S, I64, E)
mt_watchdog_failed = fn("mt_watchdog_failed", I, I64)
mt_watchdog_set_dump = fn("mt_watchdog_set_dump", None, P, P)

# Ring exchanges and pending requests
mt_ring_shift_start = fn("mt_ring_shift_start", I, P, I, I, P, P, P, P, ptr(P), E)
mt_ring_allgatherv_start = fn("mt_ring_allgatherv_start", I, P, I, A, I64, A, I64, P, I, ptr(P), E)
mt_ring_allgather_int64 = fn("mt_ring_allgather_int64", I, P, I, P, I, P, E)
mt_pending_create = fn("mt_pending_create", I, P, P, ptr(P), E)
mt_pending_wait = fn("mt_pending_wait", I, P, E)
mt_pending_test = fn("mt_pending_test", I, P, ptr(I), E)
mt_pending_done = fn("mt_pending_done", I, P)

# Distribute and the selection exchange
mt_selection_exchange = fn("mt_selection_exchange", I, P, _Layout, _Selection, U64, _Layout, I,
                           A, A,
                         E)
mt_distribute_from = fn("mt_distribute_from", I, P, _Layout, I, I64, A, A, E)

# The block pool
mt_pool_set_limit = fn("mt_pool_set_limit", SIZE, SIZE)
mt_pool_cached_bytes = fn("mt_pool_cached_bytes", SIZE)
mt_pool_trim = fn("mt_pool_trim", None)
mt_redistribute = fn("mt_redistribute", I, P, P, I, A, A, E)
