/* Which steps a plan takes: the candidates, and the one that wins.
 *
 * Shard/Replicate changes are priced two ways, as a chain of one-mesh-dim
 * collectives and as one direct exchange (plan_phases.c). Reductions are placed
 * four ways: before the shard changes (the order plan.h documents), after the
 * cuts that shrink what they carry, after all shard changes, or interleaved in
 * torch's order; the cheapest plan wins. None may move more bytes than torch's
 * order priced by the same model (torch_order.c). The tests check, over every
 * (2,2)-mesh pair and random 1- to 3-d meshes, that no plan moves more bytes than
 * torch's chain priced by the same model. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"
#include "plan-private.h"

/* How much Shard/Replicate work a candidate does before the reductions. */
enum { REDUCE_FIRST, CUT_FIRST, RESHARD_FIRST, NCANDIDATES };

/* Whether a Partial mesh dim before `m` becomes Shard(d): cutting `d` on `m`
 * first would stop that reduce-scatter (its dim would be cut again later). */
static int scatters_before(const mt_layout *src, const mt_layout *dst, int m, int d) {
  for (int k = 0; k < m; ++k) {
    if (src->placements[k].kind == MT_PLACEMENT_PARTIAL &&
        is_shard(&dst->placements[k], d))
      return 1;
  }
  return 0;
}

/* The layout a candidate reaches before reducing: `src` with some non-Partial mesh
 * dims already at their targets. CUT_FIRST moves those that do not grow the local
 * data (cuts and all-to-alls, not gathers) and do not stop a reduce-scatter,
 * RESHARD_FIRST all of them. */
static mt_layout before_reducing(const mt_layout *src, const mt_layout *dst,
                                 int which) {
  mt_layout mid = *src;
  for (int m = 0; m < mid.mesh_ndim; ++m) {
    const mt_placement *a = &src->placements[m], *b = &dst->placements[m];
    if (a->kind == MT_PLACEMENT_PARTIAL || which == REDUCE_FIRST) continue;
    if (which == RESHARD_FIRST ||
        (b->kind == MT_PLACEMENT_SHARD && !scatters_before(src, dst, m, b->dim)))
      mid.placements[m] = *b;
  }
  return mid;
}

/* One candidate: move to before_reducing(), reduce every Partial that goes away,
 * then finish the shards. Reductions carry less when the tensor is cut first
 * (torch's order for `[P, R] -> [R, S(0)]` chunks, then all-reduces half the
 * data), and gathering first can turn an all-reduce into a reduce-scatter, so
 * the planner prices all three and keeps the cheapest. */
static int staged(mt__steps *list, const mt_layout *src, const mt_layout *dst,
                  int which, int64_t itemsize, const mt_time_model *model,
                  mt__direct_memo *memo, mt_error *err) {
  mt_layout mid = before_reducing(src, dst, which);
  int rc = mt__reshard_phase(list, src, &mid, itemsize, model, memo, err);
  if (rc == MT_OK) rc = mt__reduce_phase(list, &mid, dst, itemsize, err);
  if (rc == MT_OK) rc = mt__reshard_phase(list, &mid, dst, itemsize, model, memo, err);
  return rc;
}

/* Whether candidate `b` beats `a`: a candidate moving more bytes than `limit`
 * (torch's order) never does; else the faster one, then fewer bytes, then fewer
 * messages, then fewer communicating steps; `a` wins ties. */
static int beats(mt__steps *b, mt__steps *a, int64_t limit, const mt_time_model *model) {
  if (b->bytes > limit) return 0;
  if (a->bytes > limit) return 1;
  if (model != NULL) {
    mt__set_times(a, model);
    mt__set_times(b, model);
    int order = mt__time_order(b, a);
    if (order != 0) return order < 0;
  }
  if (b->bytes != a->bytes) return b->bytes < a->bytes;
  if (b->messages != a->messages) return b->messages < a->messages;
  return mt__communicating_steps(b) < mt__communicating_steps(a);
}

/* Whether `src` has a Partial that `dst` does not keep. */
static int reduces(const mt_layout *src, const mt_layout *dst) {
  for (int m = 0; m < src->mesh_ndim; ++m) {
    if (src->placements[m].kind == MT_PLACEMENT_PARTIAL &&
        dst->placements[m].kind != MT_PLACEMENT_PARTIAL)
      return 1;
  }
  return 0;
}

/* The candidates of one search: the best so far, whether there is one, and what
 * ranks them. */
typedef struct search {
  mt__steps *best;
  int have;
  int64_t limit;
  const mt_time_model *model;
  mt__direct_memo direct;
} search;

/* Plans one candidate into `tmp` and keeps it in `sr` unless it is invalid,
 * moves more than the limit or does not beat the best. `which` < 0 is torch's
 * interleaved order (the chain straight from `src`, each Partial reduced on its
 * way); otherwise staged(), its shard changes chosen under `build` (NULL: bytes
 * first). */
static int offer(search *sr, mt__steps *tmp, const mt_layout *src, const mt_layout *dst,
                 int which, int64_t itemsize, const mt_time_model *build, mt_error *err) {
  memset(tmp, 0, sizeof *tmp);
  int found = 1, rc;
  if (which < 0)
    rc = mt__chain_phase(tmp, *src, dst, itemsize, &found, err);
  else
    rc = staged(tmp, src, dst, which, itemsize, build, &sr->direct, err);
  if (rc != MT_OK || !found || tmp->bytes > sr->limit) return rc;
  if (!sr->have || beats(tmp, sr->best, sr->limit, sr->model)) {
    *sr->best = *tmp;
    sr->have = 1;
  }
  return MT_OK;
}

/* The fastest candidate from normalised `src` to `dst` into `list`, among those
 * that move no more bytes than torch's order. Each order is planned with the
 * shard changes chosen for time and, when that moves more than torch, chosen
 * bytes first (which never does); without reductions the orders are one. */
int mt__best_candidate(mt__steps *list, const mt_layout *src, const mt_layout *dst,
                       int64_t itemsize, const mt_time_model *model,
                       mt_error *err) {
  int64_t limit = INT64_MAX;
  int rc = mt__torch_order_bytes(src, dst, itemsize, &limit, err);
  if (rc != MT_OK) return rc;
  mt__steps *tmp = malloc(sizeof *tmp);
  if (tmp == NULL) return mt__fail(err, MT_ENOMEM, "Out of memory planning a redistribution");
  search sr;
  memset(&sr, 0, sizeof sr);
  sr.best = list, sr.limit = limit, sr.model = model;
  int last = reduces(src, dst) ? NCANDIDATES - 1 : REDUCE_FIRST;
  for (int which = REDUCE_FIRST; rc == MT_OK && which <= last; ++which) {
    rc = offer(&sr, tmp, src, dst, which, itemsize, model, err);
    if (rc == MT_OK && tmp->bytes > limit)
      rc = offer(&sr, tmp, src, dst, which, itemsize, NULL, err);
  }
  if (rc == MT_OK && reduces(src, dst)) rc = offer(&sr, tmp, src, dst, -1, itemsize, model, err);
  free(tmp);
  if (rc == MT_OK && !sr.have)
    rc = mt__fail(err, MT_ESTATE,
                  "No redistribution plan moves at most the bytes of torch's order");
  return rc;
}
