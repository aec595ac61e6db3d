/* Meshes over MPI_COMM_WORLD at whatever size mpiexec gave: coordinates,
 * per-dim communicators, non-members, slices, collectives and bad input. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mpitensor/comm/mesh.h"
#include "mpitensor/comm/redistribute.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"

static int world_rank, world_size;

/* What the meshes whose collectives are checked count into. */
static mt_comm_counters test_counters;

static int *iota(int n, int reversed) {
  int *r = malloc((size_t)n * sizeof *r);
  for (int i = 0; i < n; ++i) r[i] = reversed ? n - 1 - i : i;
  return r;
}

static void test_1d(int reversed) {
  int *ranks = iota(world_size, reversed);
  int64_t shape[1] = {world_size};
  mt_mesh *m = NULL;
  mt_error err = {0};
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, shape, ranks, &m, &err) == MT_OK);
  int64_t coord[1] = {-1};
  CHECK(mt_mesh_coordinate(m, coord) == 1);
  int expect = reversed ? world_size - 1 - world_rank : world_rank;
  CHECK(coord[0] == expect);
  int sub_rank = -1, sub_size = -1;
  MPI_Comm_rank(mt_mesh_dim_comm(m, 0), &sub_rank);
  MPI_Comm_size(mt_mesh_dim_comm(m, 0), &sub_size);
  CHECK(sub_rank == expect);
  CHECK(sub_size == world_size);
  mt_mesh_destroy(m);
  free(ranks);
}

/* A (2, n/2) mesh, or (1, n) for odd n: each dim communicator holds the ranks of
 * one row or one column, in coordinate order. */
static void test_2d(void) {
  int64_t shape[2] = {world_size % 2 == 0 ? 2 : 1, 0};
  shape[1] = world_size / shape[0];
  int *ranks = iota(world_size, 0);
  mt_mesh *m = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 2, shape, ranks, &m, NULL) == MT_OK);
  int64_t coord[2];
  CHECK(mt_mesh_coordinate(m, coord) == 1);
  CHECK(coord[0] == world_rank / shape[1] && coord[1] == world_rank % shape[1]);
  for (int d = 0; d < 2; ++d) {
    int r = -1, s = -1;
    MPI_Comm_rank(mt_mesh_dim_comm(m, d), &r);
    MPI_Comm_size(mt_mesh_dim_comm(m, d), &s);
    CHECK(r == coord[d] && s == shape[d]);
  }
  int dims[1] = {1};
  mt_mesh *col = NULL;
  mt_mesh_set_counters(m, &test_counters);
  CHECK(mt_mesh_slice(m, 1, dims, &col, NULL) == MT_OK);
  CHECK(mt_mesh_counters(col) ==
        &test_counters); /* a slice counts where its parent does */
  mt_mesh_destroy(m); /* the slice keeps its parent's communicators alive */
  int64_t c1[1];
  CHECK(mt_mesh_coordinate(col, c1) == 1 && c1[0] == coord[1]);
  CHECK(mt_mesh_ndim(col) == 1 && mt_mesh_dim_size(col, 0) == shape[1]);
  int s = -1;
  MPI_Comm_size(mt_mesh_dim_comm(col, 0), &s);
  CHECK(s == shape[1]);
  mt_mesh_destroy(col);
  free(ranks);
}

