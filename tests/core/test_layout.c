/* Layout math: worked examples, an exhaustive comparison with an independent
 * brute-force model of nested torch.chunk sharding, tiling, and error paths.
 * MT_TEST_QUICK=1 sweeps fewer 2-d shapes, for valgrind. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "boxes.h"
#include "check.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"

static mt_placement R(void) { return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0}; }
static mt_placement P(int op) { return (mt_placement){MT_PLACEMENT_PARTIAL, 0, op, 0}; }
static mt_placement S(int dim) { return (mt_placement){MT_PLACEMENT_SHARD, dim, 0, 0}; }

/* The box of `coord`, or a box with ndim -1 when the call fails. */
static mt_box box_at(const mt_layout *l, const int64_t *coord) {
  mt_box b;
  memset(&b, 0, sizeof b);
  if (mt_layout_local_box(l, coord, &b, NULL) != MT_OK) b.ndim = -1;
  return b;
}

static void test_chunk(void) {
  const int64_t want10[4] = {3, 3, 3, 1}, off10[4] = {0, 3, 6, 9};
  const int64_t want5[4] = {2, 2, 1, 0}, off5[4] = {0, 2, 4, 5};
  for (int64_t i = 0; i < 4; ++i) {
    int64_t size = -1, offset = -1;
    mt_chunk(10, 4, i, &size, &offset);
    CHECK(size == want10[i] && offset == off10[i]);
    mt_chunk(5, 4, i, &size, &offset);
    CHECK(size == want5[i] && offset == off5[i]);
  }
  int64_t size = -1, offset = -1;
  mt_chunk(0, 3, 2, &size, &offset);
  CHECK(size == 0 && offset == 0);
  mt_chunk(1, 1, 0, &size, &offset);
  CHECK(size == 1 && offset == 0);
  /* 6 on 4: chunks of 2 run out after three ranks. */
  mt_chunk(6, 4, 3, &size, &offset);
  CHECK(size == 0 && offset == 6);
  /* Near INT64_MAX nothing may overflow. */
  mt_chunk(INT64_MAX, 2, 1, &size, &offset);
  CHECK(offset == (INT64_C(1) << 62) && size == (INT64_C(1) << 62) - 1);
  mt_chunk(INT64_MAX, INT64_MAX, INT64_MAX - 1, &size, &offset);
  CHECK(size == 1 && offset == INT64_MAX - 1);
  mt_chunk(5, INT64_MAX, INT64_MAX - 1, &size, &offset);
  CHECK(size == 0 && offset == 5);
}

/* One tensor dim on a 1-d mesh of `k` ranks. */
static void check_1d(int64_t n, int64_t k, const int64_t *sizes,
                     const int64_t *offsets) {
  mt_layout l;
  mt_placement pl[1] = {S(0)};
  CHECK(mt_layout_init(&l, 1, &n, 1, &k, pl, NULL) == MT_OK);
  for (int64_t c = 0; c < k; ++c) {
    mt_box b = box_at(&l, &c);
    CHECK_MSG(b.ndim == 1 && b.shape[0] == sizes[c] && b.offset[0] == offsets[c],
              "n=%lld k=%lld coord %lld: got (%lld @ %lld)", (long long)n,
              (long long)k, (long long)c, (long long)b.shape[0],
              (long long)b.offset[0]);
  }
}

