/* Helpers shared by the core's MPI translation units (mesh, counters, executor). */
#ifndef MPITENSOR_COMM_PRIVATE_H
#define MPITENSOR_COMM_PRIVATE_H

#include <mpi.h>
#include <stdint.h>

#include "core-private.h"
#include "mpitensor/comm.h"

/* Turns an MPI error code into MT_EMPI with MPI's own explanation of it. */
int mt__mpi_fail(mt_error *err, int rc, const char *what);

/* Returns from the enclosing function with MT_EMPI when an MPI call fails; the
 * function must have an `mt_error *err` in scope. */
#define MT__MPI_TRY(call, what)                                        \
  do {                                                                 \
    int mt_mpi_rc_ = (call);                                           \
    if (mt_mpi_rc_ != MPI_SUCCESS) return mt__mpi_fail(err, mt_mpi_rc_, what); \
  } while (0)

/* Records one collective call of `kind` that delivered `bytes` of payload from
 * this process to other ranks. */
void mt__count(int kind, int64_t bytes);

/* The communicator of all members of a mesh, ordered by row-major mesh position.
 * For a slice it is created on first use: Collective on the slice's members then. */
int mt__mesh_flat_comm(mt_mesh *mesh, MPI_Comm *out, mt_error *err);

#endif
