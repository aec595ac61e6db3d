/* Plans on meshes over several nodes (the time model's ranks_per_node): the plan
 * shapes that cross the network less (gathers across nodes first, reductions
 * after the dims inside a node have cut the data, ALLREDUCE_NODES), the bytes a
 * step moves between nodes counted against the exchange's own boxes, and, over
 * random layouts of up to 16,384 ranks on nodes of several sizes, never more bytes
 * between nodes (nor in all) than torch's per-mesh-dim steps.
 *
 * `test_plan_nodes --quick` (or MT_TEST_QUICK=1) checks every seventh move, for
 * valgrind: its paths are the same, and the plain run checks them all. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/timemodel.h"

/* 1, or 7 under --quick: the stride through the moves (prime to the 3 models and
 * the 2 shapes that the case number picks, so every kind is still met). */
static int stride = 1;

static mt_placement R(void) { return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0}; }
static mt_placement S(int dim) { return (mt_placement){MT_PLACEMENT_SHARD, dim, 0, 0}; }
static mt_placement P(void) { return (mt_placement){MT_PLACEMENT_PARTIAL, 0, MT_REDUCE_SUM, 0}; }

static mt_layout make(int ndim, const int64_t *shape, int mesh_ndim, const int64_t *mesh,
                      const mt_placement *p) {
  mt_layout l;
  memset(&l, 0, sizeof l);
  CHECK(mt_layout_init(&l, ndim, shape, mesh_ndim, mesh, p, NULL) == MT_OK);
  return l;
}

static mt_time_model nodes_of(int64_t per_node) {
  mt_time_model m = mt_time_model_default();
  m.ranks_per_node = per_node;
  return m;
}

static mt_plan *plan_of(const mt_layout *a, const mt_layout *b, const mt_time_model *m) {
  mt_plan *plan = NULL;
  mt_error err = {0};
  int rc = mt_plan_create_timed(a, b, 8, m, &plan, &err);
  CHECK_MSG(rc == MT_OK, "plan: %s", err.msg);
  return plan;
}

/* The kinds and mesh dims of a plan's communicating steps, as "kind@dim,...". */
static void shape_of(const mt_plan *plan, char *out, size_t n) {
  static const char *const names[] = {"AG", "A2A", "cut", "AR", "RS", "D", "ARN"};
  out[0] = '\0';
  for (int i = 0; i < mt_plan_nsteps(plan); ++i) {
    const mt_step *s = mt_plan_step(plan, i);
    size_t len = strlen(out);
    snprintf(out + len, n - len, "%s%s@%d", i ? "," : "", names[s->kind], s->mesh_dim);
  }
}

static int64_t torch_net(const mt_layout *a, const mt_layout *b, const mt_time_model *m,
                         int64_t *bytes) {
  int64_t net = -1;
  CHECK(mt_plan_torch_bytes(a, b, 8, m, bytes, &net, NULL) == MT_OK);
  return net;
}

/* P -> R on a (4,) mesh over 2 nodes of 2: a large all-reduce splits into a
 * reduce-scatter within each node, an all-reduce of halves across and an
 * all-gather, the same bytes in all and fewer between nodes; on one node, or
 * with one rank per node, it stays one all-reduce. */
static void test_allreduce_nodes(void) {
  const int64_t shape[1] = {1 << 20}, mesh[1] = {4};
  const mt_placement p[1] = {P()}, r[1] = {R()};
  mt_layout a = make(1, shape, 1, mesh, p), b = make(1, shape, 1, mesh, r);
  for (int64_t k = 0; k <= 2; ++k) {
    mt_time_model m = nodes_of(k);
    mt_plan *plan = plan_of(&a, &b, &m);
    const mt_step *s = mt_plan_step(plan, 0);
    int64_t tb = 0, tn = torch_net(&a, &b, &m, &tb);
    CHECK(mt_plan_nsteps(plan) == 1);
    CHECK_MSG(s->kind == (k == 2 ? MT_STEP_ALLREDUCE_NODES : MT_STEP_ALLREDUCE),
              "nodes of %lld: kind %d", (long long)k, s->kind);
    CHECK(mt_plan_bytes(plan) == tb);
    if (k == 2) {
      /* Each rank's half crosses in a 2-rank all-reduce: 2 (2-1)/2 of it; the flat
       * ring crosses once per node pair of ring neighbours: half its bytes. */
      CHECK(s->node_group == 2 && s->rank_messages == 2 * 1 + 1);
      CHECK_MSG(mt_plan_net_bytes(plan) == 4 * (shape[0] / 2) * 8 && tn == tb / 2,
                "net %lld, torch %lld of %lld", (long long)mt_plan_net_bytes(plan),
                (long long)tn, (long long)tb);
    } else {
      CHECK(mt_plan_net_bytes(plan) == (k == 0 ? 0 : tb) && mt_plan_net_bytes(plan) == tn);
    }
    mt_plan_destroy(plan);
  }
}

