/* Reshape groups: worked cases (merges, splits, size-1 dims on either side, empty
 * shapes, sizes that do not line up) and a sweep of small shapes checking that the
 * groups tile both shapes with equal products and are as fine as torch's rule.
 * The views of plain layouts: torch's _StridedShard where a merge takes a later
 * dim's Shard, none where the data must move.
 * (Shapes of unequal sizes are a caller's error the rule does not always see: a
 * side that runs out leaves the other's dims alone, as torch's does.) */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "mpitensor/core/reshape.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/strided.h"

enum { ROOM = 2 * MT_MAX_NDIM + 1 };

/* Whether src -> dst has the groups given as "src_at|dst_at" bound lists. */
static int groups_are(int ns, const int64_t *src, int nd, const int64_t *dst, int want_n,
                      const int *want_s, const int *want_d) {
  int n = -1, s[ROOM], d[ROOM];
  if (mt_reshape_groups(ns, src, nd, dst, &n, s, d, NULL) != MT_OK || n != want_n) return 0;
  return memcmp(s, want_s, (size_t)(n + 1) * sizeof *s) == 0 &&
         memcmp(d, want_d, (size_t)(n + 1) * sizeof *d) == 0;
}

static void test_cases(void) {
  /* (1, 8, 6) -> (8, 2, 3): the 1 alone, 8 = 8, 6 split into 2 x 3. */
  int64_t a[3] = {1, 8, 6}, b[3] = {8, 2, 3};
  CHECK(groups_are(3, a, 3, b, 3, (int[]){0, 1, 2, 3}, (int[]){0, 0, 1, 3}));
  /* (2, 1, 4) -> (1, 8): the output's 1 first, then 2, 1 and 4 merge into 8. */
  int64_t c[3] = {2, 1, 4}, e[2] = {1, 8};
  CHECK(groups_are(3, c, 2, e, 2, (int[]){0, 0, 3}, (int[]){0, 1, 2}));
  /* (6, 4) -> (4, 6): 24 both ways, one group. */
  int64_t f[2] = {6, 4}, g[2] = {4, 6};
  CHECK(groups_are(2, f, 2, g, 1, (int[]){0, 2}, (int[]){0, 2}));
  /* 1 facing 1 pairs; trailing 1s stand alone. */
  int64_t h[2] = {1, 3}, k[3] = {1, 3, 1};
  CHECK(groups_are(2, h, 3, k, 3, (int[]){0, 1, 2, 2}, (int[]){0, 1, 2, 3}));
  /* Empty shapes: no groups, or lone size-1 dims. */
  int n = -1, s[ROOM], d[ROOM];
  CHECK(mt_reshape_groups(0, NULL, 0, NULL, &n, s, d, NULL) == MT_OK && n == 0 &&
        s[0] == 0 && d[0] == 0);
  int64_t one[2] = {1, 1};
  CHECK(groups_are(0, NULL, 2, one, 2, (int[]){0, 0, 0}, (int[]){0, 1, 2}));
  /* A size 0 pairs with 0; sizes that never agree have no groups. */
  int64_t z[2] = {0, 3}, z2[2] = {0, 3}, p[1] = {6}, q[2] = {4, 2}, r[2] = {2, 0};
  CHECK(groups_are(2, z, 2, z2, 2, (int[]){0, 1, 2}, (int[]){0, 1, 2}));
  mt_error err = {0};
  n = 7;
  CHECK(mt_reshape_groups(1, p, 2, q, &n, s, d, &err) == MT_EINVAL && n == 7 &&
        strstr(err.msg, "do not line up"));
  CHECK(mt_reshape_groups(2, r, 1, z, &n, s, d, NULL) == MT_EINVAL);
  /* Products beyond int64 have no groups; bad arguments are refused. */
  int64_t big[2] = {INT64_C(1) << 40, INT64_C(1) << 40}, big2[2] = {INT64_C(1) << 50, 2};
  CHECK(mt_reshape_groups(2, big, 2, big2, &n, s, d, NULL) == MT_EINVAL);
  int64_t neg[1] = {-4};
  CHECK(mt_reshape_groups(1, neg, 1, neg, &n, s, d, &err) == MT_EINDEX &&
        strstr(err.msg, "negative"));
  CHECK(mt_reshape_groups(MT_MAX_NDIM + 1, a, 1, p, &n, s, d, NULL) == MT_EINDEX);
  CHECK(mt_reshape_groups(1, p, 1, p, NULL, s, d, NULL) == MT_EINVAL);
}

static int64_t product(const int64_t *v, int lo, int hi) {
  int64_t out = 1;
  for (int i = lo; i < hi; ++i) out *= v[i];
  return out;
}

/* The groups of src -> dst tile both shapes in order, each with equal products and
 * at least one dim, a group with an empty side holds only size-1 dims, and no
 * group with more than one dim per side splits at a shared product. */
