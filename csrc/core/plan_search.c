/* Which steps a plan takes: the candidates, and the one that wins.
 *
 * Shard/Replicate changes are priced two ways, as a chain of one-mesh-dim
 * collectives and as one direct exchange (plan_phases.c). Reductions are placed
 * four ways: before the shard changes (the order plan.h documents), after the
 * cuts that shrink what they carry, after all shard changes, or interleaved in
 * torch's order; the cheapest plan wins. On a mesh over several nodes, torch's
 * own steps and the node-first reductions join them; elsewhere torch's own steps
 * are the plan when no other candidate is within their bytes. None may move more
 * bytes than torch's order priced by the same model (torch_order.c), in all or
 * between nodes. The tests check, over every (2,2)-mesh pair and random 1- to 3-d meshes,
 * that no plan moves more bytes than torch's chain priced by the same model, and
 * over meshes of up to 16,384 ranks on nodes of several sizes, no more between
 * nodes. */
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
  if (rc == MT_OK) rc = mt__reduce_phase(list, &mid, dst, itemsize, model, err);
  if (rc == MT_OK) rc = mt__reshard_phase(list, &mid, dst, itemsize, model, memo, err);
  return rc;
}

/* Whether the mesh dim `m` of `l` is one whose groups stay inside a node, under
 * `model`, and communicate (more than one member). */
static int inside_node(const mt_layout *l, int m, const mt_time_model *model) {
  return l->mesh_shape[m] > 1 &&
         mt_time_link(model, mesh_numel(l), l->mesh_shape[m], dim_stride(l, m)) ==
             MT_LINK_SHM;
}

/* Whether `src` has a Partial that `dst` does not keep on a mesh dim whose groups
 * span nodes under `model`. */
static int reduces_across(const mt_layout *src, const mt_layout *dst,
                          const mt_time_model *model) {
  for (int m = 0; m < src->mesh_ndim; ++m) {
    if (src->placements[m].kind == MT_PLACEMENT_PARTIAL &&
        dst->placements[m].kind != MT_PLACEMENT_PARTIAL && src->mesh_shape[m] > 1 &&
        !inside_node(src, m, model))
      return 1;
  }
  return 0;
}

/* The node-first candidate: before the Partials that span nodes are reduced,
 * every mesh dim inside a node that holds the whole tensor (Replicate, or a
 * Partial that goes) cuts tensor dim `d` (a chunk, or a reduce-scatter), so the
 * reductions across nodes carry a part of the data each, from every rank of a
 * node at once; the shard changes then gather the parts within the nodes again.
 * `*found` is 0 where no dim could cut `d`. */
static int node_first(mt__steps *list, const mt_layout *src, const mt_layout *dst,
                      int d, int64_t itemsize, const mt_time_model *model,
                      mt__direct_memo *memo, int *found, mt_error *err) {
  mt_layout cur = *src;
  int rc = MT_OK;
  *found = 0;
  for (int m = 0; rc == MT_OK && m < cur.mesh_ndim; ++m) {
    mt_placement a = cur.placements[m], to = shard(d);
    if (a.kind == MT_PLACEMENT_SHARD || !inside_node(&cur, m, model) ||
        dst->placements[m].kind == MT_PLACEMENT_PARTIAL ||
        !mt__step_kind_valid(&cur, m, &a, &to))
      continue;
    rc = mt__step_to(list, &cur, m, to, itemsize, err);
    *found = 1;
  }
  if (rc != MT_OK || !*found) return rc;
  rc = mt__reduce_phase(list, &cur, dst, itemsize, model, err);
  if (rc == MT_OK) rc = mt__reshard_phase(list, &cur, dst, itemsize, model, memo, err);
  return rc;
}

/* Whether candidate `b` beats `a`: a candidate moving more bytes than `limit`
 * (torch's order), in all or between nodes, never does; else the faster one,
 * then fewer bytes, then fewer messages, then fewer communicating steps; `a` wins
 * ties. */
static int beats(mt__steps *b, mt__steps *a, int64_t limit, int64_t net_limit,
                 const mt_time_model *model) {
  mt__set_times(a, model);
  mt__set_times(b, model);
  if (b->bytes > limit || b->net > net_limit) return 0;
  if (a->bytes > limit || a->net > net_limit) return 1;
  int order = mt__time_order(b, a);
  if (order != 0) return order < 0;
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
  int64_t limit;     /* torch's bytes */
  int64_t net_limit; /* torch's bytes between nodes */
  int overflowed;    /* a candidate's counts did not fit in int64 */
  const mt_time_model *model;
  mt__direct_memo direct;
} search;

/* Candidates besides staged(): torch's interleaved order (the chain straight
 * from `src`, each Partial reduced on its way), torch's own steps (which move
 * what the limits allow, where they are valid collectives) and node_first() on
 * each tensor dim (NODE_FIRST + d). */
enum { TORCH_ORDER = -1, TORCH_STEPS = -2, NODE_FIRST = -3 - MT_MAX_NDIM };

/* Plans one candidate into `tmp` and keeps it in `sr` unless it is invalid,
 * moves more than a limit or does not beat the best. `which` is a staged()
 * order, its shard changes chosen under `build` (NULL: bytes first), or one of
 * the candidates above. */
