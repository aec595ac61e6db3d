/* What a step moves: its bytes and messages summed over the ranks, and what the
 * time model prices it by, the most one rank receives and a collective's vector.
 *
 * What a step moves is a sum over ranks, and what the time model needs is a
 * maximum over ranks; neither visits every rank where the boxes factor. A rank's
 * box is a product over tensor dims, and the extent along dim d depends only on
 * the coordinates of the mesh dims that shard d, which no other tensor dim
 * shares. Within one layout the dims are therefore independent, and the extents
 * along d are the leaves of its nested chunking (leaves.c), so sums and maxima
 * over ranks become sums and maxima over their few distinct lengths. A
 * one-mesh-dim step on mesh dim m is priced from its parent layout (the source
 * with m replicated), in which every group's boxes are consecutive chunks of one
 * parent box, from the distinct leaf lengths of the tensor dims (O(mesh dims) of
 * them each) without visiting ranks. Only a direct exchange, whose layouts differ
 * on several mesh dims, and a step of torch's order that is no valid collective
 * walk the coordinates of the mesh dims that shard something (walk.c), with
 * O(tensor dims) work per coordinate, once per planning, so planning grows with
 * the mesh and not with its pairs of ranks. */
#include <stdint.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"
#include "plan-private.h"

/* Chunk i of a length over g ranks, as mt_chunk cuts it. */
static int64_t chunk_len(int64_t len, int64_t g, int64_t i) {
  int64_t chunk = len / g + (len % g != 0), start = i * chunk;
  if (start >= len) return 0;
  return len - start < chunk ? len - start : chunk;
}

int mt__sum_numel(const mt_layout *l, int64_t *out) {
  int64_t total = 1;
  if (is_empty(l)) {
    *out = 0;
    return 1;
  }
  for (int d = 0; d < l->ndim; ++d) {
    if (!mul_ok(total, l->shape[d], &total)) return 0;
  }
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (l->placements[m].kind != MT_PLACEMENT_SHARD &&
        !mul_ok(total, l->mesh_shape[m], &total))
      return 0;
  }
  *out = total;
  return 1;
}

/* What the ranks of a one-mesh-dim step on mesh dim `m` lack (`scatter` 0: the
 * elements of their target box they do not hold) or shed (`scatter` 1: what a
 * reduce-scatter receives, numel(S) - numel(T)), summed into *out and the most
 * one rank has into *most. The step cuts tensor dim `a` (-1: none) out of the
 * parent `q` in the source and `b` (-1: none) in the target, both at the rank's
 * coordinate i on m, so a rank of parent extents (Pa, Pb) lacks
 * chunk_b(i) * (Pa - chunk_a(i)) times its extents on the other dims, and sheds
 * Pb - chunk_b(i) times them. */
static int one_dim_elements(const mt_layout *q, int m, int a, int b, int scatter,
                            int64_t *out, int64_t *most) {
  int64_t g = q->mesh_shape[m], rest = 1, top = 1;
  if (is_empty(q)) {
    *out = 0, *most = 0;
    return 1;
  }
  for (int d = 0; d < q->ndim; ++d) {
    if (d == a || d == b) continue;
    mt__hist h;
    mt__leaf_hist(q, d, &h);
    if (!mul_ok(rest, q->shape[d], &rest)) return 0;
    top *= mt__hist_max(&h); /* one rank's extents: they fit */
  }
  for (int k = 0; k < q->mesh_ndim; ++k) {
    if (k != m && q->placements[k].kind != MT_PLACEMENT_SHARD &&
        !mul_ok(rest, q->mesh_shape[k], &rest))
      return 0;
  }
  static const mt__hist none = {1, {1}, {1}};
  mt__hist ha = none, hb = none;
  if (a >= 0) mt__leaf_hist(q, a, &ha);
  if (b >= 0) mt__leaf_hist(q, b, &hb);
  int64_t sum = 0, peak = 0;
  for (int x = 0; x < ha.n; ++x) {
    for (int y = 0; y < hb.n; ++y) {
      int64_t pa = ha.len[x], pb = hb.len[y], pair = 0, weight;
      for (int64_t i = 0; i < g; ++i) {
        int64_t cb = b >= 0 ? chunk_len(pb, g, i) : pb;
        int64_t v = scatter ? pb - cb : a >= 0 ? cb * (pa - chunk_len(pa, g, i)) : 0;
        peak = v > peak ? v : peak;
        if (!add_ok(pair, v, &pair)) return 0;
      }
      if (!mul_ok(ha.count[x], hb.count[y], &weight) || !mul_ok(pair, weight, &pair) ||
          !add_ok(sum, pair, &sum))
        return 0;
    }
  }
  if (!mul_ok(sum, rest, out)) return 0;
  *most = peak * top;
  return 1;
}

