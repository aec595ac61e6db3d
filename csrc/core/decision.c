/* What a decision asks of the run that follows it (memo.h): the bytes its plans
 * move, whether two inputs that are one tensor move once, which inputs are zeros
 * on this rank, this rank's box of the output, and which moved inputs a recorded
 * node keeps as moved. */
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/memo.h"

void mt_decision_out_key(const mt_decision *dec, int dtype, int64_t itemsize,
                         mt_layout_key *out) {
  memset(out, 0, sizeof *out);
  out->mesh_ndim = dec->mesh_ndim, out->ndim = dec->out_ndim;
  memcpy(out->placements, dec->out_placements, sizeof out->placements);
  memcpy(out->shape, dec->out_shape, sizeof out->shape);
  mt_layout_contiguous_strides(out->ndim, out->shape, out->stride);
  out->dtype = dtype, out->itemsize = itemsize;
}

int64_t mt_decision_bytes(const mt_decision *dec) {
  int64_t bytes = 0;
  for (int i = 0; i < dec->ninputs; ++i)
    if (dec->plan[i] != NULL) bytes += mt_plan_bytes(dec->plan[i]);
  return bytes;
}

int mt_decision_same_move(const mt_decision *dec, int t, int k) {
  const mt_plan *a = dec->plan[t], *b = dec->plan[k];
  if (a == NULL || b == NULL || dec->partition[t] != 0 || dec->partition[k] != 0)
    return 0;
  int na = mt_plan_nsteps(a), nb = mt_plan_nsteps(b);
  if (na == 0 || nb == 0) return 0;
  const mt_layout *x = &mt_plan_step(a, na - 1)->dst, *y = &mt_plan_step(b, nb - 1)->dst;
  return memcmp(x->placements, y->placements, (size_t)x->mesh_ndim * sizeof *x->placements)
         == 0;
}

int mt_decision_zeroed(const mt_decision *dec, int t, const int64_t *coord) {
  uint32_t mask = dec->partition[t];
  for (int m = 0; m < dec->mesh_ndim && (mask >> m) != 0; ++m)
    if ((mask >> m & 1u) && coord[m] != 0) return 1;
  return 0;
}

int mt_decision_out_box(const mt_decision *dec, const int64_t *mesh_shape,
                        const int64_t *coord, mt_box *out, mt_error *err) {
  int n = dec->out_ndim < 0 ? 0 : dec->out_ndim;
  if (coord == NULL) {
    out->ndim = n;
    for (int i = 0; i < n; ++i) out->offset[i] = 0, out->shape[i] = 1;
    return MT_OK;
  }
  mt_layout l;
  int rc = mt_layout_init(&l, n, dec->out_shape, dec->mesh_ndim, mesh_shape,
                          dec->out_placements, err);
  return rc == MT_OK ? mt_layout_local_box(&l, coord, out, err) : rc;
}

/* The layouts at either end of input t's plan, or 0 when it has no step. */
static int plan_ends(const mt_decision *dec, int t, const mt_layout **src,
                     const mt_layout **dst) {
  const mt_plan *plan = dec->plan[t];
  int n = plan != NULL ? mt_plan_nsteps(plan) : 0;
  if (n == 0) return 0;
  *src = &mt_plan_step(plan, 0)->src, *dst = &mt_plan_step(plan, n - 1)->dst;
  return 1;
}

int mt_decision_keeps_moved(const mt_decision *dec, int t) {
  const mt_layout *src, *dst;
  if (dec->partition[t] != 0 || !plan_ends(dec, t, &src, &dst)) return 0;
  int saves = 0;
  for (int m = 0; m < src->mesh_ndim; ++m) {
    if (src->mesh_shape[m] == 1) continue;
    const mt_placement *from = &src->placements[m], *to = &dst->placements[m];
    if (from->kind == MT_PLACEMENT_PARTIAL && to->kind == MT_PLACEMENT_PARTIAL) return 0;
    if (from->kind == MT_PLACEMENT_SHARD && to->kind != MT_PLACEMENT_SHARD) return 0;
    saves |= from->kind == MT_PLACEMENT_PARTIAL ||
             (from->kind == MT_PLACEMENT_SHARD && from->dim != to->dim);
  }
  return saves;
}

void mt_decision_moved_key(const mt_decision *dec, int t, const mt_layout_key *given,
                           mt_layout_key *out) {
  const mt_layout *src, *dst;
  *out = *given;
  if (!plan_ends(dec, t, &src, &dst)) return;
  memcpy(out->placements, dst->placements, sizeof out->placements);
  mt_layout_contiguous_strides(out->ndim, out->shape, out->stride);
}

void mt_decision_hold(const mt_decision *dec, mt_decision *copy) {
  *copy = *dec;
  for (int i = 0; i < copy->ninputs; ++i)
    if (copy->plan[i] != NULL) mt_plan_retain(copy->plan[i]);
}

void mt_decision_drop(mt_decision *copy) {
  for (int i = 0; i < copy->ninputs; ++i) mt_plan_destroy(copy->plan[i]);
}
