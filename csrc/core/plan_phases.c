/* The phases a plan is built from: reducing the Partials that go away, and
 * changing Shard/Replicate placements either as torch's chain of one-mesh-dim
 * collectives or as one direct exchange, whichever is cheaper. Each step is
 * priced as it is appended (step_cost.c, step_local.c). */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"
#include "plan-private.h"

/* Appends the step `kind` on mesh dim `m` from `a` to `b`, priced; an
 * ALLREDUCE_NODES step reduces among runs of `node_group` members. */
static int push_step(mt__steps *list, int kind, int m, const mt_layout *a,
                     const mt_layout *b, int64_t node_group, int64_t itemsize,
                     mt_error *err) {
  assert(list->n < MT__MAX_STEPS);
  mt_step *st = &list->s[list->n];
  memset(st, 0, sizeof *st);
  st->kind = kind;
  st->mesh_dim = m;
  st->src = *a;
  st->dst = *b;
  st->itemsize = itemsize;
  st->node_layout = -1; /* counted by mt__set_times, under the planning model */
  if (kind == MT_STEP_ALLREDUCE_NODES) st->node_group = node_group;
  int rc = mt__price_step(st, itemsize, err);
  if (rc == MT_OK) rc = mt__price_local(st, itemsize, err);
  if (rc != MT_OK) return rc;
  if (!add_ok(list->bytes, st->bytes, &list->bytes) ||
      !add_ok(list->messages, st->messages, &list->messages))
    return overflow(err);
  ++list->n;
  return MT_OK;
}

int mt__step_to(mt__steps *list, mt_layout *cur, int m, mt_placement to,
                int64_t itemsize, mt_error *err) {
  mt_layout next = *cur;
  next.placements[m] = to;
  int kind = mt__step_kind(&cur->placements[m], &to);
  assert(kind >= 0 && mt__step_kind_valid(cur, m, &cur->placements[m], &to));
  int rc = push_step(list, kind, m, cur, &next, 0, itemsize, err);
  if (rc == MT_OK) *cur = next;
  return rc;
}

/* Appends the all-reduce of mesh dim `m` of `cur` (a Partial) to Replicate, and
 * advances `cur`: as one collective, or, where `model` puts several members of
 * each group on a node, as an ALLREDUCE_NODES step when it predicts that faster
 * (the all-reduce between nodes carries a share of the vector, from every rank of
 * a node at once, instead of the whole vector through the links one run of
 * members shares). */
static int all_reduce(mt__steps *list, mt_layout *cur, int m, int64_t itemsize,
                      const mt_time_model *model, mt_error *err) {
  int64_t local = model != NULL ? mt__members_per_node(cur, m, model) : 0;
  if (local <= 1 || local >= cur->mesh_shape[m])
    return mt__step_to(list, cur, m, replicate(), itemsize, err);
  mt_layout next = *cur;
  next.placements[m] = replicate();
  mt__steps two = {0};
  int rc = push_step(&two, MT_STEP_ALLREDUCE, m, cur, &next, 0, itemsize, err);
  if (rc == MT_OK)
    rc = push_step(&two, MT_STEP_ALLREDUCE_NODES, m, cur, &next, local, itemsize, err);
  if (rc != MT_OK) return rc;
  mt__price_nodes(&two.s[0], model);
  mt__price_nodes(&two.s[1], model);
  int nodes = mt__step_time(&two.s[1], model) < mt__step_time(&two.s[0], model) &&
              two.s[1].net_bytes <= two.s[0].net_bytes;
  assert(list->n < MT__MAX_STEPS);
  list->s[list->n++] = two.s[nodes];
  if (!add_ok(list->bytes, two.s[nodes].bytes, &list->bytes) ||
      !add_ok(list->messages, two.s[nodes].messages, &list->messages))
    return overflow(err);
  *cur = next;
  return MT_OK;
}

/* Reduces every Partial that `dst` does not keep. First the ones that
 * reduce-scatter straight to their target Shard, first mesh dim first, so nested
 * shards build from the outside in and each step is valid; then the rest by
 * all-reduce to Replicate (a later phase cuts them), on data the reduce-scatters
 * have already shrunk: `[P, P] -> [S(0), R]` reduce-scatters the whole buffer and
 * all-reduces half, instead of all-reducing all of it. */
int mt__reduce_phase(mt__steps *list, mt_layout *cur, const mt_layout *dst,
                     int64_t itemsize, const mt_time_model *model, mt_error *err) {
  for (int pass = 0; pass < 2; ++pass) {
    for (int m = 0; m < cur->mesh_ndim; ++m) {
      mt_placement a = cur->placements[m], b = dst->placements[m];
      if (a.kind != MT_PLACEMENT_PARTIAL || b.kind == MT_PLACEMENT_PARTIAL) continue;
      int scatter = b.kind == MT_PLACEMENT_SHARD && mt__step_kind_valid(cur, m, &a, &b);
      if (pass == 0 && !scatter) continue;
      int rc = scatter ? mt__step_to(list, cur, m, b, itemsize, err)
                       : all_reduce(list, cur, m, itemsize, model, err);
      if (rc != MT_OK) return rc;
    }
  }
  return MT_OK;
}

