/* The time model (timemodel.h) and plans ranked by it: link classes from the node
 * layout, Open MPI's algorithm choices, the alpha-beta prices, and the switch
 * between per-mesh-dim collectives and one direct exchange as sizes grow. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "mpitensor/plan.h"
#include "mpitensor/timemodel.h"

static mt_placement R(void) { return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0}; }
static mt_placement S(int dim) { return (mt_placement){MT_PLACEMENT_SHARD, dim, 0}; }

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
  test_switch();
  test_two_ranks();
  return mt_test_exit("test_timemodel");
}
