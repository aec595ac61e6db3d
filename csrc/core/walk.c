/* The walk: what a move between two layouts delivers to every rank, counted over
 * the coordinates of the mesh dims that shard something, with each tensor dim's
 * leaves tabulated once. The planner prices a direct exchange by it, and the
 * propagation engine bounds a layout's cost by it (mt__lack). */
#include <stdint.h>
#include <stdlib.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "plan-private.h"

/* One tensor dim of a walk: its source and target leaves (empty ones included)
 * in row-major order over the mesh dims that shard it, and for each target leaf
 * the source leaves it meets. */
typedef struct dim_leaves {
  int64_t *s_off, *s_len, *t_off, *t_len, *peers;
} dim_leaves;

/* For every target leaf, the non-empty source leaves it meets. Non-empty leaves
 * lie in increasing order in both lists, so two cursors sweep them once. */
static void count_peers(int64_t ns, const int64_t *s_off, const int64_t *s_len,
                        int64_t nt, const int64_t *t_off, const int64_t *t_len,
                        int64_t *peers) {
  int64_t first = 0, past = 0;
  for (int64_t j = 0; j < nt; ++j) {
    peers[j] = 0;
    if (t_len[j] == 0) continue;
    int64_t lo = t_off[j], hi = lo + t_len[j];
    while (first < ns && (s_len[first] == 0 || s_off[first] + s_len[first] <= lo))
      ++first;
    if (past < first) past = first;
    while (past < ns && (s_len[past] == 0 || s_off[past] < hi)) ++past;
    int64_t n = 0;
    for (int64_t k = first; k < past; ++k) n += s_len[k] > 0;
    peers[j] = n;
  }
}

/* What a move from `src` to `dst` changing any mesh dims delivers: over every
 * rank, the elements of its target box it does not hold (summed into *moved, the
 * most into *most_moved) and the peers whose source box meets its target box
 * (summed into *msgs, the most into *most_msgs; NULL: not wanted). The peers of
 * a rank's target box are a product over tensor dims of the source leaves it
 * meets, less the rank itself when it keeps part of its box. Walks the
 * coordinates of the mesh dims that shard something; the others repeat it. */
