/* Redistribution planning: the steps that move a tensor from one layout to another
 * and what each costs, summed over every rank of the mesh.
 *
 * Mesh dims of size 1 never change a box: a Shard over one rank is the whole
 * parent extent and a Partial over one rank is already reduced. The planner
 * therefore works on normalised layouts in which every size-1 mesh dim is
 * Replicate, so no step is ever emitted on such a dim. To keep the steps chaining
 * exactly from the caller's `src` to its `dst` (step 0's src is `src`, each step's
 * dst is the next step's src, the last step's dst is `dst`), the relabelling is
 * folded into the plan's ends: the first step's src carries the source labels on
 * size-1 dims and the last step's dst the target labels. A step's src and dst thus
 * differ on its mesh dim and, at the ends of a plan, on size-1 mesh dims, whose
 * labels no box depends on. When nothing but size-1 labels differ, the plan is
 * empty.
 *
 * Shard/Replicate changes are priced two ways, as a chain of one-mesh-dim
 * collectives and as one direct exchange (reshard_phase). Reductions are placed
 * four ways: before the shard changes (the order plan.h documents), after the
 * cuts that shrink what they carry, after all shard changes, or interleaved in
 * torch's order (best_candidate); the cheapest plan wins. The tests check, over
 * every (2,2)-mesh pair and random 1- to 3-d meshes, that no plan moves more bytes
 * than torch's chain priced by the same model.
 *
 * A one-mesh-dim step is priced from the distinct leaf lengths of the tensor dims
 * (O(mesh dims) of them each) without visiting ranks; a direct exchange walks the
 * coordinates of the mesh dims that shard something with O(tensor dims) work per
 * coordinate, once per planning, so a plan on 16,384 ranks takes a few million
 * instructions. */
#include "mpitensor/plan.h"

#include <assert.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/layout.h"
#include "mpitensor/status.h"

/* A chain may gather and cut again on every mesh dim (2 steps each), before and
 * after one reduction per mesh dim: no plan has more steps. */
#define MAX_STEPS (5 * MT_MAX_MESH_NDIM)

/* A direct exchange's price and box lists visit every rank, and MPI numbers ranks
 * with an int, so a larger mesh cannot exist and would only make planning run for
 * hours. */
#define MAX_MESH_NUMEL ((int64_t)INT32_MAX)

typedef struct step_list {
  int n;
  int64_t bytes;
  int64_t messages;
  double time;
  mt_step s[MAX_STEPS];
} step_list;

/* The steps, and what owns the plan: a count of owners, and the per-process
 * compiled part an executor attached on first use (set once, then only read). */
struct mt_plan {
  step_list list;
  atomic_int owners;
  _Atomic(void *) compiled;
  void (*compiled_free)(void *);
};

/* ---- Arithmetic. ---- */

/* a + b for non-negative operands; 0 when the sum does not fit. */
static int add_ok(int64_t a, int64_t b, int64_t *out) {
  if (a > INT64_MAX - b) return 0;
  *out = a + b;
  return 1;
}

/* a * b for non-negative operands; 0 when the product does not fit. */
static int mul_ok(int64_t a, int64_t b, int64_t *out) {
  if (a != 0 && b > INT64_MAX / a) return 0;
  *out = a * b;
  return 1;
}

static int overflow(mt_error *err) {
  return mt__fail(err, MT_EOVERFLOW,
                  "The byte or message count of this redistribution does not fit in "
                  "int64");
}

/* ---- Layouts. ---- */

/* Whether a and b (same frame) agree on every mesh dim except `m` (-1: none)
 * and those of size 1. */
static int differ_only_on(const mt_layout *a, const mt_layout *b, int m) {
  for (int k = 0; k < a->mesh_ndim; ++k) {
    if (k == m || a->mesh_shape[k] == 1) continue;
    if (!placement_eq(&a->placements[k], &b->placements[k])) return 0;
  }
  return 1;
}

/* No later mesh dim cuts tensor dim `d` again, so the boxes of a group along mesh
 * dim `m` are consecutive chunks of one parent box. A later dim of size 1 does not
 * count: its chunk is the whole parent. */
static int inner(const mt_layout *l, int m, int d) {
  for (int k = m + 1; k < l->mesh_ndim; ++k) {
    if (l->mesh_shape[k] > 1 && is_shard(&l->placements[k], d)) return 0;
  }
  return 1;
}

/* Relabels every size-1 mesh dim Replicate, which changes no rank's box. */
static void normalize(mt_layout *l) {
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (l->mesh_shape[m] == 1) l->placements[m] = replicate();
  }
}

/* The number of ranks; callers have checked it against MAX_MESH_NUMEL. */
static int64_t mesh_numel(const mt_layout *l) {
  int64_t n = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) n *= l->mesh_shape[m];
  return n;
}

/* Advances a row-major mesh coordinate; returns 0 once it wraps to all zeros. */
static int next_coord(int64_t *coord, const mt_layout *l) {
  for (int m = l->mesh_ndim - 1; m >= 0; --m) {
    if (++coord[m] < l->mesh_shape[m]) return 1;
    coord[m] = 0;
  }
  return 0;
}

/* The box of a rank of a layout this file has already validated. */
static void local_box(const mt_layout *l, const int64_t *coord, mt_box *out) {
  int rc = mt_layout_local_box(l, coord, out, NULL);
  assert(rc == MT_OK);
  (void)rc;
}

/* A box holding no element, in the layout's convention for empty extents. */
static void empty_box(const mt_layout *l, mt_box *out) {
  memset(out, 0, sizeof *out);
  out->ndim = l->ndim;
  for (int d = 0; d < l->ndim; ++d) out->offset[d] = l->shape[d];
}

/* ---- Validation. ---- */

/* Validates one layout into a clean copy; the message names which layout. */
static int check_layout(const mt_layout *l, const char *what, mt_layout *out,
                        mt_error *err) {
  int rc = mt_layout_init(out, l->ndim, l->shape, l->mesh_ndim, l->mesh_shape,
                          l->placements, err);
  if (rc == MT_OK || err == NULL) return rc;
  char msg[MT_ERROR_LEN];
  memcpy(msg, err->msg, sizeof msg);
  return mt__fail(err, rc, "The %s layout is invalid: %s", what, msg);
}