/* [S0, S1] -> [R, R] on an (8, 16) mesh of nodes of 16 (dim 1 inside a node): the
 * gather across nodes first, while dim 1 still cuts the tensor, moves 16 times
 * fewer bytes between nodes than torch's inner dim first; in all, the same. */
static void test_gather_across_first(void) {
  const int64_t shape[2] = {4096, 512}, mesh[2] = {8, 16};
  const mt_placement s[2] = {S(0), S(1)}, r[2] = {R(), R()};
  mt_layout a = make(2, shape, 2, mesh, s), b = make(2, shape, 2, mesh, r);
  mt_time_model m = nodes_of(16), one = nodes_of(0);
  mt_plan *plan = plan_of(&a, &b, &m), *flat = plan_of(&a, &b, &one);
  char got[128], before[128];
  shape_of(plan, got, sizeof got);
  shape_of(flat, before, sizeof before);
  CHECK_MSG(strcmp(got, "AG@0,AG@1") == 0, "plan %s", got);
  CHECK_MSG(strcmp(before, "AG@1,AG@0") == 0, "one node: %s", before);
  int64_t tb = 0, tn = torch_net(&a, &b, &m, &tb);
  CHECK(mt_plan_bytes(plan) == tb && mt_plan_net_bytes(plan) * 16 == tn);
  CHECK(mt_plan_time(plan) < mt_plan_predict(flat, &m));
  mt_plan_destroy(plan);
  mt_plan_destroy(flat);
}

/* [P, R] -> [R, R] on (8, 16), nodes of 16: each node cuts its replicas 16 ways,
 * all-reduces its sixteenth across the nodes and gathers it back, instead of
 * every rank all-reducing the whole vector across; [P, P] -> [R, R]
 * reduce-scatters within nodes first. */
static void test_reduce_within_first(void) {
  const int64_t shape[2] = {1024, 1024}, mesh[2] = {8, 16};
  const mt_placement pr[2] = {P(), R()}, pp[2] = {P(), P()}, r[2] = {R(), R()};
  mt_time_model m = nodes_of(16);
  const mt_placement *from[2] = {pr, pp};
  const char *want[2] = {"cut@1,AR@0,AG@1", "RS@1,AR@0,AG@1"};
  for (int i = 0; i < 2; ++i) {
    mt_layout a = make(2, shape, 2, mesh, from[i]), b = make(2, shape, 2, mesh, r);
    mt_plan *plan = plan_of(&a, &b, &m);
    char got[128];
    shape_of(plan, got, sizeof got);
    CHECK_MSG(strcmp(got, want[i]) == 0, "case %d: %s", i, got);
    int64_t tb = 0, tn = torch_net(&a, &b, &m, &tb);
    CHECK_MSG(mt_plan_bytes(plan) <= tb && mt_plan_net_bytes(plan) * 16 <= tn,
              "case %d: net %lld, torch %lld", i, (long long)mt_plan_net_bytes(plan),
              (long long)tn);
    mt_plan_destroy(plan);
  }
}

/* A mesh on one node, whatever ranks_per_node says (0, or at least the mesh),
 * plans exactly as the default model does. */
