/* Reshape: how the dims of a tensor of one shape line up with those of another of
 * the same size, the one rule behind reshape's dim map and its views. Local (no
 * MPI). */
#ifndef MPITENSOR_RESHAPE_H
#define MPITENSOR_RESHAPE_H

#include <stdint.h>

#include "mpitensor/core/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Local. A reshape's groups of dims with equal products, left to right, as torch's
 * view_groups makes them: group g is `src` dims [src_at[g], src_at[g + 1]) and
 * `dst` dims [dst_at[g], dst_at[g + 1]). A size-1 dim facing a larger one stands
 * alone (a group with no dim on the other side); otherwise dims are taken from the
 * side with the smaller product until the products agree. `*ngroups` groups;
 * src_at and dst_at have room for src_ndim + dst_ndim + 1 entries. MT_EINVAL when
 * the sizes do not line up (or a product leaves int64), MT_EINDEX for an ndim
 * outside [0, MT_MAX_NDIM] or a negative size. */
MT_EXPORT int mt_reshape_groups(int src_ndim, const int64_t *src, int dst_ndim,
                                const int64_t *dst, int *ngroups, int *src_at,
                                int *dst_at, mt_error *err);

/* Local. torch's layout of a reshape of plain `layout` into `shape` (`ndim` dims)
 * when the reshape moves no data, in `out` (a strided layout, read by strided.h):
 * by the groups of mt_reshape_groups, a Shard of a group's first dim stays on its
 * first output dim, and a merged group turns a Shard of a later dim into a
 * STRIDED placement of its first output dim whose split factor is the local size
 * of the dims before it. MT_EINVAL when there is no such view (a strided
 * `layout`, a Shard whose group splits and merges, or ends in no output dim, a
 * dim before it cut unevenly, a split factor beyond int, or a view that would not
 * hold the same elements: mt_strided_same): the data must move. */
MT_EXPORT int mt_reshape_view(const mt_layout *layout, int ndim, const int64_t *shape,
                              mt_layout *out, mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
