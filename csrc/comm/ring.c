/* Exchanges along one mesh dim for ring attention: a nonblocking shift to the
 * next rank, a nonblocking all-gather of uneven blocks, and an all-gather of
 * int64 metadata. */
#include <assert.h>
#include <stdlib.h>

#include "comm-private.h"
#include "count-private.h"
#include "mpi-types-private.h"
#include "mpitensor/comm/ring.h"
#include "mpitensor/core/pack.h"

/* Point-to-point messages of a shift; collectives on the same communicator never
 * match them, and shifts started in the same order match in that order. */
#define SHIFT_TAG 0x6d74

/* An exchange's requests are posted by a start function and completed by another
 * (mt_exchange_wait, or exchange_abort when the start fails), the split that lets
 * ring attention compute while a shift moves. The analyzer's MPI checker pairs a
 * nonblocking call with a wait inside one path, so the lines where requests leave
 * or enter a function carry its NOLINT. */
struct mt_exchange {
  MPI_Request reqs[2 * MT_RING_MAX_BLOCKS];
  int nreqs;
  int *ints; /* counts and displacements of an all-gather, read by MPI until done */
};

/* The communicator and coordinate of this rank on mesh dim `dim`, after checking
 * what can fail locally. */
static int dim_member(const mt_mesh *mesh, int dim, MPI_Comm *comm, int64_t *coord,
                      int64_t *size, mt_error *err) {
  int64_t all[MT_MAX_MESH_NDIM];
  if (dim < 0 || dim >= mt_mesh_ndim(mesh)) {
    return mt_error_set(err, MT_EINDEX, "mesh dim %d is out of range for a %d-D mesh",
                        dim, mt_mesh_ndim(mesh));
  }
  if (!mt_mesh_coordinate(mesh, all)) {
    return mt_error_set(err, MT_ESTATE, "this rank is not a member of the mesh");
  }
  *comm = mt_mesh_dim_comm(mesh, dim);
  *coord = all[dim];
  *size = mt_mesh_dim_size(mesh, dim);
  assert(*size >= 1 && *coord >= 0 && *coord < *size);
  return MT_OK;
}

static mt_exchange *exchange_new(void) {
  mt_exchange *ex = calloc(1, sizeof *ex);
  if (ex == NULL) return NULL;
  for (int i = 0; i < 2 * MT_RING_MAX_BLOCKS; ++i) ex->reqs[i] = MPI_REQUEST_NULL;
  return ex;
}

/* An exchange that failed to start: a receive already posted would wait forever
 * for a send that never comes, so it is cancelled before the request is freed. */
static void exchange_abort(mt_exchange *ex) {
  for (int i = 0; i < ex->nreqs; ++i) {
    if (ex->reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&ex->reqs[i]);
  }
  (void)MT__BLOCKING("MPI_Waitall",
                     MPI_Waitall(ex->nreqs, ex->reqs, MPI_STATUSES_IGNORE)); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
  free(ex->ints);
  free(ex);
}

/* Posts one side of a shift: a send of `send` when `is_send`, else a receive into
 * `recv` (two pointers, so that a send's buffer stays const, as MPI_Isend takes
 * it). The type of a message of `bytes` bytes may be freed as soon as the call is
 * posted, MPI keeps what it needs. */
static int post(int is_send, const void *send, void *recv, int64_t bytes, int peer,
                MPI_Comm comm, MPI_Request *req, mt_error *err) {
  MPI_Datatype unit;
  int64_t unit_bytes;
  int rc = mt__byte_unit(&bytes, 1, &unit, &unit_bytes, err);
  if (rc != MT_OK) return rc;
  int count = (int)(bytes / unit_bytes);
  rc = is_send ? MPI_Isend(send, count, unit, peer, SHIFT_TAG, comm, req)
               : MPI_Irecv(recv, count, unit, peer, SHIFT_TAG, comm, req);
  if (unit != MPI_BYTE) MPI_Type_free(&unit);
  return rc == MPI_SUCCESS ? MT_OK
                           : mt_mpi_error(err, rc, is_send ? "MPI_Isend" : "MPI_Irecv");
}