static void check_groups(int ns, const int64_t *src, int nd, const int64_t *dst) {
  int n = -1, s[ROOM], d[ROOM];
  if (product(src, 0, ns) != product(dst, 0, nd)) return;
  int rc = mt_reshape_groups(ns, src, nd, dst, &n, s, d, NULL);
  CHECK(rc == MT_OK && s[0] == 0 && d[0] == 0 && s[n] == ns && d[n] == nd);
  for (int g = 0; rc == MT_OK && g < n; ++g) {
    int ws = s[g + 1] - s[g], wd = d[g + 1] - d[g];
    CHECK(ws >= 0 && wd >= 0 && ws + wd >= 1);
    if (ws == 0 || wd == 0) {
      CHECK(ws + wd == 1 && product(ws ? src : dst, ws ? s[g] : d[g], ws ? s[g + 1] : d[g + 1]) == 1);
      continue;
    }
    CHECK(product(src, s[g], s[g + 1]) == product(dst, d[g], d[g + 1]));
    for (int i = s[g] + 1; i < s[g + 1]; ++i)
      for (int j = d[g] + 1; j < d[g + 1]; ++j)
        CHECK(product(src, s[g], i) != product(dst, d[g], j));
  }
}

/* Every pair of shapes of up to 3 dims of sizes 1, 2, 3, 4, 6 of equal product. */
static long sweep(void) {
  static const int64_t sizes[] = {1, 2, 3, 4, 6};
  int64_t shapes[156][3];
  int ndims[156], count = 0;
  for (int nd = 0; nd <= 3; ++nd) {
    int total = 1;
    for (int k = 0; k < nd; ++k) total *= 5;
    for (int c = 0; c < total; ++c, ++count) {
      ndims[count] = nd;
      for (int k = 0, r = c; k < nd; ++k, r /= 5) shapes[count][k] = sizes[r % 5];
    }
  }
  long pairs = 0;
  for (int x = 0; x < count; ++x)
    for (int y = 0; y < count; ++y) {
      check_groups(ndims[x], shapes[x], ndims[y], shapes[y]);
      pairs += product(shapes[x], 0, ndims[x]) == product(shapes[y], 0, ndims[y]);
    }
  return pairs;
}

static mt_placement S(int d) { return (mt_placement){MT_PLACEMENT_SHARD, d, 0, 0}; }

/* Whether plain (shape, pl) on `mesh` reshaped to `to` is the view `want`
 * (mesh_ndim placements), or has none when want is NULL. */
static int view_is(int ndim, const int64_t *shape, int mesh_ndim, const int64_t *mesh,
                   const mt_placement *pl, int to_ndim, const int64_t *to,
                   const mt_placement *want) {
  mt_layout l, v;
  if (mt_strided_init(&l, ndim, shape, mesh_ndim, mesh, pl, NULL) != MT_OK) return 0;
  int rc = mt_reshape_view(&l, to_ndim, to, &v, NULL);
  if (want == NULL) return rc == MT_EINVAL;
  if (rc != MT_OK || v.ndim != to_ndim) return 0;
  for (int m = 0; m < mesh_ndim; ++m)
    if (memcmp(&v.placements[m], &want[m], sizeof *want) != 0) return 0;
  return 1;
}

static void test_views(void) {
  int64_t two = 2, m22[2] = {2, 2}, m21[2] = {2, 1}, s86[2] = {8, 6}, n48 = 48;
  int64_t s44[2] = {4, 4}, n16 = 16, s34[2] = {3, 4}, n12 = 12, s13[2] = {1, 3};
  int64_t three = 3, s18[2] = {1, 8}, n8 = 8, s214[3] = {2, 1, 4};
  mt_placement ss8 = {MT_PLACEMENT_STRIDED, 0, 0, 8}, ss2 = {MT_PLACEMENT_STRIDED, 0, 0, 2};
  mt_placement ss21 = {MT_PLACEMENT_STRIDED, 1, 0, 2};
  /* A merge takes the Shard of its second dim: split factor 8, the rows. */
  CHECK(view_is(2, s86, 1, &two, (mt_placement[]){S(1)}, 1, &n48, &ss8));
  CHECK(view_is(2, s44, 2, m22, (mt_placement[]){S(0), S(1)}, 1, &n16,
                (mt_placement[]){S(0), ss2}));
  /* A dim before the Shard cut unevenly: the data moves. */
  CHECK(view_is(2, s34, 2, m22, (mt_placement[]){S(0), S(1)}, 1, &n12, NULL));
  CHECK(view_is(2, s13, 2, m21, (mt_placement[]){S(0), S(1)}, 1, &three, NULL));
  /* Size-1 dims are groups of their own. */
  CHECK(view_is(2, s18, 1, &two, (mt_placement[]){S(1)}, 1, &n8, (mt_placement[]){S(0)}));
  int64_t s14[2] = {1, 4};
  CHECK(view_is(1, &s44[0], 1, &two, (mt_placement[]){S(0)}, 2, s14,
                (mt_placement[]){S(1)}));
  CHECK(view_is(3, s214, 1, &two, (mt_placement[]){S(2)}, 2, s18, &ss21));
  /* A strided layout, or a split that also merges, has no view. */
  mt_layout l, v;
  mt_error err = {0};
  CHECK(mt_strided_init(&l, 1, &n48, 1, &two, &ss8, NULL) == MT_OK);
  CHECK(mt_reshape_view(&l, 2, s86, &v, &err) == MT_EINVAL && strstr(err.msg, "no view"));
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
  CHECK(view_is(2, s23, 1, &two, (mt_placement[]){S(1)}, 2, s32, NULL));
  CHECK(mt_reshape_view(NULL, 1, &n48, &v, NULL) == MT_EINVAL);
}

int main(void) {
  test_cases();
  test_views();
  long pairs = sweep();
  printf("test_reshape: %ld pairs of equal size swept\n", pairs);
  CHECK(pairs > 1000);
  return mt_test_exit("test_reshape");
}
