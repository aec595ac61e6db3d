/* The route of a move from or to a strided layout: one plain move on the two
 * layouts' common plain form, or, where they have none, moves through plain
 * layouts, as torch passes through Replicate. The executor runs the route; this is
 * where it is chosen. Local (no MPI). */
#ifndef MPITENSOR_STRIDED_ROUTE_H
#define MPITENSOR_STRIDED_ROUTE_H

#include "mpitensor/core/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Local. The first move of the route from `src` to `dst`, layouts of one tensor on
 * one mesh, either strided (mt_strided_init). *hops = 1: the one plain move from
 * `from` to `to`, their common plain form (mt_strided_refine). *hops = 2: there is
 * none, and the data first moves to `mid`, a plain layout of src's shape with
 * which src has one: a strided source's strided mesh dims Replicate (every Shard
 * too when that has none either), a plain source's Partials alone; the route goes
 * on from `mid`, at most three moves in all. MT_EINVAL when either layout has no
 * plain expansion. */
MT_EXPORT int mt_strided_route(const mt_layout *src, const mt_layout *dst, mt_layout *from,
                               mt_layout *to, mt_layout *mid, int *hops, mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