/* A ring of one rank: the blocks go to itself, without MPI. */
static int shift_alone(int nblocks, const void *const *send, const int64_t *send_bytes,
                       void *const *recv, const int64_t *recv_bytes, mt_error *err) {
  for (int i = 0; i < nblocks; ++i) {
    if (send_bytes[i] != recv_bytes[i]) {
      return mt_error_set(err, MT_EINVAL,
                          "a shift on a ring of one rank sends %lld bytes "
                          "to itself but expects %lld",
                          (long long)send_bytes[i], (long long)recv_bytes[i]);
    }
  }
  for (int i = 0; i < nblocks; ++i) {
    mt_copy_bytes(recv[i], send[i], send_bytes[i]);
  }
  return MT_OK;
}

static int check_blocks(int nblocks, const int64_t *send_bytes, const int64_t *recv_bytes,
                        mt_error *err) {
  if (nblocks < 1 || nblocks > MT_RING_MAX_BLOCKS) {
    return mt_error_set(err, MT_EINVAL, "a shift moves 1 to %d blocks, got %d",
                        MT_RING_MAX_BLOCKS, nblocks);
  }
  for (int i = 0; i < nblocks; ++i) {
    if (send_bytes[i] < 0 || recv_bytes[i] < 0) {
      return mt_error_set(err, MT_EINVAL, "negative byte count");
    }
  }
  return MT_OK;
}

/* Receives are posted before sends, block by block: the matching order on both
 * sides is the block order, since messages between two ranks do not overtake. */
static int post_shift(mt_exchange *ex, int nblocks, const void *const *send,
                      const int64_t *send_bytes, void *const *recv,
                      const int64_t *recv_bytes, int64_t me, int64_t n, MPI_Comm comm,
                      mt_error *err) {
  assert(n > 1); /* a ring of one rank goes by shift_alone */
  int prev = (int)((me + n - 1) % n), next = (int)((me + 1) % n), rc = MT_OK;
  for (int i = 0; rc == MT_OK && i < nblocks; ++i) {
    rc = post(0, NULL, recv[i], recv_bytes[i], prev, comm, ex->reqs + i, err);
    ex->nreqs = i + 1;
  }
  for (int i = 0; rc == MT_OK && i < nblocks; ++i) {
    rc = post(1, send[i], NULL, send_bytes[i], next, comm, ex->reqs + nblocks + i, err);
    ex->nreqs = nblocks + i + 1;
  }
  return rc;
}

