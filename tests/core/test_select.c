/* Selections (basic indexing): mt_selection_check, mt_selection_image against a
 * brute-force walk of the picked indices, and mt_selection_exchange_boxes on
 * random layouts and selections simulated over every rank of a mesh: each rank's
 * target box arrives exactly once, only from picked elements its peers hold, and
 * every send matches the receive at the other end. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"

#define MAX_RANKS 16

static mt_placement R(void) { return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0}; }
static mt_placement P(int op) { return (mt_placement){MT_PLACEMENT_PARTIAL, 0, op, 0}; }
static mt_placement S(int dim) { return (mt_placement){MT_PLACEMENT_SHARD, dim, 0, 0}; }

static uint64_t rng_state = 0x2545F4914F6CDD1Du;

static int rnd(int n) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (int)(rng_state % (uint64_t)n);
}

static mt_selection sel1(int64_t start, int64_t step, int64_t count) {
  mt_selection s;
  memset(&s, 0, sizeof s);
  s.ndim = 1, s.start[0] = start, s.step[0] = step, s.count[0] = count;
  return s;
}

static mt_box box1(int64_t off, int64_t n) {
  mt_box b;
  memset(&b, 0, sizeof b);
  b.ndim = 1, b.offset[0] = off, b.shape[0] = n;
  return b;
}

/* The picked k of dim d inside [lo, lo + n), by walking every k. */
static void brute_range(const mt_selection *s, int d, int64_t lo, int64_t n, int64_t *k0,
                        int64_t *k1) {
  *k0 = *k1 = -1;
  for (int64_t k = 0; k < s->count[d]; ++k) {
    int64_t i = s->start[d] + k * s->step[d];
    if (i < lo || i >= lo + n) continue;
    if (*k0 < 0) *k0 = k;
    CHECK_MSG(*k1 < 0 || *k1 == k, "picked indices are not consecutive in k");
    *k1 = k + 1;
  }
}

static void check_image(const mt_selection *s, const mt_box *in) {
  mt_box out;
  int any = mt_selection_image(s, in, &out), want_any = 1;
  for (int d = 0; d < in->ndim; ++d) {
    int64_t k0, k1;
    brute_range(s, d, in->offset[d], in->shape[d], &k0, &k1);
    if (k0 < 0) {
      want_any = 0;
      CHECK(out.shape[d] == 0);
      continue;
    }
    CHECK_MSG(out.offset[d] == k0 && out.shape[d] == k1 - k0,
              "dim %d: image [%lld, +%lld), want [%lld, %lld)", d,
              (long long)out.offset[d], (long long)out.shape[d], (long long)k0,
              (long long)k1);
  }
  CHECK(any == want_any);
}

static void test_image(void) {
  mt_selection s = sel1(1, 2, 4); /* 1 3 5 7 of 8 */
  mt_box b = box1(4, 4), out;
  CHECK(mt_selection_image(&s, &b, &out) == 1);
  CHECK(out.offset[0] == 2 && out.shape[0] == 2);
  s = sel1(7, -3, 3); /* 7 4 1 */
  b = box1(0, 5);
  CHECK(mt_selection_image(&s, &b, &out) == 1);
  CHECK(out.offset[0] == 1 && out.shape[0] == 2);
  s = sel1(3, 1, 1); /* an int index: only its owner picks it */
  b = box1(4, 4);
  CHECK(mt_selection_image(&s, &b, &out) == 0 && out.shape[0] == 0);
  for (int c = 0; c < 4000; ++c) {
    int64_t n = 1 + rnd(12), step = rnd(2) ? 1 + rnd(4) : -1 - rnd(4);
    int64_t start = rnd((int)n), span = step > 0 ? step : -step;
    int64_t room = step > 0 ? (n - 1 - start) / span : start / span;
    mt_selection r = sel1(start, step, rnd((int)room + 2));
    if (r.count[0] > room + 1) r.count[0] = room + 1;
    int64_t lo = rnd((int)n + 1);
    mt_box in = box1(lo, rnd((int)(n - lo) + 1));
    CHECK(mt_selection_check(&r, 1, &n, NULL) == MT_OK);
    check_image(&r, &in);
  }
}

