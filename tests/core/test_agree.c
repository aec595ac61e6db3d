/* The agreement primitive at whatever size mpiexec gave: a failure on some ranks
 * comes back on every rank with the first failing rank's status and message,
 * differing fingerprints come back as MT_EINVAL with the first rank's sentence,
 * slices agree among their own members, outsiders take no part, and the job goes
 * on after every failure (each case is followed by more agreements); on one node
 * the agreements meet in shared memory, round after round. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "mpitensor/comm/agree.h"
#include "mpitensor/comm/counters.h"
#include "mpitensor/comm/mesh.h"
#include "world_mesh.h"

static int world_rank, world_size;

static int fail_with(mt_error *err, int code, const char *what) {
  return mt_error_set(err, code, "%s on rank %d", what, world_rank);
}

static void test_all_ok(mt_mesh *m) {
  mt_error err = {0};
  strcpy(err.msg, "kept");
  CHECK(mt_agree(m, MT_OK, 42, &err) == MT_OK && strcmp(err.msg, "kept") == 0);
  CHECK(mt_agree(m, MT_OK, UINT64_MAX, NULL) == MT_OK);
  CHECK(mt_agree(m, MT_OK, 0, NULL) == MT_OK);
}

/* One rank fails, then two: every rank returns the first one's status and text. */
static void test_failures(mt_mesh *m) {
  int last = world_size - 1;
  mt_error err = {0};
  int rc = world_rank == last ? fail_with(&err, MT_ENOMEM, "no memory") : MT_OK;
  rc = mt_agree(m, rc, 7, &err);
  char want[64];
  snprintf(want, sizeof want, "no memory on rank %d", last);
  CHECK_MSG(rc == MT_ENOMEM && strcmp(err.msg, want) == 0, "%s: '%s'",
            mt_status_name(rc), err.msg);
  CHECK(err.code == MT_ENOMEM);
  mt_error e2 = {0};
  int mine = world_rank >= 1
                 ? fail_with(&e2, world_rank == 1 ? MT_EIO : MT_ETYPE, "failed")
                 : MT_OK;
  rc = mt_agree(m, mine, (uint64_t)world_rank, &e2);
  if (world_size == 1) {
    CHECK(rc == MT_OK);
  } else {
    CHECK_MSG(rc == MT_EIO && strcmp(e2.msg, "failed on rank 1") == 0, "'%s'", e2.msg);
  }
  /* Without a message channel the status still agrees. */
  rc = mt_agree(m, world_rank == last ? MT_EOVERFLOW : MT_OK, 1, NULL);
  CHECK(rc == MT_EOVERFLOW);
  test_all_ok(m);
}

/* Fingerprints that differ: MT_EINVAL with the first rank's sentence, or a
 * general one when it gave none; a failure takes precedence. */
static void test_mismatch(mt_mesh *m) {
  mt_error err = {0};
  snprintf(err.msg, sizeof err.msg, "shapes differ (seen by rank %d)", world_rank);
  int rc = mt_agree(m, MT_OK, world_rank % 2 ? UINT64_MAX : 0, &err);
  if (world_size == 1) {
    CHECK(rc == MT_OK);
    return;
  }
  CHECK_MSG(rc == MT_EINVAL && strcmp(err.msg, "shapes differ (seen by rank 0)") == 0,
            "%s '%s'", mt_status_name(rc), err.msg);
  mt_error quiet = {0};
  rc = mt_agree(m, MT_OK, (uint64_t)world_rank << 40, &quiet);
  CHECK(rc == MT_EINVAL && strstr(quiet.msg, "fingerprints differ") != NULL);
  mt_error e = {0};
  int mine = world_rank == 1 ? fail_with(&e, MT_EINDEX, "bad index") : MT_OK;
  rc = mt_agree(m, mine, (uint64_t)world_rank, &e);
  CHECK(rc == MT_EINDEX && strcmp(e.msg, "bad index on rank 1") == 0);
  test_all_ok(m);
}

