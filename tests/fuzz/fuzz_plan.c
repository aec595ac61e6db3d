/* libFuzzer target for layout and planning (make fuzz; built with ASan and UBSan,
 * so an out-of-bounds access or a signed overflow anywhere is a crash too).
 *
 * Each input decodes to a global shape (sizes 0 to past 2^40, so element and
 * byte counts cross 2^31 and sometimes int64), a mesh of 1 to 4 dims of size 1
 * to 64, a source and a target placement per mesh dim and an item size, and
 * checks, against brute force over every rank:
 * - the local boxes of the ranks that differ only on Shard mesh dims tile the
 *   global tensor exactly once, and replicas hold the same box;
 * - a plan chains from the source to the target, its totals are the sums of its
 *   steps, and every one-mesh-dim step is a valid collective;
 * - in every step each rank receives exactly its target box, each element once,
 *   from peers that hold it, every send matches the peer's receive, and the step's
 *   byte count is what the ranks receive (reductions: once per group member);
 * - MT_EOVERFLOW only where some count could truly pass int64, never a wrap;
 * - with the input's last bytes turning some Shards strided (core/strided.h):
 *   an expansion, and a common plain form of the two layouts, are plain layouts
 *   that tile, of the same element count, whose every rank holds as many elements
 *   as the strided layout says, and a plan joins the two common forms.
 * A broken invariant prints the case and aborts, which libFuzzer saves as a crash
 * input to replay with `build/fuzz/fuzz_plan CRASHFILE`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/strided.h"

/* Brute force is O(ranks^2) per step: meshes above these sizes are only planned
 * (which visits every rank once per priced step), or not checked by pairs. */
#define PLAN_MAX_RANKS 4096
#define TILE_MAX_RANKS 1024
#define EXCHANGE_MAX_RANKS 128

typedef __int128 wide;

typedef struct input {
  const uint8_t *p;
  size_t n;
} input;

static void fail(const char *what, const mt_layout *a, const mt_layout *b) {
  fprintf(stderr, "fuzz_plan: %s\n", what);
  const mt_layout *ls[2] = {a, b};
  for (int i = 0; i < 2 && ls[i] != NULL; ++i) {
    const mt_layout *l = ls[i];
    fprintf(stderr, "  layout %d: shape", i);
    for (int d = 0; d < l->ndim; ++d) fprintf(stderr, " %lld", (long long)l->shape[d]);
    fprintf(stderr, "; mesh");
    for (int m = 0; m < l->mesh_ndim; ++m)
      fprintf(stderr, " %lld:%d/%d/%d", (long long)l->mesh_shape[m],
              l->placements[m].kind, l->placements[m].dim, l->placements[m].reduce_op);
    fprintf(stderr, "\n");
  }
  abort();
}

#define EXPECT(cond, a, b) \
  do {                     \
    if (!(cond)) fail(#cond, a, b); \
  } while (0)

static unsigned take(input *in, unsigned mod) {
  if (in->n == 0) return 0;
  unsigned v = *in->p++;
  in->n--;
  return v % mod;
}

/* Mostly small sizes (where boxes go empty and chunks run short), sometimes ones
 * just past 2^31 or 2^32, and rarely ones that make the element count overflow. */
static int64_t take_size(input *in) {
  static const int64_t big[] = {(int64_t)1 << 31, ((int64_t)1 << 31) + 1,
                                ((int64_t)1 << 32) + 3, (int64_t)1 << 40,
                                INT64_MAX / 3};
  unsigned k = take(in, 16);
  if (k < 12) return (int64_t)take(in, 10);
  return big[(k - 12 + take(in, 2)) % 5];
}

static mt_placement take_placement(input *in, int ndim, int allow_partial) {
  mt_placement p = {MT_PLACEMENT_REPLICATE, 0, 0, 0};
  unsigned k = take(in, allow_partial ? 4 : 3);
  if (k >= 1 && k <= 2 && ndim > 0) p.kind = MT_PLACEMENT_SHARD, p.dim = (int)take(in, (unsigned)ndim);
  if (k == 3) p.kind = MT_PLACEMENT_PARTIAL, p.reduce_op = (int)take(in, MT_REDUCE_COUNT);
  return p;
}

static wide wide_numel(int ndim, const int64_t *shape) {
  wide n = 1;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) return 0;
  }
  for (int d = 0; d < ndim && n <= (wide)INT64_MAX; ++d) n *= shape[d];
  return n;
}