/* A one-rank mesh on rank 0: the others are not members. */
static void test_non_member(void) {
  int ranks[1] = {0};
  int64_t shape[1] = {1};
  mt_mesh *m = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, shape, ranks, &m, NULL) == MT_OK);
  int64_t coord[1];
  CHECK(mt_mesh_coordinate(m, coord) == (world_rank == 0));
  CHECK((mt_mesh_dim_comm(m, 0) == MPI_COMM_NULL) == (world_rank != 0));
  int any = -1;
  CHECK(mt_mesh_any(m, 1, &any, NULL) == MT_OK && any == 1);
  /* One member: its own value, no communication; a non-member is refused. */
  int64_t one = -1;
  int rc = mt_mesh_allgather_i64(m, 0, 5, &one, NULL);
  CHECK(world_rank == 0 ? rc == MT_OK && one == 5 : rc == MT_EINVAL);
  /* This rank's box of a layout on it: the whole tensor on the member only. */
  const int64_t tshape[2] = {6, 4};
  const mt_placement s0[1] = {{MT_PLACEMENT_SHARD, 0, 0, 0}};
  mt_layout l;
  mt_box box;
  mt_error err = {0};
  CHECK(mt_layout_init(&l, 2, tshape, 1, shape, s0, NULL) == MT_OK);
  rc = mt_mesh_local_box(m, &l, &box, &err);
  CHECK(world_rank == 0 ? rc == MT_OK && box.shape[0] == 6 && box.shape[1] == 4
                        : rc == MT_ESTATE && err.msg[0] != '\0');
  mt_mesh_destroy(m);
}

static void test_collectives(void) {
  int *ranks = iota(world_size, 0);
  int64_t shape[1] = {world_size};
  mt_mesh *m = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, shape, ranks, &m, NULL) == MT_OK);
  /* A mesh counts nothing until it is given counters. */
  mt_comm_totals before, after;
  mt_comm_counters_read(&test_counters, &before);
  CHECK(mt_mesh_counters(m) == NULL);
  int64_t *got = malloc((size_t)world_size * sizeof *got);
  CHECK(mt_mesh_allgather_i64(m, 0, 1, got, NULL) == MT_OK);
  mt_comm_counters_read(&test_counters, &after);
  CHECK(memcmp(&before, &after, sizeof before) == 0);
  mt_mesh_set_counters(m, &test_counters);
  double v[3] = {world_rank, world_rank + 1.0, -1.0};
  CHECK(mt_mesh_bcast(m, 0, v, (int64_t)sizeof v, NULL) == MT_OK);
  CHECK(v[0] == 0.0 && v[1] == 1.0 && v[2] == -1.0);
  int any = -1;
  CHECK(mt_mesh_any(m, world_rank == world_size - 1, &any, NULL) == MT_OK && any == 1);
  CHECK(mt_mesh_any(m, 0, &any, NULL) == MT_OK && any == 0);
  mt_error err = {0};
  CHECK(mt_mesh_bcast(m, 1, v, 8, &err) == MT_EINDEX && strlen(err.msg) > 0);
  /* Every member's value, by coordinate, counted as one all-gather of 8 bytes a
   * peer (none on one rank). */
  mt_comm_counters_read(&test_counters, &before);
  CHECK(mt_mesh_allgather_i64(m, 0, 10 * world_rank + 1, got, NULL) == MT_OK);
  mt_comm_counters_read(&test_counters, &after);
  for (int r = 0; r < world_size; ++r) CHECK(got[r] == 10 * r + 1);
  int gathered = world_size > 1;
  CHECK(after.calls[MT_COLL_ALL_GATHER] - before.calls[MT_COLL_ALL_GATHER] == gathered);
  CHECK(after.bytes[MT_COLL_ALL_GATHER] - before.bytes[MT_COLL_ALL_GATHER] ==
        8 * (world_size - 1));
  CHECK(mt_mesh_allgather_i64(m, 1, 0, got, &err) == MT_EINDEX);
  free(got);
  mt_mesh_destroy(m);
  free(ranks);
}

/* Exclusive scans along a mesh dim: the sum (product) of the coordinates before
 * this one, coordinate 0 keeping its buffer, counted as one exscan per call; a
 * float16 sum (a user operation) and bad input too. */