/* The values ride along as their minimum; bad counts fail locally. */
static void test_values(void) {
  int64_t v[3] = {world_rank, -world_rank, 5};
  mt_error err = {0};
  CHECK(mt_agree_comm(MPI_COMM_WORLD, MT_OK, v, 3, &err) == MT_OK);
  CHECK(v[0] == 0 && v[1] == 1 - world_size && v[2] == 5);
  int rc = world_rank == 0 ? fail_with(&err, MT_EIO, "disk") : MT_OK;
  v[0] = 10 + world_rank;
  CHECK(mt_agree_comm(MPI_COMM_WORLD, rc, v, 1, &err) == MT_EIO && v[0] == 10);
  CHECK(mt_agree_comm(MPI_COMM_WORLD, MT_OK, v, MT_AGREE_MAX_VALUES + 1, &err) ==
        MT_EINVAL);
  CHECK(mt_agree_comm(MPI_COMM_WORLD, MT_OK, NULL, 1, &err) == MT_EINVAL);
}

/* Rows of a (2, n/2) mesh agree among themselves: a failure in row 0 stays there. */
static void test_slices(void) {
  if (world_size % 2 != 0) return;
  int ranks[64];
  for (int i = 0; i < world_size; ++i) ranks[i] = i;
  int64_t shape[2] = {2, world_size / 2};
  mt_mesh *grid = NULL, *row = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 2, shape, ranks, &grid, NULL) == MT_OK);
  int dims[1] = {1};
  CHECK(mt_mesh_slice(grid, 1, dims, &row, NULL) == MT_OK);
  int in_row0 = world_rank < world_size / 2,
      last_of_row0 = world_rank == world_size / 2 - 1;
  mt_error err = {0};
  int rc = last_of_row0 ? fail_with(&err, MT_ENOTSUP, "not here") : MT_OK;
  rc = mt_agree(row, rc, 3, &err);
  CHECK_MSG(rc == (in_row0 ? MT_ENOTSUP : MT_OK), "row agreement: %s",
            mt_status_name(rc));
  CHECK(mt_agree(grid, MT_OK, 3, NULL) == MT_OK);
  rc = mt_agree(grid, world_rank == world_size - 1 ? MT_EIO : MT_OK, 3, NULL);
  CHECK(rc == MT_EIO);
  mt_mesh_destroy(row);
  mt_mesh_destroy(grid);
}

/* Agreements in shared memory (a mesh of one node) in long runs, mixed with the
 * OR of mt_mesh_any: each round's result is exact, whichever rank is last to
 * arrive, so no round reads a slot of the round before or after. A slice agrees
 * through MPI, between rounds of its parent's. */
static void test_shared_rounds(mt_mesh *m) {
  /* This machine is one node; more ranks than cores agree through MPI. */
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (world_size > 1 && world_size <= cores) CHECK(mt_mesh_shared_agreement(m) == 1);
  if (world_size == 1) CHECK(mt_mesh_shared_agreement(m) == 0);
  int dims[1] = {0};
  mt_mesh *slice = NULL;
  CHECK(mt_mesh_slice(m, 1, dims, &slice, NULL) == MT_OK);
  CHECK(mt_mesh_shared_agreement(slice) == 0);
  for (int i = 0; i < 20000; ++i) {
    int mine = i % world_size == world_rank ? 1 << (i % 31) : 0, any = -1;
    CHECK(mt_mesh_any(m, mine, &any, NULL) == MT_OK);
    if (any != 1 << (i % 31)) CHECK_MSG(0, "round %d: OR %d", i, any);
    uint64_t fp = (uint64_t)i * (uint64_t)0x9e3779b97f4a7c15ull;
    int odd = i % 997 == 0 && world_rank == world_size - 1 && world_size > 1;
    int rc = mt_agree(i % 3 ? m : slice, MT_OK, fp + (uint64_t)odd, NULL);
    if (rc != (i % 997 == 0 && world_size > 1 ? MT_EINVAL : MT_OK))
      CHECK_MSG(0, "round %d: %s", i, mt_status_name(rc));
  }
  mt_mesh_destroy(slice);
}