static void test_worked_examples(void) {
  check_1d(10, 4, (const int64_t[]){3, 3, 3, 1}, (const int64_t[]){0, 3, 6, 9});
  check_1d(5, 4, (const int64_t[]){2, 2, 1, 0}, (const int64_t[]){0, 2, 4, 5});
  check_1d(0, 2, (const int64_t[]){0, 0}, (const int64_t[]){0, 0});

  const int64_t mesh[2] = {2, 2};
  const int64_t coords[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  mt_layout l;
  mt_placement ss[2] = {S(0), S(0)};
  CHECK(mt_layout_init(&l, 2, (const int64_t[]){5, 3}, 2, mesh, ss, NULL) == MT_OK);
  const int64_t rows[4] = {2, 1, 1, 1}, starts[4] = {0, 2, 3, 4};
  for (int i = 0; i < 4; ++i) {
    mt_box b = box_at(&l, coords[i]);
    CHECK(b.ndim == 2 && b.shape[0] == rows[i] && b.offset[0] == starts[i]);
    CHECK(b.shape[1] == 3 && b.offset[1] == 0);
  }

  mt_placement s01[2] = {S(0), S(1)};
  CHECK(mt_layout_init(&l, 2, (const int64_t[]){31, 3}, 2, mesh, s01, NULL) == MT_OK);
  const int64_t want[4][2] = {{16, 2}, {16, 1}, {15, 2}, {15, 1}};
  const int64_t woff[4][2] = {{0, 0}, {0, 2}, {16, 0}, {16, 2}};
  for (int i = 0; i < 4; ++i) {
    mt_box b = box_at(&l, coords[i]);
    CHECK(b.ndim == 2 && b.shape[0] == want[i][0] && b.shape[1] == want[i][1]);
    CHECK(b.offset[0] == woff[i][0] && b.offset[1] == woff[i][1]);
  }

  /* A 0-d tensor is one element on every rank. */
  mt_placement rp[2] = {R(), P(MT_REDUCE_SUM)};
  CHECK(mt_layout_init(&l, 0, NULL, 2, mesh, rp, NULL) == MT_OK);
  mt_box b = box_at(&l, coords[3]);
  CHECK(b.ndim == 0 && mt_box_numel(&b) == 1);
}

/* ---- Brute-force reference, sharing nothing with layout.c but the structs. ---- */

#define REF_MAX 64

/* Cuts `list` (length *len) into torch.chunk pieces for `k` ranks and keeps piece
 * `i` in place: pieces hold the smallest c with c * k >= len, the last ones short,
 * and a rank past the end of the list gets nothing. */
static void ref_cut(int64_t *list, int64_t *len, int64_t k, int64_t i) {
  int64_t c = 0;
  while (c * k < *len) ++c;
  int64_t kept = 0;
  for (int64_t j = i * c; j < (i + 1) * c && j < *len; ++j) list[kept++] = list[j];
  *len = kept;
}

/* The reference box of `coord`: per tensor dim, the surviving index list, which
 * must be a run of consecutive indices for a box to describe it (else ndim -2). */
static void ref_box(int ndim, const int64_t *shape, int mesh_ndim, const int64_t *mesh,
                    const mt_placement *pl, const int64_t *coord, mt_box *out) {
  out->ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    int64_t list[REF_MAX], len = shape[d];
    for (int64_t j = 0; j < len; ++j) list[j] = j;
    for (int m = 0; m < mesh_ndim; ++m) {
      if (pl[m].kind == MT_PLACEMENT_SHARD && pl[m].dim == d)
        ref_cut(list, &len, mesh[m], coord[m]);
    }
    for (int64_t j = 1; j < len; ++j) {
      if (list[j] != list[j - 1] + 1) out->ndim = -2;
    }
    out->offset[d] = len > 0 ? list[0] : shape[d];
    out->shape[d] = len;
  }
}

static int same_box(const mt_box *a, const mt_box *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->offset[d] != b->offset[d] || a->shape[d] != b->shape[d]) return 0;
  }
  return 1;
}

/* Advances a mixed-radix counter; returns 0 once it wraps back to all zeros. */
static int next_index(int64_t *idx, const int64_t *radix, int n) {
  for (int i = n - 1; i >= 0; --i) {
    if (++idx[i] < radix[i]) return 1;
    idx[i] = 0;
  }
  return 0;
}

/* Adds one to every element of `box` in a row-major count array of `shape`, a
 * row of the innermost dim at a time. */
static void cover(int *count, int ndim, const int64_t *shape, const mt_box *box) {
  if (mt_box_numel(box) == 0) return;
  int64_t idx[MT_MAX_NDIM] = {0};
  int64_t inner = box->shape[ndim - 1];
  do {
    int64_t flat = 0;
    for (int d = 0; d < ndim; ++d) flat = flat * shape[d] + box->offset[d] + idx[d];
    for (int64_t j = 0; j < inner; ++j) ++count[flat + j];
  } while (next_index(idx, box->shape, ndim - 1));
}

static long sweep_layouts = 0;

/* Every coordinate of one (shape, mesh, placements) against the reference, then
 * the tiling: each element is held once per replica group. */
