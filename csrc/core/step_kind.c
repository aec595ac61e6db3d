/* The collective that changes one mesh dim, and whether it is valid there. */
#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "plan-private.h"

/* No later mesh dim cuts tensor dim `d` again, so the boxes of a group along mesh
 * dim `m` are consecutive chunks of one parent box. A later dim of size 1 does not
 * count: its chunk is the whole parent. */
static int inner(const mt_layout *l, int m, int d) {
  for (int k = m + 1; k < l->mesh_ndim; ++k) {
    if (l->mesh_shape[k] > 1 && is_shard(&l->placements[k], d)) return 0;
  }
  return 1;
}

/* The collective that turns placement `a` into `b` on one mesh dim, or -1. */
int mt__step_kind(const mt_placement *a, const mt_placement *b) {
  int a_shard = a->kind == MT_PLACEMENT_SHARD, b_shard = b->kind == MT_PLACEMENT_SHARD;
  int b_rep = b->kind == MT_PLACEMENT_REPLICATE;
  if (a_shard && b_rep) return MT_STEP_ALLGATHER;
  if (a_shard && b_shard && a->dim != b->dim) return MT_STEP_ALLTOALL;
  if (a->kind == MT_PLACEMENT_REPLICATE && b_shard) return MT_STEP_CHUNK;
  if (a->kind == MT_PLACEMENT_PARTIAL && b_rep) return MT_STEP_ALLREDUCE;
  if (a->kind == MT_PLACEMENT_PARTIAL && b_shard) return MT_STEP_REDUCE_SCATTER;
  return -1;
}

/* Whether changing `a` into `b` on mesh dim `m` of `src` is one valid collective:
 * every tensor dim it cuts or joins is not cut again by a later mesh dim. */
int mt__step_kind_valid(const mt_layout *src, int m, const mt_placement *a,
                        const mt_placement *b) {
  switch (mt__step_kind(a, b)) {
    case MT_STEP_ALLGATHER:
      return inner(src, m, a->dim);
    case MT_STEP_ALLTOALL:
      return inner(src, m, a->dim) && inner(src, m, b->dim);
    case MT_STEP_CHUNK:
    case MT_STEP_REDUCE_SCATTER:
      return inner(src, m, b->dim);
    case MT_STEP_ALLREDUCE:
      return 1;
    default:
      return 0;
  }
}

int mt_step_valid(const mt_layout *src, const mt_layout *dst, int mesh_dim) {
  mt_layout a, b;
  if (src == NULL || dst == NULL) return 0;
  if (mt__check_pair(src, dst, &a, &b, NULL) != MT_OK) return 0;
  if (mesh_dim < 0 || mesh_dim >= a.mesh_ndim) return 0;
  if (!differ_only_on(&a, &b, mesh_dim)) return 0;
  return mt__step_kind_valid(&a, mesh_dim, &a.placements[mesh_dim],
                             &b.placements[mesh_dim]);
}