static void test_check(void) {
  int64_t n = 8;
  mt_selection s = sel1(0, 0, 1);
  mt_error err = {0, ""};
  CHECK(mt_selection_check(&s, 1, &n, &err) == MT_EINVAL && strstr(err.msg, "nonzero"));
  s = sel1(0, 3, 4); /* 0 3 6 9: 9 is out of range */
  CHECK(mt_selection_check(&s, 1, &n, &err) == MT_EINDEX);
  s = sel1(7, -2, 5); /* 7 5 3 1 -1 */
  CHECK(mt_selection_check(&s, 1, &n, &err) == MT_EINDEX);
  s = sel1(8, 1, 0); /* an empty slice may start anywhere */
  CHECK(mt_selection_check(&s, 1, &n, NULL) == MT_OK);
  s = sel1(0, INT64_MAX, 2);
  CHECK(mt_selection_check(&s, 1, &n, NULL) == MT_EINDEX);
  CHECK(mt_selection_check(&s, 2, &n, &err) == MT_EINVAL && strstr(err.msg, "dims"));
}

/* ---- The exchange over every rank of a simulated mesh. ---- */

static mt_layout layout(int ndim, const int64_t *shape, int mesh_ndim,
                        const int64_t *mesh, const mt_placement *pl) {
  mt_layout l;
  int rc = mt_layout_init(&l, ndim, shape, mesh_ndim, mesh, pl, NULL);
  CHECK(rc == MT_OK);
  return l;
}

static void coord_of(const mt_layout *l, int64_t r, int64_t *coord) {
  for (int m = l->mesh_ndim - 1; m >= 0; --m) {
    coord[m] = r % l->mesh_shape[m];
    r /= l->mesh_shape[m];
  }
}

static int within(const mt_box *in, const mt_box *out) {
  for (int d = 0; d < in->ndim; ++d) {
    if (in->offset[d] < out->offset[d] ||
        in->offset[d] + in->shape[d] > out->offset[d] + out->shape[d])
      return 0;
  }
  return 1;
}

static int same_elements(const mt_box *a, const mt_box *b) {
  int64_t na = mt_box_numel(a), nb = mt_box_numel(b);
  if (na == 0 || nb == 0) return na == nb;
  return memcmp(a->offset, b->offset, sizeof a->offset) == 0 &&
         memcmp(a->shape, b->shape, sizeof a->shape) == 0;
}

static mt_box send_of[MAX_RANKS][MAX_RANKS], recv_of[MAX_RANKS][MAX_RANKS];

/* Every rank's target box arrives exactly once, from picked elements its
 * sender holds; sends and receives pair up. */
static void check_exchange(const mt_layout *src, const mt_selection *sel,
                           const mt_layout *dst) {
  int64_t n = 1, coord[MT_MAX_MESH_NDIM];
  for (int m = 0; m < src->mesh_ndim; ++m) n *= src->mesh_shape[m];
  for (int64_t r = 0; r < n; ++r) {
    mt_error err = {0, ""};
    coord_of(src, r, coord);
    int rc = mt_selection_exchange_boxes(src, sel, dst, coord, n, send_of[r], recv_of[r],
                                         &err);
    CHECK_MSG(rc == MT_OK, "%s", err.msg);
  }
  for (int64_t r = 0; r < n; ++r) {
    mt_box t, s, img;
    coord_of(dst, r, coord);
    mt_layout_local_box(dst, coord, &t, NULL);
    int64_t got = 0;
    for (int64_t p = 0; p < n; ++p) {
      const mt_box *b = &recv_of[r][p];
      CHECK(same_elements(b, &send_of[p][r]));
      if (mt_box_numel(b) == 0) continue;
      coord_of(src, p, coord);
      mt_layout_local_box(src, coord, &s, NULL);
      mt_selection_image(sel, &s, &img);
      CHECK(within(b, &t) && within(b, &img));
      for (int64_t q = 0; q < p; ++q) {
        mt_box both;
        CHECK(!mt_box_intersect(b, &recv_of[r][q], &both));
      }
      got += mt_box_numel(b);
    }
    CHECK_MSG(got == mt_box_numel(&t), "rank %lld receives %lld of %lld",
              (long long)r, (long long)got, (long long)mt_box_numel(&t));
  }
}

/* A random valid selection of dim d of size n. */
static void random_dim(mt_selection *s, int d, int64_t n) {
  s->step[d] = rnd(3) ? 1 + rnd(3) : -1 - rnd(3);
  if (n == 0) {
    s->start[d] = 0, s->count[d] = 0;
    return;
  }
  int64_t span = s->step[d] > 0 ? s->step[d] : -s->step[d];
  s->start[d] = rnd((int)n);
  int64_t room = (s->step[d] > 0 ? n - 1 - s->start[d] : s->start[d]) / span + 1;
  s->count[d] = rnd(4) == 0 ? room : rnd((int)room + 1);
}