static void sweep_one(int ndim, const int64_t *shape, int mesh_ndim,
                      const int64_t *mesh, const mt_placement *pl) {
  mt_layout l;
  int rc = mt_layout_init(&l, ndim, shape, mesh_ndim, mesh, pl, NULL);
  CHECK(rc == MT_OK);
  if (rc != MT_OK) return;
  ++sweep_layouts;
  static int count[REF_MAX * REF_MAX];
  int64_t numel = 1, replicas = 1;
  for (int d = 0; d < ndim; ++d) numel *= shape[d];
  for (int m = 0; m < mesh_ndim; ++m)
    if (pl[m].kind != MT_PLACEMENT_SHARD) replicas *= mesh[m];
  memset(count, 0, (size_t)numel * sizeof count[0]);
  int64_t coord[MT_MAX_MESH_NDIM] = {0};
  do {
    mt_box got, want;
    rc = mt_layout_local_box(&l, coord, &got, NULL);
    ref_box(ndim, shape, mesh_ndim, mesh, pl, coord, &want);
    if (rc != MT_OK || !same_box(&got, &want)) {
      CHECK_MSG(0, "ndim %d shape[0] %lld mesh_ndim %d coord[0] %lld", ndim,
                (long long)shape[0], mesh_ndim, (long long)coord[0]);
      return;
    }
    cover(count, ndim, shape, &got);
  } while (next_index(coord, mesh, mesh_ndim));
  int tiled = 1;
  for (int64_t i = 0; i < numel; ++i) tiled &= count[i] == replicas;
  CHECK(tiled);
}

/* Every placement combination over every mesh of `mesh_ndim` dims, sizes 1..5. */
static void sweep_shape(int ndim, const int64_t *shape, int mesh_ndim) {
  const int64_t kinds = 2 + ndim;
  int64_t mesh[MT_MAX_MESH_NDIM], mesh_idx[MT_MAX_MESH_NDIM] = {0};
  int64_t five[MT_MAX_MESH_NDIM], kind_radix[MT_MAX_MESH_NDIM];
  for (int m = 0; m < mesh_ndim; ++m) five[m] = 5, kind_radix[m] = kinds;
  do {
    for (int m = 0; m < mesh_ndim; ++m) mesh[m] = mesh_idx[m] + 1;
    int64_t kind_idx[MT_MAX_MESH_NDIM] = {0};
    do {
      mt_placement pl[MT_MAX_MESH_NDIM];
      for (int m = 0; m < mesh_ndim; ++m)
        pl[m] = kind_idx[m] == 0   ? R()
                : kind_idx[m] == 1 ? P(MT_REDUCE_SUM)
                                   : S((int)kind_idx[m] - 2);
      sweep_one(ndim, shape, mesh_ndim, mesh, pl);
    } while (next_index(kind_idx, kind_radix, mesh_ndim));
  } while (next_index(mesh_idx, five, mesh_ndim));
}

/* Under valgrind (MT_TEST_QUICK=1) the 2-d shapes take each kind of extent against
 * meshes of 1..5: empty, 1, below, at and above the largest mesh dim, uneven. */
static int quick = 0;

static int swept_extent(int64_t n) {
  return !quick || n == 0 || n == 1 || n == 2 || n == 3 || n == 5 || n == 7;
}

static void test_sweep(void) {
  for (int mesh_ndim = 1; mesh_ndim <= 3; ++mesh_ndim) {
    for (int64_t a = 0; a <= 9; ++a) {
      sweep_shape(1, &a, mesh_ndim);
      for (int64_t b = 0; b <= 9; ++b)
        if (swept_extent(a) && swept_extent(b))
          sweep_shape(2, (const int64_t[]){a, b}, mesh_ndim);
    }
  }
  static const int64_t shapes3[][3] = {{3, 4, 5}, {0, 2, 3}, {7, 1, 6}, {2, 2, 2},
                                       {5, 0, 1}, {1, 1, 1}, {9, 3, 2}, {4, 6, 0}};
  for (int mesh_ndim = 1; mesh_ndim <= 2; ++mesh_ndim) {
    for (size_t i = 0; i < sizeof shapes3 / sizeof shapes3[0]; ++i)
      sweep_shape(3, shapes3[i], mesh_ndim);
  }
  /* A single 3-d mesh pass over one awkward 3-d shape. */
  sweep_shape(3, (const int64_t[]){7, 5, 3}, 3);
}

/* ---- Errors. ---- */