static void test_exscan(void) {
  int *ranks = iota(world_size, 0);
  int64_t shape[1] = {world_size};
  mt_mesh *m = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, shape, ranks, &m, NULL) == MT_OK);
  mt_mesh_set_counters(m, &test_counters);
  mt_comm_totals before, after;
  mt_comm_counters_read(&test_counters, &before);
  int64_t v[2] = {world_rank + 1, 7};
  CHECK(mt_mesh_exscan(m, 0, v, 2, MT_DTYPE_INT64, MT_REDUCE_SUM, NULL) == MT_OK);
  int64_t below = (int64_t)world_rank * (world_rank + 1) / 2;
  CHECK(world_rank == 0 ? v[0] == 1 && v[1] == 7 : v[0] == below && v[1] == 7 * world_rank);
  double p[1] = {2.0};
  CHECK(mt_mesh_exscan(m, 0, p, 1, MT_DTYPE_FLOAT64, MT_REDUCE_PRODUCT, NULL) == MT_OK);
  CHECK(p[0] == (world_rank == 0 ? 2.0 : (double)(1LL << world_rank)));
  uint16_t h[1] = {0x3C00}; /* float16 1.0 */
  CHECK(mt_mesh_exscan(m, 0, h, 1, MT_DTYPE_FLOAT16, MT_REDUCE_SUM, NULL) == MT_OK);
  if (world_rank == 2) CHECK(h[0] == 0x4000); /* 2.0 */
  mt_comm_counters_read(&test_counters, &after);
  int scans = world_size > 1 ? 3 : 0;
  CHECK(after.calls[MT_COLL_SCAN] - before.calls[MT_COLL_SCAN] == scans);
  CHECK(after.bytes[MT_COLL_SCAN] - before.bytes[MT_COLL_SCAN] == (scans ? 16 + 8 + 2 : 0));
  mt_error err = {0};
  CHECK(mt_mesh_exscan(m, 1, v, 2, MT_DTYPE_INT64, MT_REDUCE_SUM, &err) == MT_EINDEX);
  CHECK(mt_mesh_exscan(m, 0, v, -1, MT_DTYPE_INT64, MT_REDUCE_SUM, &err) == MT_EINVAL);
  mt_mesh_destroy(m);
  free(ranks);
}

/* Variable all-to-all along a mesh dim: rank r sends r + q items of value
 * 100 r + q to coordinate q; counts and items arrive in order, counted as two
 * all-to-alls of the bytes sent to other ranks; bad input fails locally. */
static void test_alltoallv(void) {
  int *ranks = iota(world_size, 0);
  int64_t shape[1] = {world_size};
  mt_mesh *m = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, shape, ranks, &m, NULL) == MT_OK);
  mt_mesh_set_counters(m, &test_counters);
  mt_comm_totals before, after;
  mt_comm_counters_read(&test_counters, &before);
  int64_t *out = calloc((size_t)world_size, sizeof *out);
  int64_t *in = calloc((size_t)world_size, sizeof *in);
  int64_t nsend = 0, nrecv = 0, away = 0;
  for (int q = 0; q < world_size; ++q) {
    out[q] = world_rank + q;
    nsend += out[q];
    away += q == world_rank ? 0 : out[q];
  }
  int32_t *send = malloc((size_t)(nsend + 1) * sizeof *send);
  for (int q = 0, at = 0; q < world_size; ++q)
    for (int64_t k = 0; k < out[q]; ++k) send[at++] = 100 * world_rank + q;
  CHECK(mt_mesh_alltoall_i64(m, 0, out, in, NULL) == MT_OK);
  for (int q = 0; q < world_size; ++q) {
    CHECK(in[q] == q + world_rank);
    nrecv += in[q];
  }
  int32_t *recv = malloc((size_t)(nrecv + 1) * sizeof *recv);
  CHECK(mt_mesh_alltoallv(m, 0, send, out, recv, in, sizeof *send, NULL) == MT_OK);
  for (int q = 0, at = 0; q < world_size; ++q)
    for (int64_t k = 0; k < in[q]; ++k) CHECK(recv[at++] == 100 * q + world_rank);
  mt_comm_counters_read(&test_counters, &after);
  int calls = world_size > 1 ? 2 : 0;
  CHECK(after.calls[MT_COLL_ALL_TO_ALL] - before.calls[MT_COLL_ALL_TO_ALL] == calls);
  CHECK(after.bytes[MT_COLL_ALL_TO_ALL] - before.bytes[MT_COLL_ALL_TO_ALL] ==
        (calls ? 8 * (world_size - 1) + 4 * away : 0));
  mt_error err = {0};
  CHECK(mt_mesh_alltoallv(m, 1, send, out, recv, in, 4, &err) == MT_EINDEX);
  CHECK(mt_mesh_alltoallv(m, 0, send, out, recv, in, 0, &err) == MT_EINVAL);
  out[0] = -1;
  CHECK(mt_mesh_alltoallv(m, 0, send, out, recv, in, 4, &err) == MT_EINVAL);
  free(send);
  free(recv);
  free(out);
  free(in);
  mt_mesh_destroy(m);
  free(ranks);
}