static int offer(search *sr, mt__steps *tmp, const mt_layout *src, const mt_layout *dst,
                 int which, int64_t itemsize, const mt_time_model *build, mt_error *err) {
  memset(tmp, 0, sizeof *tmp);
  int found = 1, rc;
  if (which == TORCH_ORDER || which == TORCH_STEPS)
    rc = mt__chain_phase(tmp, *src, dst, itemsize,
                         which == TORCH_ORDER ? MT__INNER_FIRST : MT__TORCH_STEPS, &found,
                         err);
  else if (which < TORCH_STEPS)
    rc = node_first(tmp, src, dst, which - NODE_FIRST, itemsize, build, &sr->direct,
                    &found, err);
  else
    rc = staged(tmp, src, dst, which, itemsize, build, &sr->direct, err);
  if (rc == MT_EOVERFLOW) {
    /* A count of this candidate passes int64 (its bytes would pass torch's,
     * which fit): it drops out, and only a search left with none says so. */
    sr->overflowed = 1;
    return MT_OK;
  }
  if (rc != MT_OK || !found || tmp->bytes > sr->limit) return rc;
  mt__set_times(tmp, sr->model);
  if (tmp->net > sr->net_limit) return MT_OK;
  if (!sr->have || beats(tmp, sr->best, sr->limit, sr->net_limit, sr->model)) {
    *sr->best = *tmp;
    sr->have = 1;
  }
  return MT_OK;
}

/* Plans one staged() order for time and, when that moves more than torch in all
 * or between nodes, bytes first (which never moves more in all). */
static int offer_staged(search *sr, mt__steps *tmp, const mt_layout *src,
                        const mt_layout *dst, int which, int64_t itemsize,
                        mt_error *err) {
  int rc = offer(sr, tmp, src, dst, which, itemsize, sr->model, err);
  if (rc == MT_OK && (tmp->bytes > sr->limit || tmp->net > sr->net_limit))
    rc = offer(sr, tmp, src, dst, which, itemsize, NULL, err);
  return rc;
}

/* The fastest candidate from normalised `src` to `dst` into `list`, among those
 * that move no more bytes than torch's order, in all and between nodes. Each
 * order is planned with the shard changes chosen for time and, when that moves
 * more than torch, chosen bytes first; without reductions the orders are one.
 * Where Partials that span nodes are reduced, the node-first candidates join. */
static int search_all(search *sr, mt__steps *tmp, const mt_layout *src,
                      const mt_layout *dst, int64_t itemsize, mt_error *err);

int mt__best_candidate(mt__steps *list, const mt_layout *src, const mt_layout *dst,
                       int64_t itemsize, const mt_time_model *model,
                       mt_error *err) {
  search sr;
  memset(&sr, 0, sizeof sr);
  int rc = mt__torch_order_bytes(src, dst, itemsize, model, &sr.limit, &sr.net_limit, err);
  if (rc == MT_EOVERFLOW) {
    /* Torch's steps together move more bytes than int64 counts, so any plan whose
     * counts fit moves fewer: the search goes on without a limit. */
    sr.limit = sr.net_limit = INT64_MAX;
    rc = MT_OK;
  }
  if (rc != MT_OK) return rc;
  mt__steps *tmp = malloc(sizeof *tmp);
  if (tmp == NULL) return mt__fail(err, MT_ENOMEM, "Out of memory planning a redistribution");
  sr.best = list, sr.model = model, sr.direct.nodes = model;
  rc = search_all(&sr, tmp, src, dst, itemsize, err);
  if (rc == MT_OK && !sr.have) {
    /* No candidate moves as little between nodes as torch's steps, which are no
     * valid collectives here (torch pads and cuts them its own way): the fastest
     * within torch's bytes in all. */
    sr.net_limit = INT64_MAX;
    rc = search_all(&sr, tmp, src, dst, itemsize, err);
  }
  if (rc == MT_OK && !sr.have) {
    /* Torch's cuts may come before its reductions where no staged order puts them
     * (`[S(3), P, R] -> [S(0), S(1), S(2)]` cuts, reduce-scatters half the data,
     * then swaps dims): its own steps are then the plan, where they are valid. */
    rc = offer(&sr, tmp, src, dst, TORCH_STEPS, itemsize, model, err);
  }
  free(tmp);
  if (rc == MT_OK && !sr.have && sr.overflowed) rc = overflow(err);
  if (rc == MT_OK && !sr.have)
    rc = mt__fail(err, MT_ESTATE,
                  "No redistribution plan moves at most the bytes of torch's order");
  return rc;
}

/* Offers every candidate to `sr`. */
static int search_all(search *sr, mt__steps *tmp, const mt_layout *src,
                      const mt_layout *dst, int64_t itemsize, mt_error *err) {
  const mt_time_model *model = sr->model;
  int rc = MT_OK, last = reduces(src, dst) ? NCANDIDATES - 1 : REDUCE_FIRST;
  for (int which = REDUCE_FIRST; rc == MT_OK && which <= last; ++which)
    rc = offer_staged(sr, tmp, src, dst, which, itemsize, err);
  if (rc == MT_OK && reduces(src, dst))
    rc = offer(sr, tmp, src, dst, TORCH_ORDER, itemsize, model, err);
  if (!spans_nodes(model, src)) return rc;
  if (rc == MT_OK) rc = offer(sr, tmp, src, dst, TORCH_STEPS, itemsize, model, err);
  if (reduces_across(src, dst, model)) {
    for (int d = 0; rc == MT_OK && d < src->ndim; ++d) {
      if (src->shape[d] > 1) rc = offer(sr, tmp, src, dst, NODE_FIRST + d, itemsize, model, err);
    }
  }
  return rc;
}
