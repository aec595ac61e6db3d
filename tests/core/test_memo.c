/* The decision memo and the layout table: ids that are never reused, bounds that
 * hold under CLOCK eviction (recently found entries survive), plans held exactly
 * as long as their decisions, a miss decided by the core (moves checked before any
 * plan), and the bounded cache under them on a random workload. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/layout_table.h"
#include "mpitensor/core/memo.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/prop.h"
#include "mpitensor/core/status.h"

static mt_layout_key layout(int64_t rows, int shard) {
  mt_layout_key k;
  memset(&k, 0xab, sizeof k); /* entries past ndim must not matter */
  k.mesh_ndim = 1, k.ndim = 2, k.dtype = MT_DTYPE_FLOAT64, k.itemsize = 8;
  k.placements[0] = shard ? (mt_placement){MT_PLACEMENT_SHARD, 0, 0, 0}
                          : (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0};
  k.shape[0] = rows, k.shape[1] = 4, k.stride[0] = 4, k.stride[1] = 1;
  return k;
}

static int64_t intern(mt_layout_table *t, mt_layout_key k, int64_t *slot) {
  int64_t id = 0, s = 0;
  CHECK(mt_layout_table_intern(t, &k, &id, &s, NULL) == MT_OK);
  if (slot != NULL) *slot = s;
  return id;
}

static void test_layout_ids(void) {
  mt_layout_table *t = NULL;
  CHECK(mt_layout_table_create(4, &t, NULL) == MT_OK);
  int64_t s1, s2;
  int64_t a = intern(t, layout(8, 1), &s1);
  CHECK(a > 0 && intern(t, layout(8, 1), NULL) == a);
  int64_t b = intern(t, layout(8, 0), &s2);
  CHECK(b != a && s2 != s1);
  mt_layout_key copy = layout(8, 1);
  copy.shape[5] = 99, copy.placements[3].dim = 7; /* past ndim, mesh_ndim */
  CHECK(intern(t, copy, NULL) == a);
  const mt_layout_key *got = mt_layout_table_get(t, a, s1);
  CHECK(got != NULL && got->shape[0] == 8 && got->placements[0].kind == MT_PLACEMENT_SHARD);
  CHECK(mt_layout_table_get(t, b, s1) == NULL);
  /* Past the capacity the clock evicts; ids never come back. */
  int64_t seen[64], n = 0;
  for (int64_t rows = 100; rows < 140; ++rows) {
    int64_t id = intern(t, layout(rows, 1), NULL);
    for (int64_t i = 0; i < n; ++i) CHECK(seen[i] != id);
    CHECK(id != a && id != b);
    seen[n++] = id;
    CHECK(mt_layout_table_count(t) <= 4);
  }
  CHECK(mt_layout_table_get(t, a, s1) == NULL);
  int64_t again = intern(t, layout(8, 1), NULL);
  CHECK(again != a && again > seen[n - 1]);
  mt_layout_key bad = layout(8, 1);
  bad.ndim = MT_MAX_NDIM + 1;
  int64_t id, slot;
  CHECK(mt_layout_table_intern(t, &bad, &id, &slot, NULL) == MT_EINVAL);
  CHECK(mt_layout_table_set_capacity(t, 2, NULL) == MT_OK && mt_layout_table_count(t) == 0);
  CHECK(mt_layout_table_capacity(t) == 2 && intern(t, layout(8, 1), NULL) > again);
  mt_layout_table_destroy(t);
  mt_layout_table_destroy(NULL);
}

/* A second-chance entry: found since the hand passed, it outlives a cold one. */
static void test_clock(void) {
  mt_layout_table *t = NULL;
  CHECK(mt_layout_table_create(3, &t, NULL) == MT_OK);
  int64_t hot = intern(t, layout(1, 1), NULL);
  intern(t, layout(2, 1), NULL);
  intern(t, layout(3, 1), NULL);
  for (int64_t rows = 10; rows < 30; ++rows) {
    CHECK(intern(t, layout(1, 1), NULL) == hot);
    intern(t, layout(rows, 1), NULL);
  }
  CHECK(intern(t, layout(1, 1), NULL) == hot);
  mt_layout_table_destroy(t);
}

