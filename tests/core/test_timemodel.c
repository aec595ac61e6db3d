/* The time model (timemodel.h) and plans ranked by it: link classes from the node
 * layout, Open MPI's algorithm choices, the alpha-beta prices, and the switch
 * between per-mesh-dim collectives and one direct exchange as sizes grow. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/timemodel.h"

static mt_placement R(void) { return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0}; }
static mt_placement S(int dim) { return (mt_placement){MT_PLACEMENT_SHARD, dim, 0, 0}; }

static mt_layout make2(int64_t rows, int64_t cols, int64_t m0, int64_t m1, mt_placement a,
                       mt_placement b) {
  mt_layout l;
  const int64_t shape[2] = {rows, cols}, mesh[2] = {m0, m1};
  const mt_placement p[2] = {a, b};
  int rc = mt_layout_init(&l, 2, shape, 2, mesh, p, NULL);
  CHECK(rc == MT_OK);
  return l;
}

static int close_to(double a, double b) { return fabs(a - b) <= 1e-12 * fabs(b) + 1e-18; }

static void test_check(void) {
  mt_time_model m = mt_time_model_default();
  mt_error err = {0};
  CHECK(mt_time_model_check(&m, &err) == MT_OK);
  CHECK(m.ranks_per_node == 0 && m.alpha[MT_LINK_NET] > m.alpha[MT_LINK_SHM]);
  mt_time_model bad = m;
  bad.alpha[MT_LINK_SHM] = -1.0;
  CHECK(mt_time_model_check(&bad, &err) == MT_EINVAL && strstr(err.msg, "shared memory"));
  bad = m;
  bad.beta[MT_LINK_NET] = NAN;
  CHECK(mt_time_model_check(&bad, &err) == MT_EINVAL && strstr(err.msg, "network"));
  bad = m;
  bad.alpha[MT_LINK_NET] = bad.alpha[MT_LINK_SHM] / 2;
  CHECK(mt_time_model_check(&bad, &err) == MT_EINVAL && strstr(err.msg, "faster"));
  bad = m;
  bad.call = INFINITY;
  CHECK(mt_time_model_check(&bad, &err) == MT_EINVAL && strstr(err.msg, "call"));
  bad = m;
  bad.copy = -1e-10;
  CHECK(mt_time_model_check(&bad, &err) == MT_EINVAL && strstr(err.msg, "copy"));
  bad = m;
  bad.reduce = NAN;
  CHECK(mt_time_model_check(&bad, &err) == MT_EINVAL && strstr(err.msg, "reduce"));
  CHECK(m.copy > 0.0 && m.reduce > 0.0);
  bad = m;
  bad.ranks_per_node = -2;
  CHECK(mt_time_model_check(&bad, &err) == MT_EINVAL && strstr(err.msg, "ranks_per_node"));
  CHECK(mt_time_model_check(NULL, &err) == MT_EINVAL);
  /* A plan refuses an invalid model before anything else. */
  mt_layout a = make2(8, 8, 2, 2, S(0), R()), b = make2(8, 8, 2, 2, R(), R());
  mt_plan *plan = NULL;
  bad = m;
  bad.beta[MT_LINK_SHM] = -1e-9;
  CHECK(mt_plan_create_timed(&a, &b, 8, &bad, &plan, &err) == MT_EINVAL && plan == NULL);
}

static void test_links(void) {
  mt_time_model m = mt_time_model_default();
  /* One node: everything is shared memory. */
  CHECK(mt_time_link(&m, 4096, 64, 64) == MT_LINK_SHM);
  /* 64 ranks per node on a (64, 64) mesh: mesh dim 1 (stride 1) stays in a node,
   * mesh dim 0 (stride 64) crosses nodes. */
  m.ranks_per_node = 64;
  CHECK(mt_time_link(&m, 4096, 64, 1) == MT_LINK_SHM);
  CHECK(mt_time_link(&m, 4096, 64, 64) == MT_LINK_NET);
  /* 8 per node: a group of 64 consecutive ranks spans 8 nodes; 8 of them fit. */
  m.ranks_per_node = 8;
  CHECK(mt_time_link(&m, 4096, 64, 1) == MT_LINK_NET);
  CHECK(mt_time_link(&m, 4096, 8, 1) == MT_LINK_SHM);
  CHECK(mt_time_link(&m, 4096, 4, 2) == MT_LINK_SHM);
  /* Groups that straddle node boundaries: 3 ranks in nodes of 8. */
  CHECK(mt_time_link(&m, 4095, 3, 1) == MT_LINK_NET);
  /* A group of one never communicates. */
  CHECK(mt_time_link(&m, 4096, 1, 4096) == MT_LINK_SHM);
}

