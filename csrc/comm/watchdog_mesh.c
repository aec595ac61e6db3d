/* The watchdog's listening on a mesh's communicator (watchdog.h): a file of its own
 * above both the mesh and the departure notices, which the mesh's own calls reach. */
#include "mpitensor/comm/mesh.h"
#include "mpitensor/comm/watchdog.h"

int mt_watchdog_listen_mesh(mt_mesh *mesh, int *listening, mt_error *err) {
  int64_t coord[MT_MAX_MESH_NDIM];
  MPI_Comm comm = MPI_COMM_NULL;
  *listening = 0;
  /* A rank outside the mesh shows that the mesh does not hold every rank. */
  if (!mt_mesh_coordinate(mesh, coord) || mt_mesh_comm(mesh, &comm, NULL) != MT_OK)
    return MT_OK;
  int rc = mt_watchdog_listen(comm, err);
  if (rc == MT_OK) *listening = mt_watchdog_listening();
  return rc;
}