static mt_plan *make_plan(void) {
  mt_layout a, b;
  const int64_t shape[1] = {8}, mesh[1] = {2};
  const mt_placement s0 = {MT_PLACEMENT_SHARD, 0, 0, 0}, r = {MT_PLACEMENT_REPLICATE, 0, 0, 0};
  CHECK(mt_layout_init(&a, 1, shape, 1, mesh, &s0, NULL) == MT_OK);
  CHECK(mt_layout_init(&b, 1, shape, 1, mesh, &r, NULL) == MT_OK);
  mt_plan *p = NULL;
  CHECK(mt_plan_create(&a, &b, 8, &p, NULL) == MT_OK);
  return p;
}

static mt_memo_key key(int64_t op, int64_t a, int64_t b) {
  mt_memo_key k;
  memset(&k, 0x5a, sizeof k);
  k.op = op, k.aux = 0, k.noperands = 2, k.grad = 0, k.want = 0, k.operand[0] = a, k.operand[1] = b;
  return k;
}

static mt_decision decision(mt_plan *p0, mt_plan *p1) {
  mt_decision d;
  memset(&d, 0, sizeof d);
  d.ninputs = 2, d.plan[0] = p0, d.plan[1] = p1, d.mesh_ndim = 1, d.out_ndim = 1;
  d.out_shape[0] = 8;
  return d;
}

static void test_memo_basics(void) {
  mt_memo *memo = NULL;
  CHECK(mt_memo_create(8, 4, &memo, NULL) == MT_OK);
  mt_memo_key k = key(1, 5, -2);
  CHECK(mt_memo_find(memo, &k) == NULL);
  mt_decision d = decision(NULL, NULL);
  mt_decision *got = mt_memo_insert(memo, &k, &d, NULL);
  CHECK(got != NULL && got->out_shape[0] == 8);
  got->out_id = 42;
  mt_memo_key same = key(1, 5, -2);
  same.operand[5] = 1234; /* past noperands: ignored */
  got = mt_memo_find(memo, &same);
  CHECK(got != NULL && got->out_id == 42);
  mt_memo_key other = key(1, 5, -3), op2 = key(2, 5, -2);
  CHECK(mt_memo_peek(memo, &other) == NULL && mt_memo_peek(memo, &op2) == NULL);
  /* A gradient wanted is another decision, through the front entry as well. */
  mt_memo_key wants = key(1, 5, -2);
  wants.grad = 2;
  CHECK(mt_memo_find(memo, &wants) == NULL && mt_memo_peek(memo, &wants) == NULL);
  /* So is an output headed elsewhere. */
  mt_memo_key headed = key(1, 5, -2);
  headed.want = 9;
  CHECK(mt_memo_find(memo, &headed) == NULL && mt_memo_peek(memo, &headed) == NULL);
  mt_memo_stats st;
  mt_memo_stats_get(memo, &st);
  CHECK(st.hits == 1 && st.misses == 3 && st.decisions == 1 && st.plans == 0);
  mt_memo_key bad = key(1, 5, -2);
  bad.noperands = MT_MEMO_MAX_OPERANDS + 1;
  CHECK(mt_memo_insert(memo, &bad, &d, NULL) == NULL && mt_memo_peek(memo, &bad) == NULL);
  mt_memo_clear(memo);
  mt_memo_stats_get(memo, &st);
  CHECK(st.decisions == 0 && st.hits == 1);
  mt_memo_destroy(memo);
  mt_memo_destroy(NULL);
}

/* Repeated finds of an op are answered before hashing; what they answer is never
 * a decision an insert, clear or new bound has moved or dropped meanwhile, nor
 * another key's of the same op. */