static void test_algorithms(void) {
  CHECK(mt_time_coll_alg(MT_TIME_ALLGATHER, 1, 100) == MT_ALG_NONE);
  CHECK(mt_time_coll_alg(MT_TIME_ALLGATHER, 2, 1 << 30) == MT_ALG_TWO_PROC);
  CHECK(mt_time_coll_alg(MT_TIME_ALLGATHER, 64, 1024) == MT_ALG_RECURSIVE);
  CHECK(mt_time_coll_alg(MT_TIME_ALLGATHER, 64, 1 << 20) == MT_ALG_RING);
  CHECK(mt_time_coll_alg(MT_TIME_ALLREDUCE, 64, 8000) == MT_ALG_RECURSIVE);
  CHECK(mt_time_coll_alg(MT_TIME_ALLREDUCE, 64, 1 << 20) == MT_ALG_RING);
  CHECK(mt_time_coll_alg(MT_TIME_REDUCE_SCATTER, 6, 12 * 1024) == MT_ALG_RECURSIVE);
  CHECK(mt_time_coll_alg(MT_TIME_REDUCE_SCATTER, 6, 100 * 1024) == MT_ALG_RING);
  CHECK(mt_time_coll_alg(MT_TIME_REDUCE_SCATTER, 8, 100 * 1024) == MT_ALG_RECURSIVE);
  CHECK(mt_time_coll_alg(MT_TIME_REDUCE_SCATTER, 8, 1 << 20) == MT_ALG_RING);
  CHECK(mt_time_coll_alg(MT_TIME_ALLTOALL, 64, 16) == MT_ALG_LINEAR);
}

static void test_prices(void) {
  mt_time_model m = mt_time_model_default();
  double a = m.alpha[MT_LINK_NET], b = m.beta[MT_LINK_NET], c = m.call;
  /* Recursive doubling: 6 rounds for 64 ranks, the others' 63 KiB once. */
  CHECK(close_to(mt_time_coll(&m, MT_TIME_ALLGATHER, 64, 1024 * 64 / 64, 1008, MT_LINK_NET),
                 c + 6 * a + 1008 * b));
  /* Neighbour exchange on an even group: 32 rounds. */
  CHECK(close_to(mt_time_coll(&m, MT_TIME_ALLGATHER, 64, 1 << 20, 63 << 14, MT_LINK_NET),
                 c + 32 * a + (63 << 14) * b));
  /* Ring on an odd group: G - 1 rounds. */
  CHECK(close_to(mt_time_coll(&m, MT_TIME_ALLGATHER, 63, 1 << 20, 1000000, MT_LINK_NET),
                 c + 62 * a + 1e6 * b));
  /* A small all-reduce sends its whole vector every round. */
  CHECK(close_to(mt_time_coll(&m, MT_TIME_ALLREDUCE, 16, 4000, 0, MT_LINK_SHM),
                 c + 4 * (m.alpha[MT_LINK_SHM] + 4000 * m.beta[MT_LINK_SHM])));
  /* A large one: reduce-scatter and all-gather by ring. */
  CHECK(close_to(mt_time_coll(&m, MT_TIME_ALLREDUCE, 16, 1 << 20, 0, MT_LINK_SHM),
                 c + 30 * m.alpha[MT_LINK_SHM] +
                     2.0 * (1 << 20) * 15 / 16 * m.beta[MT_LINK_SHM]));
  CHECK(close_to(mt_time_linear(&m, 10, 1000, MT_LINK_SHM),
                 c + 10 * m.alpha[MT_LINK_SHM] + 1000 * m.beta[MT_LINK_SHM]));
  CHECK(mt_time_coll(&m, MT_TIME_ALLGATHER, 1, 1 << 20, 0, MT_LINK_NET) == 0.0);
}

/* How many members of a mesh dim's groups share a node. */
static void test_members_per_node(void) {
  mt_time_model m = mt_time_model_default();
  /* One node: every group whole. */
  CHECK(mt_time_members_per_node(&m, 1024, 128, 1) == 128);
  /* (8, 128) on nodes of 64: dim 1's groups hold runs of 64 on a node, dim 0's
   * one member per node. */
  m.ranks_per_node = 64;
  CHECK(mt_time_members_per_node(&m, 1024, 128, 1) == 64);
  CHECK(mt_time_members_per_node(&m, 1024, 8, 128) == 1);
  /* (16, 16) on nodes of 64: dim 0's groups (stride 16) keep 4 members on a node. */
  CHECK(mt_time_members_per_node(&m, 256, 16, 16) == 4);
  CHECK(mt_time_members_per_node(&m, 256, 16, 1) == 16);
  /* Runs that do not divide the group: priced as one member per node. */
  m.ranks_per_node = 3;
  CHECK(mt_time_members_per_node(&m, 12, 4, 1) == 1);
}

