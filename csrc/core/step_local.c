/* A step's local passes: what the busiest rank copies and reduces in its own
 * memory besides its messages.
 *
 * Besides its messages a step passes over local memory, as the executor runs it
 * (comm/redistribute.c, pairwise.c, exchange.c): a chunk copies the box it
 * keeps; an all-gather along an inner dim places every block of its output (MPI
 * lands the blocks of a dim-0 gather in place); a reduce-scatter whose blocks are
 * not slabs of its input packs the input; an exchange copies the part a rank
 * keeps, and MPI packs the parts whose subarray datatypes are not contiguous; a
 * reduction combines G - 1 contributions of what a rank keeps. The rank at
 * coordinate 0 has the largest boxes (chunks shrink towards the end), so the
 * largest kept part too; what the busiest rank of an exchange receives is the
 * step's rank_bytes. */
#include <stdint.h>
#include <stdlib.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"
#include "plan-private.h"

/* The box of the rank at coordinate 0. */
static void first_box(const mt_layout *l, mt_box *out) {
  int64_t coord[MT_MAX_MESH_NDIM] = {0};
  local_box(l, coord, out);
}

/* Whether a box has more than one row before dim d (some extent there is not 1),
 * so that the blocks it is cut into along d are strided, not slabs. */
static int rows_before(const mt_box *b, int d) {
  for (int i = 0; i < d; ++i) {
    if (b->shape[i] != 1) return 1;
  }
  return 0;
}

/* How the parts of an exchange lie along one tensor dim, from its source and
 * target leaves (non-empty ones in increasing order in both lists): whether some
 * non-empty part is shorter than its source leaf (`cut_src`) or its target leaf
 * (`cut_dst`), and whether some is longer than one element. */
static void part_extents(const int64_t *s_off, const int64_t *s_len, int64_t ns,
                         const int64_t *t_off, const int64_t *t_len, int64_t nt,
                         int *cut_src, int *cut_dst, int *wide) {
  int64_t i = 0, j = 0;
  while (i < ns && j < nt) {
    if (s_len[i] == 0) {
      ++i;
      continue;
    }
    if (t_len[j] == 0) {
      ++j;
      continue;
    }
    int64_t s_end = s_off[i] + s_len[i], t_end = t_off[j] + t_len[j];
    int64_t lo = s_off[i] > t_off[j] ? s_off[i] : t_off[j];
    int64_t hi = s_end < t_end ? s_end : t_end;
    if (hi > lo) {
      *cut_src |= hi - lo < s_len[i];
      *cut_dst |= hi - lo < t_len[j];
      *wide |= hi - lo > 1;
    }
    if (s_end <= t_end) ++i;
    else ++j;
  }
}

/* Whether some part is not contiguous in its box: cut along one dim while longer
 * than one element along an earlier one. Each dim's parts pair with any of the
 * other dims' (the mesh dims that place them differ), so flags per dim suffice. */
static int scattered(const int *cut, const int *wide, int ndim) {
  int wider = 0;
  for (int d = 0; d < ndim; ++d) {
    if (cut[d] && wider) return 1;
    wider |= wide[d];
  }
  return 0;
}

/* Whether the mesh dims that cut dim d in `a` are the first of those that cut it
 * in `b`, in mesh order: then b's leaves nest in a's. */
static int cuts_prefix(const mt_layout *a, const mt_layout *b, int d) {
  int ended = 0;
  for (int m = 0; m < a->mesh_ndim; ++m) {
    int in_a = is_shard(&a->placements[m], d), in_b = is_shard(&b->placements[m], d);
    if (in_a && (ended || !in_b)) return 0;
    ended |= in_b && !in_a;
  }
  return 1;
}

static int64_t non_empty(const mt__hist *h) {
  int64_t n = 0;
  for (int i = 0; i < h->n; ++i) n += h->len[i] > 0 ? h->count[i] : 0;
  return n;
}

/* part_extents without visiting leaves where one side's leaves nest in the
 * other's: the parts are the finer leaves, and they cut the coarser side where
 * there are more of them that hold something. 0 when neither nests. */
static int nested_parts(const mt_layout *src, const mt_layout *dst, int d,
                        int *cut_src, int *cut_dst, int *wide) {
  int src_finer = cuts_prefix(dst, src, d);
  if (!src_finer && !cuts_prefix(src, dst, d)) return 0;
  mt__hist fine, coarse;
  mt__leaf_hist(src_finer ? src : dst, d, &fine);
  mt__leaf_hist(src_finer ? dst : src, d, &coarse);
  int split = non_empty(&fine) > non_empty(&coarse);
  *cut_src = !src_finer && split;
  *cut_dst = src_finer && split;
  *wide = mt__hist_max(&fine) > 1;
  return 1;
}