/* Bad input fails on every rank before any communication, so no rank hangs. */
static void test_bad_input(void) {
  mt_mesh *m = NULL;
  mt_error err = {0};
  int64_t too_big[1] = {world_size + 1};
  int *ranks = iota(world_size + 1, 0);
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, too_big, ranks, &m, &err) == MT_EINVAL);
  CHECK(strstr(err.msg, "more ranks") != NULL);
  int64_t two[1] = {2};
  int dup[2] = {0, 0};
  if (world_size >= 2) {
    CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, two, dup, &m, &err) == MT_EINVAL);
    CHECK(strstr(err.msg, "twice") != NULL);
  }
  int64_t one[1] = {1};
  int bad[1] = {world_size};
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, one, bad, &m, &err) == MT_EINVAL);
  int64_t zero[1] = {0};
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, zero, ranks, &m, &err) == MT_EINVAL);
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 0, zero, ranks, &m, &err) == MT_EINVAL);
  CHECK(m == NULL);
  free(ranks);
}

static mt_mesh *world_mesh(void) {
  int *ranks = iota(world_size, 0);
  int64_t shape[1] = {world_size};
  mt_mesh *m = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, shape, ranks, &m, NULL) == MT_OK);
  free(ranks);
  return m;
}

/* A communicator of the mesh freed by someone else (Python's
 * mesh.get_group().Free()) makes the mesh and its slices refuse to communicate,
 * and the mesh is destroyed without freeing it twice. */
static void test_freed_communicator(void) {
  mt_mesh *m = world_mesh(), *s = NULL;
  mt_error err = {0};
  int dims[1] = {0};
  CHECK(mt_mesh_check(m, &err) == MT_OK);
  CHECK(mt_mesh_slice(m, 1, dims, &s, &err) == MT_OK);
  int64_t live = mt_comm_live_count();
  MPI_Comm theirs = mt_mesh_dim_comm(m, 0);
  MPI_Comm_free(&theirs);
  CHECK(mt_mesh_check(m, &err) == MT_ESTATE && strstr(err.msg, "freed") != NULL);
  CHECK(mt_mesh_check(s, &err) == MT_ESTATE);
  CHECK(mt_comm_live_count() == live - 1);
  CHECK(mt_mesh_dim_comm(m, 0) == MPI_COMM_NULL);
  mt_mesh_destroy(s);
  mt_mesh_destroy(m);
  mt_mesh *fresh = world_mesh();
  CHECK(mt_mesh_check(fresh, &err) == MT_OK); /* other meshes are not affected */
  mt_mesh_destroy(fresh);
}

/* What another thread finds: a mesh it made itself may communicate there; the
 * world mesh, made on the main thread, may not. */
static void *other_thread(void *world) {
  mt_error err = {0};
  mt_mesh *own = NULL, *slice = NULL;
  int dims[1] = {0};
  int refused = mt_mesh_check(world, &err) == MT_ESTATE &&
                strstr(err.msg, "thread that created it") != NULL;
  /* A slice belongs to the thread that cut it. */
  int sliced = mt_mesh_slice(world, 1, dims, &slice, NULL) == MT_OK &&
               mt_mesh_check(slice, NULL) == MT_OK;
  int64_t shape[1] = {1};
  int me = 0;
  int made = mt_mesh_create(MPI_COMM_SELF, 1, shape, &me, &own, NULL) == MT_OK &&
             mt_mesh_check(own, NULL) == MT_OK;
  mt_mesh_destroy(slice);
  if (refused && sliced && made) return own;
  mt_mesh_destroy(own);
  return NULL;
}

