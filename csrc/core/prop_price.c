/* The price of the layout an input needs under a combination: free when it only
 * cuts, bounded from below without planning when it communicates, and planned
 * when a search asks; memoised per input by its variants.
 *
 * On one mesh dim an input needs only a few distinct placements over all the
 * candidates (its "variants"). The layout an input needs under a combination is
 * then a mixed-radix number of variants, which indexes a memo of its price, so
 * each distinct layout is classified and planned at most once per call. A layout
 * that only cuts replicated mesh dims inside the input's existing cuts moves
 * nothing: it is free without a plan. Whether a layout communicates is answered
 * without planning (a Partial reduced, or a rank missing part of its box), and
 * its lower bounds come from the same count (mt__lack, the planner's walk). */
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"
#include "prop-private.h"

/* The layout input i must be moved to under `choice`. A Replicate input that a
 * candidate partitions into a Partial stays Replicate here: partitioning is local
 * (mt_decision's `partition`), so only the rest of the move is priced. */
void mt__prop_needed_layout(const mt__engine *e, int i, const int *choice,
                            mt_layout *out) {
  *out = e->cur[i];
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const mt_placement *p = &e->dims[m].c[choice[m]].in[i];
    if (!(p->kind == MT_PLACEMENT_PARTIAL &&
          e->cur[i].placements[m].kind == MT_PLACEMENT_REPLICATE))
      out->placements[m] = *p;
  }
}

/* Whether cur -> need only cuts replicated mesh dims, each after every mesh dim
 * that already cuts the same tensor dim: every rank's new box lies in its old one,
 * so the plan is chunks alone. Mesh dims of size 1 do not count. */
static int only_cuts(const mt_layout *cur, const mt_layout *need) {
  for (int m = 0; m < cur->mesh_ndim; ++m) {
    const mt_placement *a = &cur->placements[m], *b = &need->placements[m];
    if (cur->mesh_shape[m] == 1 || placement_eq(a, b)) continue;
    if (a->kind != MT_PLACEMENT_REPLICATE || b->kind != MT_PLACEMENT_SHARD) return 0;
    for (int k = m + 1; k < cur->mesh_ndim; ++k) {
      if (cur->mesh_shape[k] > 1 && is_shard(&cur->placements[k], b->dim)) return 0;
    }
  }
  return 1;
}

/* A lower bound of the plan cur -> need into p->lb_*, and in *comm whether it
 * communicates at all. Every element a rank lacks must reach it in some step that
 * is not a reduction (reductions never grow a box), every such rank receives at
 * least one message, and each Partial reduced on a mesh dim of size G is one
 * collective of N (G - 1) messages in the plan's model. */
static int bound(const mt__engine *e, int i, const mt_layout *need, mt__price *p,
                 int *comm, mt_error *err) {
  const mt_layout *cur = &e->cur[i];
  int64_t moved = 0, lacking = 0, reduce_msgs = 0, most = 0, reductions = 0;
  for (int m = 0; m < cur->mesh_ndim; ++m) {
    const mt_placement *a = &cur->placements[m];
    if (cur->mesh_shape[m] > 1 && a->kind == MT_PLACEMENT_PARTIAL &&
        !placement_eq(a, &need->placements[m])) {
      reduce_msgs += e->mesh_numel * (cur->mesh_shape[m] - 1);
      ++reductions;
    }
  }
  mt_error werr = {0, ""};
  int rc = mt__lack(cur, need, &moved, &most, &lacking, &werr);
  if (rc == MT_EOVERFLOW) {
    /* More lacking elements than int64 counts: some rank lacks some, and the
     * bound saturates as costs do. */
    moved = INT64_MAX, most = 0, lacking = 1;
  } else if (rc != MT_OK) {
    return mt__fail(err, rc, "%s", werr.msg);
  }
  p->lb_bytes = sat_mul(moved, e->in->itemsize[i]);
  p->lb_messages = reduce_msgs + lacking;
  /* Each reduction is a step of at least one message, and what the busiest rank
   * lacks reaches it in other steps (reductions never grow a box), at least one
   * message and its bytes, all at shared memory's price at best. */
  const mt_time_model *t = e->model;
  double step = t->call + t->alpha[MT_LINK_SHM];
  p->lb_time = (double)reductions * step +
               (lacking > 0 ? step + (double)most * (double)e->in->itemsize[i] *
                                         t->beta[MT_LINK_SHM]
                            : 0.0);
  *comm = p->lb_messages > 0;
  return MT_OK;
}