static void test_one_node_unchanged(void) {
  const int64_t shape[2] = {64, 48}, mesh[2] = {2, 4};
  const mt_placement opts[4] = {R(), S(0), S(1), P()};
  mt_time_model big = nodes_of(8);
  for (int i = 0; i < 64; ++i) {
    const mt_placement pa[2] = {opts[i % 4], opts[(i / 4) % 4]};
    const mt_placement pb[2] = {opts[(i / 16) % 3], opts[(i + 1) % 3]};
    mt_layout a = make(2, shape, 2, mesh, pa), b = make(2, shape, 2, mesh, pb);
    mt_plan *x = NULL, *y = plan_of(&a, &b, &big);
    CHECK(mt_plan_create(&a, &b, 8, &x, NULL) == MT_OK);
    char sx[128], sy[128];
    shape_of(x, sx, sizeof sx);
    shape_of(y, sy, sizeof sy);
    CHECK_MSG(strcmp(sx, sy) == 0 && mt_plan_net_bytes(y) == 0, "%s vs %s", sx, sy);
    mt_plan_destroy(x);
    mt_plan_destroy(y);
  }
}

/* The elements each rank receives from ranks of other nodes in a direct
 * exchange, from the exchange's own boxes (mt_exchange_boxes), for nodes of
 * `per_node` consecutive mesh positions. */
static int64_t boxes_net(const mt_layout *src, const mt_layout *dst, int64_t per_node) {
  int64_t n = 1, total = 0;
  for (int m = 0; m < src->mesh_ndim; ++m) n *= src->mesh_shape[m];
  mt_box *send = malloc(2 * (size_t)n * sizeof *send);
  CHECK(send != NULL);
  if (send == NULL) return -1;
  for (int64_t me = 0; me < n; ++me) {
    int64_t coord[MT_MAX_MESH_NDIM], rest = me;
    for (int m = src->mesh_ndim - 1; m >= 0; --m)
      coord[m] = rest % src->mesh_shape[m], rest /= src->mesh_shape[m];
    CHECK(mt_exchange_boxes(src, dst, -1, coord, n, send, send + n, NULL) == MT_OK);
    for (int64_t q = 0; q < n; ++q) {
      if (q / per_node != me / per_node) total += mt_box_numel(&send[n + q]);
    }
  }
  free(send);
  return total;
}

/* Every direct step's bytes between nodes are those its boxes say, on nodes that
 * are blocks of the mesh (counted in closed form) and on nodes that are not (3
 * ranks on a (2, 3) mesh's rows of 3... and 2 on them: counted pair by pair). */
static void test_direct_counts(void) {
  static const struct {
    int mesh_ndim;
    int64_t mesh[3], per_node;
  } meshes[] = {{1, {8}, 4}, {2, {2, 3}, 2}, {2, {4, 4}, 8}, {3, {2, 2, 3}, 6},
                {3, {2, 3, 2}, 4}, {2, {3, 4}, 3}};
  mt_time_model bytes_first = mt_time_model_default();
  bytes_first.alpha[MT_LINK_SHM] = bytes_first.alpha[MT_LINK_NET] = 0.0;
  bytes_first.call = bytes_first.copy = bytes_first.reduce = 0.0;
  const mt_placement opts[3] = {R(), S(0), S(1)};
  int directs = 0;
  for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; ++i) {
    const int64_t shape[2] = {13, 10};
    int nd = meshes[i].mesh_ndim;
    bytes_first.ranks_per_node = meshes[i].per_node;
    for (int c = 0; c < 81; ++c) {
      mt_placement pa[3], pb[3];
      for (int m = 0; m < nd; ++m) pa[m] = opts[(c / (m + 1)) % 3], pb[m] = opts[(c / (3 * m + 2) + m) % 3];
      mt_layout a = make(2, shape, nd, meshes[i].mesh, pa);
      mt_layout b = make(2, shape, nd, meshes[i].mesh, pb);
      mt_plan *plan = plan_of(&a, &b, &bytes_first);
      for (int s = 0; plan != NULL && s < mt_plan_nsteps(plan); ++s) {
        const mt_step *st = mt_plan_step(plan, s);
        if (st->kind != MT_STEP_DIRECT) continue;
        ++directs;
        int64_t want = boxes_net(&st->src, &st->dst, meshes[i].per_node) * 8;
        CHECK_MSG(st->net_bytes == want, "mesh %zu case %d: %lld between nodes, boxes %lld",
                  i, c, (long long)st->net_bytes, (long long)want);
      }
      mt_plan_destroy(plan);
    }
  }
  CHECK_MSG(directs > 50, "only %d direct steps", directs);
}