/* mt_layout_init fails with `want`, fills `err` and leaves `out` alone. */
static void check_init_fails(int want, int ndim, const int64_t *shape, int mesh_ndim,
                             const int64_t *mesh, const mt_placement *pl) {
  mt_layout out, before;
  memset(&out, 0xAB, sizeof out);
  before = out;
  mt_error err = {0, ""};
  int rc = mt_layout_init(&out, ndim, shape, mesh_ndim, mesh, pl, &err);
  CHECK_MSG(rc == want, "got %s, want %s", mt_status_name(rc), mt_status_name(want));
  CHECK(err.code == want && err.msg[0] != '\0');
  CHECK(memcmp(&out, &before, sizeof out) == 0);
  CHECK(mt_layout_init(&out, ndim, shape, mesh_ndim, mesh, pl, NULL) == want);
}

/* The message a Python user sees, and `out` left alone. */
static void test_init_message(void) {
  const int64_t shape[2] = {4, 6}, mesh[2] = {2, 3};
  mt_placement s2[2] = {S(2), R()};
  mt_layout out, before;
  memset(&out, 0x5A, sizeof out);
  before = out;
  mt_error err = {0, ""};
  CHECK(mt_layout_init(&out, 2, shape, 2, mesh, s2, &err) == MT_EINDEX);
  CHECK(strcmp(err.msg, "Shard(dim=2) on mesh dim 0 is out of range for a tensor "
                        "with 2 dims") == 0);
  CHECK(memcmp(&out, &before, sizeof out) == 0);
}

static void test_init_placement_errors(void) {
  const int64_t shape[2] = {4, 6}, mesh[2] = {2, 3};
  const mt_placement bad_op[2] = {R(), P(MT_REDUCE_COUNT)};
  const mt_placement neg_op[2] = {P(-1), R()};
  const mt_placement bad_kind[2] = {{7, 0, 0, 0}, R()};
  check_init_fails(MT_EINDEX, 2, shape, 2, mesh, (mt_placement[]){R(), S(-1)});
  check_init_fails(MT_EINDEX, 0, NULL, 1, mesh, (mt_placement[]){S(0)});
  check_init_fails(MT_EINVAL, 2, shape, 2, mesh, bad_op);
  check_init_fails(MT_EINVAL, 2, shape, 2, mesh, neg_op);
  check_init_fails(MT_EINVAL, 2, shape, 2, mesh, bad_kind);
  check_init_fails(MT_EINVAL, 2, shape, 1, mesh, NULL);
}

static void test_init_shape_errors(void) {
  const int64_t shape[2] = {4, 6}, mesh[2] = {2, 3};
  const int64_t neg[2] = {4, -1}, zero_mesh[2] = {2, 0}, neg_mesh[2] = {-3, 1};
  const int64_t too_many[2] = {INT64_C(1) << 32, INT64_C(1) << 31};
  int64_t ones[MT_MAX_NDIM + 1];
  mt_placement rs[MT_MAX_MESH_NDIM + 1];
  for (int d = 0; d <= MT_MAX_NDIM; ++d) ones[d] = 1;
  for (int m = 0; m <= MT_MAX_MESH_NDIM; ++m) rs[m] = R();
  check_init_fails(MT_EINVAL, 2, neg, 2, mesh, rs);
  check_init_fails(MT_EINVAL, 2, shape, 2, zero_mesh, rs);
  check_init_fails(MT_EINVAL, 2, shape, 2, neg_mesh, rs);
  check_init_fails(MT_EINVAL, MT_MAX_NDIM + 1, ones, 1, mesh, rs);
  check_init_fails(MT_EINVAL, -1, shape, 1, mesh, rs);
  check_init_fails(MT_EINVAL, 2, shape, MT_MAX_MESH_NDIM + 1, ones, rs);
  check_init_fails(MT_EINVAL, 2, shape, 0, mesh, rs);
  check_init_fails(MT_EINVAL, 2, NULL, 1, mesh, rs);
  check_init_fails(MT_EINVAL, 2, shape, 1, NULL, rs);
  /* More elements than int64 can index. */
  check_init_fails(MT_EOVERFLOW, 2, too_many, 1, mesh, rs);
  CHECK(mt_layout_init(NULL, 2, shape, 1, mesh, rs, NULL) == MT_EINVAL);

  /* The limits themselves are fine, and so is an empty dim beside a huge one. */
  mt_layout out;
  const int64_t huge_empty[2] = {INT64_MAX, 0};
  CHECK(mt_layout_init(&out, MT_MAX_NDIM, ones, MT_MAX_MESH_NDIM, ones, rs, NULL) ==
        MT_OK);
  CHECK(mt_layout_init(&out, 2, huge_empty, 1, mesh, rs, NULL) == MT_OK);
}

