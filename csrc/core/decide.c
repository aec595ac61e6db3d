/* Deciding on a miss (memo.h): the engine's placements or a caller's (a user's rule,
 * a redistribute), each input's move checked and planned, and the decision stored. */
#include <assert.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/memo.h"

static int same_placements(const mt_layout *l, const mt_placement *p) {
  for (int m = 0; m < l->mesh_ndim; ++m) {
    const mt_placement *a = &l->placements[m];
    if (a->kind != p[m].kind) return 0;
    if (a->kind == MT_PLACEMENT_SHARD && a->dim != p[m].dim) return 0;
    if (a->kind == MT_PLACEMENT_PARTIAL && a->reduce_op != p[m].reduce_op) return 0;
  }
  return 1;
}

/* Where `to` asks a Replicate mesh dim of `src` for a Partial of sum, avg, max or
 * min, the value is partitioned locally rather than moved (torch's
 * Replicate -> Partial): that dim stays Replicate in `to`, and the Partial(sum)
 * ones of size > 1 are marked in *partition. A Partial(product) target is left
 * for mt_plan_check to refuse, as torch refuses to partition it. */
static void take_partitions(const mt_layout *src, mt_placement *to, uint32_t *partition) {
  *partition = 0;
  for (int m = 0; m < src->mesh_ndim; ++m) {
    if (src->placements[m].kind != MT_PLACEMENT_REPLICATE ||
        to[m].kind != MT_PLACEMENT_PARTIAL || to[m].reduce_op == MT_REDUCE_PRODUCT)
      continue;
    if (to[m].reduce_op == MT_REDUCE_SUM && src->mesh_shape[m] > 1) *partition |= 1u << m;
    to[m] = src->placements[m];
  }
}

/* The plan that gives `src` the placements `to`, checked first; NULL in *out when
 * nothing moves. */
static int plan_input(const mt_layout *src, const mt_placement *target, int64_t itemsize,
                      int dtype, const mt_time_model *model, mt_plan **out,
                      uint32_t *partition, mt_error *err) {
  *out = NULL;
  mt_placement to[MT_MAX_MESH_NDIM];
  memcpy(to, target, (size_t)src->mesh_ndim * sizeof *to);
  take_partitions(src, to, partition);
  if (same_placements(src, to)) return MT_OK;
  mt_layout dst = *src;
  memcpy(dst.placements, to, (size_t)src->mesh_ndim * sizeof *to);
  int rc = mt_plan_check(src, &dst, dtype, err);
  if (rc == MT_OK) rc = mt_plan_create_timed(src, &dst, itemsize, model, out, err);
  if (rc == MT_OK && mt_plan_nsteps(*out) == 0) {
    mt_plan_destroy(*out); /* only mesh dims of size 1 differ: nothing runs */
    *out = NULL;
  }
  return rc;
}

static void drop_plans(mt_decision *d) {
  for (int i = 0; i < d->ninputs; ++i) {
    mt_plan_destroy(d->plan[i]);
    d->plan[i] = NULL;
  }
}

int mt_memo_decide_targets(mt_memo *memo, const mt_memo_key *key,
                           const mt_prop_inputs *in, const int *dtypes,
                           const mt_placement (*targets)[MT_MAX_MESH_NDIM],
                           const mt_decision *outcome, mt_decision **out, mt_error *err) {
  if (in->ninputs < 0 || in->ninputs > MT_PROP_MAX_INPUTS)
    return mt__fail(err, MT_EINVAL, "A decision has 0 to %d inputs", MT_PROP_MAX_INPUTS);
  mt_decision d = *outcome;
  d.ninputs = in->ninputs, d.mesh_ndim = in->mesh_ndim;
  memset(d.plan, 0, sizeof d.plan);
  memset(d.partition, 0, sizeof d.partition);
  int rc = MT_OK;
  for (int i = 0; rc == MT_OK && i < in->ninputs; ++i) {
    mt_layout src;
    rc = mt_layout_init(&src, in->ndim[i], in->shape[i], in->mesh_ndim, in->mesh_shape,
                        in->placements[i], err);
    if (rc == MT_OK)
      rc = plan_input(&src, targets[i], in->itemsize[i], dtypes[i],
                      mt_memo_time_model(memo), &d.plan[i], &d.partition[i], err);
  }
  mt_decision *stored = rc == MT_OK ? mt_memo_insert(memo, key, &d, err) : NULL;
  drop_plans(&d); /* the memo holds its own */
  if (rc == MT_OK && stored == NULL) rc = err != NULL && err->code ? err->code : MT_ENOMEM;
  if (rc == MT_OK) *out = stored;
  return rc;
}