/* Sets mesh dim `m` of `cur`, a Shard or Partial that changes, to its target
 * Shard in one valid collective (all-to-all, reduce-scatter) or else to
 * Replicate (all-gather, all-reduce); `*moved` is 0, nothing appended, when
 * neither is valid. */
static int gather_or_move(mt__steps *list, mt_layout *cur, int m, const mt_layout *dst,
                          int64_t itemsize, int *moved, mt_error *err) {
  mt_placement a = cur->placements[m], b = dst->placements[m], to = b;
  if (b.kind != MT_PLACEMENT_SHARD || !mt__step_kind_valid(cur, m, &a, &b))
    to = replicate();
  *moved = mt__step_kind_valid(cur, m, &a, &to);
  return *moved ? mt__step_to(list, cur, m, to, itemsize, err) : MT_OK;
}

/* Whether mesh dim `m` of `cur` still has a Shard or Partial to change. */
static int to_gather(const mt_layout *cur, const mt_layout *dst, int m) {
  const mt_placement *a = &cur->placements[m], *b = &dst->placements[m];
  return a->kind != MT_PLACEMENT_REPLICATE && !placement_eq(a, b);
}

/* The per-mesh-dim chain from `cur` to `dst`. In torch's order (MT__INNER_FIRST)
 * the last mesh dim first, each Shard or Partial that changes going to its target
 * Shard or to Replicate in one valid collective; MT__OUTER_FIRST takes the first
 * mesh dim first and passes again over the dims whose step was not valid yet,
 * which gathers across the nodes (the outer dims of a (nodes, local) mesh) while
 * the data is still cut by the dims inside them. Then Replicate dims are cut,
 * first mesh dim first. `*found` is 0 when some step would not be valid. */
/* torch's own steps from `cur` to `dst` (mt__torch_order_bytes): inner mesh dims
 * first, each to its target, or to Replicate where the mesh dims before it shard
 * that tensor dim differently; then outer to inner for what is left. `*found` is
 * 0 when some step would not be valid. */
static int torch_steps(mt__steps *list, mt_layout cur, const mt_layout *dst,
                       int64_t itemsize, int *found, mt_error *err) {
  int n = cur.mesh_ndim, rc = MT_OK;
  for (int pass = 0; rc == MT_OK && pass < 2; ++pass) {
    for (int i = 0; rc == MT_OK && i < n; ++i) {
      int m = pass == 0 ? n - 1 - i : i;
      mt_placement a = cur.placements[m], to = dst->placements[m];
      if (pass == 0 && to.kind == MT_PLACEMENT_SHARD &&
          !mt__same_outer_sharding(&cur, dst, m, to.dim))
        to = replicate();
      if (placement_eq(&a, &to)) continue;
      if (!mt__step_kind_valid(&cur, m, &a, &to)) return MT_OK;
      rc = mt__step_to(list, &cur, m, to, itemsize, err);
    }
  }
  *found = rc == MT_OK;
  return rc;
}

int mt__chain_phase(mt__steps *list, mt_layout cur, const mt_layout *dst,
                    int64_t itemsize, int order, int *found, mt_error *err) {
  *found = 0;
  if (order == MT__TORCH_STEPS) return torch_steps(list, cur, dst, itemsize, found, err);
  int n = cur.mesh_ndim, moved = 1, rc = MT_OK;
  for (int pass = 0; rc == MT_OK && moved && pass < n; ++pass) {
    moved = 0;
    for (int i = 0; rc == MT_OK && i < n; ++i) {
      int m = order == MT__OUTER_FIRST ? i : n - 1 - i, one = 0;
      if (!to_gather(&cur, dst, m)) continue;
      rc = gather_or_move(list, &cur, m, dst, itemsize, &one, err);
      if (!one && order != MT__OUTER_FIRST) return MT_OK;
      moved |= one;
    }
    if (order != MT__OUTER_FIRST) break;
  }
  for (int m = 0; rc == MT_OK && m < n; ++m) {
    mt_placement a = cur.placements[m], b = dst->placements[m];
    if (placement_eq(&a, &b)) continue;
    if (!mt__step_kind_valid(&cur, m, &a, &b)) return MT_OK;
    rc = mt__step_to(list, &cur, m, b, itemsize, err);
  }
  *found = rc == MT_OK;
  return rc;
}

int mt__communicating_steps(const mt__steps *list) {
  int n = 0;
  for (int i = 0; i < list->n; ++i) n += list->s[i].kind != MT_STEP_CHUNK;
  return n;
}

/* On equal bytes a chain with at most one collective wins, since it is the one
 * collective torch users expect and MPI optimises (the direct exchange can only
 * save messages to ranks that hold nothing); so does a chain that sends no more
 * messages, as torch's per-dim collectives would: the propagation engine prices
 * an operation's moves by bytes and messages, and a plan it did not price must
 * not replace the one it did. Otherwise the faster one wins under `model`; on a
 * tie, or with no model (bytes first), fewer bytes win, then fewer messages, then
 * the chain. */