static int64_t mesh_numel(const mt_layout *l) {
  int64_t n = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) n *= l->mesh_shape[m];
  return n;
}

static void coord_of(const mt_layout *l, int64_t r, int64_t *coord) {
  for (int m = l->mesh_ndim - 1; m >= 0; --m) {
    coord[m] = r % l->mesh_shape[m];
    r /= l->mesh_shape[m];
  }
}

static void box_of(const mt_layout *l, int64_t r, mt_box *out) {
  int64_t coord[MT_MAX_MESH_NDIM];
  coord_of(l, r, coord);
  EXPECT(mt_layout_local_box(l, coord, out, NULL) == MT_OK, l, NULL);
}

static int box_eq(const mt_box *a, const mt_box *b) {
  if (a->ndim != b->ndim) return 0;
  if (mt_box_numel(a) == 0 && mt_box_numel(b) == 0) return 1;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->offset[d] != b->offset[d] || a->shape[d] != b->shape[d]) return 0;
  }
  return 1;
}

static int box_inside(const mt_box *in, const mt_box *outer) {
  if (mt_box_numel(in) == 0) return 1;
  for (int d = 0; d < in->ndim; ++d) {
    if (in->offset[d] < outer->offset[d] ||
        in->offset[d] + in->shape[d] > outer->offset[d] + outer->shape[d])
      return 0;
  }
  return 1;
}

/* `n` boxes inside `whole` cover it exactly once: volumes add up, no two meet. */
static int tiles(const mt_box *boxes, int64_t n, const mt_box *whole) {
  wide sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!box_inside(&boxes[i], whole)) return 0;
    sum += mt_box_numel(&boxes[i]);
  }
  if (sum != mt_box_numel(whole)) return 0;
  for (int64_t i = 0; i < n; ++i) {
    mt_box x;
    for (int64_t j = i + 1; j < n; ++j) {
      if (mt_box_intersect(&boxes[i], &boxes[j], &x)) return 0;
    }
  }
  return 1;
}

/* Rank r's replica group: the ranks sharing its coordinate on every mesh dim
 * that does not shard. */
static int same_group(const mt_layout *l, int64_t r, int64_t q) {
  int64_t a[MT_MAX_MESH_NDIM], b[MT_MAX_MESH_NDIM];
  coord_of(l, r, a);
  coord_of(l, q, b);
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (l->placements[m].kind != MT_PLACEMENT_SHARD && a[m] != b[m]) return 0;
  }
  return 1;
}

static void check_tiling(const mt_layout *l, mt_box *buf) {
  int64_t n = mesh_numel(l);
  if (n > TILE_MAX_RANKS) return;
  mt_box whole = {.ndim = l->ndim};
  for (int d = 0; d < l->ndim; ++d) whole.shape[d] = l->shape[d];
  /* The group of rank 0 tiles the tensor, and every rank holds the box of its
   * counterpart in that group (same Shard coordinates), so every group does. */
  int64_t k = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (same_group(l, r, 0)) box_of(l, r, &buf[k++]);
  }
  EXPECT(tiles(buf, k, &whole), l, NULL);
  int64_t a[MT_MAX_MESH_NDIM];
  for (int64_t r = 0; r < n; ++r) {
    mt_box mine, rep;
    coord_of(l, r, a);
    for (int m = 0; m < l->mesh_ndim; ++m) {
      if (l->placements[m].kind != MT_PLACEMENT_SHARD) a[m] = 0;
    }
    box_of(l, r, &mine);
    EXPECT(mt_layout_local_box(l, a, &rep, NULL) == MT_OK, l, NULL);
    EXPECT(box_eq(&mine, &rep), l, NULL);
  }
}