/* The share of a collective's bytes that crosses nodes, by its algorithm. */
static void test_net_share(void) {
  /* A ring crosses once per run of members on a node. */
  CHECK(close_to(mt_time_net_share(MT_TIME_ALLGATHER, 16, 4, 1 << 20), 0.25));
  CHECK(close_to(mt_time_net_share(MT_TIME_ALLREDUCE, 16, 1, 1 << 20), 1.0));
  /* Recursive doubling: the rounds whose partners are 4 or more apart. */
  CHECK(close_to(mt_time_net_share(MT_TIME_ALLGATHER, 16, 4, 1024), 12.0 / 15.0));
  CHECK(close_to(mt_time_net_share(MT_TIME_ALLREDUCE, 16, 4, 1024), 0.5));
  /* A linear exchange: the members on other nodes. */
  CHECK(close_to(mt_time_net_share(MT_TIME_ALLTOALL, 16, 4, 1 << 20), 12.0 / 15.0));
  CHECK(mt_time_net_share(MT_TIME_ALLTOALL, 16, 16, 1 << 20) == 0.0);
}

/* Groups over nodes: one rank per node is the network's per-rank price, one node
 * shared memory's; in between, the rounds inside a node cost shared memory's alpha
 * and what crosses is paid for every rank of a node at once. */
static void test_nodes_prices(void) {
  mt_time_model m = mt_time_model_default();
  const int kinds[4] = {MT_TIME_ALLGATHER, MT_TIME_ALLTOALL, MT_TIME_ALLREDUCE,
                        MT_TIME_REDUCE_SCATTER};
  const int64_t sizes[3] = {512, 40000, 1 << 22};
  for (int k = 0; k < 4; ++k) {
    for (int s = 0; s < 3; ++s) {
      int64_t got = sizes[s] * 15 / 16;
      m.ranks_per_node = 1;
      CHECK(close_to(mt_time_coll_nodes(&m, kinds[k], 16, 1, sizes[s], got),
                     mt_time_coll(&m, kinds[k], 16, sizes[s], got, MT_LINK_NET)));
      m.ranks_per_node = 0;
      CHECK(close_to(mt_time_coll_nodes(&m, kinds[k], 16, 1, sizes[s], got),
                     mt_time_coll(&m, kinds[k], 16, sizes[s], got, MT_LINK_SHM)));
      m.ranks_per_node = 16;
      CHECK(close_to(mt_time_coll_nodes(&m, kinds[k], 16, 16, sizes[s], got),
                     mt_time_coll(&m, kinds[k], 16, sizes[s], got, MT_LINK_SHM)));
    }
  }
  const double *a = m.alpha, *b = m.beta, c = m.call;
  /* A dp dim of (8, 4) on nodes of 4: a large ring all-gather whose every member
   * is on another node; the four rings of a node share its link. */
  m.ranks_per_node = 4;
  double r = 7.0 * (1 << 20);
  CHECK(close_to(mt_time_coll_nodes(&m, MT_TIME_ALLGATHER, 8, 1, 8 << 20, 7 << 20),
                 c + 4 * a[MT_LINK_NET] + 4 * r * b[MT_LINK_NET]));
  /* A 1-d (16,) on nodes of 4: one ring, crossing once per node. */
  double g = 15.0 * (1 << 20);
  CHECK(close_to(mt_time_coll_nodes(&m, MT_TIME_ALLGATHER, 16, 4, 16 << 20, 15 << 20),
                 c + 8 * a[MT_LINK_NET] + g * b[MT_LINK_NET]));
  /* Small: recursive doubling, 2 rounds inside a node, 2 across by all 4 ranks. */
  CHECK(close_to(mt_time_coll_nodes(&m, MT_TIME_ALLGATHER, 16, 4, 1600, 1500),
                 c + 2 * a[MT_LINK_SHM] + 2 * a[MT_LINK_NET] +
                     1500.0 * 3 / 15 * b[MT_LINK_SHM] + 4 * 1500.0 * 12 / 15 * b[MT_LINK_NET]));
}

