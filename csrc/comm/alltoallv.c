/* All-to-all of variable-sized parts along one mesh dim (mesh.h: mt_mesh_alltoall_i64,
 * mt_mesh_alltoallv): the bucket exchange of a distributed sample sort, whose part
 * sizes are known only after the data is seen. */
#include <limits.h>
#include <stdlib.h>

#include "comm-private.h"
#include "count-private.h"
#include "mpitensor/comm/agree.h"
#include "mpitensor/core/pack.h"

static int check_dim(const mt_mesh *mesh, int dim, mt_error *err) {
  int ndim = mt_mesh_ndim(mesh);
  if (dim < 0 || dim >= ndim) {
    return mt_error_set(err, MT_EINDEX, "mesh dim %d is out of range for a %d-D mesh",
                        dim, ndim);
  }
  int64_t coord[MT_MAX_MESH_NDIM];
  if (!mt_mesh_coordinate(mesh, coord))
    return mt_error_set(err, MT_EINVAL, "this rank is not in the mesh");
  return MT_OK;
}

int mt_mesh_alltoall_i64(const mt_mesh *mesh, int dim, const int64_t *send,
                         int64_t *recv, mt_error *err) {
  int rc = check_dim(mesh, dim, err);
  if (rc != MT_OK) return rc;
  int64_t n = mt_mesh_dim_size(mesh, dim);
  if (n == 1) {
    recv[0] = send[0];
    return MT_OK;
  }
  MT__MPI_TRY(MPI_Alltoall(send, 1, MPI_INT64_T, recv, 1, MPI_INT64_T,
                           mt_mesh_dim_comm(mesh, dim)),
              "MPI_Alltoall");
  mt__count(mesh, MT_COLL_ALL_TO_ALL, (int64_t)sizeof *send * (n - 1));
  return MT_OK;
}

/* Counts and displacements in units of one item, which MPI takes as ints. */
static int int_counts(const int64_t *counts, int64_t n, int *cnt, int *disp,
                      mt_error *err) {
  int64_t at = 0;
  for (int64_t q = 0; q < n; ++q) {
    if (counts[q] < 0) return mt_error_set(err, MT_EINVAL, "negative count");
    if (counts[q] > INT_MAX || at > INT_MAX) {
      return mt_error_set(err, MT_EOVERFLOW,
                          "an all-to-all part of %lld items at offset %lld exceeds "
                          "MPI's int count",
                          (long long)counts[q], (long long)at);
    }
    cnt[q] = (int)counts[q];
    disp[q] = (int)at;
    at += counts[q];
  }
  return MT_OK;
}

int mt_mesh_alltoallv(const mt_mesh *mesh, int dim, const void *send,
                      const int64_t *send_counts, void *recv,
                      const int64_t *recv_counts, int64_t itemsize, mt_error *err) {
  int rc = check_dim(mesh, dim, err);
  if (rc != MT_OK) return rc;
  if (itemsize <= 0 || itemsize > INT_MAX)
    return mt_error_set(err, MT_EINVAL, "item size %lld", (long long)itemsize);
  int64_t n = mt_mesh_dim_size(mesh, dim);
  if (n == 1) {
    if (send_counts[0] < 0 || send_counts[0] != recv_counts[0])
      return mt_error_set(err, MT_EINVAL, "a lone rank's counts differ or are negative");
    mt_copy_bytes(recv, send, send_counts[0] * itemsize);
    return MT_OK;
  }
  int64_t coord[MT_MAX_MESH_NDIM];
  mt_mesh_coordinate(mesh, coord);
  MPI_Comm comm = mt_mesh_dim_comm(mesh, dim);
  int *ints = malloc((size_t)n * 4 * sizeof *ints);
  int *scnt = ints, *sdisp = NULL, *rcnt = NULL, *rdisp = NULL;
  if (ints == NULL) {
    rc = mt_error_set(err, MT_ENOMEM, "all-to-all counts");
  } else {
    sdisp = ints + n;
    rcnt = ints + 2 * n;
    rdisp = ints + 3 * n;
    rc = int_counts(send_counts, n, scnt, sdisp, err);
    if (rc == MT_OK) rc = int_counts(recv_counts, n, rcnt, rdisp, err);
  }
  /* Counts that MPI cannot take may be one rank's alone (an uneven bucket): the
   * ranks agree before the exchange, so none waits in it for a rank that left. */
  rc = mt_agree_comm(comm, rc, NULL, 0, err);
  int mrc = MPI_SUCCESS;
  MPI_Datatype item = MPI_DATATYPE_NULL;
  if (rc == MT_OK) mrc = MPI_Type_contiguous((int)itemsize, MPI_BYTE, &item);
  if (rc == MT_OK && mrc == MPI_SUCCESS) mrc = MPI_Type_commit(&item);
  if (rc == MT_OK && mrc == MPI_SUCCESS)
    mrc = MT__BLOCKING(
        "MPI_Alltoallv", MPI_Alltoallv(send, scnt, sdisp, item, recv, rcnt, rdisp, item, comm));
  if (item != MPI_DATATYPE_NULL) MPI_Type_free(&item);
  if (rc == MT_OK && mrc != MPI_SUCCESS) rc = mt_mpi_error(err, mrc, "MPI_Alltoallv");
  if (rc == MT_OK) {
    int64_t sent = 0;
    for (int64_t q = 0; q < n; ++q) sent += q == coord[dim] ? 0 : send_counts[q];
    mt__count(mesh, MT_COLL_ALL_TO_ALL, sent * itemsize);
  }
  free(ints);
  return rc;
}