/* The case decoded from the input; 0 when the input ends too early to matter. */
static int decode(input *in, mt_layout *src, mt_layout *dst, int64_t *itemsize) {
  int ndim = (int)take(in, 5);
  int64_t shape[MT_MAX_NDIM], mesh[MT_MAX_MESH_NDIM];
  for (int d = 0; d < ndim; ++d) shape[d] = take_size(in);
  int mesh_ndim = 1 + (int)take(in, 4);
  for (int m = 0; m < mesh_ndim; ++m) mesh[m] = 1 + take(in, 64);
  mt_placement ps[MT_MAX_MESH_NDIM], pd[MT_MAX_MESH_NDIM];
  for (int m = 0; m < mesh_ndim; ++m) ps[m] = take_placement(in, ndim, 1);
  for (int m = 0; m < mesh_ndim; ++m) {
    /* Mostly a Partial target keeps the source's, the one valid way to have it. */
    pd[m] = take_placement(in, ndim, 0);
    if (ps[m].kind == MT_PLACEMENT_PARTIAL && take(in, 3) == 0) pd[m] = ps[m];
  }
  static const int64_t sizes[] = {1, 2, 4, 8, 16, (int64_t)1 << 20};
  *itemsize = sizes[take(in, 6)];
  mt_error err;
  int rc = mt_layout_init(src, ndim, shape, mesh_ndim, mesh, ps, &err);
  int overflows = wide_numel(ndim, shape) > (wide)INT64_MAX;
  EXPECT((rc == MT_EOVERFLOW) == overflows, NULL, NULL);
  if (rc != MT_OK) return 0;
  EXPECT(mt_layout_init(dst, ndim, shape, mesh_ndim, mesh, pd, &err) == MT_OK, src, NULL);
  return mesh_numel(src) <= PLAN_MAX_RANKS;
}

static int placement_eq(const mt_placement *a, const mt_placement *b) {
  if (a->kind != b->kind) return 0;
  if (a->kind == MT_PLACEMENT_SHARD) return a->dim == b->dim;
  if (a->kind == MT_PLACEMENT_PARTIAL) return a->reduce_op == b->reduce_op;
  return 1;
}

