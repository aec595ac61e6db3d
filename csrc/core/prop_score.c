/* A combination's standing: whether its candidates may go together, what its
 * moves cost now and its Partials later, and the two orders the searches rank
 * combinations by (by cost, `better`, and by time, `faster`). */
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/prop.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"
#include "prop-private.h"

/* The extent [*off, *off + *n) of a dim of size `size` held at `idx`, nested
 * chunks over `k` mesh dims of sizes `g` (an empty extent has offset 0). */
static void nested_extent(int64_t size, const int64_t *g, const int64_t *idx, int k,
                          int64_t *off, int64_t *n) {
  int64_t o = 0, s = size;
  for (int j = 0; j < k; ++j) {
    int64_t sz, of;
    mt_chunk(s, g[j], idx[j], &sz, &of);
    o += sz > 0 ? of : 0;
    s = sz;
  }
  *off = s > 0 ? o : 0, *n = s;
}

/* Whether x/a == y/b, as x*b == y*a; a product too large for int64 counts as
 * different, which only keeps a shard from passing (a redistribution is safe). */
static int same_fraction(int64_t x, int64_t a, int64_t y, int64_t b) {
  int64_t p = sat_mul(x, b), q = sat_mul(y, a);
  return p == q && p != INT64_MAX;
}

/* Whether label l, cut by the mesh dims `choice` shards it on, may stay sharded on
 * its resized output dim: every rank's share of the label (size a) and of the
 * output dim (size b) is the same fraction of the group (prop.h). */
static int scales(const mt__engine *e, const int *choice, int l) {
  int d = e->out_pos[l], k = 0;
  if (d < 0 || !bit(e->map->out_resized, d)) return 1;
  int64_t g[MT_MAX_MESH_NDIM], idx[MT_MAX_MESH_NDIM] = {0};
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const mt__cand *c = &e->dims[m].c[choice[m]];
    if (c->kind == MT__CAND_LABEL && c->label == l) g[k++] = e->in->mesh_shape[m];
  }
  int64_t a = e->size[l], b = e->out_shape[d];
  for (;;) {
    int64_t ia, na, ib, nb;
    nested_extent(a, g, idx, k, &ia, &na);
    nested_extent(b, g, idx, k, &ib, &nb);
    if (!same_fraction(na, a, nb, b) || !same_fraction(ia, a, ib, b)) return 0;
    int j = k - 1;
    while (j >= 0 && ++idx[j] == g[j]) idx[j--] = 0;
    if (j < 0) return 1;
  }
}

/* Every max/min/avg REDUCE label has an element per shard, even_only labels divide
 * evenly and labels kept on a resized dim scale, counting the shards of all mesh
 * dims that cut them. */
int mt__prop_combo_valid(const mt__engine *e, const int *choice) {
  int labels[MT_MAX_MESH_NDIM], n = 0;
  int64_t shards[MT_MAX_MESH_NDIM];
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const mt__cand *c = &e->dims[m].c[choice[m]];
    if (c->kind != MT__CAND_LABEL) continue;
    int k = 0;
    while (k < n && labels[k] != c->label) ++k;
    if (k == n) labels[n] = c->label, shards[n++] = 1;
    shards[k] = sat_mul(shards[k], e->in->mesh_shape[m]);
  }
  for (int k = 0; k < n; ++k) {
    if (!mt__prop_fits(e, labels[k], shards[k]) || !scales(e, choice, labels[k]))
      return 0;
  }
  return 1;
}

/* An estimate of reducing later the Partials this combination creates: a
 * reduce-scatter of the output per such mesh dim, first mesh dim first, each
 * shrinking what the next carries. Summed over ranks like plan costs; every rank
 * holds the output whole except along the mesh dims that shard it. */
static void deferred(const mt__engine *e, const int *choice, int64_t *bytes,
                     int64_t *messages) {
  int64_t held = e->out_numel;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    if (e->dims[m].c[choice[m]].out.kind != MT_PLACEMENT_SHARD)
      held = sat_mul(held, e->in->mesh_shape[m]);
  }
  *bytes = *messages = 0;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    int64_t g = e->in->mesh_shape[m];
    if (!e->dims[m].c[choice[m]].creates) continue;
    *bytes = sat_add(*bytes, sat_mul(held / g * (g - 1), e->out_itemsize));
    *messages = sat_add(*messages, sat_mul(e->mesh_numel, g - 1));
    held /= g;
  }
}

/* The cost of moving `bytes` in `messages`. */
int64_t mt__prop_cost(int64_t bytes, int64_t messages) {
  return sat_add(bytes, sat_mul(messages, MT_PROP_MESSAGE_BYTES));
}

/* The estimated cost of reducing later the Partials `choice` creates. */
static int64_t later_cost(const mt__engine *e, const int *choice) {
  int64_t db, dm;
  deferred(e, choice, &db, &dm);
  return mt__prop_cost(db, dm);
}

/* The elements of the output the rank at coordinate 0 holds under `choice`:
 * the largest share, as chunks shrink towards the end. */
static int64_t held_output(const mt__engine *e, const int *choice) {
  int64_t held = e->out_numel;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    int64_t g = e->in->mesh_shape[m];
    if (e->dims[m].c[choice[m]].out.kind == MT_PLACEMENT_SHARD) held = held / g + (held % g != 0);
  }
  return held;
}

/* The same estimate in seconds under the engine's model: each reduce-scatter
 * takes the output one rank holds at that point over its group, on the link its
 * groups use. */