/* `l` with Replicate for every Partial: where a gradient of it lives. */
static mt_layout without_partials(const mt_layout *l) {
  mt_layout out = *l;
  for (int m = 0; m < l->mesh_ndim; ++m)
    if (out.placements[m].kind == MT_PLACEMENT_PARTIAL)
      out.placements[m] = replicate();
  return out;
}

/* Adds the plan src -> dst to `p`: 0 when it was planned, else its status (a
 * plan that fails makes the layout invalid, as the forward's would). */
static int add_plan(const mt__engine *e, int64_t itemsize, const mt_layout *src,
                    const mt_layout *dst, mt__price *p, mt_error *perr) {
  mt_plan *plan = NULL;
  int rc = mt_plan_create_timed(src, dst, itemsize, e->model, &plan, perr);
  if (rc != MT_OK) return rc;
  p->bytes = sat_add(p->bytes, mt_plan_bytes(plan));
  p->messages = sat_add(p->messages, mt_plan_messages(plan));
  p->time += mt_plan_time(plan);
  mt_plan_destroy(plan);
  return MT_OK;
}

/* Plans cur -> need into `p`. Only running out of memory fails the call; any
 * other planning error makes this layout, and the combinations needing it,
 * invalid. */
static int plan_price(mt__engine *e, int i, const mt_layout *need, mt__price *p,
                      mt_error *err) {
  mt_error perr = {0, ""};
  p->bytes = 0, p->messages = 0, p->time = 0.0;
  int rc = add_plan(e, e->in->itemsize[i], &e->cur[i], need, p, &perr);
  if (rc == MT_ENOMEM) return mt__fail(err, rc, "%s", perr.msg);
  if (rc != MT_OK) {
    if (e->plan_rc == MT_OK) e->plan_rc = rc, e->plan_err = perr;
    p->state = MT__PRICE_INVALID;
    return MT_OK;
  }
  p->state = MT__PRICE_DONE;
  return MT_OK;
}

/* A layout seen for the first time: free of communication (mere cuts, which
 * cost their copies), communicating (bounded, and planned only when `full`), or
 * one that moves nothing without being mere cuts (planned, for exact counts;
 * only empty boxes get here). */
static int classify(mt__engine *e, int i, const mt_layout *need, int full, mt__price *p,
                    mt_error *err) {
  if (only_cuts(&e->cur[i], need)) {
    p->state = MT__PRICE_DONE, p->bytes = 0, p->messages = 0;
    p->time = mt__cuts_time(&e->cur[i], need, e->in->itemsize[i], e->model);
    return MT_OK;
  }
  int comm = 0, rc = bound(e, i, need, p, &comm, err);
  if (rc != MT_OK) return rc;
  if (comm && !full) {
    p->state = MT__PRICE_COMM;
    return MT_OK;
  }
  return plan_price(e, i, need, p, err);
}

/* The layout input i's gradient comes back in under `choice`: the layout the
 * input was moved to, Replicate for its Partials, and Partial(sum) where a
 * LINEAR_ONE candidate keeps another input's Partial (the derivative of p * r in
 * r is p). */
static mt_layout grad_layout(const mt__engine *e, int i, const int *choice) {
  mt_layout need;
  mt__prop_needed_layout(e, i, choice, &need);
  mt_layout g = without_partials(&need);
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const mt__cand *c = &e->dims[m].c[choice[m]];
    if (e->map->partial_rule == MT_PARTIAL_LINEAR_ONE && c->kind == MT__CAND_PARTIAL &&
        c->in[i].kind != MT_PLACEMENT_PARTIAL)
      g.placements[m] = partial(MT_REDUCE_SUM);
  }
  return g;
}

/* What the gradients cost on their way back to the inputs that want them, as
 * torch's redistribute backward moves them: from the layout each comes back in
 * to the input's own, with Replicate for its Partials. Planned per combination,
 * for communicating combinations only: where none communicates, the forward
 * decides as torch's does. */
