/* The walk across nodes: what a direct exchange delivers from other nodes, when
 * the mesh's ranks, in row-major order, fill nodes of a fixed size.
 *
 * Every element a rank lacks comes from exactly one peer (the ranks that differ
 * from it only on the mesh dims the source shards, whose source boxes tile the
 * tensor), so what it receives from other nodes is what it lacks less what its
 * peers on its own node send. The peers a rank hears from at all are a product
 * over tensor dims of the source leaves its target box meets (walk.c), found
 * here by binary search in each dim's leaves.
 *
 * Where nodes are blocks of the mesh (every node a range of c coordinates of one
 * mesh dim and all coordinates of the dims after it, as (nodes, local) meshes
 * and 1-D meshes are), a rank's peers on its node are a product of coordinate
 * ranges, one per mesh dim the source shards, and what they send it is a
 * product over tensor dims of sums over source leaves: O(ranks per node) interval
 * overlaps per rank at most. Other layouts intersect the boxes of every pair of
 * ranks on a node. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "plan-private.h"

/* Pairs of ranks beyond which the walk is not made (out->walked stays 0) on
 * nodes that are not blocks of the mesh: the caller prices the exchange as if
 * everything crossed between nodes, never less than it does. */
#define PAIRS_MAX ((int64_t)1 << 24)

/* One tensor dim's source leaves: all of them (empty ones included) in
 * row-major order over the mesh dims that shard it, and the non-empty ones in
 * increasing order. */
typedef struct dim_src {
  int64_t total, n;
  int64_t *all_off, *all_len, *off, *len;
} dim_src;

/* How many of `ds`'s non-empty leaves meet [lo, lo + len): those between the
 * first that ends after lo and the first that starts at or after its end. */
static int64_t leaves_met(const dim_src *ds, int64_t lo, int64_t len) {
  if (len == 0) return 0;
  int64_t a = 0, b = ds->n;
  while (a < b) { /* the first leaf ending after lo */
    int64_t mid = a + (b - a) / 2;
    if (ds->off[mid] + ds->len[mid] <= lo) a = mid + 1;
    else b = mid;
  }
  int64_t first = a;
  b = ds->n;
  while (a < b) { /* the first leaf starting at or after lo + len */
    int64_t mid = a + (b - a) / 2;
    if (ds->off[mid] < lo + len) a = mid + 1;
    else b = mid;
  }
  return a - first;
}

static int64_t overlap(const mt_box *a, const mt_box *b) {
  mt_box c;
  return mt_box_intersect(a, b, &c) ? mt_box_numel(&c) : 0;
}

/* The walk's tables: each tensor dim's source leaves, and the boxes and
 * coordinates of one node's ranks. */
typedef struct tables {
  dim_src dims[MT_MAX_NDIM];
  int64_t *buf;
  mt_box *sb, *tb;
  int64_t *coord;
} tables;

static void tables_free(tables *t) {
  free(t->buf);
  free(t->sb);
  free(t->coord);
  t->buf = NULL, t->sb = t->tb = NULL, t->coord = NULL;
}

static int tables_init(const mt_layout *src, int64_t per_node, tables *t,
                       mt_error *err) {
  int64_t need = 0;
  memset(t, 0, sizeof *t);
  for (int d = 0; d < src->ndim; ++d) need += 4 * mt__leaf_total(src, d);
  t->buf = malloc((size_t)(need > 0 ? need : 1) * sizeof *t->buf);
  t->sb = malloc(2 * (size_t)per_node * sizeof *t->sb);
  t->coord = malloc((size_t)per_node * MT_MAX_MESH_NDIM * sizeof *t->coord);
  if (t->buf == NULL || t->sb == NULL || t->coord == NULL) {
    tables_free(t);
    mt__fail(err, MT_ENOMEM, "Out of memory pricing an exchange across nodes");
    return MT_ENOMEM;
  }
  t->tb = t->sb + per_node;
  int64_t *at = t->buf;
  for (int d = 0; d < src->ndim; ++d) {
    dim_src *ds = &t->dims[d];
    ds->total = mt__leaf_total(src, d);
    ds->all_off = at, ds->all_len = at + ds->total;
    ds->off = at + 2 * ds->total, ds->len = at + 3 * ds->total;
    at += 4 * ds->total;
    mt__fill_leaves(src, d, ds->all_off, ds->all_len);
    ds->n = 0;
    for (int64_t i = 0; i < ds->total; ++i) { /* the non-empty ones, in order */
      if (ds->all_len[i] == 0) continue;
      ds->off[ds->n] = ds->all_off[i], ds->len[ds->n] = ds->all_len[i], ++ds->n;
    }
  }
  return MT_OK;
}