static double later_time(const mt__engine *e, const int *choice) {
  int64_t held = held_output(e, choice), stride = e->mesh_numel;
  double t = 0.0;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    int64_t g = e->in->mesh_shape[m];
    stride /= g;
    if (!e->dims[m].c[choice[m]].creates) continue;
    int64_t vector = sat_mul(held, e->out_itemsize);
    int link = mt_time_link(e->model, e->mesh_numel, g, stride);
    t += mt_time_coll(e->model, MT_TIME_REDUCE_SCATTER, g, vector, vector - vector / g, link);
    held = held / g + (held % g != 0);
  }
  return t;
}

/* The local pass of reducing later every Partial of the output, created by the
 * operation or kept from an input: mesh dim by mesh dim, each reduce-scatter
 * reduces what a rank receives of the output it holds then. */
static double later_local(const mt__engine *e, const int *choice) {
  int64_t held = held_output(e, choice);
  double t = 0.0;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    int64_t g = e->in->mesh_shape[m];
    if (e->dims[m].c[choice[m]].out.kind != MT_PLACEMENT_PARTIAL) continue;
    int64_t vector = sat_mul(held, e->out_itemsize);
    t += mt_time_local(e->model, 0, vector - vector / g);
    held = held / g + (held % g != 0);
  }
  return t;
}

/* -1 when `a` seconds is less than `b`, 1 when more, 0 when they agree within a
 * part in a million (the same collectives, priced alike). */
static int time_cmp(double a, double b) {
  double tol = 1e-6 * (a > b ? a : b);
  return a < b - tol ? -1 : a > b + tol ? 1 : 0;
}

/* How many (input, mesh dim of size > 1) pairs `choice` asks to change. */
static int changes(const mt__engine *e, const int *choice) {
  int n = 0;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    if (e->in->mesh_shape[m] == 1) continue;
    for (int i = 0; i < e->ninputs; ++i)
      n += !placement_eq(&e->dims[m].c[choice[m]].in[i], &e->cur[i].placements[m]);
  }
  return n;
}

/* Scores one combination into `s`; `*valid` is 0 when it is not allowed or a
 * plan fails. Without `full` a communicating combination is only flagged. */
int mt__prop_score(mt__engine *e, const int *choice, int full, mt__score *s,
                   int *valid, mt_error *err) {
  *valid = 0;
  if (!mt__prop_combo_valid(e, choice)) return MT_OK;
  memset(s, 0, sizeof *s);
  for (int i = 0; i < e->ninputs; ++i) {
    mt__price p;
    if (mt__prop_moved_with_alias(e, i, choice)) continue;
    int rc = mt__prop_input_price(e, i, choice, full, &p, err);
    if (rc != MT_OK || p.state == MT__PRICE_INVALID) return rc;
    if (p.state == MT__PRICE_COMM) {
      s->comm = 1, *valid = 1;
      return MT_OK;
    }
    s->bytes = sat_add(s->bytes, p.bytes);
    s->messages = sat_add(s->messages, p.messages);
    s->time += p.time;
  }
  mt__price w;
  int out_comm, rc = mt__prop_way_out(e, choice, full, &w, &out_comm, err);
  if (rc != MT_OK) return rc;
  if (out_comm && !full) {
    s->comm = 1, *valid = 1;
    return MT_OK;
  }
  s->bytes = sat_add(s->bytes, w.bytes);
  s->messages = sat_add(s->messages, w.messages);
  s->time += w.time;
  s->comm = s->bytes > 0 || s->messages > 0;
  if (s->comm && full) {
    mt__price g;
    rc = mt__prop_grads_back(e, choice, &g, err);
    if (rc != MT_OK) return rc;
    s->bytes = sat_add(s->bytes, g.bytes);
    s->messages = sat_add(s->messages, g.messages);
    s->time += g.time;
  }
  s->changes = changes(e, choice);
  s->cost = mt__prop_cost(s->bytes, s->messages);
  s->later = later_cost(e, choice);
  s->later_time = later_time(e, choice);
  s->later_local = later_local(e, choice);
  *valid = 1;
  return MT_OK;
}

/* Whether `a` beats `b`; on a tie the earlier one (b) stays. Among combinations
 * that move nothing, the one that leaves more inputs as they are wins before any
 * estimate of later costs, as torch keeps [R, S(1)] summed over dim 1 [R, P(avg)]
 * rather than cut it to [S(0), P(avg)]. */
int mt__prop_better(const mt__score *a, const mt__score *b) {
  if (a->comm != b->comm) return a->comm < b->comm;
  if (!a->comm && a->changes != b->changes) return a->changes < b->changes;
  if (a->cost != b->cost) return a->cost < b->cost;
  if (a->later != b->later) return a->later < b->later;
  if (a->bytes != b->bytes) return a->bytes < b->bytes;
  return a->messages < b->messages;
}

/* What a combination is timed by: its moves now and the local pass of every
 * reduction its output leaves pending. Each Partial is reduced sooner or later,
 * and reducing one now is charged its local pass in `time`; charging deferral
 * the same keeps that pass from favouring it, so the later messages decide
 * between reducing now and later. */
double mt__prop_now_time(const mt__score *s) { return s->time + s->later_local; }

/* Whether `a` is faster than `b` under the engine's model, the rule among the
 * combinations that move no more bytes than the one `better` picks: free first
 * and fewer changes among free ones as there, then the predicted time of the
 * moves now (now_time), of the reductions' messages later, fewer bytes, fewer
 * messages. */
int mt__prop_faster(const mt__score *a, const mt__score *b) {
  if (a->comm != b->comm) return a->comm < b->comm;
  if (!a->comm && a->changes != b->changes) return a->changes < b->changes;
  int order = time_cmp(mt__prop_now_time(a), mt__prop_now_time(b));
  if (order == 0) order = time_cmp(a->later_time, b->later_time);
  if (order != 0) return order < 0;
  if (a->bytes != b->bytes) return a->bytes < b->bytes;
  return a->messages < b->messages;
}
