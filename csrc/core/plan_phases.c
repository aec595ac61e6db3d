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

/* Appends the step `kind` on mesh dim `m` from `a` to `b`, priced. */
static int push_step(mt__steps *list, int kind, int m, const mt_layout *a,
                     const mt_layout *b, int64_t itemsize, mt_error *err) {
  assert(list->n < MT__MAX_STEPS);
  mt_step *st = &list->s[list->n];
  memset(st, 0, sizeof *st);
  st->kind = kind;
  st->mesh_dim = m;
  st->src = *a;
  st->dst = *b;
  int rc = mt__price_step(st, itemsize, err);
  if (rc == MT_OK) rc = mt__price_local(st, itemsize, err);
  if (rc != MT_OK) return rc;
  if (!add_ok(list->bytes, st->bytes, &list->bytes) ||
      !add_ok(list->messages, st->messages, &list->messages))
    return overflow(err);
  ++list->n;
  return MT_OK;
}

/* Appends the one-mesh-dim step that sets placement `to` on mesh dim `m` of
 * `cur`, and advances `cur`. */
static int step_to(mt__steps *list, mt_layout *cur, int m, mt_placement to,
                   int64_t itemsize, mt_error *err) {
  mt_layout next = *cur;
  next.placements[m] = to;
  int kind = mt__step_kind(&cur->placements[m], &to);
  assert(kind >= 0 && mt__step_kind_valid(cur, m, &cur->placements[m], &to));
  int rc = push_step(list, kind, m, cur, &next, itemsize, err);
  if (rc == MT_OK) *cur = next;
  return rc;
}

/* Reduces every Partial that `dst` does not keep. First the ones that
 * reduce-scatter straight to their target Shard, first mesh dim first, so nested
 * shards build from the outside in and each step is valid; then the rest by
 * all-reduce to Replicate (a later phase cuts them), on data the reduce-scatters
 * have already shrunk: `[P, P] -> [S(0), R]` reduce-scatters the whole buffer and
 * all-reduces half, instead of all-reducing all of it. */
int mt__reduce_phase(mt__steps *list, mt_layout *cur, const mt_layout *dst,
                     int64_t itemsize, mt_error *err) {
  for (int pass = 0; pass < 2; ++pass) {
    for (int m = 0; m < cur->mesh_ndim; ++m) {
      mt_placement a = cur->placements[m], b = dst->placements[m];
      if (a.kind != MT_PLACEMENT_PARTIAL || b.kind == MT_PLACEMENT_PARTIAL) continue;
      int scatter = b.kind == MT_PLACEMENT_SHARD && mt__step_kind_valid(cur, m, &a, &b);
      if (pass == 0 && !scatter) continue;
      int rc = step_to(list, cur, m, scatter ? b : replicate(), itemsize, err);
      if (rc != MT_OK) return rc;
    }
  }
  return MT_OK;
}

/* The per-mesh-dim chain from `cur` to `dst`, torch's order: last mesh dim
 * first, each Shard or Partial that changes goes to its target Shard in one valid
 * collective (all-to-all, reduce-scatter) or else to Replicate (all-gather,
 * all-reduce); then Replicate dims are cut, first mesh dim first. `*found` is 0
 * when some step would not be valid. */
int mt__chain_phase(mt__steps *list, mt_layout cur, const mt_layout *dst,
                    int64_t itemsize, int *found, mt_error *err) {
  *found = 0;
  for (int m = cur.mesh_ndim - 1; m >= 0; --m) {
    mt_placement a = cur.placements[m], b = dst->placements[m];
    if (a.kind == MT_PLACEMENT_REPLICATE || placement_eq(&a, &b)) continue;
    mt_placement to = b;
    if (b.kind != MT_PLACEMENT_SHARD || !mt__step_kind_valid(&cur, m, &a, &b))
      to = replicate();
    if (!mt__step_kind_valid(&cur, m, &a, &to)) return MT_OK;
    int rc = step_to(list, &cur, m, to, itemsize, err);
    if (rc != MT_OK) return rc;
  }
  for (int m = 0; m < cur.mesh_ndim; ++m) {
    mt_placement a = cur.placements[m], b = dst->placements[m];
    if (placement_eq(&a, &b)) continue;
    if (!mt__step_kind_valid(&cur, m, &a, &b)) return MT_OK;
    int rc = step_to(list, &cur, m, b, itemsize, err);
    if (rc != MT_OK) return rc;
  }
  *found = 1;
  return MT_OK;
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
    int rc = push_step(&one, MT_STEP_DIRECT, -1, cur, dst, itemsize, err);
    if (rc != MT_OK) return rc;
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
  int found = 0, rc = mt__chain_phase(chain, *cur, dst, itemsize, &found, err);
  if (rc == MT_OK) rc = push_direct(direct, cur, dst, itemsize, memo, err);
  if (rc == MT_OK)
    rc = append_list(list, found && chain_wins(chain, direct, model) ? chain : direct,
                     err);
  free(chain);
  free(direct);
  return rc;
}
