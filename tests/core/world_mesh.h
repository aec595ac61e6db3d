/* A 1-D mesh over all of MPI_COMM_WORLD, for the C tests that run under mpiexec,
 * counting its collectives into `test_counters`. */
#ifndef MPITENSOR_TEST_WORLD_MESH_H
#define MPITENSOR_TEST_WORLD_MESH_H

#include <mpi.h>
#include <stdlib.h>

#include "check.h"
#include "mpitensor/comm/counters.h"
#include "mpitensor/comm/mesh.h"

/* What the tests' meshes count into. */
static mt_comm_counters test_counters;

static inline mt_mesh *world_mesh(void) {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int *ranks = malloc((size_t)size * sizeof *ranks);
  CHECK(ranks != NULL);
  if (ranks == NULL) return NULL;
  for (int i = 0; i < size; ++i) ranks[i] = i;
  int64_t shape[1] = {size};
  mt_mesh *m = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, shape, ranks, &m, NULL) == MT_OK);
  free(ranks);
  if (m != NULL) mt_mesh_set_counters(m, &test_counters);
  return m;
}

#endif
