/* What torch's order of steps moves: the byte limit no plan may exceed, so that
 * mpitensor never moves more than torch for the same redistribution. */
#include <stdint.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "plan-private.h"

/* Whether mesh dims before `m` shard tensor dim `d` alike in `a` and `b`. */
static int same_outer_sharding(const mt_layout *a, const mt_layout *b, int m, int d) {
  for (int k = 0; k < m; ++k) {
    if (is_shard(&a->placements[k], d) != is_shard(&b->placements[k], d)) return 0;
  }
  return 1;
}

/* Bytes that torch's order moves from `src` to `dst` (torch/distributed/tensor/
 * _redistribute.py), priced as plan steps are: inner mesh dims first, each to its
 * target, or to Replicate where the mesh dims before it shard that tensor dim
 * differently in the two layouts; then outer to inner for what is left. */
int mt__torch_order_bytes(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                          int64_t *out, mt_error *err) {
  mt_layout cur = *src;
  int64_t total = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < cur.mesh_ndim; ++i) {
      int m = pass == 0 ? cur.mesh_ndim - 1 - i : i;
      mt_placement to = dst->placements[m];
      if (pass == 0 && to.kind == MT_PLACEMENT_SHARD &&
          !same_outer_sharding(&cur, dst, m, to.dim))
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
      cur = next;
    }
  }
  *out = total;
  return MT_OK;
}