/* The parent of a one-mesh-dim step on `m` and the tensor dims it cuts there. */
static void one_dim_frame(const mt_layout *src, const mt_layout *dst, int m,
                          mt_layout *q, int *a, int *b) {
  *q = *src;
  q->placements[m] = replicate();
  const mt_placement *p = &src->placements[m], *t = &dst->placements[m];
  *a = p->kind == MT_PLACEMENT_SHARD ? p->dim : -1;
  *b = t->kind == MT_PLACEMENT_SHARD ? t->dim : -1;
}

/* The ring all-reduce model: each of the G ranks of a group receives
 * 2 (G - 1) / G of the buffer. Every rank of a group holds the same box, so the
 * total is the sum over ranks of numel times 2 (G - 1) / G, an exact integer. */
int mt__reduced_elements(const mt_layout *src, int m, int64_t *out) {
  int64_t total;
  if (!mt__sum_numel(src, &total)) return 0;
  return mul_ok(total / src->mesh_shape[m], 2 * (src->mesh_shape[m] - 1), out);
}

/* Elements moved from `src` to `dst`, which differ on mesh dim `m` only, neither
 * Partial there: closed form for a valid step, else a walk. */
int mt__moved_elements(const mt_layout *src, const mt_layout *dst, int m,
                       int64_t *out, int64_t *most, mt_error *err) {
  if (!mt__step_kind_valid(src, m, &src->placements[m], &dst->placements[m]))
    return mt__walk(src, dst, out, most, NULL, NULL, NULL, err);
  mt_layout q;
  int a, b;
  one_dim_frame(src, dst, m, &q, &a, &b);
  return one_dim_elements(&q, m, a, b, 0, out, most) ? MT_OK : overflow(err);
}

/* The vector a collective step is priced by (timemodel.h, mt_time_kind): the box
 * of the rank at coordinate 0, the largest, as chunks shrink towards the end. */
static int64_t coll_elements(const mt_step *st) {
  int64_t coord[MT_MAX_MESH_NDIM] = {0};
  mt_box b;
  local_box(st->kind == MT_STEP_ALLGATHER ? &st->dst : &st->src, coord, &b);
  return mt_box_numel(&b);
}

/* Fills a step's bytes and messages from its kind and layouts, and what the time
 * model prices it by: the most bytes one rank receives (an all-reduce: its
 * vector) and a collective's vector. */
int mt__price_step(mt_step *st, int64_t itemsize, mt_error *err) {
  int64_t elems = 0, most = 0;
  if (st->kind == MT_STEP_CHUNK) return MT_OK;
  if (st->kind == MT_STEP_DIRECT) {
    int rc = mt__walk(&st->src, &st->dst, &elems, &most, NULL, &st->messages,
                      &st->rank_messages, err);
    if (rc == MT_OK && (!mul_ok(elems, itemsize, &st->bytes) ||
                        !mul_ok(most, itemsize, &st->rank_bytes)))
      return overflow(err);
    return rc;
  }
  int m = st->mesh_dim;
  if (st->kind == MT_STEP_ALLREDUCE || st->kind == MT_STEP_ALLREDUCE_NODES) {
    if (!mt__reduced_elements(&st->src, m, &elems)) return overflow(err);
  } else if (st->kind == MT_STEP_REDUCE_SCATTER) {
    mt_layout q;
    int a, b;
    one_dim_frame(&st->src, &st->dst, m, &q, &a, &b);
    if (!one_dim_elements(&q, m, -1, b, 1, &elems, &most)) return overflow(err);
  } else {
    int rc = mt__moved_elements(&st->src, &st->dst, m, &elems, &most, err);
    if (rc != MT_OK) return rc;
  }
  if (!mul_ok(elems, itemsize, &st->bytes)) return overflow(err);
  /* A collective over G ranks: G - 1 messages per rank, N * (G - 1) < 2^62; an
   * ALLREDUCE_NODES step's member hears from the l - 1 others of its node twice
   * and from the G / l - 1 others it reduces its part with. */
  int64_t g = st->src.mesh_shape[m], l = st->node_group;
  st->rank_messages = st->kind == MT_STEP_ALLREDUCE_NODES ? 2 * (l - 1) + g / l - 1 : g - 1;
  st->messages = mesh_numel(&st->src) * st->rank_messages;
  int64_t vector = coll_elements(st);
  int whole = st->kind == MT_STEP_ALLREDUCE || st->kind == MT_STEP_ALLREDUCE_NODES;
  if (!mul_ok(whole ? vector : most, itemsize, &st->rank_bytes) ||
      !mul_ok(vector, itemsize, &st->vector_bytes))
    return overflow(err);
  return MT_OK;
}
