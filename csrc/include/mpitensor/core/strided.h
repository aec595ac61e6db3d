/* Strided layouts: torch's _StridedShard as a layout the core knows.
 *
 * A STRIDED placement on mesh dim m cuts tensor dim `dim` into `split_factor`
 * equal pieces of its current local extent and shards each piece over mesh dim m
 * as SHARD does (torch.chunk); a rank holds its part of every piece, in order.
 * Placements apply in mesh-dim order. Such a rank's elements are not one box, but
 * they are the box of a plain layout of a finer shape (each dim split into
 * factors): its expansion. Since a local array is the same bytes under a
 * reshape, every plain rule (plans, boxes) serves a strided layout through its
 * expansion; this header is that translation and nothing else. Local (no MPI). */
#ifndef MPITENSOR_STRIDED_H
#define MPITENSOR_STRIDED_H

#include <stdint.h>

#include "mpitensor/core/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Local. mt_layout_init that also takes STRIDED placements (a dim in range, a
 * split factor >= 1). Such a layout is read only by the functions below. */
MT_EXPORT int mt_strided_init(mt_layout *out, int ndim, const int64_t *shape,
                              int mesh_ndim, const int64_t *mesh_shape,
                              const mt_placement *placements, mt_error *err);

/* Local. Whether a placement of `layout` is STRIDED. */
MT_EXPORT int mt_strided_has(const mt_layout *layout);

/* Local. The plain layout whose local arrays, reshaped, are `layout`'s: tensor
 * dim d becomes dims [group[d], group[d + 1]) of `out` (`group` has ndim + 1
 * entries). A plain layout is its own expansion. MT_EINVAL when there is none: a
 * split factor that does not divide the dim's local extent, a cut after an uneven
 * one, or more than MT_MAX_NDIM dims. */
MT_EXPORT int mt_strided_expand(const mt_layout *layout, mt_layout *out, int *group,
                                mt_error *err);

/* Local. The local shape of the rank at mesh coordinate `coord`, and as offset
 * the global index, along each dim, of its first element (the global size of the
 * dim where it holds none, as mt_layout_local_box). For a plain layout this is
 * mt_layout_local_box. */
MT_EXPORT int mt_strided_local_box(const mt_layout *layout, const int64_t *coord,
                                   mt_box *out, mt_error *err);

/* Local. Two layouts of one tensor on one mesh, either strided, as plain layouts
 * `ra` and `rb` of one common shape, each holding on every rank the elements of
 * its original in the same local order: a move between them is a plain move of
 * reshaped local arrays. MT_EINVAL when there is no common plain form (then the
 * data must pass through a plain layout of one of them). */
MT_EXPORT int mt_strided_refine(const mt_layout *a, const mt_layout *b, mt_layout *ra,
                                mt_layout *rb, mt_error *err);

/* Local. A normal form of a layout: its expansion with the dims of size 1 no mesh
 * dim cuts dropped, and each uncut dim merged into the dim before it where that
 * dim's cuts still divide the merged size. Two layouts of one mesh hold the same
 * elements in the same order on every rank (a local reshape turns one into the
 * other) exactly when their normal forms are equal. MT_EINVAL when the layout has
 * no expansion, MT_EOVERFLOW when a merged size leaves int64. */
MT_EXPORT int mt_strided_canonical(const mt_layout *layout, mt_layout *out, mt_error *err);

/* Local. Whether `a` and `b`, layouts of one mesh, either strided, have equal
 * normal forms (mt_strided_canonical): 1, or 0 (also when either has none). */
MT_EXPORT int mt_strided_same(const mt_layout *a, const mt_layout *b);

/* Local. The placements of the plain layout a strided one passes through where no
 * rule takes it as it is: each STRIDED placement (and, with `all` nonzero, each
 * SHARD too) becomes REPLICATE, the rest stay. `out` may be `placements`.
 * MT_EINVAL for NULL arrays or a mesh_ndim outside [1, MT_MAX_MESH_NDIM]. */
MT_EXPORT int mt_strided_plain(const mt_placement *placements, int mesh_ndim, int all,
                               mt_placement *out, mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