static void test_memo_front(void) {
  mt_memo *memo = NULL;
  CHECK(mt_memo_create(2, 4, &memo, NULL) == MT_OK);
  mt_memo_key k1 = key(3, 5, -2), k2 = key(3, 6, -2), k0 = key(3, 5, 0);
  mt_decision d = decision(NULL, NULL);
  mt_decision *got = mt_memo_insert(memo, &k1, &d, NULL);
  got->out_id = 1;
  got = mt_memo_insert(memo, &k0, &d, NULL); /* a scalar of kind 0: operand 0 */
  got->out_id = 3;
  for (int i = 0; i < 3; ++i) {
    got = mt_memo_find(memo, &k1);
    CHECK(got != NULL && got->out_id == 1);
    got = mt_memo_find(memo, &k0);
    CHECK(got != NULL && got->out_id == 3);
    CHECK(mt_memo_find(memo, &k2) == NULL);
  }
  CHECK(mt_memo_find(memo, &k1) != NULL);
  /* k2 evicts one of the two (capacity 2): a find of k1 answers what the memo
   * holds now, whichever went. */
  got = mt_memo_insert(memo, &k2, &d, NULL);
  got->out_id = 2;
  got = mt_memo_find(memo, &k1);
  CHECK(got == mt_memo_peek(memo, &k1));
  CHECK(got == NULL || got->out_id == 1);
  got = mt_memo_find(memo, &k2);
  CHECK(got != NULL && got->out_id == 2);
  mt_memo_clear(memo);
  CHECK(mt_memo_find(memo, &k2) == NULL);
  got = mt_memo_insert(memo, &k2, &d, NULL);
  CHECK(mt_memo_find(memo, &k2) == got);
  CHECK(mt_memo_set_limits(memo, 4, 4, NULL) == MT_OK);
  CHECK(mt_memo_find(memo, &k2) == NULL);
  mt_memo_stats st;
  mt_memo_stats_get(memo, &st);
  CHECK(st.hits + st.misses == 15); /* every find counted once, front or not */
  mt_memo_destroy(memo);
}

/* Plans are held while their decision stays, and the plan bound evicts. */
static void test_memo_plans(void) {
  mt_memo *memo = NULL;
  CHECK(mt_memo_create(100, 3, &memo, NULL) == MT_OK);
  mt_plan *p = make_plan();
  mt_decision d = decision(p, NULL);
  for (int64_t i = 1; i <= 10; ++i) {
    mt_memo_key k = key(7, i, i);
    CHECK(mt_memo_insert(memo, &k, &d, NULL) != NULL);
    mt_memo_stats st;
    mt_memo_stats_get(memo, &st);
    CHECK(st.plans <= 3 && st.plans == st.decisions);
  }
  mt_memo_key k = key(7, 10, 10);
  mt_decision two = decision(p, p);
  CHECK(mt_memo_insert(memo, &k, &two, NULL) != NULL); /* replaces, keeps one plan more */
  mt_memo_stats st;
  mt_memo_stats_get(memo, &st);
  CHECK(st.plans == st.decisions + 1);
  CHECK(mt_memo_set_limits(memo, 5, 1, NULL) == MT_OK);
  mt_memo_stats_get(memo, &st);
  CHECK(st.decisions == 0 && st.plans == 0 && st.decision_limit == 5 && st.plan_limit == 1);
  CHECK(mt_memo_insert(memo, &k, &two, NULL) != NULL); /* alone, over the plan bound */
  CHECK(mt_memo_set_limits(memo, 5, 0, NULL) == MT_EINVAL);
  mt_memo_destroy(memo);
  /* The memo's owners are gone: ours is the last, so this frees the plan (valgrind
   * would report a double free or a leak otherwise). */
  mt_plan_destroy(p);
}

/* The bounded cache against a model: every key found is one still held, and
 * the count never passes the bound. */
static void test_random_workload(void) {
  mt_layout_table *t = NULL;
  CHECK(mt_layout_table_create(16, &t, NULL) == MT_OK);
  int64_t ids[64] = {0};
  unsigned state = 7;
  for (int step = 0; step < 5000; ++step) {
    state = state * 1103515245u + 12345u;
    int rows = (int)((state >> 16) % 64);
    int64_t id = intern(t, layout(rows + 1, 0), NULL);
    CHECK(id >= ids[rows]); /* the same id while held, a newer one after */
    ids[rows] = id;
    CHECK(mt_layout_table_count(t) <= 16);
  }
  mt_layout_table_destroy(t);
}

static void test_contiguous_strides(void) {
  const int64_t shape[4] = {2, 3, 0, 4};
  int64_t stride[4];
  mt_layout_contiguous_strides(4, shape, stride);
  CHECK(stride[0] == 12 && stride[1] == 4 && stride[2] == 4 && stride[3] == 1);
  const int64_t empty[2] = {4, 0};
  mt_layout_contiguous_strides(2, empty, stride);
  CHECK(stride[0] == 1 && stride[1] == 1); /* local_map's (4, 0) and x * 2 agree */
}