int mt_memo_decide(mt_memo *memo, const mt_memo_key *key, const mt_dimmap *map,
                   const mt_prop_inputs *in, const int *dtypes, mt_decision **out,
                   mt_error *err) {
  mt_prop_result res;
  mt_prop_inputs timed = *in;
  timed.model = mt_memo_time_model(memo);
  int rc = mt_propagate(map, &timed, &res, err);
  if (rc != MT_OK) return rc;
  mt_decision outcome;
  memset(&outcome, 0, sizeof outcome);
  outcome.out_ndim = res.out_ndim;
  memcpy(outcome.out_placements, res.out_placements, sizeof outcome.out_placements);
  memcpy(outcome.out_shape, res.out_shape, sizeof outcome.out_shape);
  return mt_memo_decide_targets(memo, key, in, dtypes,
                                (const mt_placement(*)[MT_MAX_MESH_NDIM])res.in_placements,
                                &outcome, out, err);
}

void mt_prop_inputs_add(mt_prop_inputs *in, const mt_layout_key *key) {
  int i = in->ninputs++;
  assert(i < MT_PROP_MAX_INPUTS);
  in->ndim[i] = key->ndim, in->itemsize[i] = key->itemsize;
  memcpy(in->shape[i], key->shape, sizeof in->shape[i]);
  memcpy(in->placements[i], key->placements, sizeof in->placements[i]);
}

void mt_prop_inputs_want(mt_prop_inputs *in, const mt_layout_key *key) {
  in->want = 1, in->want_ndim = key->ndim;
  memcpy(in->want_shape, key->shape, sizeof in->want_shape);
  for (int m = 0; m < in->mesh_ndim; ++m)
    in->want_placements[m] = key->placements[m].kind == MT_PLACEMENT_PARTIAL
                                 ? (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0}
                                 : key->placements[m];
}

int mt_memo_decide_move(mt_memo *memo, const mt_memo_key *key, const mt_layout_key *src,
                        int dtype, const int64_t *mesh_shape, const mt_placement *dst,
                        mt_decision **out, mt_error *err) {
  int nm = src->mesh_ndim;
  mt_layout from, to;
  int rc = mt_layout_init(&from, src->ndim, src->shape, nm, mesh_shape, src->placements,
                          err);
  if (rc == MT_OK) rc = mt_layout_init(&to, src->ndim, src->shape, nm, mesh_shape, dst, err);
  if (rc == MT_OK) rc = mt_plan_check(&from, &to, dtype, err);
  if (rc != MT_OK) return rc;
  mt_prop_inputs in;
  memset(&in, 0, sizeof in);
  in.mesh_ndim = nm;
  memcpy(in.mesh_shape, mesh_shape, (size_t)nm * sizeof *mesh_shape);
  mt_prop_inputs_add(&in, src);
  mt_placement targets[1][MT_MAX_MESH_NDIM];
  memset(targets, 0, sizeof targets);
  memcpy(targets[0], dst, (size_t)nm * sizeof *dst);
  mt_decision outcome;
  memset(&outcome, 0, sizeof outcome);
  outcome.ninputs = 1, outcome.mesh_ndim = nm, outcome.out_ndim = src->ndim;
  memcpy(outcome.out_shape, src->shape, (size_t)src->ndim * sizeof *src->shape);
  memcpy(outcome.out_placements, dst, (size_t)nm * sizeof *dst);
  return mt_memo_decide_targets(memo, key, &in, &dtype,
                                (const mt_placement(*)[MT_MAX_MESH_NDIM])targets,
                                &outcome, out, err);
}
