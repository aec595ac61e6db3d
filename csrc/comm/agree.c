/* The agreement primitive (agree.h) over a communicator: the lowest failing rank
 * and the minima of the values in one all-reduce (MPI's, or in shared memory on a
 * mesh of one node: agree_shm.c), then that rank's mt_error in one MPI_Bcast. It
 * calls nothing of the meshes, so that creating a mesh can agree (mesh.c);
 * mt_agree, on a mesh, is in agree_mesh.c. */
#include "mpitensor/comm/agree.h"

#include <stdio.h>
#include <string.h>

#include "comm-private.h"

/* mt_agree_comm, its all-reduce through `shm` when not NULL. */
static int agree_values(MPI_Comm comm, mt__shm *shm, int status, int64_t *values, int n,
                        mt_error *err) {
  if (n < 0 || n > MT_AGREE_MAX_VALUES || (n > 0 && values == NULL)) {
    return mt_error_set(err, MT_EINVAL, "an agreement carries 0 to %d values, got %d",
                        MT_AGREE_MAX_VALUES, n);
  }
  int me = 0, size = 0;
  MT__MPI_TRY(MPI_Comm_rank(comm, &me), "MPI_Comm_rank");
  MT__MPI_TRY(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  int64_t v[1 + MT_AGREE_MAX_VALUES] = {status != MT_OK ? me : size};
  for (int i = 0; i < n; ++i) v[1 + i] = values[i];
  if (shm != NULL)
    mt__shm_allreduce(shm, v, 1 + n, MT__SHM_MIN);
  else
    MT__MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, v, 1 + n, MPI_INT64_T, MPI_MIN, comm),
                "MPI_Allreduce");
  for (int i = 0; i < n; ++i) values[i] = v[1 + i];
  if (v[0] == size) return MT_OK;
  int first = (int)v[0];
  mt_error rec = {0};
  if (me == first) {
    rec.code = status;
    if (err != NULL) memcpy(rec.msg, err->msg, sizeof rec.msg);
  }
  MT__MPI_TRY(MPI_Bcast(&rec, (int)sizeof rec, MPI_BYTE, first, comm), "MPI_Bcast");
  rec.msg[sizeof rec.msg - 1] = '\0';
  if (err != NULL) *err = rec;
  return rec.code;
}

int mt_agree_comm(MPI_Comm comm, int status, int64_t *values, int n, mt_error *err) {
  return agree_values(comm, NULL, status, values, n, err);
}

/* Order-preserving: unsigned fingerprints compared as signed minima. */
static int64_t as_signed(uint64_t u) {
  uint64_t flipped = u ^ ((uint64_t)1 << 63);
  int64_t s;
  memcpy(&s, &flipped, sizeof s);
  return s;
}

int mt__agree_fingerprint(MPI_Comm comm, mt__shm *shm, int status, uint64_t fingerprint,
                          int64_t *values, int n, mt_error *err) {
  if (n < 0 || n > MT_AGREE_MAX_VALUES - 2 || (n > 0 && values == NULL))
    return mt_error_set(err, MT_EINVAL, "an agreement carries 0 to %d values, got %d",
                        MT_AGREE_MAX_VALUES - 2, n);
  mt_error mine = {0};
  if (err != NULL) mine = *err;
  /* min(x) and min(~x) = ~max(x): both ends of the range in one MIN reduction. */
  int64_t v[MT_AGREE_MAX_VALUES] = {as_signed(fingerprint), ~as_signed(fingerprint)};
  for (int i = 0; i < n; ++i) v[2 + i] = values[i];
  int rc = agree_values(comm, shm, status, v, 2 + n, err);
  for (int i = 0; i < n; ++i) values[i] = v[2 + i];
  if (rc != MT_OK || v[0] == ~v[1]) return rc;
  int me = 0;
  MT__MPI_TRY(MPI_Comm_rank(comm, &me), "MPI_Comm_rank");
  if (me == 0 && mine.msg[0] == '\0') {
    snprintf(mine.msg, sizeof mine.msg,
             "the ranks of the mesh disagree: their "
             "fingerprints differ (an argument or call that must be the same on every "
             "rank is not)");
  }
  if (err != NULL) *err = mine;
  /* Only the first rank "fails", so its sentence is the one every rank gets. */
  return agree_values(comm, shm, me == 0 ? MT_EINVAL : MT_OK, NULL, 0, err);
}

int mt_agree_fingerprint_comm(MPI_Comm comm, int status, uint64_t fingerprint,
                              mt_error *err) {
  return mt__agree_fingerprint(comm, NULL, status, fingerprint, NULL, 0, err);
}