int mt__prop_grads_back(const mt__engine *e, const int *choice, mt__price *out,
                        mt_error *err) {
  out->bytes = 0, out->messages = 0, out->time = 0.0;
  for (int i = 0; i < e->ninputs; ++i) {
    if (!(e->in->grad >> i & 1u) || mt__prop_moved_with_alias(e, i, choice)) continue;
    mt_layout from = grad_layout(e, i, choice), to = without_partials(&e->cur[i]);
    int same = 1;
    for (int m = 0; m < e->mesh_ndim; ++m)
      same &= e->cur[i].mesh_shape[m] == 1 ||
              placement_eq(&from.placements[m], &to.placements[m]);
    if (same) continue;
    mt_error perr = {0, ""};
    int rc = add_plan(e, e->in->itemsize[i], &from, &to, out, &perr);
    if (rc == MT_ENOMEM) return mt__fail(err, rc, "%s", perr.msg);
    /* A gradient the planner cannot move adds nothing: the forward decides. */
  }
  return MT_OK;
}

int mt__prop_moved_with_alias(const mt__engine *e, int i, const int *choice) {
  int j = e->in->alias[i] - 1;
  if (j < 0) return 0;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const mt__cand *c = &e->dims[m].c[choice[m]];
    if (!placement_eq(&c->in[i], &c->in[j])) return 0;
  }
  return 1;
}

/* The price of input i's needed layout under `choice`, from the memo when there
 * is one. With `full` a communicating layout is planned, else only marked. */
int mt__prop_input_price(mt__engine *e, int i, const int *choice, int full,
                         mt__price *out, mt_error *err) {
  mt__price local = {MT__PRICE_UNKNOWN, 0, 0, 0.0, 0, 0, 0.0}, *p = &local;
  if (e->memo[i] != NULL) {
    int64_t idx = 0;
    for (int m = 0; m < e->mesh_ndim; ++m)
      idx += e->dims[m].c[choice[m]].variant[i] * e->stride[i][m];
    p = &e->memo[i][idx];
  }
  int rc = MT_OK;
  if (p->state == MT__PRICE_UNKNOWN || (p->state == MT__PRICE_COMM && full)) {
    mt_layout need;
    mt__prop_needed_layout(e, i, choice, &need);
    rc = p->state == MT__PRICE_UNKNOWN ? classify(e, i, &need, full, p, err)
                                   : plan_price(e, i, &need, p, err);
  }
  *out = *p;
  return rc;
}

/* The output's layout under `choice`. */
static mt_layout out_layout(const mt__engine *e, const int *choice) {
  mt_layout out = e->cur[0];
  out.ndim = e->map->out_ndim;
  for (int d = 0; d < out.ndim; ++d) out.shape[d] = e->out_shape[d];
  for (int m = 0; m < e->mesh_ndim; ++m) out.placements[m] = e->dims[m].c[choice[m]].out;
  return out;
}

int mt__prop_way_out(const mt__engine *e, const int *choice, int full, mt__price *out,
                     int *comm, mt_error *err) {
  out->bytes = 0, out->messages = 0, out->time = 0.0;
  *comm = 0;
  const mt_prop_inputs *in = e->in;
  if (!in->want || in->want_ndim != e->map->out_ndim) return MT_OK;
  for (int d = 0; d < in->want_ndim; ++d)
    if (in->want_shape[d] != e->out_shape[d]) return MT_OK;
  mt_layout from = out_layout(e, choice), to = from;
  memcpy(to.placements, in->want_placements, sizeof to.placements);
  if (only_cuts(&from, &to)) {
    out->time = mt__cuts_time(&from, &to, e->out_itemsize, e->model);
    return MT_OK;
  }
  *comm = 1;
  if (!full) return MT_OK;
  mt_error perr = {0, ""};
  int rc = add_plan(e, e->out_itemsize, &from, &to, out, &perr);
  if (rc == MT_ENOMEM) return mt__fail(err, rc, "%s", perr.msg);
  /* An output the planner cannot move adds nothing: the op decides alone. */
  return MT_OK;
}