/* A mesh of world rank 0 alone: the others keep their own status, uncounted. */
static void test_outsiders(void) {
  int ranks[1] = {0};
  int64_t one[1] = {1};
  mt_mesh *m = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, one, ranks, &m, NULL) == MT_OK);
  CHECK(mt_agree(m, MT_OK, (uint64_t)world_rank, NULL) == MT_OK);
  CHECK(mt_agree(m, MT_EIO, 0, NULL) == MT_EIO);
  mt_mesh_destroy(m);
}

/* Creating a mesh agrees on every rank's arguments: another shape or rank order on
 * the last rank, or a check that fails there only, or a caller's verdict or
 * fingerprint that differs, is the same status and message on every rank, and no
 * mesh is made; equal arguments make the mesh as before. */
static void test_mesh_creation(void) {
  int ranks[64], reversed[64];
  for (int i = 0; i < world_size; ++i) ranks[i] = i, reversed[i] = world_size - 1 - i;
  int last = world_rank == world_size - 1;
  int64_t flat[1] = {world_size}, grid[2] = {1, world_size};
  mt_mesh *m = NULL;
  mt_error err = {0};
  int rc = mt_mesh_create(MPI_COMM_WORLD, last ? 2 : 1, last ? grid : flat, ranks, &m, &err);
  if (world_size > 1) {
    CHECK_MSG(rc == MT_EINVAL && m == NULL && strstr(err.msg, "different meshes") != NULL,
              "%s '%s'", mt_status_name(rc), err.msg);
    rc = mt_mesh_create(MPI_COMM_WORLD, 1, flat, last ? reversed : ranks, &m, &err);
    CHECK(rc == MT_EINVAL && m == NULL);
    int dup[64];
    memcpy(dup, ranks, sizeof dup);
    dup[0] = last ? 1 : 0; /* rank 1 twice, on the last rank only */
    mt_error e = {0};
    rc = mt_mesh_create(MPI_COMM_WORLD, 1, flat, dup, &m, &e);
    CHECK_MSG(rc == MT_EINVAL && m == NULL && strstr(e.msg, "appears twice") != NULL,
              "'%s'", e.msg);
    mt_error mine = {0};
    if (world_rank == 1) mt_error_set(&mine, MT_ETYPE, "names are not str");
    rc = mt_mesh_create_agreed(MPI_COMM_WORLD, 1, flat, ranks,
                               world_rank == 1 ? MT_ETYPE : MT_OK, 0, &m, &mine);
    CHECK(rc == MT_ETYPE && m == NULL && strcmp(mine.msg, "names are not str") == 0);
    rc = mt_mesh_create_agreed(MPI_COMM_WORLD, 1, flat, ranks, MT_OK,
                               (uint64_t)last, &m, NULL);
    CHECK(rc == MT_EINVAL && m == NULL);
  }
  CHECK(mt_mesh_create_agreed(MPI_COMM_WORLD, 1, flat, ranks, MT_OK, 9, &m, NULL) == MT_OK);
  CHECK(mt_agree(m, MT_OK, 1, NULL) == MT_OK);
  mt_mesh_destroy(m);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  mt_mesh *m = world_mesh();
  mt_comm_totals before, after;
  mt_comm_counters_read(&test_counters, &before);
  test_all_ok(m);
  test_failures(m);
  test_mismatch(m);
  mt_comm_counters_read(&test_counters, &after);
  /* Agreement is metadata, not payload: it is not counted. */
  CHECK(memcmp(&before, &after, sizeof before) == 0);
  test_values();
  test_shared_rounds(m);
  test_slices();
  test_outsiders();
  test_mesh_creation();
  mt_mesh_destroy(m);
  int failed = mt_test_failures;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int rc = mt_test_exit("test_agree");
  MPI_Finalize();
  return failed == 0 ? rc : 1;
}