/* Inputs of an elementwise op of two 8 x 8 float64 tensors on a mesh of `ranks`. */
static mt_prop_inputs two_inputs(int64_t ranks, mt_placement a, mt_placement b) {
  mt_prop_inputs in;
  memset(&in, 0, sizeof in);
  in.ninputs = 2, in.mesh_ndim = 1, in.mesh_shape[0] = ranks;
  for (int i = 0; i < 2; ++i) {
    in.ndim[i] = 2, in.shape[i][0] = 8, in.shape[i][1] = 8, in.itemsize[i] = 8;
    in.placements[i][0] = i == 0 ? a : b;
  }
  return in;
}

/* A miss decided by the core: placements by the engine, moves checked and planned. */
static void test_decide(void) {
  const mt_placement s0 = {MT_PLACEMENT_SHARD, 0, 0, 0}, s1 = {MT_PLACEMENT_SHARD, 1, 0, 0};
  const mt_placement pmax = {MT_PLACEMENT_PARTIAL, 0, MT_REDUCE_MAX, 0};
  const mt_op_sig add = {MT_OP_ELEMENTWISE, MT_ELEMENTWISE_ADD, {0, 0, 0, 0, 0}};
  const mt_op_args args = {2, 3u, 0, 0, 0};
  const int f64[2] = {MT_DTYPE_FLOAT64, MT_DTYPE_FLOAT64};
  const int c128[2] = {MT_DTYPE_COMPLEX128, MT_DTYPE_COMPLEX128};
  mt_memo *memo = NULL;
  CHECK(mt_memo_create(16, 16, &memo, NULL) == MT_OK);
  mt_prop_inputs in = two_inputs(2, s0, s1);
  mt_dimmap map;
  CHECK(mt_op_dimmap(&add, &args, &in, MT_DTYPE_FLOAT64, &map, NULL) == MT_OK);
  mt_memo_key k = key(1, 1, 2);
  mt_decision *d = NULL;
  CHECK(mt_memo_decide(memo, &k, &map, &in, f64, &d, NULL) == MT_OK && d != NULL);
  CHECK(d->ninputs == 2 && d->out_ndim == 2 && d->out_placements[0].kind == MT_PLACEMENT_SHARD);
  CHECK((d->plan[0] == NULL) != (d->plan[1] == NULL)); /* one input moves */
  CHECK(mt_memo_peek(memo, &k) == d);
  /* A Partial(max) of complex values reduced first: refused before any plan, on a
   * mesh dim of size 1 too, where nothing would run; nothing stored. */
  const mt_op_sig exp_ = {MT_OP_ELEMENTWISE, MT_ELEMENTWISE_NONE, {0, 0, 0, 0, 0}};
  for (int64_t ranks = 1; ranks <= 2; ++ranks) {
    mt_prop_inputs one = two_inputs(ranks, pmax, pmax);
    one.ninputs = 1;
    const mt_op_args unary = {1, 1u, 0, 0, 0};
    CHECK(mt_op_dimmap(&exp_, &unary, &one, MT_DTYPE_COMPLEX128, &map, NULL) == MT_OK);
    mt_memo_key k2 = key(2, ranks, 0);
    mt_error err = {0, ""};
    CHECK(mt_memo_decide(memo, &k2, &map, &one, c128, &d, &err) == MT_ETYPE);
    CHECK(strstr(err.msg, "complex numbers have no order") != NULL);
    CHECK(mt_memo_peek(memo, &k2) == NULL);
    CHECK(mt_memo_decide(memo, &k2, &map, &one, f64, &d, NULL) == MT_OK);
    CHECK(ranks == 2 ? d->plan[0] != NULL : d->plan[0] == NULL); /* no step: no plan */
  }
  /* A caller's targets: the same checks, its output as given. */
  mt_placement to[2][MT_MAX_MESH_NDIM] = {{s1}, {s1}};
  mt_decision outcome;
  memset(&outcome, 0, sizeof outcome);
  outcome.out_ndim = -1, outcome.out_placements[0] = s1;
  mt_memo_key k3 = key(3, 1, 2);
  CHECK(mt_memo_decide_targets(memo, &k3, &in, f64,
                               (const mt_placement(*)[MT_MAX_MESH_NDIM])to, &outcome, &d,
                               NULL) == MT_OK);
  CHECK(d->out_ndim == -1 && d->plan[0] != NULL && d->plan[1] == NULL);
  /* P(sum) + R keeps P(sum): the Replicate input is partitioned, not moved (no
   * plan, marked on mesh dim 0); on one rank nothing is marked. */
  const mt_placement psum = {MT_PLACEMENT_PARTIAL, 0, MT_REDUCE_SUM, 0};
  const mt_placement rep = {MT_PLACEMENT_REPLICATE, 0, 0, 0};
  for (int64_t ranks = 1; ranks <= 2; ++ranks) {
    for (int order = 0; order < 2; ++order) {
      mt_prop_inputs pr = order ? two_inputs(ranks, rep, psum) : two_inputs(ranks, psum, rep);
      CHECK(mt_op_dimmap(&add, &args, &pr, MT_DTYPE_FLOAT64, &map, NULL) == MT_OK);
      mt_memo_key kp = key(5 + order, ranks, 2);
      CHECK(mt_memo_decide(memo, &kp, &map, &pr, f64, &d, NULL) == MT_OK);
      CHECK(d->plan[0] == NULL && d->plan[1] == NULL);
      CHECK(ranks == 1 || (d->out_placements[0].kind == MT_PLACEMENT_PARTIAL &&
                           d->out_placements[0].reduce_op == MT_REDUCE_SUM));
      CHECK(d->partition[order] == 0 && d->partition[1 - order] == (ranks == 2 ? 1u : 0u));
    }
  }
  /* A caller's Replicate -> Partial(product) target is refused, as torch refuses
   * to partition a product. */
  const mt_placement pprod = {MT_PLACEMENT_PARTIAL, 0, MT_REDUCE_PRODUCT, 0};
  mt_prop_inputs rr = two_inputs(2, rep, rep);
  mt_placement to_prod[2][MT_MAX_MESH_NDIM] = {{pprod}, {pprod}};
  mt_memo_key k6 = key(7, 2, 2);
  CHECK(mt_memo_decide_targets(memo, &k6, &rr, f64,
                               (const mt_placement(*)[MT_MAX_MESH_NDIM])to_prod, &outcome,
                               &d, NULL) != MT_OK);
  /* Shapes that do not fit the map: the engine's error, nothing stored. */
  in.shape[1][0] = 4;
  mt_memo_key k4 = key(4, 1, 2);
  CHECK(mt_memo_decide(memo, &k4, &map, &in, f64, &d, NULL) == MT_EINVAL);
  const mt_op_sig mm = {MT_OP_MATMUL, 0, {0, 0, 0, 0, 0}}, bad = {9, 0, {0, 0, 0, 0, 0}};
  in.ninputs = 1;
  CHECK(mt_op_dimmap(&mm, &args, &in, MT_DTYPE_FLOAT64, &map, NULL) == MT_EINVAL);
  CHECK(mt_op_dimmap(&bad, &args, &in, MT_DTYPE_FLOAT64, &map, NULL) == MT_EINVAL);
  mt_memo_destroy(memo);
}