int mt_ring_shift_start(const mt_mesh *mesh, int dim, int nblocks,
                        const void *const *send, const int64_t *send_bytes,
                        void *const *recv, const int64_t *recv_bytes,
                        mt_exchange **out, mt_error *err) {
  MPI_Comm comm = MPI_COMM_NULL;
  int64_t me = 0, n = 0;
  int rc = dim_member(mesh, dim, &comm, &me, &n, err);
  if (rc == MT_OK) rc = check_blocks(nblocks, send_bytes, recv_bytes, err);
  if (rc != MT_OK) return rc;
  mt_exchange *ex = exchange_new();
  if (ex == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  if (n == 1) {
    rc = shift_alone(nblocks, send, send_bytes, recv, recv_bytes, err);
  } else {
    rc = post_shift(ex, nblocks, send, send_bytes, recv, recv_bytes, me, n, comm, err);
    int64_t total = 0;
    for (int i = 0; i < nblocks; ++i) total += send_bytes[i];
    if (rc == MT_OK) mt__count(mesh, MT_COLL_ALL_TO_ALL, total);
  }
  if (rc != MT_OK) {
    exchange_abort(ex);
  } else {
    *out = ex;
  }
  return rc; /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
}

/* Counts and displacements of an all-gather in one unit that fits MPI's ints. */
static int gather_counts(const int64_t *bytes, int64_t n, int **ints, MPI_Datatype *unit,
                         int64_t *unit_bytes, mt_error *err) {
  int64_t *v = malloc((size_t)(2 * n) * sizeof *v);
  *ints = malloc((size_t)(2 * n) * sizeof **ints);
  if (v == NULL || *ints == NULL) {
    free(v);
    return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  int64_t off = 0;
  for (int64_t k = 0; k < n; ++k) {
    v[k] = bytes[k];
    v[n + k] = off;
    off += bytes[k];
  }
  int rc = mt__byte_unit(v, 2 * n, unit, unit_bytes, err);
  for (int64_t i = 0; rc == MT_OK && i < 2 * n; ++i) (*ints)[i] = (int)(v[i] / *unit_bytes);
  free(v);
  return rc;
}

/* The byte counts must fit the buffers, or MPI would write past `recv`. */
static int check_sizes(const int64_t *bytes, int nbytes, int64_t n, int64_t me,
                       int64_t send_bytes, int64_t recv_bytes, mt_error *err) {
  if (nbytes != n) {
    return mt_error_set(err, MT_EINVAL, "%d byte counts for a mesh dim of size %lld",
                        nbytes, (long long)n);
  }
  int64_t total = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (bytes[k] < 0) {
      return mt_error_set(err, MT_EINVAL, "negative byte count for coordinate %lld",
                          (long long)k);
    }
    total += bytes[k];
  }
  if (bytes[me] != send_bytes || total != recv_bytes) {
    return mt_error_set(err, MT_EINVAL,
                        "the byte counts do not match the send and receive arrays");
  }
  return MT_OK;
}

int mt_ring_allgatherv_start(const mt_mesh *mesh, int dim, const void *send,
                             int64_t send_bytes, void *recv, int64_t recv_bytes,
                             const int64_t *bytes, int nbytes, mt_exchange **out,
                             mt_error *err) {
  MPI_Comm comm = MPI_COMM_NULL;
  int64_t me = 0, n = 0;
  int rc = dim_member(mesh, dim, &comm, &me, &n, err);
  if (rc == MT_OK) rc = check_sizes(bytes, nbytes, n, me, send_bytes, recv_bytes, err);
  if (rc != MT_OK) return rc;
  mt_exchange *ex = exchange_new();
  if (ex == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  MPI_Datatype unit = MPI_BYTE;
  int64_t unit_bytes = 1;
  rc = gather_counts(bytes, n, &ex->ints, &unit, &unit_bytes, err);
  if (rc == MT_OK) {
    int mpi = MPI_Iallgatherv(send, ex->ints[me], unit, recv, ex->ints, ex->ints + n,
                              unit, comm, ex->reqs);
    ex->nreqs = 1;
    if (mpi != MPI_SUCCESS) rc = mt_mpi_error(err, mpi, "MPI_Iallgatherv");
  }
  if (unit != MPI_BYTE) MPI_Type_free(&unit);
  if (rc != MT_OK) {
    exchange_abort(ex);
    return rc;
  }
  if (n > 1) mt__count(mesh, MT_COLL_ALL_GATHER, bytes[me] * (n - 1));
  *out = ex;
  return MT_OK;
}

int mt_exchange_test(mt_exchange *ex, int *done, mt_error *err) {
  MT__MPI_TRY(MPI_Testall(ex->nreqs, ex->reqs, done, MPI_STATUSES_IGNORE), "MPI_Testall");
  return MT_OK;
}

int mt_exchange_wait(mt_exchange *ex, mt_error *err) {
  if (ex == NULL) return MT_OK;
  int rc = MT__BLOCKING("MPI_Waitall",
                        MPI_Waitall(ex->nreqs, ex->reqs, MPI_STATUSES_IGNORE)); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
  free(ex->ints);
  free(ex);
  return rc == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, rc, "MPI_Waitall");
}

int mt_ring_allgather_int64(const mt_mesh *mesh, int dim, const int64_t *values,
                            int n, int64_t *out, mt_error *err) {
  MPI_Comm comm = MPI_COMM_NULL;
  int64_t me = 0, size = 0;
  int rc = dim_member(mesh, dim, &comm, &me, &size, err);
  if (rc != MT_OK) return rc;
  if (n < 0) return mt_error_set(err, MT_EINVAL, "negative value count");
  MT__MPI_TRY(MPI_Allgather(values, n, MPI_INT64_T, out, n, MPI_INT64_T, comm),
              "MPI_Allgather");
  return MT_OK;
}