/* Both layouts must describe one tensor on one mesh. */
static int check_frames(const mt_layout *a, const mt_layout *b, mt_error *err) {
  if (a->ndim != b->ndim)
    return mt__fail(err, MT_EINVAL,
                    "The source layout has %d tensor dims and the target %d; "
                    "redistribution keeps the global shape",
                    a->ndim, b->ndim);
  for (int d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d])
      return mt__fail(err, MT_EINVAL,
                      "Tensor dim %d has size %" PRId64 " in the source and %" PRId64
                      " in the target; redistribution keeps the shape",
                      d, a->shape[d], b->shape[d]);
  }
  if (a->mesh_ndim != b->mesh_ndim)
    return mt__fail(err, MT_EINVAL,
                    "The source mesh has %d dims and the target mesh %d; "
                    "redistribution to another mesh is not supported",
                    a->mesh_ndim, b->mesh_ndim);
  for (int m = 0; m < a->mesh_ndim; ++m) {
    if (a->mesh_shape[m] != b->mesh_shape[m])
      return mt__fail(err, MT_EINVAL,
                      "Mesh dim %d has size %" PRId64 " in the source and %" PRId64
                      " in the target; both must use the same mesh",
                      m, a->mesh_shape[m], b->mesh_shape[m]);
  }
  return MT_OK;
}

/* Planning and exchanges visit every rank; refuse meshes no MPI job can have. */
static int check_mesh_size(const mt_layout *l, mt_error *err) {
  int64_t n = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) {
    n *= l->mesh_shape[m];
    if (n > MAX_MESH_NUMEL)
      return mt__fail(err, MT_EINVAL,
                      "The mesh has more than %" PRId64
                      " ranks, more than MPI can number",
                      MAX_MESH_NUMEL);
  }
  return MT_OK;
}

/* Validates src and dst into clean copies of one tensor on one mesh. */
static int check_pair(const mt_layout *src, const mt_layout *dst, mt_layout *a,
                      mt_layout *b, mt_error *err) {
  int rc = check_layout(src, "source", a, err);
  if (rc == MT_OK) rc = check_layout(dst, "target", b, err);
  if (rc == MT_OK) rc = check_frames(a, b, err);
  if (rc == MT_OK) rc = check_mesh_size(a, err);
  return rc;
}

/* Redistribution never creates a pending reduction: a Partial target needs the
 * same Partial in the source. */
static int check_partials(const mt_layout *a, const mt_layout *b, mt_error *err) {
  for (int m = 0; m < a->mesh_ndim; ++m) {
    const mt_placement *p = &a->placements[m], *q = &b->placements[m];
    if (!creates_partial(p, q)) continue;
    char from[32], to[32];
    return mt__fail(err, MT_EINVAL,
                    "Cannot redistribute %s to %s on mesh dim %d: a Partial target "
                    "needs the same Partial in the source (Partial comes from "
                    "from_local and from operators, not from redistribute)",
                    mt__placement_text(p, 0, from, sizeof from),
                    mt__placement_text(q, 0, to, sizeof to), m);
  }
  return MT_OK;
}

/* ---- Step kinds and validity. ---- */

/* The collective that turns placement `a` into `b` on one mesh dim, or -1. */
static int kind_of(const mt_placement *a, const mt_placement *b) {
  int a_shard = a->kind == MT_PLACEMENT_SHARD, b_shard = b->kind == MT_PLACEMENT_SHARD;
  int b_rep = b->kind == MT_PLACEMENT_REPLICATE;
  if (a_shard && b_rep) return MT_STEP_ALLGATHER;
  if (a_shard && b_shard && a->dim != b->dim) return MT_STEP_ALLTOALL;
  if (a->kind == MT_PLACEMENT_REPLICATE && b_shard) return MT_STEP_CHUNK;
  if (a->kind == MT_PLACEMENT_PARTIAL && b_rep) return MT_STEP_ALLREDUCE;
  if (a->kind == MT_PLACEMENT_PARTIAL && b_shard) return MT_STEP_REDUCE_SCATTER;
  return -1;
}

/* Whether changing `a` into `b` on mesh dim `m` of `src` is one valid collective:
 * every tensor dim it cuts or joins is not cut again by a later mesh dim. */
static int kind_valid(const mt_layout *src, int m, const mt_placement *a,
                      const mt_placement *b) {
  switch (kind_of(a, b)) {
    case MT_STEP_ALLGATHER:
      return inner(src, m, a->dim);
    case MT_STEP_ALLTOALL:
      return inner(src, m, a->dim) && inner(src, m, b->dim);
    case MT_STEP_CHUNK:
    case MT_STEP_REDUCE_SCATTER:
      return inner(src, m, b->dim);
    case MT_STEP_ALLREDUCE:
      return 1;
    default:
      return 0;
  }
}

int mt_step_valid(const mt_layout *src, const mt_layout *dst, int mesh_dim) {
  mt_layout a, b;
  if (src == NULL || dst == NULL) return 0;
  if (check_pair(src, dst, &a, &b, NULL) != MT_OK) return 0;
  if (mesh_dim < 0 || mesh_dim >= a.mesh_ndim) return 0;
  if (!differ_only_on(&a, &b, mesh_dim)) return 0;
  return kind_valid(&a, mesh_dim, &a.placements[mesh_dim], &b.placements[mesh_dim]);
}

