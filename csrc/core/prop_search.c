/* Finding the winning combination while planning as little as possible.
 *
 * Needing no communication beats any cost, and whether a layout communicates is
 * answered without planning, so a first pass looks only for combinations that
 * communicate nowhere; plans are made only when every combination communicates.
 * Then each combination gets lower bounds (prop_price.c: elements ranks lack,
 * ranks that lack any, the most one rank lacks, collectives for the Partials
 * reduced, and from those a time), and combinations are planned in order of
 * their bounds until no bound left can beat the best found: first for the
 * reference pricing (bytes and messages), whose bytes cap the second search, for
 * time. A (2,2)-mesh matmul that must communicate plans a handful of layouts
 * instead of all of them; the two searches share the memo, so nothing is planned
 * twice. Above MT_PROP_MAX_COMBOS combinations the search is greedy. Either way
 * no decision moves more bytes than torch's for the same op and placements
 * (prop_torch.c), forward and backward priced alike. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/prop.h"
#include "mpitensor/core/status.h"
#include "prop-private.h"

/* A combination (its row-major number over mesh dims) and a lower bound of its
 * cost. */
typedef struct bounded {
  int64_t lb;
  int64_t lb_bytes;
  double lb_time;
  int64_t idx;
} bounded;

/* Advances a combination, last mesh dim fastest; 0 once it wraps. */
static int next_choice(const mt__engine *e, int *choice) {
  for (int m = e->mesh_ndim - 1; m >= 0; --m) {
    if (++choice[m] < e->dims[m].n) return 1;
    choice[m] = 0;
  }
  return 0;
}

/* One pass over every combination for those that communicate nowhere; none is
 * planned unless its boxes are empty. */
static int search_free(mt__engine *e, int *best, mt__score *best_s, int *found,
                       mt_error *err) {
  int choice[MT_MAX_MESH_NDIM] = {0};
  *found = 0;
  do {
    mt__score s;
    int valid, rc = mt__prop_score(e, choice, 0, &s, &valid, err);
    if (rc != MT_OK) return rc;
    if (!valid || s.comm) continue;
    if (!*found || mt__prop_better(&s, best_s)) {
      memcpy(best, choice, sizeof choice);
      *best_s = s, *found = 1;
    }
  } while (next_choice(e, choice));
  return MT_OK;
}

/* A lower bound of a combination's cost without planning (exact prices where the
 * memo has them); `*valid` is 0 when it is not allowed or a plan failed. */
static int combo_bound(mt__engine *e, const int *choice, bounded *b, int *valid,
                       mt_error *err) {
  int64_t bytes = 0, messages = 0;
  double time = 0.0;
  *valid = 0;
  if (!mt__prop_combo_valid(e, choice)) return MT_OK;
  for (int i = 0; i < e->ninputs; ++i) {
    mt__price p;
    if (mt__prop_moved_with_alias(e, i, choice)) continue;
    int rc = mt__prop_input_price(e, i, choice, 0, &p, err);
    if (rc != MT_OK || p.state == MT__PRICE_INVALID) return rc;
    int exact = p.state == MT__PRICE_DONE;
    bytes = sat_add(bytes, exact ? p.bytes : p.lb_bytes);
    messages = sat_add(messages, exact ? p.messages : p.lb_messages);
    time += exact ? p.time : p.lb_time;
  }
  b->lb = mt__prop_cost(bytes, messages);
  b->lb_bytes = bytes;
  b->lb_time = time;
  *valid = 1;
  return MT_OK;
}

/* Bounds every valid combination into `list` (numbered in enumeration order). */
static int collect_bounds(mt__engine *e, bounded *list, int64_t *n, mt_error *err) {
  int choice[MT_MAX_MESH_NDIM] = {0};
  int64_t idx = 0;
  *n = 0;
  do {
    int valid, rc = combo_bound(e, choice, &list[*n], &valid, err);
    if (rc != MT_OK) return rc;
    if (valid) list[*n].idx = idx, ++*n;
    ++idx;
  } while (next_choice(e, choice));
  return MT_OK;
}

static int cmp_bounded(const void *pa, const void *pb) {
  const bounded *a = pa, *b = pb;
  if (a->lb != b->lb) return a->lb < b->lb ? -1 : 1;
  return a->idx < b->idx ? -1 : a->idx > b->idx;
}

