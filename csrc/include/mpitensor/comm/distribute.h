/* Distributing a whole tensor that every member holds over the mesh
 * (distribute_tensor), each rank keeping its box. Every call is Collective on the
 * mesh and counts what it sent into the mesh's counters (counters.h). */
#ifndef MPITENSOR_DISTRIBUTE_H
#define MPITENSOR_DISTRIBUTE_H

#include <stdint.h>

#include "mpitensor/comm/mesh.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective on the mesh. distribute_tensor: `full` is the whole tensor of
 * `layout`'s shape on every member, of which the copy on the rank at coordinate 0
 * of every mesh dim is the source of truth; `local` receives this rank's box.
 * Shard dims are scattered first among the ranks holding the source's replica,
 * then Replicate dims are broadcast, so each byte leaves a rank once per receiver.
 * Partial(sum) and Partial(product) put the value on coordinate 0 of that dim and
 * the identity elsewhere; Partial(avg|max|min) put the value everywhere. First the
 * members agree (mt_agree: one small all-reduce) that they passed the same global
 * shape, dtype and placements, and that each has its box: `local` may be NULL for
 * a non-empty box when the caller could not allocate it; then every member
 * returns MT_ENOMEM (a mismatch: MT_EINVAL), with the same message. */
int mt_distribute(mt_mesh *mesh, const mt_layout *layout, int dtype, const void *full,
                  void *local, mt_error *err);

/* mt_distribute with the copy at coordinate `src` of every mesh dim as the source
 * of truth (torch's src_data_rank: a rank of each mesh dim's group); Partial(sum|
 * product) put the value there. MT_EINDEX when `src` is not below every mesh dim's
 * size (checked alike on every rank, before any communication). */
MT_EXPORT int mt_distribute_from(mt_mesh *mesh, const mt_layout *layout, int dtype,
                                 int64_t src, const void *full, void *local,
                                 mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
