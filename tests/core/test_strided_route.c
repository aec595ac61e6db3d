/* The route of strided moves: one move on a common form, else a move to a plain
 * layout and the route from there, at most three moves, over every pair of
 * layouts of a small tensor on a small mesh; and worked cases of each kind of
 * middle layout. */
#include <string.h>

#include "check.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/strided.h"
#include "mpitensor/core/strided_route.h"

static mt_placement R(void) { return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0}; }
static mt_placement S(int dim) { return (mt_placement){MT_PLACEMENT_SHARD, dim, 0, 0}; }
static mt_placement P(void) { return (mt_placement){MT_PLACEMENT_PARTIAL, 0, MT_REDUCE_SUM, 0}; }
static mt_placement SS(int dim, int sf) {
  return (mt_placement){MT_PLACEMENT_STRIDED, dim, 0, sf};
}

static mt_layout make(int ndim, const int64_t *shape, int mesh_ndim, const int64_t *mesh,
                      const mt_placement *p) {
  mt_layout l;
  mt_error err = {0};
  CHECK(mt_strided_init(&l, ndim, shape, mesh_ndim, mesh, p, &err) == MT_OK);
  return l;
}

static int kind_at(const mt_layout *l, int m) { return l->placements[m].kind; }

/* A strided source keeps its Shards through the middle when it can, and its
 * Partials always; a plain source keeps only its Partials. */
static void worked_cases(void) {
  int64_t shape[2] = {8, 6}, mesh[2] = {2, 2};
  mt_layout from, to, mid;
  int hops = 0;
  mt_error err = {0};
  /* Two strided layouts of one dim with a common form: one hop. */
  mt_placement a[2] = {SS(0, 2), S(0)}, b[2] = {S(0), R()};
  mt_layout la = make(2, shape, 2, mesh, a), lb = make(2, shape, 2, mesh, b);
  CHECK(mt_strided_route(&la, &lb, &from, &to, &mid, &hops, &err) == MT_OK && hops == 1);
  CHECK(from.ndim == to.ndim && !mt_strided_has(&from) && !mt_strided_has(&to));
  /* Strided on dim 1, Shard on dim 0, to a Shard of dim 1 split another way. */
  mt_placement c[2] = {S(0), SS(1, 3)}, d[2] = {SS(1, 2), P()};
  mt_layout lc = make(2, shape, 2, mesh, c), ld = make(2, shape, 2, mesh, d);
  CHECK(mt_strided_route(&lc, &ld, &from, &to, &mid, &hops, &err) == MT_OK && hops == 2);
  CHECK(!mt_strided_has(&mid) && kind_at(&mid, 0) == MT_PLACEMENT_SHARD);
  CHECK(kind_at(&mid, 1) == MT_PLACEMENT_REPLICATE);
  /* A plain source with a Partial and a Shard to a strided target it cannot reach
   * in one move: its Partial stays, its Shard becomes Replicate. */
  mt_placement e[2] = {P(), S(0)}, f[2] = {R(), SS(0, 2)};
  int64_t tall[2] = {12, 8}, mesh23[2] = {2, 3};
  mt_layout le = make(2, tall, 2, mesh23, e), lf = make(2, tall, 2, mesh23, f);
  CHECK(mt_strided_route(&le, &lf, &from, &to, &mid, &hops, &err) == MT_OK && hops == 2);
  CHECK(kind_at(&mid, 0) == MT_PLACEMENT_PARTIAL && kind_at(&mid, 1) == MT_PLACEMENT_REPLICATE);
  /* No plain expansion: the split factor does not divide the local extent. */
  mt_placement g[1] = {SS(0, 3)}, h[1] = {R()};
  int64_t eight[1] = {8}, two[1] = {2};
  mt_layout lg = make(1, eight, 1, two, g), lh = make(1, eight, 1, two, h);
  CHECK(mt_strided_route(&lg, &lh, &from, &to, &mid, &hops, &err) == MT_EINVAL);
}

/* Every pair of layouts of a 12 x 8 tensor on a 2 x 3 mesh from a set of
 * placements: when both expand, following the route (the first move of each
 * two-hop route is a plain move on a common form) reaches the target in at most
 * three moves, and Partials pass through every middle layout as they are. */
static void sweep(void) {
  mt_placement set[] = {R(), S(0), S(1), P(), SS(0, 2), SS(0, 3), SS(1, 2), SS(1, 4)};
  enum { K = sizeof set / sizeof set[0] };
  int64_t shape[2] = {12, 8}, mesh[2] = {2, 3};
  mt_layout all[K * K];
  int n = 0;
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) {
      mt_placement p[2] = {set[i], set[j]};
      mt_layout e;
      int group[MT_MAX_NDIM + 1];
      mt_error err = {0};
      if (mt_strided_init(&all[n], 2, shape, 2, mesh, p, &err) == MT_OK &&
          mt_strided_expand(&all[n], &e, group, &err) == MT_OK)
        ++n;
    }
  long moves[4] = {0}, plain_sources = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      mt_layout cur = all[i], from, to, mid;
      int hops = 2, count = 0;
      for (;;) {
        mt_error err = {0};
        CHECK(mt_strided_route(&cur, &all[j], &from, &to, &mid, &hops, &err) == MT_OK);
        if (++count > 3 || hops == 1) break;
        CHECK(hops == 2 && !mt_strided_has(&mid));
        CHECK(mt_strided_refine(&cur, &mid, &from, &to, &err) == MT_OK);
        for (int m = 0; m < 2; ++m)
          CHECK((kind_at(&cur, m) == MT_PLACEMENT_PARTIAL) ==
                (kind_at(&mid, m) == MT_PLACEMENT_PARTIAL));
        if (!mt_strided_has(&cur)) {
          ++plain_sources;
          for (int m = 0; m < 2; ++m) CHECK(kind_at(&mid, m) != MT_PLACEMENT_SHARD);
        }
        cur = mid;
      }
      CHECK(hops == 1 && count <= 3);
      if (count <= 3) ++moves[count];
    }
  printf("test_strided_route: %d layouts; routes of 1, 2, 3 moves: %ld, %ld, %ld\n", n,
         moves[1], moves[2], moves[3]);
  CHECK(moves[1] > 0 && moves[2] > 0 && plain_sources > 0);
}

int main(void) {
  worked_cases();
  sweep();
  return mt_test_exit("test_strided_route");
}