/* ---- Costs. ----
 *
 * What a step moves is a sum over ranks, and what the time model needs is a
 * maximum over ranks; neither visits every rank where the boxes factor. A rank's
 * box is a product over tensor dims, and the extent along dim d depends only on
 * the coordinates of the mesh dims that shard d, which no other tensor dim
 * shares. Within one layout the dims are therefore independent, and the extents
 * along d are the leaves of its nested chunking: they partition [0, n_d) and take
 * few distinct lengths (ceil-chunking a length L gives full chunks, at most one
 * remainder and empty ones), so sums and maxima over ranks become sums and
 * maxima over those lengths. A one-mesh-dim step on mesh dim m is priced from its
 * parent layout (the source with m replicated), in which every group's boxes are
 * consecutive chunks of one parent box. Only a direct exchange, whose layouts
 * differ on several mesh dims, and a step of torch's order that is no valid
 * collective walk the coordinates of the mesh dims that shard something, with
 * each tensor dim's leaves tabulated once. */

/* Distinct leaf lengths of one tensor dim with how many leaves have each. A
 * length chunked over G gives at most two non-zero lengths (the full chunk and a
 * remainder), so each mesh dim at most doubles them: a mesh of MT_MAX_MESH_NDIM
 * dims has at most 2^MT_MAX_MESH_NDIM non-zero ones, and zero. */
#define HIST_MAX ((1 << MT_MAX_MESH_NDIM) + 1)

typedef struct hist {
  int n;
  int64_t len[HIST_MAX];
  int64_t count[HIST_MAX];
} hist;

static void hist_add(hist *h, int64_t len, int64_t count) {
  if (count == 0) return;
  for (int i = 0; i < h->n; ++i) {
    if (h->len[i] == len) {
      h->count[i] += count;
      return;
    }
  }
  assert(h->n < HIST_MAX);
  h->len[h->n] = len;
  h->count[h->n++] = count;
}

/* The leaf lengths of tensor dim `d` under `l`, as mt_chunk cuts them: of a
 * length L over G ranks, L / ceil(L / G) full chunks, one remainder if any, and
 * empty chunks for the rest. Leaf counts are products of mesh sizes: they fit. */
static void leaf_hist(const mt_layout *l, int d, hist *out) {
  out->n = 1;
  out->len[0] = l->shape[d];
  out->count[0] = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (!is_shard(&l->placements[m], d)) continue;
    int64_t g = l->mesh_shape[m];
    hist next = {0, {0}, {0}};
    for (int i = 0; i < out->n; ++i) {
      int64_t len = out->len[i], k = out->count[i];
      int64_t chunk = len / g + (len % g != 0);
      if (chunk == 0) {
        hist_add(&next, 0, k * g);
        continue;
      }
      int64_t full = len / chunk, rem = len - full * chunk;
      hist_add(&next, chunk, k * full);
      hist_add(&next, rem, rem > 0 ? k : 0);
      hist_add(&next, 0, k * (g - full - (rem > 0)));
    }
    *out = next;
  }
}

static int64_t hist_max(const hist *h) {
  int64_t top = 0;
  for (int i = 0; i < h->n; ++i) top = h->len[i] > top ? h->len[i] : top;
  return top;
}

/* Chunk i of a length over g ranks, as mt_chunk cuts it. */
static int64_t chunk_len(int64_t len, int64_t g, int64_t i) {
  int64_t chunk = len / g + (len % g != 0), start = i * chunk;
  if (start >= len) return 0;
  return len - start < chunk ? len - start : chunk;
}

/* Sum over ranks of numel(box): n_d summed over the leaves of every dim, times
 * the mesh dims that cut nothing. 0 when it does not fit. */
/* Whether `l` has no element. Pricing multiplies dims, and an empty tensor's other
 * dims may have a product beyond int64: it moves nothing, so the pricing answers
 * 0 for it before multiplying. */
static int is_empty(const mt_layout *l) {
  for (int d = 0; d < l->ndim; ++d) {
    if (l->shape[d] == 0) return 1;
  }
  return 0;
}

static int sum_numel(const mt_layout *l, int64_t *out) {
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
    hist h;
    leaf_hist(q, d, &h);
    if (!mul_ok(rest, q->shape[d], &rest)) return 0;
    top *= hist_max(&h); /* one rank's extents: they fit */
  }
  for (int k = 0; k < q->mesh_ndim; ++k) {
    if (k != m && q->placements[k].kind != MT_PLACEMENT_SHARD &&
        !mul_ok(rest, q->mesh_shape[k], &rest))
      return 0;
  }
  static const hist none = {1, {1}, {1}};
  hist ha = none, hb = none;
  if (a >= 0) leaf_hist(q, a, &ha);
  if (b >= 0) leaf_hist(q, b, &hb);
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
static int reduced_elements(const mt_layout *src, int m, int64_t *out) {
  int64_t total;
  if (!sum_numel(src, &total)) return 0;
  return mul_ok(total / src->mesh_shape[m], 2 * (src->mesh_shape[m] - 1), out);
}

/* One tensor dim of a walk: its source and target leaves (empty ones included)
 * in row-major order over the mesh dims that shard it, and for each target leaf
 * the source leaves it meets. */
typedef struct dim_leaves {
  int64_t *s_off, *s_len, *t_off, *t_len, *peers;
} dim_leaves;

/* Leaves of tensor dim `d` under `l` into off/len, refined one sharding mesh dim
 * at a time in place (a parent's children land at or after it); their count. */
static int64_t fill_leaves(const mt_layout *l, int d, int64_t *off, int64_t *len) {
  int64_t n = 1;
  off[0] = 0;
  len[0] = l->shape[d];
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (!is_shard(&l->placements[m], d)) continue;
    int64_t g = l->mesh_shape[m];
    for (int64_t j = n - 1; j >= 0; --j) {
      int64_t o = off[j], size = len[j], chunk = size / g + (size % g != 0);
      for (int64_t i = g - 1; i >= 0; --i) {
        int64_t start = i * chunk, c = start >= size ? 0 : size - start;
        off[j * g + i] = o + start;
        len[j * g + i] = c < chunk ? c : chunk;
      }
    }
    n *= g;
  }
  return n;
}