/* The coordinate of row-major mesh position `pos`. */
static void coord_of(const mt_layout *l, int64_t pos, int64_t *coord) {
  for (int m = l->mesh_ndim - 1; m >= 0; --m) {
    coord[m] = pos % l->mesh_shape[m];
    pos /= l->mesh_shape[m];
  }
}

/* Whether ranks at `a` and `b` are peers of a direct exchange: equal on every
 * mesh dim the source does not shard. */
static int peers(const mt_layout *src, const int64_t *a, const int64_t *b) {
  for (int m = 0; m < src->mesh_ndim; ++m) {
    if (src->placements[m].kind != MT_PLACEMENT_SHARD && a[m] != b[m]) return 0;
  }
  return 1;
}

/* How the nodes cut the mesh where they are blocks of it: nodes of `run`
 * coordinates of mesh dim `dim` and all of the later dims. */
typedef struct blocks {
  int dim;
  int64_t run;
} blocks;

static int node_blocks(const mt_layout *l, int64_t per_node, blocks *out) {
  for (int m = 0; m < l->mesh_ndim; ++m) {
    int64_t stride = dim_stride(l, m);
    if (stride > per_node) continue;
    if (per_node % stride != 0 || l->mesh_shape[m] % (per_node / stride) != 0) return 0;
    out->dim = m, out->run = per_node / stride;
    return 1;
  }
  return 0;
}

/* Over the source leaves of tensor dim `d` that the peers on the node of a rank
 * hold (on each mesh dim m that shards d, the coordinates lo_c[m] .. lo_c[m] +
 * n_c[m] - 1): the elements they share with [lo, lo + len), summed into *sum,
 * and how many leaves share any, into *met. */
static void node_leaves(const mt_layout *src, int d, const dim_src *ds,
                        const int64_t *lo_c, const int64_t *n_c, int64_t lo,
                        int64_t len, int64_t *sum, int64_t *met) {
  int ms[MT_MAX_MESH_NDIM], nm = 0;
  for (int m = 0; m < src->mesh_ndim; ++m) {
    if (is_shard(&src->placements[m], d)) ms[nm++] = m;
  }
  int64_t at[MT_MAX_MESH_NDIM] = {0};
  *sum = *met = 0;
  for (;;) {
    int64_t leaf = 0;
    for (int i = 0; i < nm; ++i) leaf = leaf * src->mesh_shape[ms[i]] + lo_c[ms[i]] + at[i];
    int64_t a = ds->all_off[leaf], b = a + ds->all_len[leaf];
    int64_t x = a > lo ? a : lo, y = b < lo + len ? b : lo + len;
    if (y > x) *sum += y - x, ++*met;
    int i = nm - 1;
    for (; i >= 0; --i) {
      if (++at[i] < n_c[ms[i]]) break;
      at[i] = 0;
    }
    if (i < 0) break;
  }
}

/* What the rank at coordinate `c` (with boxes sb, tb) receives from the peers on
 * its node, when nodes are blocks `bl` of the mesh: *near elements from *near_msgs
 * peers, itself left out. */