static void test_box_errors(void) {
  mt_layout l;
  const int64_t shape[2] = {4, 6}, mesh[2] = {2, 3};
  CHECK(mt_layout_init(&l, 2, shape, 2, mesh, (mt_placement[]){S(0), S(1)}, NULL) ==
        MT_OK);
  const int64_t bad[3][2] = {{2, 0}, {0, 3}, {-1, 0}};
  for (int i = 0; i < 3; ++i) {
    mt_box out, before;
    memset(&out, 0x3C, sizeof out);
    before = out;
    mt_error err = {0, ""};
    CHECK(mt_layout_local_box(&l, bad[i], &out, &err) == MT_EINDEX);
    CHECK(err.code == MT_EINDEX && err.msg[0] != '\0');
    CHECK(memcmp(&out, &before, sizeof out) == 0);
  }
  mt_box out;
  CHECK(mt_layout_local_box(NULL, bad[0], &out, NULL) == MT_EINVAL);
  CHECK(mt_layout_local_box(&l, NULL, &out, NULL) == MT_EINVAL);
  CHECK(mt_layout_local_box(&l, bad[0], NULL, NULL) == MT_EINVAL);
  /* A hand-made layout is checked before it is trusted. */
  mt_layout hand = l;
  hand.placements[1].dim = 5;
  CHECK(mt_layout_local_box(&hand, (const int64_t[]){0, 0}, &out, NULL) == MT_EINDEX);
  hand = l;
  hand.mesh_ndim = MT_MAX_MESH_NDIM + 1;
  CHECK(mt_layout_local_box(&hand, (const int64_t[]){0, 0}, &out, NULL) == MT_EINVAL);
}

/* mt_layout_even_global_shape of a 2-d local shape on a (2, 3) mesh. */
static int even2(const int64_t *local, int mesh_ndim, const mt_placement *pl,
                 int64_t *g, mt_error *err) {
  const int64_t mesh[2] = {2, 3};
  return mt_layout_even_global_shape(2, local, mesh_ndim, mesh, pl, g, err);
}

static void test_even_global_shape(void) {
  const int64_t local[2] = {3, 4}, empty[2] = {0, 4}, mesh[1] = {2};
  int64_t g[2] = {0, 0};
  CHECK(even2(local, 2, (mt_placement[]){S(0), S(1)}, g, NULL) == MT_OK);
  CHECK(g[0] == 6 && g[1] == 12);
  /* Nested shards of one dim multiply. */
  CHECK(even2(local, 2, (mt_placement[]){S(0), S(0)}, g, NULL) == MT_OK);
  CHECK(g[0] == 18 && g[1] == 4);
  CHECK(even2(local, 2, (mt_placement[]){R(), P(MT_REDUCE_MAX)}, g, NULL) == MT_OK);
  CHECK(g[0] == 3 && g[1] == 4);
  CHECK(even2(empty, 2, (mt_placement[]){S(1), S(0)}, g, NULL) == MT_OK);
  CHECK(g[0] == 0 && g[1] == 8);
  CHECK(mt_layout_even_global_shape(0, NULL, 1, mesh, (mt_placement[]){R()}, NULL,
                                    NULL) == MT_OK);
}

static void test_even_global_shape_errors(void) {
  const int64_t local[2] = {3, 4}, neg[2] = {-1, 2}, zero_mesh[1] = {0};
  const int64_t huge[2] = {INT64_MAX / 2 + 1, 1}, third[2] = {INT64_MAX / 3, 1};
  const int64_t half[2] = {INT64_MAX / 2, 1};
  mt_error err = {0, ""};
  int64_t g[2] = {77, 88};
  CHECK(even2(huge, 1, (mt_placement[]){S(0)}, g, &err) == MT_EOVERFLOW);
  CHECK(err.code == MT_EOVERFLOW && err.msg[0] != '\0');
  CHECK(g[0] == 77 && g[1] == 88);
  /* Each factor fits; the product of the nested shards does not. */
  CHECK(even2(third, 2, (mt_placement[]){S(0), S(0)}, g, NULL) == MT_EOVERFLOW);
  CHECK(g[0] == 77 && g[1] == 88);
  CHECK(even2(half, 1, (mt_placement[]){S(0)}, g, NULL) == MT_OK);
  CHECK(g[0] == INT64_MAX - 1 && g[1] == 1);

  g[0] = 77, g[1] = 88;
  CHECK(even2(local, 1, (mt_placement[]){S(2)}, g, &err) == MT_EINDEX);
  CHECK(err.code == MT_EINDEX && g[0] == 77);
  CHECK(even2(neg, 1, (mt_placement[]){R()}, g, NULL) == MT_EINVAL);
  CHECK(even2(local, 1, (mt_placement[]){P(9)}, g, NULL) == MT_EINVAL);
  CHECK(even2(local, 1, (mt_placement[]){R()}, NULL, NULL) == MT_EINVAL);
  CHECK(mt_layout_even_global_shape(2, local, 1, zero_mesh, (mt_placement[]){R()}, g,
                                    NULL) == MT_EINVAL);
  CHECK(g[0] == 77 && g[1] == 88);
}

