/* mt_agree (agree.h): the agreement over a mesh's members, apart from agree.c so
 * that the meshes' file calls the agreement and not the other way round. */
#include "mpitensor/comm/agree.h"

#include "comm-private.h"

int mt_agree(mt_mesh *mesh, int status, uint64_t fingerprint, mt_error *err) {
  int64_t coord[MT_MAX_MESH_NDIM];
  if (!mt_mesh_coordinate(mesh, coord)) return status;
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = mt_mesh_comm(mesh, &comm, err);
  if (rc != MT_OK) return rc;
  return mt_agree_fingerprint_comm(comm, status, fingerprint, err);
}