/* What a decision asks of a run (decision.c): S(0) + S(1) on 2 ranks moves one
 * input (8 x 8 float64: half of it to the other rank), one tensor given twice
 * moves once, a partitioned input is zeros off coordinate 0, and each rank's box
 * of the output is its chunk (ones outside the mesh). */
static void test_decision_reads(void) {
  const mt_placement s0 = {MT_PLACEMENT_SHARD, 0, 0, 0}, s1 = {MT_PLACEMENT_SHARD, 1, 0, 0};
  const mt_op_sig add = {MT_OP_ELEMENTWISE, MT_ELEMENTWISE_ADD, {0, 0, 0, 0, 0}};
  const mt_op_args args = {2, 3u, 0, 0, 0};
  const int f64[2] = {MT_DTYPE_FLOAT64, MT_DTYPE_FLOAT64};
  mt_memo *memo = NULL;
  CHECK(mt_memo_create(16, 16, &memo, NULL) == MT_OK);
  mt_prop_inputs in = two_inputs(2, s0, s1);
  mt_dimmap map;
  CHECK(mt_op_dimmap(&add, &args, &in, MT_DTYPE_FLOAT64, &map, NULL) == MT_OK);
  mt_memo_key k = key(1, 1, 2);
  mt_decision *d = NULL;
  CHECK(mt_memo_decide(memo, &k, &map, &in, f64, &d, NULL) == MT_OK);
  const mt_plan *moved = d->plan[0] != NULL ? d->plan[0] : d->plan[1];
  CHECK(mt_decision_bytes(d) == mt_plan_bytes(moved) && mt_decision_bytes(d) > 0);
  mt_decision held;
  mt_decision_hold(d, &held);
  mt_memo_clear(memo); /* the held plans outlive the memo's decision */
  CHECK(mt_decision_bytes(&held) == mt_plan_bytes(moved) && mt_plan_nsteps(moved) > 0);
  mt_decision twice = held;
  twice.plan[0] = twice.plan[1] = (mt_plan *)moved;
  CHECK(mt_decision_same_move(&twice, 1, 0) && !mt_decision_same_move(&held, 1, 0));
  twice.partition[1] = 1u;
  CHECK(!mt_decision_same_move(&twice, 1, 0));
  const int64_t mesh_shape[1] = {2}, c0[1] = {0}, c1[1] = {1};
  CHECK(!mt_decision_zeroed(&twice, 1, c0) && mt_decision_zeroed(&twice, 1, c1));
  CHECK(!mt_decision_zeroed(&twice, 0, c1));
  mt_box box;
  CHECK(mt_decision_out_box(&held, mesh_shape, c1, &box, NULL) == MT_OK);
  CHECK(box.ndim == 2 && box.shape[0] + box.shape[1] == 12);
  CHECK(mt_decision_out_box(&held, mesh_shape, NULL, &box, NULL) == MT_OK);
  CHECK(box.ndim == 2 && box.shape[0] == 1 && box.shape[1] == 1);
  const int64_t bad[1] = {3};
  mt_error err = {0, ""};
  CHECK(mt_decision_out_box(&held, mesh_shape, bad, &box, &err) != MT_OK && err.msg[0] != 0);
  mt_layout_key out;
  mt_decision_out_key(&held, MT_DTYPE_FLOAT32, 4, &out);
  CHECK(out.ndim == 2 && out.shape[0] == 8 && out.stride[0] == 8 && out.stride[1] == 1);
  CHECK(out.itemsize == 4 && out.mesh_ndim == 1 &&
        out.placements[0].kind == held.out_placements[0].kind);
  mt_decision_drop(&held);
  mt_memo_destroy(memo);
}