static void test_boxes(void) {
  mt_box a = box2(0, 4, 2, 3), b = box2(2, 5, 0, 4), out;
  CHECK(mt_box_numel(&a) == 12);
  CHECK(mt_box_intersect(&a, &b, &out) == 1);
  CHECK(out.ndim == 2 && out.offset[0] == 2 && out.shape[0] == 2);
  CHECK(out.offset[1] == 2 && out.shape[1] == 2 && mt_box_numel(&out) == 4);
  mt_box ab = out;
  CHECK(mt_box_intersect(&b, &a, &out) == 1 && same_box(&out, &ab));
  mt_box inner = box2(1, 1, 3, 1);
  CHECK(mt_box_intersect(&a, &inner, &out) == 1 && same_box(&out, &inner));

  /* Touching and disjoint boxes, and boxes of different ranks, share nothing and
   * leave `out` alone. */
  mt_box sentinel = box2(-9, -9, -9, -9);
  out = sentinel;
  mt_box scalar;
  memset(&scalar, 0, sizeof scalar);
  CHECK(mt_box_intersect(&a, &scalar, &out) == 0 && same_box(&out, &sentinel));
  mt_box touch = box2(4, 2, 2, 3);
  CHECK(mt_box_intersect(&a, &touch, &out) == 0 && same_box(&out, &sentinel));
  mt_box apart = box2(0, 4, 10, 3);
  CHECK(mt_box_intersect(&a, &apart, &out) == 0 && same_box(&out, &sentinel));
  mt_box empty = box2(1, 0, 2, 3);
  CHECK(mt_box_numel(&empty) == 0);
  CHECK(mt_box_intersect(&a, &empty, &out) == 0 && same_box(&out, &sentinel));
  mt_box huge_empty = box2(0, INT64_MAX, 0, 0);
  CHECK(mt_box_numel(&huge_empty) == 0);

  /* Two 0-d boxes are the same single element. */
  mt_box s0, s1;
  memset(&s0, 0, sizeof s0);
  memset(&s1, 0, sizeof s1);
  CHECK(mt_box_numel(&s0) == 1);
  CHECK(mt_box_intersect(&s0, &s1, &out) == 1 && out.ndim == 0);
}

/* A local array's shape against its box: the words the user sees name the array's
 * shape as Python prints a tuple. */
static void test_check_local(void) {
  mt_box b = box2(0, 2, 0, 3);
  mt_error err = {0};
  int64_t fits[2] = {2, 3}, off[2] = {2, 2}, one[1] = {5};
  CHECK(mt_box_check_local(&b, 2, fits, &err) == MT_OK);
  CHECK(mt_box_check_local(&b, 2, off, &err) == MT_EINVAL &&
        strstr(err.msg, "local array of shape (2, 2) is not this rank's shard (2 dims)"));
  CHECK(mt_box_check_local(&b, 1, one, &err) == MT_EINVAL && strstr(err.msg, "(5,)"));
  CHECK(mt_box_check_local(&b, 0, NULL, &err) == MT_EINVAL && strstr(err.msg, "shape ()"));
  mt_box s;
  memset(&s, 0, sizeof s);
  CHECK(mt_box_check_local(&s, 0, NULL, &err) == MT_OK);
}

int main(void) {
  const char *q = getenv("MT_TEST_QUICK");
  quick = q != NULL && q[0] == '1';
  test_chunk();
  test_worked_examples();
  test_sweep();
  test_init_message();
  test_init_placement_errors();
  test_init_shape_errors();
  test_box_errors();
  test_even_global_shape();
  test_even_global_shape_errors();
  test_boxes();
  test_check_local();
  printf("test_layout: %ld layouts swept\n", sweep_layouts);
  return mt_test_exit("test_layout");
}