static int64_t leaf_total(const mt_layout *l, int d) {
  int64_t n = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (is_shard(&l->placements[m], d)) n *= l->mesh_shape[m];
  }
  return n;
}

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
static int walk_elements(const mt_layout *src, const mt_layout *dst, int64_t *moved,
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
    int64_t ns = leaf_total(src, d), nt = leaf_total(dst, d);
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
    int64_t ns = leaf_total(src, d), nt = leaf_total(dst, d);
    dl[j].s_off = at, dl[j].s_len = at + ns, at += 2 * ns;
    dl[j].t_off = at, dl[j].t_len = at + nt, dl[j].peers = at + 2 * nt, at += 3 * nt;
    fill_leaves(src, d, dl[j].s_off, dl[j].s_len);
    fill_leaves(dst, d, dl[j].t_off, dl[j].t_len);
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
      p *= dl[j].peers[ti[j]];
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
  return walk_elements(have, need, sum, most, ranks, NULL, NULL, err);
}

/* Elements moved from `src` to `dst`, which differ on mesh dim `m` only, neither
 * Partial there: closed form for a valid step, else a walk. */
static int moved_elements(const mt_layout *src, const mt_layout *dst, int m,
                          int64_t *out, int64_t *most, mt_error *err) {
  if (!kind_valid(src, m, &src->placements[m], &dst->placements[m]))
    return walk_elements(src, dst, out, most, NULL, NULL, NULL, err);
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
static int price_step(mt_step *st, int64_t itemsize, mt_error *err) {
  int64_t elems = 0, most = 0;
  if (st->kind == MT_STEP_CHUNK) return MT_OK;
  if (st->kind == MT_STEP_DIRECT) {
    int rc = walk_elements(&st->src, &st->dst, &elems, &most, NULL, &st->messages,
                           &st->rank_messages, err);
    if (rc == MT_OK && (!mul_ok(elems, itemsize, &st->bytes) ||
                        !mul_ok(most, itemsize, &st->rank_bytes)))
      return overflow(err);
    return rc;
  }
  int m = st->mesh_dim;
  if (st->kind == MT_STEP_ALLREDUCE) {
    if (!reduced_elements(&st->src, m, &elems)) return overflow(err);
  } else if (st->kind == MT_STEP_REDUCE_SCATTER) {
    mt_layout q;
    int a, b;
    one_dim_frame(&st->src, &st->dst, m, &q, &a, &b);
    if (!one_dim_elements(&q, m, -1, b, 1, &elems, &most)) return overflow(err);
  } else {
    int rc = moved_elements(&st->src, &st->dst, m, &elems, &most, err);
    if (rc != MT_OK) return rc;
  }
  if (!mul_ok(elems, itemsize, &st->bytes)) return overflow(err);
  /* A collective over G ranks: G - 1 messages per rank, N * (G - 1) < 2^62. */
  st->messages = mesh_numel(&st->src) * (st->src.mesh_shape[m] - 1);
  st->rank_messages = st->src.mesh_shape[m] - 1;
  int64_t vector = coll_elements(st);
  if (!mul_ok(st->kind == MT_STEP_ALLREDUCE ? vector : most, itemsize, &st->rank_bytes) ||
      !mul_ok(vector, itemsize, &st->vector_bytes))
    return overflow(err);
  return MT_OK;
}

/* ---- Local passes. ----
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

static int64_t non_empty(const hist *h) {
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
  hist fine, coarse;
  leaf_hist(src_finer ? src : dst, d, &fine);
  leaf_hist(src_finer ? dst : src, d, &coarse);
  int split = non_empty(&fine) > non_empty(&coarse);
  *cut_src = !src_finer && split;
  *cut_dst = src_finer && split;
  *wide = hist_max(&fine) > 1;
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
    int64_t ns = leaf_total(src, d), nt = leaf_total(dst, d);
    free(buf);
    buf = malloc((size_t)(2 * (ns + nt)) * sizeof *buf);
    if (buf == NULL) return mt__fail(err, MT_ENOMEM, "Out of memory pricing an exchange");
    int64_t *s_off = buf, *s_len = buf + ns, *t_off = buf + 2 * ns, *t_len = t_off + nt;
    fill_leaves(src, d, s_off, s_len);
    fill_leaves(dst, d, t_off, t_len);
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
static int price_local(mt_step *st, int64_t itemsize, mt_error *err) {
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
  } else if (st->kind == MT_STEP_ALLREDUCE) {
    st->reduce_bytes = in - in / g;
  } else {
    st->copy_bytes = rows_before(&s, st->dst.placements[m].dim) ? in : 0;
    if (!mul_ok(out, g - 1, &st->reduce_bytes)) return overflow(err);
  }
  return MT_OK;
}

/* ---- Time. ---- */

/* The collective each one-mesh-dim step kind runs. */
static int coll_of(int kind) {
  switch (kind) {
    case MT_STEP_ALLGATHER: return MT_TIME_ALLGATHER;
    case MT_STEP_ALLREDUCE: return MT_TIME_ALLREDUCE;
    case MT_STEP_REDUCE_SCATTER: return MT_TIME_REDUCE_SCATTER;
    default: return MT_TIME_ALLTOALL;
  }
}

/* A step's predicted seconds under `model`: its local passes, and its messages.
 * A direct exchange is one linear exchange over the whole mesh, on the network
 * once the mesh spans nodes; a chunk has no message. */
static double step_time(const mt_step *st, const mt_time_model *model) {
  int64_t numel = mesh_numel(&st->src);
  double local = mt_time_local(model, st->copy_bytes, st->reduce_bytes);
  if (st->kind == MT_STEP_CHUNK) return local;
  if (st->kind == MT_STEP_DIRECT) {
    int link = mt_time_link(model, numel, numel, 1);
    return local + mt_time_linear(model, st->rank_messages, st->rank_bytes, link);
  }
  int m = st->mesh_dim;
  int64_t group = st->src.mesh_shape[m], stride = 1;
  for (int k = m + 1; k < st->src.mesh_ndim; ++k) stride *= st->src.mesh_shape[k];
  int link = mt_time_link(model, numel, group, stride);
  return local + mt_time_coll(model, coll_of(st->kind), group, st->vector_bytes,
                              st->rank_bytes, link);
}

/* Sets every step's time and the list's total. */
static void set_times(step_list *list, const mt_time_model *model) {
  list->time = 0.0;
  for (int i = 0; i < list->n; ++i) {
    list->s[i].time = step_time(&list->s[i], model);
    list->time += list->s[i].time;
  }
}

/* -1 when `a` is predicted faster than `b`, 1 when slower, 0 when they tie within
 * a part in a million (the same collectives, priced alike). */
static int time_order(const step_list *a, const step_list *b) {
  double tol = 1e-6 * (a->time > b->time ? a->time : b->time);
  if (a->time < b->time - tol) return -1;
  if (a->time > b->time + tol) return 1;
  return 0;
}

/* ---- Building plans. ---- */

/* Appends the step `kind` on mesh dim `m` from `a` to `b`, priced. */
static int push_step(step_list *list, int kind, int m, const mt_layout *a,
                     const mt_layout *b, int64_t itemsize, mt_error *err) {
  assert(list->n < MAX_STEPS);
  mt_step *st = &list->s[list->n];
  memset(st, 0, sizeof *st);
  st->kind = kind;
  st->mesh_dim = m;
  st->src = *a;
  st->dst = *b;
  int rc = price_step(st, itemsize, err);
  if (rc == MT_OK) rc = price_local(st, itemsize, err);
  if (rc != MT_OK) return rc;
  if (!add_ok(list->bytes, st->bytes, &list->bytes) ||
      !add_ok(list->messages, st->messages, &list->messages))
    return overflow(err);
  ++list->n;
  return MT_OK;
}

/* Appends the one-mesh-dim step that sets placement `to` on mesh dim `m` of
 * `cur`, and advances `cur`. */
static int step_to(step_list *list, mt_layout *cur, int m, mt_placement to,
                   int64_t itemsize, mt_error *err) {
  mt_layout next = *cur;
  next.placements[m] = to;
  int kind = kind_of(&cur->placements[m], &to);
  assert(kind >= 0 && kind_valid(cur, m, &cur->placements[m], &to));
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
static int reduce_phase(step_list *list, mt_layout *cur, const mt_layout *dst,
                        int64_t itemsize, mt_error *err) {
  for (int pass = 0; pass < 2; ++pass) {
    for (int m = 0; m < cur->mesh_ndim; ++m) {
      mt_placement a = cur->placements[m], b = dst->placements[m];
      if (a.kind != MT_PLACEMENT_PARTIAL || b.kind == MT_PLACEMENT_PARTIAL) continue;
      int scatter = b.kind == MT_PLACEMENT_SHARD && kind_valid(cur, m, &a, &b);
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
static int chain_phase(step_list *list, mt_layout cur, const mt_layout *dst,
                       int64_t itemsize, int *found, mt_error *err) {
  *found = 0;
  for (int m = cur.mesh_ndim - 1; m >= 0; --m) {
    mt_placement a = cur.placements[m], b = dst->placements[m];
    if (a.kind == MT_PLACEMENT_REPLICATE || placement_eq(&a, &b)) continue;
    mt_placement to = b;
    if (b.kind != MT_PLACEMENT_SHARD || !kind_valid(&cur, m, &a, &b)) to = replicate();
    if (!kind_valid(&cur, m, &a, &to)) return MT_OK;
    int rc = step_to(list, &cur, m, to, itemsize, err);
    if (rc != MT_OK) return rc;
  }
  for (int m = 0; m < cur.mesh_ndim; ++m) {
    mt_placement a = cur.placements[m], b = dst->placements[m];
    if (placement_eq(&a, &b)) continue;
    if (!kind_valid(&cur, m, &a, &b)) return MT_OK;
    int rc = step_to(list, &cur, m, b, itemsize, err);
    if (rc != MT_OK) return rc;
  }
  *found = 1;
  return MT_OK;
}

double mt__cuts_time(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                     const mt_time_model *model) {
  mt_layout cur = *src;
  double copied = 0.0;
  if (is_empty(src)) return 0.0;
  /* chain_phase's cuts, first mesh dim first, each copying the box it keeps */
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

static int communicating_steps(const step_list *list) {
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
static int chain_wins(step_list *chain, step_list *direct, const mt_time_model *model) {
  if (chain->bytes == direct->bytes &&
      (communicating_steps(chain) <= 1 || chain->messages <= direct->messages))
    return 1;
  if (model != NULL) {
    set_times(chain, model);
    set_times(direct, model);
    int order = time_order(chain, direct);
    if (order != 0) return order < 0;
  }
  if (chain->bytes != direct->bytes) return chain->bytes < direct->bytes;
  return chain->messages <= direct->messages;
}

/* Appends the steps of `from` to `list`. */
static int append_list(step_list *list, const step_list *from, mt_error *err) {
  assert(list->n + from->n <= MAX_STEPS);
  for (int i = 0; i < from->n; ++i) list->s[list->n++] = from->s[i];
  if (!add_ok(list->bytes, from->bytes, &list->bytes) ||
      !add_ok(list->messages, from->messages, &list->messages))
    return overflow(err);
  return MT_OK;
}

/* The last direct exchange priced in one planning: the candidates of a plan
 * often price the same one (an order planned for time and again bytes first),
 * and its walk is the dearest part of planning. */
typedef struct direct_memo {
  int have;
  mt_step step;
} direct_memo;

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
static int push_direct(step_list *list, const mt_layout *cur, const mt_layout *dst,
                       int64_t itemsize, direct_memo *memo, mt_error *err) {
  if (!memo->have || !same_layout(&memo->step.src, cur) ||
      !same_layout(&memo->step.dst, dst)) {
    memo->have = 0;
    step_list one = {0};
    int rc = push_step(&one, MT_STEP_DIRECT, -1, cur, dst, itemsize, err);
    if (rc != MT_OK) return rc;
    memo->step = one.s[0];
    memo->have = 1;
  }
  assert(list->n < MAX_STEPS);
  list->s[list->n] = memo->step;
  if (!add_ok(list->bytes, memo->step.bytes, &list->bytes) ||
      !add_ok(list->messages, memo->step.messages, &list->messages))
    return overflow(err);
  ++list->n;
  return MT_OK;
}

/* The Shard/Replicate changes from `cur` to `dst`: the cheaper of the chain and
 * one direct exchange. */
static int reshard_phase(step_list *list, const mt_layout *cur, const mt_layout *dst,
                         int64_t itemsize, const mt_time_model *model, direct_memo *memo,
                         mt_error *err) {
  if (differ_only_on(cur, dst, -1)) return MT_OK;
  step_list *chain = calloc(1, sizeof *chain), *direct = calloc(1, sizeof *direct);
  if (chain == NULL || direct == NULL) {
    free(chain);
    free(direct);
    return mt__fail(err, MT_ENOMEM, "Out of memory planning a redistribution");
  }
  int found = 0, rc = chain_phase(chain, *cur, dst, itemsize, &found, err);
  if (rc == MT_OK) rc = push_direct(direct, cur, dst, itemsize, memo, err);
  if (rc == MT_OK)
    rc = append_list(list, found && chain_wins(chain, direct, model) ? chain : direct,
                     err);
  free(chain);
  free(direct);
  return rc;
}

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
static int staged(step_list *list, const mt_layout *src, const mt_layout *dst,
                  int which, int64_t itemsize, const mt_time_model *model,
                  direct_memo *memo, mt_error *err) {
  mt_layout mid = before_reducing(src, dst, which);
  int rc = reshard_phase(list, src, &mid, itemsize, model, memo, err);
  if (rc == MT_OK) rc = reduce_phase(list, &mid, dst, itemsize, err);
  if (rc == MT_OK) rc = reshard_phase(list, &mid, dst, itemsize, model, memo, err);
  return rc;
}

/* Whether candidate `b` beats `a`: a candidate moving more bytes than `limit`
 * (torch's order) never does; else the faster one, then fewer bytes, then fewer
 * messages, then fewer communicating steps; `a` wins ties. */
static int beats(step_list *b, step_list *a, int64_t limit, const mt_time_model *model) {
  if (b->bytes > limit) return 0;
  if (a->bytes > limit) return 1;
  if (model != NULL) {
    set_times(a, model);
    set_times(b, model);
    int order = time_order(b, a);
    if (order != 0) return order < 0;
  }
  if (b->bytes != a->bytes) return b->bytes < a->bytes;
  if (b->messages != a->messages) return b->messages < a->messages;
  return communicating_steps(b) < communicating_steps(a);
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

/* Whether mesh dims before `m` shard tensor dim `d` alike in `a` and `b`. */
static int same_outer_sharding(const mt_layout *a, const mt_layout *b, int m, int d) {
  for (int k = 0; k < m; ++k) {
    if (is_shard(&a->placements[k], d) != is_shard(&b->placements[k], d)) return 0;
  }
  return 1;
}

/* Bytes that torch's order moves from `src` to `dst` (torch/distributed/tensor/
 * _redistribute.py), priced as plan steps are: inner mesh dims first, each to its
 * target, or to Replicate where the mesh dims before it shard that tensor dim
 * differently in the two layouts; then outer to inner for what is left. */
static int torch_order_bytes(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                             int64_t *out, mt_error *err) {
  mt_layout cur = *src;
  int64_t total = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < cur.mesh_ndim; ++i) {
      int m = pass == 0 ? cur.mesh_ndim - 1 - i : i;
      mt_placement to = dst->placements[m];
      if (pass == 0 && to.kind == MT_PLACEMENT_SHARD &&
          !same_outer_sharding(&cur, dst, m, to.dim))
        to = replicate();
      if (placement_eq(&cur.placements[m], &to)) continue;
      mt_layout next = cur;
      next.placements[m] = to;
      int64_t elems = 0, most = 0, before, after, bytes;
      if (cur.placements[m].kind != MT_PLACEMENT_PARTIAL) {
        int rc = moved_elements(&cur, &next, m, &elems, &most, err);
        if (rc != MT_OK) return rc;
      } else if (to.kind == MT_PLACEMENT_REPLICATE) {
        if (!reduced_elements(&cur, m, &elems)) return overflow(err);
      } else {
        /* A reduce-scatter receives what the ranks' boxes shrink by. */
        if (!sum_numel(&cur, &before) || !sum_numel(&next, &after)) return overflow(err);
        elems = before - after;
      }
      if (!mul_ok(elems, itemsize, &bytes) || !add_ok(total, bytes, &total))
        return overflow(err);
      cur = next;
    }
  }
  *out = total;
  return MT_OK;
}

/* The candidates of one search: the best so far, whether there is one, and what
 * ranks them. */
typedef struct search {
  step_list *best;
  int have;
  int64_t limit;
  const mt_time_model *model;
  direct_memo direct;
} search;

/* Plans one candidate into `tmp` and keeps it in `sr` unless it is invalid,
 * moves more than the limit or does not beat the best. `which` < 0 is torch's
 * interleaved order (the chain straight from `src`, each Partial reduced on its
 * way); otherwise staged(), its shard changes chosen under `build` (NULL: bytes
 * first). */
static int offer(search *sr, step_list *tmp, const mt_layout *src, const mt_layout *dst,
                 int which, int64_t itemsize, const mt_time_model *build, mt_error *err) {
  memset(tmp, 0, sizeof *tmp);
  int found = 1, rc;
  if (which < 0)
    rc = chain_phase(tmp, *src, dst, itemsize, &found, err);
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
static int best_candidate(step_list *list, const mt_layout *src, const mt_layout *dst,
                          int64_t itemsize, const mt_time_model *model,
                          mt_error *err) {
  int64_t limit = INT64_MAX;
  int rc = torch_order_bytes(src, dst, itemsize, &limit, err);
  if (rc != MT_OK) return rc;
  step_list *tmp = malloc(sizeof *tmp);
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

/* Plans on normalised layouts, then puts the caller's size-1 labels back at the
 * ends so the steps chain exactly from `src` to `dst`. */
static int build(step_list *list, const mt_layout *src, const mt_layout *dst,
                 int64_t itemsize, const mt_time_model *model, mt_error *err) {
  mt_layout from = *src, goal = *dst;
  normalize(&from);
  normalize(&goal);
  int rc = best_candidate(list, &from, &goal, itemsize, model, err);
  set_times(list, model);
  if (rc != MT_OK || list->n == 0) return rc;
  list->s[0].src = *src;
  list->s[list->n - 1].dst = *dst;
  return MT_OK;
}

int mt_plan_create(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                   mt_plan **out, mt_error *err) {
  return mt_plan_create_timed(src, dst, itemsize, NULL, out, err);
}

int mt_plan_create_timed(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                         const mt_time_model *model, mt_plan **out, mt_error *err) {
  if (src == NULL || dst == NULL || out == NULL)
    return mt__fail(err, MT_EINVAL,
                    "The source layout, target layout and output plan are required");
  if (itemsize < 1)
    return mt__fail(err, MT_EINVAL, "The item size is %" PRId64 "; it must be >= 1",
                    itemsize);
  mt_time_model fallback = mt_time_model_default();
  if (model == NULL) model = &fallback;
  mt_layout a, b;
  int rc = mt_time_model_check(model, err);
  if (rc == MT_OK) rc = check_pair(src, dst, &a, &b, err);
  if (rc == MT_OK) rc = check_partials(&a, &b, err);
  if (rc != MT_OK) return rc;
  mt_plan *plan = calloc(1, sizeof *plan);
  if (plan == NULL) return mt__fail(err, MT_ENOMEM, "Out of memory allocating a plan");
  atomic_init(&plan->owners, 1);
  atomic_init(&plan->compiled, NULL);
  rc = build(&plan->list, &a, &b, itemsize, model, err);
  if (rc != MT_OK) {
    free(plan);
    return rc;
  }
  *out = plan;
  return MT_OK;
}

void mt_plan_retain(mt_plan *plan) {
  if (plan != NULL) atomic_fetch_add_explicit(&plan->owners, 1, memory_order_relaxed);
}

void mt_plan_destroy(mt_plan *plan) {
  if (plan == NULL) return;
  /* The last owner sees every other owner's writes (acq_rel), the compiled part's
   * destructor included. */
  if (atomic_fetch_sub_explicit(&plan->owners, 1, memory_order_acq_rel) != 1) return;
  void *compiled = atomic_load_explicit(&plan->compiled, memory_order_acquire);
  if (compiled != NULL && plan->compiled_free != NULL) plan->compiled_free(compiled);
  free(plan);
}

void *mt_plan_compiled(const mt_plan *plan) {
  return atomic_load_explicit(&((mt_plan *)plan)->compiled, memory_order_acquire);
}

int mt_plan_set_compiled(mt_plan *plan, void *data, void (*free_fn)(void *)) {
  void *none = NULL;
  if (!atomic_compare_exchange_strong_explicit(
          &plan->compiled, &none, data, memory_order_acq_rel, memory_order_acquire)) {
    return 0;
  }
  plan->compiled_free = free_fn;
  return 1;
}

int mt_plan_nsteps(const mt_plan *plan) { return plan == NULL ? 0 : plan->list.n; }

const mt_step *mt_plan_step(const mt_plan *plan, int i) {
  if (plan == NULL || i < 0 || i >= plan->list.n) return NULL;
  return &plan->list.s[i];
}

double mt_plan_predict(const mt_plan *plan, const mt_time_model *model) {
  double t = 0.0;
  for (int i = 0; plan != NULL && i < plan->list.n; ++i)
    t += step_time(&plan->list.s[i], model);
  return t;
}

double mt_plan_time(const mt_plan *plan) {
  return plan == NULL ? 0.0 : plan->list.time;
}

int64_t mt_plan_bytes(const mt_plan *plan) {
  return plan == NULL ? 0 : plan->list.bytes;
}

int64_t mt_plan_messages(const mt_plan *plan) {
  return plan == NULL ? 0 : plan->list.messages;
}

/* ---- Exchanges. ---- */

/* Which mesh dims a rank's peers may differ on. A direct exchange reaches across
 * every dim the source shards (their source boxes partition the tensor). A step
 * on one mesh dim reaches along it, except from Replicate (a chunk), where every
 * rank already holds what it keeps and takes it from itself. From Partial (a
 * reduction) recv[p] is p's contribution to this rank's box, so each element
 * arrives once from every rank of the group rather than once in all. */
static void exchange_scope(const mt_layout *src, int mesh_dim, int *scope) {
  for (int m = 0; m < src->mesh_ndim; ++m) {
    int kind = src->placements[m].kind;
    if (mesh_dim < 0)
      scope[m] = kind == MT_PLACEMENT_SHARD;
    else
      scope[m] = m == mesh_dim && kind != MT_PLACEMENT_REPLICATE;
  }
}

static int is_peer(const mt_layout *l, const int64_t *a, const int64_t *b,
                   const int *scope) {
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (!scope[m] && a[m] != b[m]) return 0;
  }
  return 1;
}

/* x ∩ y, or the empty box of `l`. */
static void meet(const mt_box *x, const mt_box *y, const mt_layout *l, mt_box *out) {
  if (!mt_box_intersect(x, y, out)) empty_box(l, out);
}

/* The src box of a rank in b's coordinates: its image under `sel`, or the box
 * itself without one. */
static void src_box(const mt_layout *a, const mt_selection *sel, const int64_t *coord,
                    mt_box *out) {
  mt_box box;
  local_box(a, coord, &box);
  if (sel == NULL)
    *out = box;
  else
    mt_selection_image(sel, &box, out);
}

/* The send and recv boxes of the rank at `coord` against every mesh rank; with a
 * selection, src boxes are mapped to b's coordinates first. */
static void fill_exchange(const mt_layout *a, const mt_selection *sel,
                          const mt_layout *b, const int64_t *coord, const int *scope,
                          mt_box *send, mt_box *recv) {
  mt_box s_me, t_me;
  src_box(a, sel, coord, &s_me);
  local_box(b, coord, &t_me);
  int64_t pc[MT_MAX_MESH_NDIM] = {0}, p = 0;
  do {
    if (is_peer(a, coord, pc, scope)) {
      mt_box s_p, t_p;
      src_box(a, sel, pc, &s_p);
      local_box(b, pc, &t_p);
      meet(&s_me, &t_p, b, &send[p]);
      meet(&s_p, &t_me, b, &recv[p]);
    } else {
      empty_box(b, &send[p]);
      empty_box(b, &recv[p]);
    }
    ++p;
  } while (next_coord(pc, a));
}

/* Checks the arguments of mt_exchange_boxes beyond the layouts themselves. */
static int check_exchange(const mt_layout *a, int mesh_dim, const int64_t *coord,
                          int64_t npeers, const int *scope, mt_error *err) {
  if (mesh_dim < -1 || mesh_dim >= a->mesh_ndim)
    return mt__fail(err, MT_EINDEX,
                    "Mesh dim %d is out of range for a %d-dim mesh (-1 means a "
                    "direct exchange)",
                    mesh_dim, a->mesh_ndim);
  if (npeers != mesh_numel(a))
    return mt__fail(err, MT_EINVAL,
                    "npeers is %" PRId64 " but the mesh has %" PRId64 " ranks", npeers,
                    mesh_numel(a));
  mt_box probe;
  int rc = mt_layout_local_box(a, coord, &probe, err);
  if (rc != MT_OK || a->ndim > 0) return rc;
  /* A 0-d box always holds its one element, so "no message" has no box. */
  for (int m = 0; m < a->mesh_ndim; ++m) {
    if (!scope[m] && a->mesh_shape[m] > 1)
      return mt__fail(err, MT_ENOTSUP,
                      "A 0-d tensor has no empty box for the ranks outside this "
                      "exchange (mesh dim %d of size %" PRId64 " is not part of it)",
                      m, a->mesh_shape[m]);
  }
  return MT_OK;
}

int mt_exchange_boxes(const mt_layout *src, const mt_layout *dst, int mesh_dim,
                      const int64_t *coord, int64_t npeers, mt_box *send, mt_box *recv,
                      mt_error *err) {
  if (src == NULL || dst == NULL || coord == NULL || send == NULL || recv == NULL)
    return mt__fail(err, MT_EINVAL,
                    "The layouts, coordinate and send and recv arrays are required");
  mt_layout a, b;
  int rc = check_pair(src, dst, &a, &b, err);
  if (rc != MT_OK) return rc;
  int scope[MT_MAX_MESH_NDIM] = {0};
  if (mesh_dim >= -1 && mesh_dim < a.mesh_ndim) exchange_scope(&a, mesh_dim, scope);
  rc = check_exchange(&a, mesh_dim, coord, npeers, scope, err);
  if (rc != MT_OK) return rc;
  fill_exchange(&a, NULL, &b, coord, scope, send, recv);
  return MT_OK;
}

/* A selection's layouts: one mesh, dst shaped as the selection, Partials kept. */
static int check_selection_pair(const mt_layout *a, const mt_selection *sel,
                                const mt_layout *b, mt_error *err) {
  int rc = mt_selection_check(sel, a->ndim, a->shape, err);
  if (rc != MT_OK) return rc;
  if (a->ndim == 0 || b->ndim != a->ndim || a->mesh_ndim != b->mesh_ndim)
    return mt__fail(err, MT_EINVAL,
                    "A selection exchange needs layouts of equal ndim (>= 1) on one "
                    "mesh; got %d and %d dims on %d- and %d-dim meshes",
                    a->ndim, b->ndim, a->mesh_ndim, b->mesh_ndim);
  for (int d = 0; d < a->ndim; ++d) {
    if (b->shape[d] != sel->count[d])
      return mt__fail(err, MT_EINVAL,
                      "The target's dim %d has size %" PRId64
                      " but the selection picks %" PRId64,
                      d, b->shape[d], sel->count[d]);
  }
  for (int m = 0; m < a->mesh_ndim; ++m) {
    const mt_placement *p = &a->placements[m], *q = &b->placements[m];
    int pa = p->kind == MT_PLACEMENT_PARTIAL, pb = q->kind == MT_PLACEMENT_PARTIAL;
    if (a->mesh_shape[m] != b->mesh_shape[m])
      return mt__fail(err, MT_EINVAL, "The layouts are on different meshes");
    if ((pa || pb) && !placement_eq(p, q))
      return mt__fail(err, MT_EINVAL,
                      "Mesh dim %d: a selection exchange keeps Partials as they are",
                      m);
  }
  return MT_OK;
}

int mt_selection_exchange_boxes(const mt_layout *src, const mt_selection *sel,
                                const mt_layout *dst, const int64_t *coord,
                                int64_t npeers, mt_box *send, mt_box *recv,
                                mt_error *err) {
  if (src == NULL || sel == NULL || dst == NULL || coord == NULL || send == NULL ||
      recv == NULL)
    return mt__fail(err, MT_EINVAL,
                    "The layouts, selection, coordinate and send and recv arrays are "
                    "required");
  mt_layout a, b;
  int rc = check_layout(src, "source", &a, err);
  if (rc == MT_OK) rc = check_layout(dst, "target", &b, err);
  if (rc == MT_OK) rc = check_selection_pair(&a, sel, &b, err);
  if (rc == MT_OK) rc = check_mesh_size(&a, err);
  if (rc != MT_OK) return rc;
  int scope[MT_MAX_MESH_NDIM] = {0};
  exchange_scope(&a, -1, scope);
  rc = check_exchange(&a, -1, coord, npeers, scope, err);
  if (rc != MT_OK) return rc;
  fill_exchange(&a, sel, &b, coord, scope, send, recv);
  return MT_OK;
}