/* A redistribute decided by the core: S(0) -> R plans one step and keeps the
 * shape; creating a Partial, or moving to a dim the tensor lacks, is refused and
 * stores nothing. */
static void test_decide_move(void) {
  mt_memo *memo = NULL;
  CHECK(mt_memo_create(16, 16, &memo, NULL) == MT_OK);
  const int64_t mesh_shape[1] = {2};
  mt_layout_key src = layout(8, 1);
  const mt_placement rep[1] = {{MT_PLACEMENT_REPLICATE, 0, 0, 0}};
  const mt_placement psum[1] = {{MT_PLACEMENT_PARTIAL, 0, MT_REDUCE_SUM, 0}};
  const mt_placement s5[1] = {{MT_PLACEMENT_SHARD, 5, 0, 0}};
  mt_memo_key k = key(9, 1, 0);
  mt_decision *d = NULL;
  CHECK(mt_memo_decide_move(memo, &k, &src, MT_DTYPE_FLOAT64, mesh_shape, rep, &d, NULL) ==
        MT_OK);
  CHECK(d != NULL && d->ninputs == 1 && d->plan[0] != NULL && mt_memo_peek(memo, &k) == d);
  CHECK(d->out_ndim == 2 && d->out_shape[0] == 8 &&
        d->out_placements[0].kind == MT_PLACEMENT_REPLICATE);
  mt_memo_key k2 = key(9, 2, 0);
  mt_error err = {0, ""};
  CHECK(mt_memo_decide_move(memo, &k2, &src, MT_DTYPE_FLOAT64, mesh_shape, psum, &d,
                            &err) != MT_OK);
  CHECK(err.msg[0] != 0 && mt_memo_peek(memo, &k2) == NULL);
  CHECK(mt_memo_decide_move(memo, &k2, &src, MT_DTYPE_FLOAT64, mesh_shape, s5, &d,
                            &err) != MT_OK);
  CHECK(mt_memo_peek(memo, &k2) == NULL);
  mt_memo_destroy(memo);
}

/* The input a recorded node keeps as moved: a Partial reduced or shards moved
 * between dims keep the moved copy (with contiguous strides); a gather, a chunk,
 * or an input partitioned into zeros keep the input as given. */
