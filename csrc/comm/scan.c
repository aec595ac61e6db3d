/* Exclusive scans along one mesh dim (mesh.h: mt_mesh_exscan): what the shards
 * before a rank contribute to a running sum or product along a sharded axis. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm-private.h"
#include "count-private.h"
#include "mpi-types-private.h"
#include "mpitensor/core/dtype.h"

int mt_mesh_exscan(const mt_mesh *mesh, int dim, void *buf, int64_t count, int dtype,
                   int op, mt_error *err) {
  int ndim = mt_mesh_ndim(mesh);
  if (dim < 0 || dim >= ndim) {
    return mt_error_set(err, MT_EINDEX, "mesh dim %d is out of range for a %d-D mesh",
                        dim, ndim);
  }
  if (count < 0) return mt_error_set(err, MT_EINVAL, "negative count");
  if (count > INT_MAX)
    return mt_error_set(err, MT_EOVERFLOW, "an exclusive scan of %lld elements",
                        (long long)count);
  int64_t coord[MT_MAX_MESH_NDIM];
  if (!mt_mesh_coordinate(mesh, coord) || mt_mesh_dim_size(mesh, dim) == 1)
    return MT_OK;
  MPI_Datatype type;
  MPI_Op mop;
  int rc = mt__reduce_type(dtype, op, &type, &mop, err);
  if (rc != MT_OK) return rc;
  size_t nbytes = (size_t)count * mt_dtype_size(dtype);
  /* MPI leaves the receive buffer of the first rank undefined: scan from a copy. */
  void *send = malloc(nbytes ? nbytes : 1);
  if (send == NULL) return mt_error_set(err, MT_ENOMEM, "exscan buffer of %zu B", nbytes);
  memcpy(send, buf, nbytes);
  int mrc = MT__BLOCKING(
      "MPI_Exscan", MPI_Exscan(send, buf, (int)count, type, mop, mt_mesh_dim_comm(mesh, dim)));
  if (mrc == MPI_SUCCESS && coord[dim] == 0) memcpy(buf, send, nbytes);
  free(send);
  if (mrc != MPI_SUCCESS) return mt_mpi_error(err, mrc, "MPI_Exscan");
  mt__count(mesh, MT_COLL_SCAN, (int64_t)nbytes);
  return MT_OK;
}