/* Deterministic randomness. */
static uint64_t state = 0x9E3779B97F4A7C15u;
static int64_t rnd(int64_t n) {
  uint64_t z = (state += 0x9E3779B97F4A7C15u);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
  return (int64_t)((z ^ (z >> 31)) % (uint64_t)n);
}

static mt_placement random_placement(int ndim, int partial) {
  int64_t r = rnd(partial ? 5 : 4);
  return r == 4 ? P() : r == 0 ? R() : S((int)rnd(ndim));
}

/* The models the search runs under: the built-in one; a network as fast as
 * shared memory (where a plan that crosses more is not slower for it); bytes
 * alone (no cost per message or step). */
static mt_time_model model_kind(int kind, int64_t per_node) {
  mt_time_model m = nodes_of(per_node);
  if (kind == 1) {
    m.alpha[MT_LINK_NET] = m.alpha[MT_LINK_SHM];
    m.beta[MT_LINK_NET] = m.beta[MT_LINK_SHM];
  } else if (kind == 2) {
    m.alpha[MT_LINK_SHM] = m.alpha[MT_LINK_NET] = m.call = 0.0;
  }
  return m;
}

/* One move checked: no more bytes between nodes than torch's steps, nor in all,
 * and the plan's bytes between nodes are its steps'. 1 when planned. */
static int check_move(const mt_layout *a, const mt_layout *b, const mt_time_model *m,
                      const char *what) {
  mt_plan *plan = plan_of(a, b, m);
  if (plan == NULL) return 0;
  int64_t tb = 0, tn = torch_net(a, b, m, &tb), steps = 0;
  for (int s = 0; s < mt_plan_nsteps(plan); ++s) steps += mt_plan_step(plan, s)->net_bytes;
  char got[160];
  shape_of(plan, got, sizeof got);
  CHECK_MSG(mt_plan_net_bytes(plan) <= tn && mt_plan_bytes(plan) <= tb,
            "%s, nodes of %lld: %s: net %lld vs torch %lld, bytes %lld vs %lld", what,
            (long long)m->ranks_per_node, got, (long long)mt_plan_net_bytes(plan),
            (long long)tn, (long long)mt_plan_bytes(plan), (long long)tb);
  CHECK(steps == mt_plan_net_bytes(plan));
  mt_plan_destroy(plan);
  return 1;
}

static const struct {
  int nd;
  int64_t mesh[3];
} meshes[] = {{1, {4}},         {2, {2, 2}},      {1, {64}},        {2, {8, 8}},
              {3, {2, 4, 8}},   {2, {16, 16}},    {2, {16, 64}},    {3, {4, 16, 16}},
              {1, {16384}},     {2, {128, 128}},  {3, {8, 16, 128}}, {2, {6, 10}}};
static const int64_t per_node[] = {1, 2, 3, 4, 8, 16, 32, 64, 128, 256};
#define NMESHES ((int)(sizeof meshes / sizeof meshes[0]))
#define NPER ((int)(sizeof per_node / sizeof per_node[0]))

static int64_t numel_of(int i) {
  int64_t n = 1;
  for (int m = 0; m < meshes[i].nd; ++m) n *= meshes[i].mesh[m];
  return n;
}

/* Every move between placements of R, S0, S1 and P (targets without P) of a large
 * and of an odd 2-d tensor, on the 1-d and 2-d meshes of at most 1,024 ranks, on
 * every node size that splits them, under the three models. */
