/* Creating a plan (plan.h, mt_plan_create): the layouts checked, the steps
 * chosen, the plan filled.
 *
 * Mesh dims of size 1 never change a box: a Shard over one rank is the whole
 * parent extent and a Partial over one rank is already reduced. The planner
 * therefore works on normalised layouts in which every size-1 mesh dim is
 * Replicate, so no step is ever emitted on such a dim. To keep the steps chaining
 * exactly from the caller's `src` to its `dst` (step 0's src is `src`, each step's
 * dst is the next step's src, the last step's dst is `dst`), the relabelling is
 * folded into the plan's ends: the first step's src carries the source labels on
 * size-1 dims and the last step's dst the target labels. A step's src and dst thus
 * differ on its mesh dim and, at the ends of a plan, on size-1 mesh dims, whose
 * labels no box depends on. When nothing but size-1 labels differ, the plan is
 * empty. Which steps a plan takes is plan_search.c's question. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"
#include "plan-private.h"

/* Relabels every size-1 mesh dim Replicate, which changes no rank's box. */
static void normalize(mt_layout *l) {
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (l->mesh_shape[m] == 1) l->placements[m] = replicate();
  }
}

/* Plans on normalised layouts, then puts the caller's size-1 labels back at the
 * ends so the steps chain exactly from `src` to `dst`. */
static int build(mt__steps *list, const mt_layout *src, const mt_layout *dst,
                 int64_t itemsize, const mt_time_model *model, int torch,
                 mt_error *err) {
  mt_layout from = *src, goal = *dst;
  normalize(&from);
  normalize(&goal);
  int found = 1, rc;
  if (torch)
    rc = mt__chain_phase(list, from, &goal, itemsize, MT__TORCH_STEPS, &found, err);
  else
    rc = mt__best_candidate(list, &from, &goal, itemsize, model, err);
  if (rc == MT_OK && !found)
    rc = mt__fail(err, MT_ENOTSUP, "A step of torch's order is no valid collective here");
  mt__set_times(list, model);
  if (rc != MT_OK || list->n == 0) return rc;
  list->s[0].src = *src;
  list->s[list->n - 1].dst = *dst;
  return MT_OK;
}

/* The arguments of a plan checked, the model defaulted, and the layouts
 * normalised: what planning and torch's order start from. */
static int prepare(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                   const mt_time_model *model, mt_layout *a, mt_layout *b,
                   mt_error *err) {
  if (src == NULL || dst == NULL)
    return mt__fail(err, MT_EINVAL, "The source and target layouts are required");
  if (itemsize < 1)
    return mt__fail(err, MT_EINVAL, "The item size is %" PRId64 "; it must be >= 1",
                    itemsize);
  int rc = mt_time_model_check(model, err);
  if (rc == MT_OK) rc = mt__check_pair(src, dst, a, b, err);
  if (rc == MT_OK) rc = mt__check_partials(a, b, err);
  return rc;
}

int mt_plan_torch_bytes(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                        const mt_time_model *model, int64_t *bytes, int64_t *net_bytes,
                        mt_error *err) {
  mt_time_model fallback = mt_time_model_default();
  mt_layout a, b;
  if (bytes == NULL || net_bytes == NULL)
    return mt__fail(err, MT_EINVAL, "The byte counts to fill are required");
  if (model == NULL) model = &fallback;
  int rc = prepare(src, dst, itemsize, model, &a, &b, err);
  if (rc != MT_OK) return rc;
  normalize(&a);
  normalize(&b);
  return mt__torch_order_bytes(&a, &b, itemsize, model, bytes, net_bytes, err);
}

int mt_plan_torch_cost(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                       double *us, mt_error *err) {
  mt_time_model model = mt_time_model_default();
  mt_layout a, b;
  if (us == NULL) return mt__fail(err, MT_EINVAL, "The cost to fill is required");
  int rc = prepare(src, dst, itemsize, &model, &a, &b, err);
  if (rc != MT_OK) return rc;
  normalize(&a);
  normalize(&b);
  *us = mt__torch_order_cost(&a, &b, itemsize);
  return MT_OK;
}

int mt_plan_create(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                   mt_plan **out, mt_error *err) {
  return mt_plan_create_timed(src, dst, itemsize, NULL, out, err);
}

static int create(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                  const mt_time_model *model, int torch, mt_plan **out, mt_error *err);

int mt_plan_create_timed(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                         const mt_time_model *model, mt_plan **out, mt_error *err) {
  return create(src, dst, itemsize, model, 0, out, err);
}

int mt_plan_create_torch(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                         const mt_time_model *model, mt_plan **out, mt_error *err) {
  return create(src, dst, itemsize, model, 1, out, err);
}

static int create(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                  const mt_time_model *model, int torch, mt_plan **out, mt_error *err) {
  if (src == NULL || dst == NULL || out == NULL)
    return mt__fail(err, MT_EINVAL,
                    "The source layout, target layout and output plan are required");
  mt_time_model fallback = mt_time_model_default();
  if (model == NULL) model = &fallback;
  mt_layout a = {0}, b = {0}; /* the analyzer cannot see prepare fill them */
  int rc = prepare(src, dst, itemsize, model, &a, &b, err);
  if (rc != MT_OK) return rc;
  mt__steps *list = calloc(1, sizeof *list);
  if (list == NULL)
    return mt__fail(err, MT_ENOMEM, "Out of memory planning a redistribution");
  rc = build(list, &a, &b, itemsize, model, torch, err);
  if (rc == MT_OK) rc = mt__plan_new(list->s, list->n, out, err);
  free(list);
  return rc;
}