static int kept_as_moved(mt_memo *memo, int64_t op, mt_placement from, mt_placement to,
                         mt_layout_key *moved) {
  const int64_t mesh_shape[1] = {2};
  mt_layout_key src = layout(8, 0);
  src.placements[0] = from, src.stride[0] = 1, src.stride[1] = 8;
  mt_memo_key k = key(op, 1, 0);
  mt_decision *d = NULL;
  CHECK(mt_memo_decide_move(memo, &k, &src, MT_DTYPE_FLOAT64, mesh_shape, &to, &d, NULL) ==
        MT_OK);
  mt_decision_moved_key(d, 0, &src, moved);
  int keeps = mt_decision_keeps_moved(d, 0);
  d->partition[0] = 1u;
  CHECK(!mt_decision_keeps_moved(d, 0));
  d->partition[0] = 0;
  return keeps;
}

static void test_keeps_moved(void) {
  const mt_placement s0 = {MT_PLACEMENT_SHARD, 0, 0, 0}, s1 = {MT_PLACEMENT_SHARD, 1, 0, 0};
  const mt_placement r = {MT_PLACEMENT_REPLICATE, 0, 0, 0};
  const mt_placement p = {MT_PLACEMENT_PARTIAL, 0, MT_REDUCE_SUM, 0};
  mt_memo *memo = NULL;
  CHECK(mt_memo_create(16, 16, &memo, NULL) == MT_OK);
  mt_layout_key moved;
  CHECK(kept_as_moved(memo, 20, s0, s1, &moved));
  CHECK(moved.placements[0].kind == MT_PLACEMENT_SHARD && moved.placements[0].dim == 1);
  CHECK(moved.stride[0] == 4 && moved.stride[1] == 1 && moved.shape[0] == 8);
  CHECK(kept_as_moved(memo, 21, p, r, &moved));
  CHECK(kept_as_moved(memo, 22, p, s0, &moved));
  CHECK(!kept_as_moved(memo, 23, s0, r, &moved));
  CHECK(!kept_as_moved(memo, 24, r, s0, &moved));
  mt_decision none;
  memset(&none, 0, sizeof none);
  none.ninputs = 1;
  mt_layout_key given = layout(8, 1);
  mt_decision_moved_key(&none, 0, &given, &moved);
  CHECK(!mt_decision_keeps_moved(&none, 0) && memcmp(&moved, &given, sizeof moved) == 0);
  mt_memo_destroy(memo);
}

/* The engine's inputs made of layout keys: each key appended as an input, and a
 * wanted gradient's placements with Replicate for its Partials. */
static void test_prop_inputs_of_keys(void) {
  mt_prop_inputs in;
  memset(&in, 0, sizeof in);
  in.mesh_ndim = 1, in.mesh_shape[0] = 2;
  mt_layout_key a = layout(8, 1), b = layout(6, 0);
  mt_prop_inputs_add(&in, &a);
  mt_prop_inputs_add(&in, &b);
  CHECK(in.ninputs == 2 && in.ndim[1] == 2 && in.shape[1][0] == 6 && in.itemsize[0] == 8);
  CHECK(in.placements[0][0].kind == MT_PLACEMENT_SHARD &&
        in.placements[1][0].kind == MT_PLACEMENT_REPLICATE && in.want == 0);
  a.placements[0] = (mt_placement){MT_PLACEMENT_PARTIAL, 0, MT_REDUCE_SUM, 0};
  mt_prop_inputs_want(&in, &a);
  CHECK(in.want == 1 && in.want_ndim == 2 && in.want_shape[0] == 8);
  CHECK(in.want_placements[0].kind == MT_PLACEMENT_REPLICATE);
  mt_prop_inputs_want(&in, &b);
  CHECK(in.want_shape[0] == 6 && in.want_placements[0].kind == MT_PLACEMENT_REPLICATE);
  mt_prop_inputs_want(&in, &(mt_layout_key){.ndim = 1, .shape = {4}, .mesh_ndim = 1,
                                            .placements = {{MT_PLACEMENT_SHARD, 0, 0, 0}}});
  CHECK(in.want_placements[0].kind == MT_PLACEMENT_SHARD && in.want_ndim == 1);
}

int main(void) {
  test_prop_inputs_of_keys();
  test_decide();
  test_decision_reads();
  test_keeps_moved();
  test_decide_move();
  test_contiguous_strides();
  test_layout_ids();
  test_clock();
  test_memo_basics();
  test_memo_front();
  test_memo_plans();
  test_random_workload();
  return mt_test_exit("test_memo");
}