static void test_every_move(void) {
  const mt_placement opts[4] = {R(), S(0), S(1), P()};
  const int64_t shapes[2][2] = {{4096, 1024}, {37, 5}};
  int checked = 0;
  for (int i = 0; i < NMESHES; ++i) {
    int nd = meshes[i].nd, pairs = 1;
    if (nd > 2 || numel_of(i) > 1024) continue;
    for (int m = 0; m < nd; ++m) pairs *= 16;
    for (int k = 0; k < NPER; ++k) {
      if (per_node[k] >= numel_of(i)) continue;
      for (int c = 0; c < pairs * 2 * 3; c += stride) {
        int pair = c / 6, v = pair;
        mt_placement pa[2], pb[2];
        for (int m = 0; m < nd; ++m) pa[m] = opts[v % 4], pb[m] = opts[(v / 4) % 4], v /= 16;
        int skip = 0;
        for (int m = 0; m < nd; ++m) skip |= pb[m].kind == MT_PLACEMENT_PARTIAL;
        if (skip) continue;
        mt_time_model md = model_kind(c % 3, per_node[k]);
        mt_layout a = make(2, shapes[(c / 3) % 2], nd, meshes[i].mesh, pa);
        mt_layout b = make(2, shapes[(c / 3) % 2], nd, meshes[i].mesh, pb);
        char what[64];
        snprintf(what, sizeof what, "mesh %d pair %d", i, pair);
        checked += check_move(&a, &b, &md, what);
      }
    }
  }
  CHECK_MSG(checked > 10000 / stride, "%d moves", checked);
}

/* The same over random layouts (1- to 3-d tensors of 1 to 4,096 per dim, kept
 * Partials) on every mesh, up to 16,384 ranks. */
static void test_random_moves(void) {
  int checked = 0;
  for (int i = 0; i < NMESHES; ++i) {
    int nd = meshes[i].nd;
    for (int k = 0; k < NPER; ++k) {
      if (per_node[k] >= numel_of(i)) continue;
      int cases = numel_of(i) > 4096 ? 6 : 24;
      for (int c = 0; c < cases * 3; c += stride) {
        mt_time_model m = model_kind(c % 3, per_node[k]);
        int ndim = 1 + (int)rnd(3);
        int64_t shape[3];
        for (int d = 0; d < ndim; ++d) shape[d] = 1 + rnd(rnd(2) ? 4096 : 40);
        mt_placement pa[3], pb[3];
        for (int j = 0; j < nd; ++j) {
          pa[j] = random_placement(ndim, 1);
          pb[j] = pa[j].kind == MT_PLACEMENT_PARTIAL && rnd(4) == 0 ? pa[j]
                                                                     : random_placement(ndim, 0);
        }
        mt_layout a = make(ndim, shape, nd, meshes[i].mesh, pa);
        mt_layout b = make(ndim, shape, nd, meshes[i].mesh, pb);
        char what[64];
        snprintf(what, sizeof what, "mesh %d random case %d", i, c);
        checked += check_move(&a, &b, &m, what);
      }
    }
  }
  CHECK_MSG(checked > 2400 / stride, "%d moves", checked);
}

/* A cut of a Replicate array too large to count in bytes moves nothing: torch's
 * bytes are 0 and pricing its message size must not overflow (found by the
 * fuzzer; UBSan in test-asan and test-fuzz would flag it). */
static void test_huge_cut_prices_without_overflow(void) {
  int64_t shape[1] = {(int64_t)1 << 61}, mesh[1] = {2};
  mt_placement r[1] = {R()}, s0[1] = {S(0)};
  mt_layout a = make(1, shape, 1, mesh, r), b = make(1, shape, 1, mesh, s0);
  mt_time_model m = nodes_of(1);
  int64_t bytes = -1, net = -1;
  CHECK(mt_plan_torch_bytes(&a, &b, 1 << 20, &m, &bytes, &net, NULL) == MT_OK);
  CHECK(bytes == 0 && net == 0);
}

int main(int argc, char **argv) {
  const char *q = getenv("MT_TEST_QUICK");
  if ((argc > 1 && strcmp(argv[1], "--quick") == 0) || (q != NULL && q[0] == '1')) stride = 7;
  test_huge_cut_prices_without_overflow();
  test_allreduce_nodes();
  test_gather_across_first();
  test_reduce_within_first();
  test_one_node_unchanged();
  test_direct_counts();
  test_every_move();
  test_random_moves();
  return mt_test_exit("test_plan_nodes");
}
