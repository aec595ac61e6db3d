/* Agreement: anything that can fail on some ranks only (a size check, an
 * allocation, a file, an argument that differs by rank) is agreed on before the
 * next collective, so that every rank returns the same status and message and none
 * is left waiting in a collective the others never reach.
 *
 * One small all-reduce carries every rank's verdict (and, in the same message,
 * values whose minimum the ranks need anyway); only when some rank failed does a
 * broadcast follow, of the first failing rank's message. */
#ifndef MPITENSOR_AGREE_H
#define MPITENSOR_AGREE_H

#include <mpi.h>
#include <stdint.h>

#include "mpitensor/comm/mesh.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The smallest global tensor, in bytes, whose redistribution starts with an
 * agreement (mt_redistribute): its all-reduce costs a negligible share of moving
 * that much, while on small tensors it would be a share worth noticing. */
#define MT_AGREE_MIN_BYTES ((int64_t)1 << 24)

/* The most values mt_agree_comm carries along. */
#define MT_AGREE_MAX_VALUES 7

/* Collective on `comm`. Every rank passes its status so far (MT_OK, or an MT_E*
 * code with its message in err->msg) and `n` values (0 <= n <= MT_AGREE_MAX_VALUES;
 * `values` may be NULL when n is 0). Returns, on every rank, MT_OK when every rank
 * passed MT_OK (leaving `err` as it was), else the status of the lowest rank of
 * `comm` that failed, with its message in `err` (which may be NULL); the values come
 * back as their minimum over the ranks either way. An MPI failure of the agreement
 * itself is MT_EMPI on the ranks it happens on. MT_EINVAL, without communicating,
 * for n out of range.
 *
 *   int64_t nonce = first ? my_nonce : INT64_MAX;
 *   rc = mt_agree_comm(comm, rc, &nonce, 1, &err);  // same rc, same nonce everywhere
 */
int mt_agree_comm(MPI_Comm comm, int status, int64_t *values, int n, mt_error *err);

/* Collective on `comm`. mt_agree over any communicator: the status and message of
 * the lowest failing rank of `comm`, else MT_EINVAL with rank 0's err->msg (or a
 * general sentence) when the ranks' fingerprints differ, else MT_OK. One
 * all-reduce of three int64 values, and a broadcast only on failure.
 *
 *   mt_error err = {0};
 *   snprintf(err.msg, sizeof err.msg, "the ranks passed different meshes");
 *   rc = mt_agree_fingerprint_comm(comm, rc, hash_of(shape, ranks), &err);
 */
int mt_agree_fingerprint_comm(MPI_Comm comm, int status, uint64_t fingerprint,
                              mt_error *err);

/* Collective on the mesh. Whether every member succeeded and passed the same
 * `fingerprint` (a hash of what must agree: shapes, placements, a path, a call
 * site). `status` is this rank's verdict and err->msg its message: why it failed,
 * or, with MT_OK, what a disagreement of fingerprints means ("" for a general
 * sentence), so initialise `err` (`mt_error err = {0};`). Returns on every member:
 * the status and message of the first member (by row-major mesh position) that
 * failed; else, when the fingerprints differ, MT_EINVAL with the first member's
 * mismatch message; else MT_OK. One all-reduce of three int64 values, and a
 * broadcast only on failure. A rank outside the mesh takes no part and returns
 * `status` as it is. For a slice, the first agreement creates the slice's
 * communicator (mt_mesh_comm).
 *
 *   mt_error err = {0};
 *   int rc = buf != NULL ? MT_OK : mt_error_set(&err, MT_ENOMEM, "out of memory");
 *   rc = mt_agree(mesh, rc, hash_of(shape), &err);
 *   if (rc != MT_OK) return rc;  // every member returns here, with one message
 */
MT_EXPORT int mt_agree(mt_mesh *mesh, int status, uint64_t fingerprint, mt_error *err);

/* Collective on the mesh. mt_agree, carrying `n` values (at most
 * MT_AGREE_MAX_VALUES - 2; else MT_EINVAL without communicating) in the same
 * all-reduce: each comes back as its minimum over the members, which is what each
 * member's `values` hold on return (a rank outside the mesh keeps its own).
 *
 *   int64_t mine = local_is_contiguous;
 *   rc = mt_agree_with(mesh, rc, fp, &mine, 1, &err);  // mine: 1 where all are
 */
MT_EXPORT int mt_agree_with(mt_mesh *mesh, int status, uint64_t fingerprint,
                            int64_t *values, int n, mt_error *err);

/* Collective on the mesh. mt_agree for an explicit redistribute of a tensor laid
 * out as `from` to the placements `to` (NULL: this rank failed before it knew
 * them), cast to `dtype` and asynchronous or not: every member's verdict, and the
 * same layouts, dtype and async flag everywhere, else MT_EINVAL saying so. Called
 * before anything moves, also where this rank's part stays, so that a move that is
 * none on one rank cannot leave another waiting in its collective.
 *
 *   rc = mt_agree_move(mesh, rc, &src_layout, dst_placements, dtype, async, &err);
 */
MT_EXPORT int mt_agree_move(mt_mesh *mesh, int status, const mt_layout *from,
                            const mt_placement *to, int dtype, int async, mt_error *err);

/* Collective on the mesh. The agreement on an operation's floating-point errors
 * where NumPy's error state raises (`status`: this rank's, MT_EFLOAT or another
 * failure of the local computation, with its message in err->msg): MT_OK when every
 * member succeeded, else the first failing member's status and message on every
 * member. It has the call agreement's form (a fingerprint and one value), so that
 * a member whose error state does not raise, which makes its next agreement
 * instead, meets one of its own size: every member then returns MT_EINVAL saying
 * that the error states differ. A rank outside the mesh returns `status`.
 *
 *   rc = mt_agree_float_errors(mesh, local_ok ? MT_OK : MT_EFLOAT, &err);
 */
MT_EXPORT int mt_agree_float_errors(mt_mesh *mesh, int status, mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
