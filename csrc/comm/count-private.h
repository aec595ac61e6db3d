/* Counting what the executors send, for CommDebugMode (counters.h): the comm
 * files that run collectives on a mesh include this; the mesh itself counts into
 * its own field, so that this header, which asks the mesh for its counters, is
 * not one the mesh needs. */
#ifndef MPITENSOR_COUNT_PRIVATE_H
#define MPITENSOR_COUNT_PRIVATE_H

#include <stdint.h>

#include "mpitensor/comm/counters.h"
#include "mpitensor/comm/mesh.h"

/* Counts one collective of `kind` on `mesh` that delivered `bytes` of payload from
 * this process to other ranks, into the mesh's counters (if any). */
static inline void mt__count(const mt_mesh *mesh, int kind, int64_t bytes) {
  mt_comm_count(mt_mesh_counters(mesh), kind, bytes);
}

#endif