/* The local passes of each step kind, worked by hand on 8 x 8 float64 (512 B)
 * over 4 ranks, and a step's time as its collective plus those passes. */
static void test_local_passes(void) {
  static const struct {
    mt_placement from, to;
    int kind;
    int64_t copy, reduce;
  } cases[] = {
      {{MT_PLACEMENT_SHARD, 0, 0, 0}, {MT_PLACEMENT_REPLICATE, 0, 0, 0}, MT_STEP_ALLGATHER, 0, 0},
      /* the blocks of columns are placed in the whole output */
      {{MT_PLACEMENT_SHARD, 1, 0, 0}, {MT_PLACEMENT_REPLICATE, 0, 0, 0}, MT_STEP_ALLGATHER, 512, 0},
      /* the kept two columns are copied */
      {{MT_PLACEMENT_REPLICATE, 0, 0, 0}, {MT_PLACEMENT_SHARD, 1, 0, 0}, MT_STEP_CHUNK, 128, 0},
      {{MT_PLACEMENT_PARTIAL, 0, 0, 0}, {MT_PLACEMENT_REPLICATE, 0, 0, 0}, MT_STEP_ALLREDUCE, 0,
       384},
      /* three contributions of two rows; blocks of rows are slabs */
      {{MT_PLACEMENT_PARTIAL, 0, 0, 0}, {MT_PLACEMENT_SHARD, 0, 0, 0}, MT_STEP_REDUCE_SCATTER, 0,
       384},
      {{MT_PLACEMENT_PARTIAL, 0, 0, 0}, {MT_PLACEMENT_SHARD, 1, 0, 0}, MT_STEP_REDUCE_SCATTER,
       512, 384},
      /* rows to columns: the columns sent are strided, MPI packs them, and every
       * element of the target box passes once (kept or unpacked) */
      {{MT_PLACEMENT_SHARD, 0, 0, 0}, {MT_PLACEMENT_SHARD, 1, 0, 0}, MT_STEP_ALLTOALL, 128, 0},
  };
  mt_time_model m = mt_time_model_default(), free_local = m;
  free_local.copy = free_local.reduce = 0.0;
  const int64_t shape[2] = {8, 8}, mesh[1] = {4};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    mt_layout a, b;
    CHECK(mt_layout_init(&a, 2, shape, 1, mesh, &cases[i].from, NULL) == MT_OK);
    CHECK(mt_layout_init(&b, 2, shape, 1, mesh, &cases[i].to, NULL) == MT_OK);
    mt_plan *plan = NULL;
    CHECK(mt_plan_create_timed(&a, &b, 8, &m, &plan, NULL) == MT_OK);
    const mt_step *st = mt_plan_step(plan, 0);
    CHECK(mt_plan_nsteps(plan) == 1 && st->kind == cases[i].kind);
    CHECK_MSG(st->copy_bytes == cases[i].copy && st->reduce_bytes == cases[i].reduce,
              "case %zu: copies %lld, reduces %lld", i, (long long)st->copy_bytes,
              (long long)st->reduce_bytes);
    CHECK(close_to(st->time, mt_plan_predict(plan, &free_local) +
                                 mt_time_local(&m, cases[i].copy, cases[i].reduce)));
    mt_plan_destroy(plan);
  }
  CHECK(close_to(mt_time_local(&m, 1000, 10), 1000 * m.copy + 10 * m.reduce));
}

/* Rows of one element: every part of the exchange is contiguous, so only the
 * kept part is copied; and a direct exchange whose parts are strided on both
 * sides passes over its target box and what it lacks. */
static void test_exchange_copies(void) {
  mt_time_model m = mt_time_model_default();
  m.copy = m.reduce = 0.0; /* the direct exchange wins; the copies are still counted */
  const int64_t rows[2] = {4, 8}, one[1] = {4};
  const mt_placement s0 = S(0), s1 = S(1);
  mt_layout a, b;
  CHECK(mt_layout_init(&a, 2, rows, 1, one, &s0, NULL) == MT_OK);
  CHECK(mt_layout_init(&b, 2, rows, 1, one, &s1, NULL) == MT_OK);
  mt_plan *plan = NULL;
  CHECK(mt_plan_create_timed(&a, &b, 8, &m, &plan, NULL) == MT_OK);
  CHECK(mt_plan_step(plan, 0)->copy_bytes == 2 * 8);
  mt_plan_destroy(plan);
  /* [S1, S0] -> [S2, R] of 4 x 4 x 4 on (2, 2): each rank keeps 2 x 2 x 2 of its
   * 4 x 4 x 2 target and lacks 24 elements. */
  const int64_t cube[3] = {4, 4, 4}, mesh[2] = {2, 2};
  const mt_placement from[2] = {S(1), S(0)}, to[2] = {{MT_PLACEMENT_SHARD, 2, 0, 0}, R()};
  CHECK(mt_layout_init(&a, 3, cube, 2, mesh, from, NULL) == MT_OK);
  CHECK(mt_layout_init(&b, 3, cube, 2, mesh, to, NULL) == MT_OK);
  CHECK(mt_plan_create_timed(&a, &b, 8, &m, &plan, NULL) == MT_OK);
  CHECK(mt_plan_nsteps(plan) == 1 && mt_plan_step(plan, 0)->kind == MT_STEP_DIRECT);
  CHECK(mt_plan_step(plan, 0)->copy_bytes == (32 + 24) * 8);
  mt_plan_destroy(plan);
}