static void from_node_blocks(const mt_layout *src, const tables *t, const blocks *bl,
                             const int64_t *c, const mt_box *sb, const mt_box *tb,
                             int64_t *near, int64_t *near_msgs) {
  int64_t lo_c[MT_MAX_MESH_NDIM], n_c[MT_MAX_MESH_NDIM];
  for (int m = 0; m < src->mesh_ndim; ++m) {
    lo_c[m] = m < bl->dim ? c[m] : m == bl->dim ? c[m] / bl->run * bl->run : 0;
    n_c[m] = m < bl->dim ? 1 : m == bl->dim ? bl->run : src->mesh_shape[m];
  }
  int64_t vol = 1, count = 1;
  for (int d = 0; d < tb->ndim; ++d) {
    int64_t sum = tb->shape[d], met = 1;
    if (t->dims[d].total > 1)
      node_leaves(src, d, &t->dims[d], lo_c, n_c, tb->offset[d], tb->shape[d], &sum, &met);
    vol *= sum, count *= met; /* below the box's elements and the node's ranks */
  }
  int64_t keep = overlap(sb, tb);
  *near = vol - keep;
  *near_msgs = count - (keep > 0);
}

/* What the rank i of a node of n (boxes in `t`) receives from the peers on its
 * node, box by box: *near elements from *near_msgs peers. */
static void from_node_pairs(const mt_layout *src, const tables *t, int64_t n, int64_t i,
                            int64_t *near, int64_t *near_msgs) {
  const int64_t *ci = t->coord + i * MT_MAX_MESH_NDIM;
  *near = *near_msgs = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (j == i || !peers(src, ci, t->coord + j * MT_MAX_MESH_NDIM)) continue;
    int64_t v = overlap(&t->sb[j], &t->tb[i]);
    *near += v, *near_msgs += v > 0;
  }
}

/* Rank i of a node of n: what it lacks and the peers it hears from, less the part
 * and the peers of its own node; summed into *node_sum and *out, maximised in
 * *out. */
static void visit(const mt_layout *src, const tables *t, const blocks *bl, int64_t n,
                  int64_t i, int64_t *node_sum, mt__node_walk *out) {
  const mt_box *tb = &t->tb[i];
  int64_t want = mt_box_numel(tb);
  if (want == 0) return;
  int64_t keep = overlap(&t->sb[i], tb), met = 1, near = 0, near_msgs = 0;
  for (int d = 0; d < tb->ndim; ++d) met *= leaves_met(&t->dims[d], tb->offset[d], tb->shape[d]);
  met -= keep > 0;
  if (bl != NULL)
    from_node_blocks(src, t, bl, t->coord + i * MT_MAX_MESH_NDIM, &t->sb[i], tb, &near,
                     &near_msgs);
  else
    from_node_pairs(src, t, n, i, &near, &near_msgs);
  int64_t far = want - keep - near, far_msgs = met - near_msgs;
  *node_sum += far; /* below the node's target elements: it fits */
  out->net += far;  /* below the mesh's target elements */
  out->net_msgs = far_msgs > out->net_msgs ? far_msgs : out->net_msgs;
  out->shm_msgs = near_msgs > out->shm_msgs ? near_msgs : out->shm_msgs;
}

int mt__walk_nodes(const mt_layout *src, const mt_layout *dst, int64_t per_node,
                   mt__node_walk *out, mt_error *err) {
  int64_t total = mesh_numel(src);
  memset(out, 0, sizeof *out);
  if (per_node <= 1 || per_node >= total || is_empty(src)) return MT_OK;
  blocks bl;
  int aligned = node_blocks(src, per_node, &bl);
  if (!aligned && total > PAIRS_MAX / per_node) return MT_OK;
  tables t;
  int rc = tables_init(src, per_node, &t, err);
  if (rc != MT_OK) return rc;
  for (int64_t start = 0; start < total; start += per_node) {
    int64_t n = total - start < per_node ? total - start : per_node, node_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t *c = t.coord + i * MT_MAX_MESH_NDIM;
      coord_of(src, start + i, c);
      local_box(src, c, &t.sb[i]);
      local_box(dst, c, &t.tb[i]);
    }
    for (int64_t i = 0; i < n; ++i) visit(src, &t, aligned ? &bl : NULL, n, i, &node_sum, out);
    out->node_most = node_sum > out->node_most ? node_sum : out->node_most;
  }
  tables_free(&t);
  out->walked = 1;
  return MT_OK;
}