static int layout_eq(const mt_layout *a, const mt_layout *b) {
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

/* Redistribution never creates a Partial: the one error a valid pair may get
 * (MT_ESTATE, as mt_plan_check refuses it). */
static int partial_target_refused(const mt_layout *src, const mt_layout *dst) {
  for (int m = 0; m < src->mesh_ndim; ++m) {
    const mt_placement *p = &src->placements[m], *q = &dst->placements[m];
    if (q->kind == MT_PLACEMENT_PARTIAL && !placement_eq(p, q)) return 1;
  }
  return 0;
}

/* Whether torch's order could move more bytes than int64 counts, the only case in
 * which a plan may be refused as an overflow (within it, torch's order is itself a
 * candidate): in each step every rank receives at most the whole tensor twice over
 * (the ring all-reduce model), and the order visits each mesh dim at most twice. */
static int may_overflow(const mt_layout *l, int64_t itemsize) {
  wide bound = wide_numel(l->ndim, l->shape) * itemsize * 2 * mesh_numel(l) * 2 * l->mesh_ndim;
  return bound > (wide)INT64_MAX;
}

static void check_chain(const mt_plan *plan, const mt_layout *src, const mt_layout *dst) {
  int n = mt_plan_nsteps(plan);
  wide bytes = 0, messages = 0;
  for (int i = 0; i < n; ++i) {
    const mt_step *st = mt_plan_step(plan, i);
    EXPECT(layout_eq(&st->src, i == 0 ? src : &mt_plan_step(plan, i - 1)->dst), src, dst);
    EXPECT(st->bytes >= 0 && st->messages >= 0, src, dst);
    if (st->mesh_dim >= 0) EXPECT(mt_step_valid(&st->src, &st->dst, st->mesh_dim), src, dst);
    bytes += st->bytes;
    messages += st->messages;
  }
  if (n > 0) EXPECT(layout_eq(&mt_plan_step(plan, n - 1)->dst, dst), src, dst);
  EXPECT(bytes == mt_plan_bytes(plan) && messages == mt_plan_messages(plan), src, dst);
}

/* An empty plan: every rank already holds its target box (and any Partial). */
static void check_nothing_to_do(const mt_layout *src, const mt_layout *dst) {
  int64_t n = mesh_numel(src);
  if (n > TILE_MAX_RANKS) return;
  for (int64_t r = 0; r < n; ++r) {
    mt_box a, b;
    box_of(src, r, &a);
    box_of(dst, r, &b);
    EXPECT(box_eq(&a, &b), src, dst);
  }
  for (int m = 0; m < src->mesh_ndim; ++m) {
    int pa = src->placements[m].kind == MT_PLACEMENT_PARTIAL;
    int pb = dst->placements[m].kind == MT_PLACEMENT_PARTIAL;
    EXPECT(src->mesh_shape[m] == 1 || pa == pb, src, dst);
  }
}

/* Whether ranks r and q share their coordinate on every mesh dim but `m`. */
static int along(const mt_layout *l, int m, int64_t r, int64_t q) {
  int64_t a[MT_MAX_MESH_NDIM], b[MT_MAX_MESH_NDIM];
  coord_of(l, r, a);
  coord_of(l, q, b);
  for (int k = 0; k < l->mesh_ndim; ++k) {
    if (k != m && a[k] != b[k]) return 0;
  }
  return 1;
}

/* A reduction: rank r receives its whole target box from every member of its
 * group along the step's mesh dim (itself included), nothing from anyone else. */
static void check_reduction(const mt_step *st, int64_t n, const mt_box *recv) {
  for (int64_t r = 0; r < n; ++r) {
    mt_box t;
    box_of(&st->dst, r, &t);
    for (int64_t p = 0; p < n; ++p) {
      const mt_box *b = &recv[r * n + p];
      if (along(&st->src, st->mesh_dim, r, p))
        EXPECT(box_eq(b, &t), &st->src, &st->dst);
      else
        EXPECT(mt_box_numel(b) == 0, &st->src, &st->dst);
    }
  }
}

/* A move: rank r's receives tile its target box, each comes from what the sender
 * holds and is what the sender sends, and the received bytes are the step's. */
static void check_move(const mt_step *st, int64_t n, int64_t itemsize,
                       const mt_box *send, const mt_box *recv) {
  wide bytes = 0;
  for (int64_t r = 0; r < n; ++r) {
    mt_box t;
    box_of(&st->dst, r, &t);
    EXPECT(tiles(&recv[r * n], n, &t), &st->src, &st->dst);
    for (int64_t p = 0; p < n; ++p) {
      mt_box s;
      box_of(&st->src, p, &s);
      EXPECT(box_inside(&recv[r * n + p], &s), &st->src, &st->dst);
      EXPECT(box_eq(&recv[r * n + p], &send[p * n + r]), &st->src, &st->dst);
      if (p != r) bytes += (wide)mt_box_numel(&recv[r * n + p]) * itemsize;
    }
  }
  EXPECT(bytes == st->bytes, &st->src, &st->dst);
}

static void check_exchanges(const mt_plan *plan, int64_t itemsize) {
  const mt_step *first = mt_plan_step(plan, 0);
  int64_t n = first == NULL ? 0 : mesh_numel(&first->src);
  if (n == 0 || n > EXCHANGE_MAX_RANKS || first->src.ndim == 0) return;
  mt_box *send = malloc((size_t)(n * n) * sizeof *send);
  mt_box *recv = malloc((size_t)(n * n) * sizeof *recv);
  if (send == NULL || recv == NULL) abort();
  for (int i = 0; i < mt_plan_nsteps(plan); ++i) {
    const mt_step *st = mt_plan_step(plan, i);
    for (int64_t r = 0; r < n; ++r) {
      int64_t coord[MT_MAX_MESH_NDIM];
      coord_of(&st->src, r, coord);
      int rc = mt_exchange_boxes(&st->src, &st->dst, st->mesh_dim, coord, n,
                                 &send[r * n], &recv[r * n], NULL);
      EXPECT(rc == MT_OK, &st->src, &st->dst);
    }
    int reduces = st->mesh_dim >= 0 &&
                  st->src.placements[st->mesh_dim].kind == MT_PLACEMENT_PARTIAL;
    if (reduces)
      check_reduction(st, n, recv);
    else
      check_move(st, n, itemsize, send, recv);
  }
  free(send);
  free(recv);
}

static void check_plan(const mt_layout *src, const mt_layout *dst, int64_t itemsize) {
  mt_plan *plan = NULL;
  mt_error err;
  int rc = mt_plan_create(src, dst, itemsize, &plan, &err);
  if (partial_target_refused(src, dst)) {
    EXPECT(rc == MT_ESTATE, src, dst);
    return;
  }
  if (rc == MT_EOVERFLOW) {
    EXPECT(may_overflow(src, itemsize), src, dst);
    return;
  }
  EXPECT(rc == MT_OK, src, dst);
  check_chain(plan, src, dst);
  if (mt_plan_nsteps(plan) == 0) check_nothing_to_do(src, dst);
  check_exchanges(plan, itemsize);
  mt_plan_destroy(plan);
}

/* `l` with some Shards made strided by the input (split factors small, or one
 * past 2^30); 0 when none is. */
static int take_strided(input *in, const mt_layout *l, mt_layout *out) {
  static const int factors[] = {1, 2, 3, 4, 6, 8, 12, (1 << 30) + 1};
  mt_placement p[MT_MAX_MESH_NDIM];
  int any = 0;
  for (int m = 0; m < l->mesh_ndim; ++m) {
    p[m] = l->placements[m];
    if (p[m].kind == MT_PLACEMENT_SHARD && take(in, 2) == 0) {
      p[m].kind = MT_PLACEMENT_STRIDED, p[m].split_factor = factors[take(in, 8)], any = 1;
    }
  }
  EXPECT(mt_strided_init(out, l->ndim, l->shape, l->mesh_ndim, l->mesh_shape, p, NULL) ==
             MT_OK, l, NULL);
  return any;
}

/* Every rank of plain `e` holds as many elements as strided `l` says it holds. */
static void check_counts(const mt_layout *l, const mt_layout *e) {
  int64_t n = mesh_numel(l);
  if (n > TILE_MAX_RANKS) return;
  for (int64_t r = 0; r < n; ++r) {
    int64_t coord[MT_MAX_MESH_NDIM];
    coord_of(l, r, coord);
    mt_box a, b;
    EXPECT(mt_strided_local_box(l, coord, &a, NULL) == MT_OK, l, e);
    EXPECT(mt_layout_local_box(e, coord, &b, NULL) == MT_OK, l, e);
    EXPECT(wide_numel(a.ndim, a.shape) == wide_numel(b.ndim, b.shape), l, e);
  }
}

/* An expansion and a common plain form are plain layouts of the same elements. */
static void check_strided(input *in, const mt_layout *src, const mt_layout *dst,
                          int64_t itemsize) {
  mt_layout a, b, e, ra, rb;
  int group[MT_MAX_NDIM + 1];
  int sa = take_strided(in, src, &a), sb = take_strided(in, dst, &b);
  if (!sa && !sb) return;
  mt_box *buf = malloc(TILE_MAX_RANKS * sizeof *buf);
  if (buf == NULL) abort();
  int rc = mt_strided_expand(&a, &e, group, NULL);
  EXPECT(rc == MT_OK || rc == MT_EINVAL, &a, NULL);
  if (rc == MT_OK) {
    EXPECT(wide_numel(e.ndim, e.shape) == wide_numel(a.ndim, a.shape), &a, &e);
    EXPECT(group[a.ndim] == e.ndim, &a, &e);
    check_tiling(&e, buf);
    check_counts(&a, &e);
  }
  rc = mt_strided_refine(&a, &b, &ra, &rb, NULL);
  EXPECT(rc == MT_OK || rc == MT_EINVAL, &a, &b);
  if (rc == MT_OK) {
    EXPECT(ra.ndim == rb.ndim && wide_numel(ra.ndim, ra.shape) == wide_numel(a.ndim, a.shape),
           &ra, &rb);
    check_tiling(&ra, buf);
    check_tiling(&rb, buf);
    check_counts(&a, &ra);
    check_counts(&b, &rb);
    check_plan(&ra, &rb, itemsize);
  }
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  input in = {data, size};
  mt_layout src, dst;
  int64_t itemsize;
  if (!decode(&in, &src, &dst, &itemsize)) return 0;
  mt_box *buf = malloc(TILE_MAX_RANKS * sizeof *buf);
  if (buf == NULL) abort();
  check_tiling(&src, buf);
  check_tiling(&dst, buf);
  free(buf);
  check_plan(&src, &dst, itemsize);
  check_strided(&in, &src, &dst, itemsize);
  return 0;
}