/* A mesh's collectives run on the thread that made it: mt_mesh_check refuses any
 * other, the same on every rank, before any communication. */
static void test_owner_thread(void) {
  mt_mesh *m = world_mesh();
  pthread_t t;
  void *theirs = NULL;
  CHECK(pthread_create(&t, NULL, other_thread, m) == 0 && pthread_join(t, &theirs) == 0);
  CHECK(theirs != NULL);
  mt_error err = {0};
  CHECK(mt_mesh_check(m, &err) == MT_OK);
  CHECK(theirs == NULL || mt_mesh_check(theirs, &err) == MT_ESTATE);
  mt_mesh_destroy(theirs);
  mt_mesh_destroy(m);
}

/* A mesh dim split into runs of members (within a node) and the members that far
 * apart (across nodes): on the world in reverse, each run holds consecutive
 * coordinates, each "across" group those equal modulo the run; a slice uses its
 * parent's split; runs that do not divide the dim are refused; the split's
 * communicators go with the mesh. */
static void test_node_comms(void) {
  int *ranks = iota(world_size, 1);
  int64_t shape[2] = {1, world_size};
  mt_mesh *m = NULL, *s = NULL;
  mt_error err = {0};
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 2, shape, ranks, &m, &err) == MT_OK);
  int dims[1] = {1};
  CHECK(mt_mesh_slice(m, 1, dims, &s, &err) == MT_OK);
  int64_t at = world_size - 1 - world_rank;
  for (int64_t run = 1; run <= world_size; ++run) {
    MPI_Comm inside, across, again_in, again_across;
    int rc = mt_mesh_node_comms(m, 1, run, &inside, &across, &err);
    if (world_size % run != 0) {
      CHECK(rc == MT_EINVAL && strstr(err.msg, "runs of") != NULL);
      continue;
    }
    CHECK(rc == MT_OK);
    int in_rank = -1, in_size = -1, x_rank = -1, x_size = -1;
    MPI_Comm_rank(inside, &in_rank);
    MPI_Comm_size(inside, &in_size);
    MPI_Comm_rank(across, &x_rank);
    MPI_Comm_size(across, &x_size);
    CHECK(in_size == run && in_rank == at % run);
    CHECK(x_size == world_size / run && x_rank == at / run);
    /* Members of one run hold consecutive coordinates. */
    int64_t first = at - in_rank;
    MPI_Bcast(&first, 1, MPI_INT64_T, 0, inside);
    CHECK(first == at - at % run);
    CHECK(mt_mesh_node_comms(s, 0, run, &again_in, &again_across, &err) == MT_OK);
    CHECK(again_in == inside && again_across == across);
  }
  CHECK(mt_mesh_node_comms(m, 0, 2, NULL, NULL, &err) == MT_EINVAL || world_size == 1);
  mt_mesh_destroy(s);
  mt_mesh_destroy(m);
  free(ranks);
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  test_1d(0);
  test_1d(1);
  test_2d();
  test_non_member();
  test_collectives();
  test_exscan();
  test_alltoallv();
  test_bad_input();
  test_freed_communicator();
  test_owner_thread();
  test_node_comms();
  CHECK(mt_comm_live_count() == 0);
  char version[256];
  CHECK(mt_mpi_library_version(version, (int)sizeof version, NULL) == MT_OK);
  CHECK(strlen(version) > 0);
  /* A mesh that outlives MPI refuses to communicate, and is destroyed without
   * an MPI call. */
  mt_mesh *late = world_mesh();
  int failed = mt_test_exit("test_mesh") != 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  MPI_Finalize();
  mt_error err = {0};
  int after = mt_mesh_check(late, &err) == MT_ESTATE && strstr(err.msg, "finalized") != NULL;
  mt_mesh_destroy(late);
  if (!after) fprintf(stderr, "test_mesh: a mesh did not refuse to communicate after MPI_Finalize\n");
  return any_failed || !after;
}
