/* mt_agree (agree.h): the agreement over a mesh's members, apart from agree.c so
 * that the meshes' file calls the agreement and not the other way round. */
#include "mpitensor/comm/agree.h"

#include <stdio.h>

#include "comm-private.h"

int mt_agree(mt_mesh *mesh, int status, uint64_t fingerprint, mt_error *err) {
  return mt_agree_with(mesh, status, fingerprint, NULL, 0, err);
}

int mt_agree_with(mt_mesh *mesh, int status, uint64_t fingerprint, int64_t *values, int n,
                  mt_error *err) {
  int64_t coord[MT_MAX_MESH_NDIM];
  if (!mt_mesh_coordinate(mesh, coord)) return status;
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = mt_mesh_comm(mesh, &comm, err);
  if (rc != MT_OK) return rc;
  return mt__agree_fingerprint(comm, mt__mesh_shm(mesh), status, fingerprint, values, n,
                               err);
}

int mt_agree_move(mt_mesh *mesh, int status, const mt_layout *from,
                  const mt_placement *to, int dtype, int async, mt_error *err) {
  mt_error e = {0};
  if (status != MT_OK && err != NULL) e = *err;
  if (status == MT_OK) {
    snprintf(e.msg, sizeof e.msg,
             "redistribute: the ranks of the mesh passed different placements, "
             "async_op or forward_dtype, or DTensors of different global shapes; every "
             "rank must make the same call on the same DTensor (from_local of uneven "
             "shards needs shape= and stride=)");
  }
  mt_layout target = *from;
  if (to != NULL) {
    for (int m = 0; m < from->mesh_ndim; ++m) target.placements[m] = to[m];
  }
  uint64_t h = mt__fnv1a(MT__FNV_START, &dtype, sizeof dtype);
  h = mt__fnv1a(mt__layout_fnv(mt__layout_fnv(h, from), &target), &async, sizeof async);
  int rc = mt_agree(mesh, status, h, &e);
  if (rc != MT_OK && err != NULL) *err = e;
  return rc;
}

/* Apart from every other agreement's fingerprint: a member whose error state does
 * not raise skips this agreement and makes its next one, which must see a
 * difference. */
#define FLOAT_ERRORS_FINGERPRINT 0x6572727374617465ull /* "errstate" */

int mt_agree_float_errors(mt_mesh *mesh, int status, mt_error *err) {
  int64_t all_ok = status == MT_OK; /* its minimum: whether every member succeeded */
  mt_error mismatch = {0};
  snprintf(mismatch.msg, sizeof mismatch.msg,
           "the ranks of the mesh are in different NumPy error states (np.errstate, "
           "np.seterr): where floating-point errors raise on one rank, they must on "
           "every rank");
  int rc = mt_agree_with(mesh, MT_OK, FLOAT_ERRORS_FINGERPRINT, &all_ok, 1, &mismatch);
  if (rc == MT_EINVAL) {
    /* The fingerprints differ: agree on the first member's words a second time,
     * as the call agreement that met this one does. */
    rc = mt_agree(mesh, MT_EINVAL, 0, &mismatch);
  }
  if (rc != MT_OK) {
    if (err != NULL) *err = mismatch;
    return rc;
  }
  return all_ok ? MT_OK : mt_agree(mesh, status, 0, err);
}