static int has_direct(const mt_plan *plan) {
  for (int i = 0; i < mt_plan_nsteps(plan); ++i)
    if (mt_plan_step(plan, i)->kind == MT_STEP_DIRECT) return 1;
  return 0;
}

/* [R, S(0)] -> [S(1), R] on a (64, 64) mesh of 64 ranks per node: for a small
 * tensor one all-gather inside each node and a cut beat a direct exchange of 63
 * messages over the network, though the exchange moves fewer bytes; for a large
 * one the exchange's bytes win. Bytes first (no per-message cost) always picks
 * the exchange, as the planner did before it had a time model. */
static void test_switch(void) {
  mt_time_model m = mt_time_model_default(), bytes_first = m;
  m.ranks_per_node = 64;
  bytes_first.alpha[MT_LINK_SHM] = bytes_first.alpha[MT_LINK_NET] = 0.0;
  bytes_first.call = 0.0;
  const int64_t cols[2] = {1, 32768}; /* 32 KiB and 1 GiB of float64 */
  for (int i = 0; i < 2; ++i) {
    mt_layout a = make2(4096, cols[i], 64, 64, R(), S(0));
    mt_layout b = make2(4096, cols[i], 64, 64, S(1), R());
    mt_plan *timed = NULL, *flat = NULL;
    CHECK(mt_plan_create_timed(&a, &b, 8, &m, &timed, NULL) == MT_OK);
    CHECK(mt_plan_create_timed(&a, &b, 8, &bytes_first, &flat, NULL) == MT_OK);
    CHECK_MSG(has_direct(timed) == (i == 1), "size %d: %d steps, first kind %d", i,
              mt_plan_nsteps(timed), mt_plan_step(timed, 0)->kind);
    CHECK(has_direct(flat));
    CHECK(mt_plan_bytes(flat) <= mt_plan_bytes(timed));
    double sum = 0.0;
    for (int s = 0; s < mt_plan_nsteps(timed); ++s) sum += mt_plan_step(timed, s)->time;
    CHECK(mt_plan_time(timed) > 0.0 && close_to(mt_plan_time(timed), sum));
    mt_plan_destroy(timed);
    mt_plan_destroy(flat);
  }
}

/* Two ranks on one node: every 1-D transition is the one collective it was. */
static void test_two_ranks(void) {
  mt_time_model m = mt_time_model_default();
  const int64_t shape[1] = {1 << 20}, mesh[1] = {2};
  const mt_placement from[3] = {S(0), R(), S(0)}, to[3] = {R(), S(0), S(0)};
  const int kinds[2] = {MT_STEP_ALLGATHER, MT_STEP_CHUNK};
  for (int i = 0; i < 2; ++i) {
    mt_layout a, b;
    CHECK(mt_layout_init(&a, 1, shape, 1, mesh, &from[i], NULL) == MT_OK);
    CHECK(mt_layout_init(&b, 1, shape, 1, mesh, &to[i], NULL) == MT_OK);
    mt_plan *plan = NULL;
    CHECK(mt_plan_create_timed(&a, &b, 4, &m, &plan, NULL) == MT_OK);
    CHECK(mt_plan_nsteps(plan) == 1 && mt_plan_step(plan, 0)->kind == kinds[i]);
    mt_plan_destroy(plan);
  }
}

int main(void) {
  test_check();
  test_links();
  test_algorithms();
  test_prices();
  test_members_per_node();
  test_net_share();
  test_nodes_prices();
  test_switch();
  test_two_ranks();
  test_local_passes();
  test_exchange_copies();
  return mt_test_exit("test_timemodel");
}