static int chain_wins(mt__steps *chain, mt__steps *direct, const mt_time_model *model) {
  if (chain->bytes == direct->bytes &&
      (mt__communicating_steps(chain) <= 1 || chain->messages <= direct->messages))
    return 1;
  if (model != NULL) {
    mt__set_times(chain, model);
    mt__set_times(direct, model);
    int order = mt__time_order(chain, direct);
    if (order != 0) return order < 0;
  }
  if (chain->bytes != direct->bytes) return chain->bytes < direct->bytes;
  return chain->messages <= direct->messages;
}

/* Appends the steps of `from` to `list`. */
static int append_list(mt__steps *list, const mt__steps *from, mt_error *err) {
  assert(list->n + from->n <= MT__MAX_STEPS);
  for (int i = 0; i < from->n; ++i) list->s[list->n++] = from->s[i];
  if (!add_ok(list->bytes, from->bytes, &list->bytes) ||
      !add_ok(list->messages, from->messages, &list->messages))
    return overflow(err);
  return MT_OK;
}

static int same_layout(const mt_layout *a, const mt_layout *b) {
  if (a->ndim != b->ndim || a->mesh_ndim != b->mesh_ndim) return 0;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d]) return 0;
  }
  for (int m = 0; m < a->mesh_ndim; ++m) {
    if (a->mesh_shape[m] != b->mesh_shape[m] ||
        !placement_eq(&a->placements[m], &b->placements[m]))
      return 0;
  }
  return 1;
}

/* Appends the direct exchange from `cur` to `dst`, priced once per planning. */
static int push_direct(mt__steps *list, const mt_layout *cur, const mt_layout *dst,
                       int64_t itemsize, mt__direct_memo *memo, mt_error *err) {
  if (!memo->have || !same_layout(&memo->step.src, cur) ||
      !same_layout(&memo->step.dst, dst)) {
    memo->have = 0;
    mt__steps one = {0};
    int rc = push_step(&one, MT_STEP_DIRECT, -1, cur, dst, 0, itemsize, err);
    if (rc != MT_OK) return rc;
    /* Its walk across nodes is the dearest part: once, under the search's model. */
    if (memo->nodes != NULL) mt__price_nodes(&one.s[0], memo->nodes);
    memo->step = one.s[0];
    memo->have = 1;
  }
  assert(list->n < MT__MAX_STEPS);
  list->s[list->n] = memo->step;
  if (!add_ok(list->bytes, memo->step.bytes, &list->bytes) ||
      !add_ok(list->messages, memo->step.messages, &list->messages))
    return overflow(err);
  ++list->n;
  return MT_OK;
}

/* The chain from `cur` to `dst` into `chain`: the inner dims first, or where the
 * mesh spans nodes and the outer dims first is predicted faster while moving no
 * more bytes, in all and between nodes, that one. `*found` as mt__chain_phase. */
static int best_chain(mt__steps *chain, mt__steps *other, const mt_layout *cur,
                      const mt_layout *dst, int64_t itemsize, const mt_time_model *model,
                      int *found, mt_error *err) {
  int rc = mt__chain_phase(chain, *cur, dst, itemsize, MT__INNER_FIRST, found, err);
  if (rc != MT_OK || !spans_nodes(model, cur)) return rc;
  int outer = 0;
  rc = mt__chain_phase(other, *cur, dst, itemsize, MT__OUTER_FIRST, &outer, err);
  if (rc != MT_OK || !outer) return rc;
  mt__set_times(other, model);
  if (*found) {
    mt__set_times(chain, model);
    if (other->bytes > chain->bytes || other->net > chain->net ||
        mt__time_order(other, chain) >= 0)
      return MT_OK;
  }
  *chain = *other;
  *found = 1;
  return MT_OK;
}

/* The Shard/Replicate changes from `cur` to `dst`: the cheaper of the chain and
 * one direct exchange. */
int mt__reshard_phase(mt__steps *list, const mt_layout *cur, const mt_layout *dst,
                      int64_t itemsize, const mt_time_model *model,
                      mt__direct_memo *memo, mt_error *err) {
  if (differ_only_on(cur, dst, -1)) return MT_OK;
  mt__steps *chain = calloc(1, sizeof *chain), *direct = calloc(1, sizeof *direct);
  if (chain == NULL || direct == NULL) {
    free(chain);
    free(direct);
    return mt__fail(err, MT_ENOMEM, "Out of memory planning a redistribution");
  }
  int found = 0, rc = best_chain(chain, direct, cur, dst, itemsize, model, &found, err);
  if (rc == MT_OK) {
    memset(direct, 0, sizeof *direct);
    rc = push_direct(direct, cur, dst, itemsize, memo, err);
  }
  if (rc == MT_OK)
    rc = append_list(list, found && chain_wins(chain, direct, model) ? chain : direct,
                     err);
  free(chain);
  free(direct);
  return rc;
}