int mt__walk(const mt_layout *src, const mt_layout *dst, int64_t *moved,
             int64_t *most_moved, int64_t *lacking, int64_t *msgs,
             int64_t *most_msgs, mt_error *err) {
  int act[MT_MAX_NDIM], nact = 0, rel[MT_MAX_MESH_NDIM], nrel = 0;
  int64_t fixed = 1, repeat = 1, need = 0;
  if (is_empty(src)) { /* nothing moves, no peer is met */
    *moved = *most_moved = 0;
    if (lacking != NULL) *lacking = 0;
    if (msgs != NULL) *msgs = *most_msgs = 0;
    return MT_OK;
  }
  for (int d = 0; d < src->ndim; ++d) {
    int64_t ns = mt__leaf_total(src, d), nt = mt__leaf_total(dst, d);
    if (ns == 1 && nt == 1) {
      fixed *= src->shape[d]; /* both boxes span the dim: numel fits */
      continue;
    }
    act[nact++] = d;
    need += 2 * ns + 3 * nt;
  }
  for (int m = 0; m < src->mesh_ndim; ++m) {
    if (src->placements[m].kind == MT_PLACEMENT_SHARD ||
        dst->placements[m].kind == MT_PLACEMENT_SHARD)
      rel[nrel++] = m;
    else if (!mul_ok(repeat, src->mesh_shape[m], &repeat))
      return overflow(err);
  }
  int64_t *buf = malloc((size_t)(need > 0 ? need : 1) * sizeof *buf);
  if (buf == NULL) return mt__fail(err, MT_ENOMEM, "Out of memory pricing an exchange");
  dim_leaves dl[MT_MAX_NDIM];
  int64_t *at = buf;
  for (int j = 0; j < nact; ++j) {
    int d = act[j];
    int64_t ns = mt__leaf_total(src, d), nt = mt__leaf_total(dst, d);
    dl[j].s_off = at, dl[j].s_len = at + ns, at += 2 * ns;
    dl[j].t_off = at, dl[j].t_len = at + nt, dl[j].peers = at + 2 * nt, at += 3 * nt;
    mt__fill_leaves(src, d, dl[j].s_off, dl[j].s_len);
    mt__fill_leaves(dst, d, dl[j].t_off, dl[j].t_len);
    if (msgs != NULL)
      count_peers(ns, dl[j].s_off, dl[j].s_len, nt, dl[j].t_off, dl[j].t_len,
                  dl[j].peers);
  }
  /* Moving coordinate m by one moves the leaf index of the dim it shards by the
   * leaves of the later mesh dims sharding that dim. */
  int64_t s_step[MT_MAX_MESH_NDIM] = {0}, t_step[MT_MAX_MESH_NDIM] = {0};
  int s_dim[MT_MAX_MESH_NDIM], t_dim[MT_MAX_MESH_NDIM];
  for (int r = 0; r < nrel; ++r) {
    int m = rel[r];
    s_dim[r] = t_dim[r] = -1;
    for (int j = 0; j < nact; ++j) {
      const mt_placement *p = &src->placements[m], *q = &dst->placements[m];
      int d = act[j];
      int64_t below = 1;
      for (int k = m + 1; k < src->mesh_ndim; ++k)
        below *= is_shard(&src->placements[k], d) ? src->mesh_shape[k] : 1;
      if (is_shard(p, d)) s_dim[r] = j, s_step[r] = below;
      below = 1;
      for (int k = m + 1; k < dst->mesh_ndim; ++k)
        below *= is_shard(&dst->placements[k], d) ? dst->mesh_shape[k] : 1;
      if (is_shard(q, d)) t_dim[r] = j, t_step[r] = below;
    }
  }
  int64_t coord[MT_MAX_MESH_NDIM] = {0}, si[MT_MAX_NDIM] = {0}, ti[MT_MAX_NDIM] = {0};
  int64_t sum = 0, peak = 0, nmsg = 0, busiest = 0, short_of = 0;
  int ok = 1;
  for (;;) {
    int64_t t = fixed, h = fixed, p = 1;
    for (int j = 0; j < nact; ++j) {
      int64_t tl = dl[j].t_len[ti[j]], to = dl[j].t_off[ti[j]];
      int64_t so = dl[j].s_off[si[j]], se = so + dl[j].s_len[si[j]];
      int64_t lo = so > to ? so : to, hi = se < to + tl ? se : to + tl;
      t *= tl;
      h *= hi > lo ? hi - lo : 0;
      if (msgs != NULL) p *= dl[j].peers[ti[j]]; /* filled only when wanted */
    }
    int64_t lack = t - h;
    peak = lack > peak ? lack : peak;
    short_of += lack > 0;
    ok &= add_ok(sum, lack, &sum);
    if (msgs != NULL && t > 0) {
      int64_t n = p - (h > 0);
      busiest = n > busiest ? n : busiest;
      nmsg += n; /* below ranks^2 < 2^62 */
    }
    int r = nrel - 1;
    for (; r >= 0; --r) {
      int m = rel[r];
      /* One step forward, or back to 0 from the last coordinate. */
      int wrap = ++coord[m] == src->mesh_shape[m];
      int64_t move = wrap ? 1 - src->mesh_shape[m] : 1;
      if (wrap) coord[m] = 0;
      if (s_dim[r] >= 0) si[s_dim[r]] += s_step[r] * move;
      if (t_dim[r] >= 0) ti[t_dim[r]] += t_step[r] * move;
      if (!wrap) break;
    }
    if (r < 0) break;
  }
  free(buf);
  if (!ok || !mul_ok(sum, repeat, moved)) return overflow(err);
  *most_moved = peak;
  if (lacking != NULL) *lacking = short_of * repeat; /* at most the ranks */
  if (msgs != NULL) {
    *msgs = nmsg * repeat;
    *most_msgs = busiest;
  }
  return MT_OK;
}

int mt__lack(const mt_layout *have, const mt_layout *need, int64_t *sum, int64_t *most,
             int64_t *ranks, mt_error *err) {
  return mt__walk(have, need, sum, most, ranks, NULL, NULL, err);
}