/* How many sides of the exchange from `src` to `dst` (sending, receiving) MPI
 * packs: those on which some part, the kept one included, is not contiguous in
 * the box it is cut from or lands in. */
static int packed_sides(const mt_layout *src, const mt_layout *dst, int *sides,
                        mt_error *err) {
  int cut_src[MT_MAX_NDIM] = {0}, cut_dst[MT_MAX_NDIM] = {0}, wide[MT_MAX_NDIM] = {0};
  int64_t *buf = NULL;
  for (int d = 0; d < src->ndim; ++d) {
    if (nested_parts(src, dst, d, &cut_src[d], &cut_dst[d], &wide[d])) continue;
    int64_t ns = mt__leaf_total(src, d), nt = mt__leaf_total(dst, d);
    free(buf);
    buf = malloc((size_t)(2 * (ns + nt)) * sizeof *buf);
    if (buf == NULL) return mt__fail(err, MT_ENOMEM, "Out of memory pricing an exchange");
    int64_t *s_off = buf, *s_len = buf + ns, *t_off = buf + 2 * ns, *t_len = t_off + nt;
    mt__fill_leaves(src, d, s_off, s_len);
    mt__fill_leaves(dst, d, t_off, t_len);
    part_extents(s_off, s_len, ns, t_off, t_len, nt, &cut_src[d], &cut_dst[d], &wide[d]);
  }
  free(buf);
  *sides = scattered(cut_src, wide, src->ndim) + scattered(cut_dst, wide, src->ndim);
  return MT_OK;
}

/* The copies of an exchange (all-to-all, direct): a rank copies the part it
 * keeps, and on each packed side MPI passes over about what the rank lacks (it
 * unpacks what the rank receives, or packs what it sends, which is taken to be
 * as much). That is its kept part with no side packed (rank 0's is the largest),
 * its target box with one, and that box and what it lacks with both, each at its
 * most over the ranks. */
static int exchange_copies(mt_step *st, int64_t itemsize, mt_error *err) {
  mt_box s, t, kept;
  first_box(&st->src, &s);
  first_box(&st->dst, &t);
  int sides = 0, rc = packed_sides(&st->src, &st->dst, &sides, err);
  if (rc != MT_OK) return rc;
  int64_t elems = mt_box_numel(&t), most = 0;
  if (sides == 0) elems = mt_box_intersect(&s, &t, &kept) ? mt_box_numel(&kept) : 0;
  if (sides == 2) most = st->rank_bytes;
  if (!mul_ok(elems, itemsize, &elems) || !add_ok(elems, most, &st->copy_bytes))
    return overflow(err);
  return MT_OK;
}

/* Fills a priced step's copy_bytes and reduce_bytes. */
int mt__price_local(mt_step *st, int64_t itemsize, mt_error *err) {
  if (is_empty(&st->src)) return MT_OK;
  if (st->kind == MT_STEP_ALLTOALL || st->kind == MT_STEP_DIRECT)
    return exchange_copies(st, itemsize, err);
  int m = st->mesh_dim;
  int64_t g = st->src.mesh_shape[m], in = 0, out = 0;
  mt_box s, t;
  first_box(&st->src, &s);
  first_box(&st->dst, &t);
  if (!mul_ok(mt_box_numel(&s), itemsize, &in) || !mul_ok(mt_box_numel(&t), itemsize, &out))
    return overflow(err);
  if (st->kind == MT_STEP_CHUNK) {
    st->copy_bytes = out;
  } else if (st->kind == MT_STEP_ALLGATHER) {
    st->copy_bytes = rows_before(&t, st->src.placements[m].dim) ? out : 0;
  } else if (st->kind == MT_STEP_ALLREDUCE || st->kind == MT_STEP_ALLREDUCE_NODES) {
    /* Split or not, each rank reduces (G - 1) / G of its vector. */
    st->reduce_bytes = in - in / g;
  } else {
    st->copy_bytes = rows_before(&s, st->dst.placements[m].dim) ? in : 0;
    if (!mul_ok(out, g - 1, &st->reduce_bytes)) return overflow(err);
  }
  return MT_OK;
}

double mt__cuts_time(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                     const mt_time_model *model) {
  mt_layout cur = *src;
  double copied = 0.0;
  if (is_empty(src)) return 0.0;
  /* mt__chain_phase's cuts, first mesh dim first, each copying the box it keeps */
  for (int m = 0; m < cur.mesh_ndim; ++m) {
    if (cur.mesh_shape[m] == 1 || placement_eq(&cur.placements[m], &dst->placements[m]))
      continue;
    cur.placements[m] = dst->placements[m];
    mt_box t;
    first_box(&cur, &t);
    copied += (double)mt_box_numel(&t) * (double)itemsize;
  }
  return copied * model->copy;
}