static void random_case(void) {
  static const int64_t meshes[][2] = {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {2, 2}, {2, 3}};
  const int64_t *mesh = meshes[rnd(6)];
  int mesh_ndim = mesh[1] > 1 ? 2 : 1, ndim = 1 + rnd(3);
  int64_t shape[3];
  mt_selection sel;
  memset(&sel, 0, sizeof sel);
  sel.ndim = ndim;
  for (int d = 0; d < ndim; ++d) shape[d] = rnd(7), random_dim(&sel, d, shape[d]);
  mt_placement a[2], b[2];
  for (int m = 0; m < mesh_ndim; ++m) {
    int k = rnd(ndim + 2);
    a[m] = k < ndim ? S(k) : (k == ndim ? R() : P(MT_REDUCE_SUM));
    /* The target keeps Partials, and may gather or keep any Shard. */
    b[m] = a[m].kind == MT_PLACEMENT_SHARD && rnd(2) ? R() : a[m];
  }
  mt_layout src = layout(ndim, shape, mesh_ndim, mesh, a);
  mt_layout dst = layout(ndim, sel.count, mesh_ndim, mesh, b);
  check_exchange(&src, &sel, &dst);
}

static void test_exchange(void) {
  /* x[3] of 8 rows over 4 ranks: only rank 1 sends, to the three others. */
  const int64_t shape[2] = {8, 2}, mesh[1] = {4};
  mt_placement s0 = S(0), r = R();
  mt_selection sel;
  memset(&sel, 0, sizeof sel);
  sel.ndim = 2, sel.start[0] = 3, sel.step[0] = 1, sel.count[0] = 1;
  sel.step[1] = 1, sel.count[1] = 2;
  const int64_t out_shape[2] = {1, 2};
  mt_layout src = layout(2, shape, 1, mesh, &s0), dst = layout(2, out_shape, 1, mesh, &r);
  check_exchange(&src, &sel, &dst);
  for (int64_t q = 0; q < 4; ++q) {
    for (int64_t p = 0; p < 4; ++p) {
      int64_t want = p == 1 ? 2 : 0; /* rank 1 keeps its own copy too */
      CHECK(mt_box_numel(&send_of[p][q]) == want);
    }
  }
  for (int c = 0; c < 3000; ++c) random_case();
}

static void test_exchange_errors(void) {
  const int64_t shape[1] = {8}, mesh[1] = {2}, four[1] = {4}, coord[1] = {0};
  mt_placement s0 = S(0), r = R(), psum = P(MT_REDUCE_SUM);
  mt_selection sel = sel1(0, 2, 4);
  mt_layout src = layout(1, shape, 1, mesh, &s0), dst = layout(1, four, 1, mesh, &r);
  mt_box send[2], recv[2];
  mt_error err = {0, ""};
  CHECK(mt_selection_exchange_boxes(&src, &sel, &dst, coord, 2, send, recv, NULL) ==
        MT_OK);
  CHECK(mt_selection_exchange_boxes(&src, &sel, &dst, coord, 3, send, recv, &err) ==
        MT_EINVAL);
  CHECK(mt_selection_exchange_boxes(NULL, &sel, &dst, coord, 2, send, recv, &err) ==
        MT_EINVAL);
  mt_selection bad = sel1(0, 2, 5);
  CHECK(mt_selection_exchange_boxes(&src, &bad, &dst, coord, 2, send, recv, &err) ==
        MT_EINDEX);
  mt_layout wrong = layout(1, shape, 1, mesh, &r);
  CHECK(mt_selection_exchange_boxes(&src, &sel, &wrong, coord, 2, send, recv, &err) ==
            MT_EINVAL &&
        strstr(err.msg, "picks") != NULL);
  mt_layout part = layout(1, shape, 1, mesh, &psum);
  mt_selection all = sel1(0, 1, 8);
  CHECK(mt_selection_exchange_boxes(&part, &all, &wrong, coord, 2, send, recv, &err) ==
            MT_EINVAL &&
        strstr(err.msg, "Partial") != NULL);
}

int main(void) {
  test_check();
  test_image();
  test_exchange();
  test_exchange_errors();
  return mt_test_exit("test_select");
}