static int cmp_timed(const void *pa, const void *pb) {
  const bounded *a = pa, *b = pb;
  if (a->lb_time != b->lb_time) return a->lb_time < b->lb_time ? -1 : 1;
  return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* The combination numbered `idx` in enumeration order. */
static void decode(const mt__engine *e, int64_t idx, int *choice) {
  for (int m = e->mesh_ndim - 1; m >= 0; --m) {
    choice[m] = (int)(idx % e->dims[m].n);
    idx /= e->dims[m].n;
  }
}

/* Among the combinations of `list` moving at most the bytes of the one in
 * *best_s (numbered *best_idx), the fastest, planned in order of their time
 * bounds until the next bound is slower than the best beyond time_cmp's
 * tolerance; ties go to the earlier combination, as an exhaustive pass would. */
static int search_timed(mt__engine *e, bounded *list, int64_t n, int *best,
                        mt__score *best_s, int64_t *best_idx, mt_error *err) {
  int64_t cap = best_s->bytes;
  qsort(list, (size_t)n, sizeof *list, cmp_timed);
  for (int64_t k = 0; k < n; ++k) {
    if (list[k].lb_time > mt__prop_now_time(best_s) * (1.0 + 2e-6)) break;
    if (list[k].lb_bytes > cap) continue;
    int choice[MT_MAX_MESH_NDIM] = {0}, valid;
    mt__score s;
    decode(e, list[k].idx, choice);
    int rc = mt__prop_score(e, choice, 1, &s, &valid, err);
    if (rc != MT_OK) return rc;
    if (!valid || s.bytes > cap) continue;
    int tie = !mt__prop_faster(&s, best_s) && !mt__prop_faster(best_s, &s);
    if (mt__prop_faster(&s, best_s) || (tie && list[k].idx < *best_idx)) {
      memcpy(best, choice, sizeof choice);
      *best_s = s, *best_idx = list[k].idx;
    }
  }
  return MT_OK;
}

/* Torch's decision (mt__prop_torch_pick) scored as any combination, into
 * `torch` and *torch_s; *found is 0 when it is unknown or cannot be planned. */
static int torch_decision(mt__engine *e, int *torch, mt__score *torch_s, int *found,
                          mt_error *err) {
  *found = 0;
  if (!mt__prop_torch_pick(e, torch)) return MT_OK;
  return mt__prop_score(e, torch, 1, torch_s, found, err);
}

/* The reference pick among the combinations of `list` (sorted by lower bound)
 * that move at most `cap` bytes: planned in order of their bounds until the next
 * bound exceeds the best cost found. Equal costs still go to fewer bytes, fewer
 * messages and then the earlier combination, so the winner is the one an
 * exhaustive pass would pick. */
static int search_reference(mt__engine *e, const bounded *list, int64_t n, int64_t cap,
                            int *best, mt__score *best_s, int64_t *best_idx, int *found,
                            mt_error *err) {
  int rc = MT_OK;
  *found = 0, *best_idx = -1;
  for (int64_t k = 0; rc == MT_OK && k < n; ++k) {
    if (*found && list[k].lb > best_s->cost) break;
    if (list[k].lb_bytes > cap) continue;
    int choice[MT_MAX_MESH_NDIM] = {0}, valid;
    mt__score s;
    decode(e, list[k].idx, choice);
    rc = mt__prop_score(e, choice, 1, &s, &valid, err);
    if (rc != MT_OK || !valid || s.bytes > cap) continue;
    int tie = !mt__prop_better(&s, best_s) && !mt__prop_better(best_s, &s);
    if (!*found || mt__prop_better(&s, best_s) || (tie && list[k].idx < *best_idx)) {
      memcpy(best, choice, sizeof choice);
      *best_s = s, *found = 1, *best_idx = list[k].idx;
    }
  }
  return rc;
}

/* Torch's decision's bytes into *cap where they are fewer than `bytes`, else
 * INT64_MAX. Its lower bound is read first: only a decision that may move fewer
 * is planned. */
static int torch_cap(mt__engine *e, int64_t bytes, int64_t *cap, mt_error *err) {
  int torch[MT_MAX_MESH_NDIM] = {0}, valid;
  bounded b;
  mt__score s;
  *cap = INT64_MAX;
  if (!mt__prop_torch_pick(e, torch)) return MT_OK;
  int rc = combo_bound(e, torch, &b, &valid, err);
  if (rc != MT_OK || !valid || b.lb_bytes >= bytes) return rc;
  rc = mt__prop_score(e, torch, 1, &s, &valid, err);
  if (rc == MT_OK && valid && s.bytes < bytes) *cap = s.bytes;
  return rc;
}

/* When every combination communicates: the reference pick, and where it moves
 * more bytes than torch's decision, the reference pick among those moving no
 * more than torch's (which is one of them). That winner's bytes then cap the
 * fastest (search_timed). */
static int search_bounded(mt__engine *e, int64_t combos, int *best, mt__score *best_s,
                          int *found, mt_error *err) {
  assert(combos >= 1); /* every mesh dim has its all-Replicate candidate */
  bounded *list = malloc((size_t)combos * sizeof *list);
  if (list == NULL)
    return mt__fail(err, MT_ENOMEM, "Out of memory choosing placements");
  int64_t n = 0, best_idx = -1, cap = INT64_MAX;
  int rc = collect_bounds(e, list, &n, err);
  if (rc == MT_OK) {
    qsort(list, (size_t)n, sizeof *list, cmp_bounded);
    rc = search_reference(e, list, n, cap, best, best_s, &best_idx, found, err);
  }
  if (rc == MT_OK && *found) rc = torch_cap(e, best_s->bytes, &cap, err);
  if (rc == MT_OK && cap != INT64_MAX)
    rc = search_reference(e, list, n, cap, best, best_s, &best_idx, found, err);
  if (rc == MT_OK && *found) rc = search_timed(e, list, n, best, best_s, &best_idx, err);
  free(list);
  return rc;
}

/* Above MT_PROP_MAX_COMBOS: each mesh dim in turn takes its best candidate, the
 * earlier ones fixed and the later ones at their first (Replicate, or on a
 * mesh dim of size 1 the one ordered first). */
static int greedy(mt__engine *e, int *best, mt__score *best_s, int *found,
                  mt_error *err) {
  int choice[MT_MAX_MESH_NDIM] = {0};
  for (int m = 0; m < e->mesh_ndim; ++m) {
    int pick = 0, any = 0;
    for (int c = 0; c < e->dims[m].n; ++c) {
      mt__score s;
      int valid, rc;
      choice[m] = c;
      rc = mt__prop_score(e, choice, 1, &s, &valid, err);
      if (rc != MT_OK) return rc;
      if (valid && (!any || mt__prop_better(&s, best_s))) pick = c, *best_s = s, any = 1;
    }
    choice[m] = pick;
  }
  int rc = mt__prop_score(e, choice, 1, best_s, found, err);
  memcpy(best, choice, sizeof choice);
  return rc;
}

/* The greedy pick, or torch's decision where that one moves fewer bytes. */
static int search_greedy(mt__engine *e, int *best, mt__score *best_s, int *found,
                         mt_error *err) {
  int torch[MT_MAX_MESH_NDIM] = {0}, known;
  mt__score torch_s;
  int rc = greedy(e, best, best_s, found, err);
  if (rc == MT_OK) rc = torch_decision(e, torch, &torch_s, &known, err);
  if (rc == MT_OK && known && (!*found || best_s->bytes > torch_s.bytes)) {
    memcpy(best, torch, sizeof torch);
    *best_s = torch_s, *found = 1;
  }
  return rc;
}

/* Sizes the per-input memos for an exhaustive search (each at most the number of
 * combinations) and allocates them in one block. */
static int alloc_memo(mt__engine *e, mt_error *err) {
  assert(e->ninputs >= 1 && e->mesh_ndim >= 1); /* load_inputs checked them */
  int64_t total = 0;
  for (int i = 0; i < e->ninputs; ++i) {
    int64_t n = 1;
    for (int m = 0; m < e->mesh_ndim; ++m) {
      e->stride[i][m] = n;
      n *= e->dims[m].nvariants[i];
    }
    total += n;
  }
  /* calloc(0) may return NULL, which would read as out of memory. */
  e->memo_block = calloc((size_t)(total > 0 ? total : 1), sizeof *e->memo_block);
  if (e->memo_block == NULL)
    return mt__fail(err, MT_ENOMEM, "Out of memory choosing placements");
  for (int i = 0, off = 0; i < e->ninputs; ++i) {
    e->memo[i] = e->memo_block + off;
    int64_t n = 1;
    for (int m = 0; m < e->mesh_ndim; ++m) n *= e->dims[m].nvariants[i];
    off += (int)n;
  }
  return MT_OK;
}

/* Finds the winning combination: exhaustively when there are at most
 * MT_PROP_MAX_COMBOS (first among those that communicate nowhere, else among
 * all, planning only those whose lower bound can still win), greedily otherwise. */
int mt__prop_search(mt__engine *e, int *best, mt__score *best_s, mt_error *err) {
  int64_t combos = 1;
  for (int m = 0; m < e->mesh_ndim; ++m) combos = sat_mul(combos, e->dims[m].n);
  int rc, found = 0;
  if (combos > MT_PROP_MAX_COMBOS) {
    rc = search_greedy(e, best, best_s, &found, err);
  } else {
    rc = alloc_memo(e, err);
    if (rc == MT_OK) rc = search_free(e, best, best_s, &found, err);
    if (rc == MT_OK && !found)
      rc = search_bounded(e, combos, best, best_s, &found, err);
  }
  if (rc != MT_OK || found) return rc;
  if (e->plan_rc != MT_OK) return mt__fail(err, e->plan_rc, "%s", e->plan_err.msg);
  return mt__fail(err, MT_EINVAL, "No valid placement exists for this op");
}
