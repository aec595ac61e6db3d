/* Helpers shared by the comm library's translation units (mesh, executors,
 * distribute, ring, agreement); not part of the public API. */
#ifndef MPITENSOR_COMM_PRIVATE_H
#define MPITENSOR_COMM_PRIVATE_H

#include <assert.h>
#include <mpi.h>
#include <stdint.h>
#include <string.h>

#include "mpitensor/counters.h"
#include "mpitensor/layout.h"
#include "mpitensor/mesh.h"
#include "mpitensor/status.h"

/* Returns from the enclosing function with MT_EMPI when an MPI call fails; the
 * function must have an `mt_error *err` in scope. */
#define MT__MPI_TRY(call, what)                                                \
  do {                                                                         \
    int mt_mpi_rc_ = (call);                                                   \
    if (mt_mpi_rc_ != MPI_SUCCESS) return mt_mpi_error(err, mt_mpi_rc_, what); \
  } while (0)

/* Counts one collective of `kind` on `mesh` that delivered `bytes` of payload from
 * this process to other ranks, into the mesh's counters (if any). */
static inline void mt__count(const mt_mesh *mesh, int kind, int64_t bytes) {
  mt_comm_count(mt_mesh_counters(mesh), kind, bytes);
}

/* The box of the rank whose coordinate is `coord` with mesh dim `m` set to `k`
 * (m < 0: `coord` itself), for a layout already validated: the member boxes of a
 * group along one mesh dim, as the executors walk them. */
static inline void mt__box_at(const mt_layout *layout, const int64_t *coord, int m,
                              int64_t k, mt_box *out) {
  int64_t at[MT_MAX_MESH_NDIM];
  memcpy(at, coord, (size_t)layout->mesh_ndim * sizeof *at);
  if (m >= 0) at[m] = k;
  int rc = mt_layout_local_box(layout, at, out, NULL);
  assert(rc == MT_OK);
  (void)rc;
}

#endif
