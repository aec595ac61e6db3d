/* What torch's order of steps moves: the byte limits no plan may exceed, so that
 * mpitensor never moves more than torch for the same redistribution, in all and
 * between nodes. */
#include <stdint.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "plan-private.h"

int mt__same_outer_sharding(const mt_layout *a, const mt_layout *b, int m, int d) {
  for (int k = 0; k < m; ++k) {
    if (is_shard(&a->placements[k], d) != is_shard(&b->placements[k], d)) return 0;
  }
  return 1;
}

/* The bytes between nodes of torch's step on mesh dim `m` from `cur` to `next`,
 * moving `bytes` in all: as a plan's collective of that kind is counted, by the
 * vector of the rank at coordinate 0 (the largest). */
static int64_t step_net(const mt_layout *cur, const mt_layout *next, int m,
                        int64_t bytes, int64_t itemsize, const mt_time_model *model) {
  int kind = mt__step_kind(&cur->placements[m], &next->placements[m]);
  int64_t coord[MT_MAX_MESH_NDIM] = {0};
  mt_box b;
  local_box(kind == MT_STEP_ALLGATHER ? next : cur, coord, &b);
  /* One rank's box in bytes, the message size the model prices by; a box too large
   * to count in bytes is priced as the largest message. */
  int64_t vector;
  if (!mul_ok(mt_box_numel(&b), itemsize, &vector)) vector = INT64_MAX;
  return mt__coll_net_bytes(kind, cur, m, bytes, vector, model);
}

/* Bytes that torch's order moves from `src` to `dst` (torch/distributed/tensor/
 * _redistribute.py), priced as plan steps are: inner mesh dims first, each to its
 * target, or to Replicate where the mesh dims before it shard that tensor dim
 * differently in the two layouts; then outer to inner for what is left. */
int mt__torch_order_bytes(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                          const mt_time_model *model, int64_t *out, int64_t *net,
                          mt_error *err) {
  mt_layout cur = *src;
  int64_t total = 0, across = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < cur.mesh_ndim; ++i) {
      int m = pass == 0 ? cur.mesh_ndim - 1 - i : i;
      mt_placement to = dst->placements[m];
      if (pass == 0 && to.kind == MT_PLACEMENT_SHARD &&
          !mt__same_outer_sharding(&cur, dst, m, to.dim))
        to = replicate();
      if (placement_eq(&cur.placements[m], &to)) continue;
      mt_layout next = cur;
      next.placements[m] = to;
      int64_t elems = 0, most = 0, before, after, bytes;
      if (cur.placements[m].kind != MT_PLACEMENT_PARTIAL) {
        int rc = mt__moved_elements(&cur, &next, m, &elems, &most, err);
        if (rc != MT_OK) return rc;
      } else if (to.kind == MT_PLACEMENT_REPLICATE) {
        if (!mt__reduced_elements(&cur, m, &elems)) return overflow(err);
      } else {
        /* A reduce-scatter receives what the ranks' boxes shrink by. */
        if (!mt__sum_numel(&cur, &before) || !mt__sum_numel(&next, &after))
          return overflow(err);
        elems = before - after;
      }
      if (!mul_ok(elems, itemsize, &bytes) || !add_ok(total, bytes, &total))
        return overflow(err);
      across += step_net(&cur, &next, m, bytes, itemsize, model); /* below total */
      cur = next;
    }
  }
  *out = total;
  *net = across;
  return MT_OK;
}
