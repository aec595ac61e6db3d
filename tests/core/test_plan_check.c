/* mt_plan_check and mt_partial_check: what a redistribution refuses before any
 * communication, with torch's messages (the Python layer raises them as they are),
 * and what it lets through. */
#include <string.h>

#include "check.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"

static mt_placement R(void) {
  return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0};
}
static mt_placement S(int d) {
  return (mt_placement){MT_PLACEMENT_SHARD, d, 0, 0};
}
static mt_placement P(int op) {
  return (mt_placement){MT_PLACEMENT_PARTIAL, 0, op, 0};
}

/* Layouts with only what mt_plan_check reads: the mesh dims and placements. */
static mt_layout on_mesh(int n, mt_placement a, mt_placement b) {
  mt_layout l;
  memset(&l, 0, sizeof l);
  l.mesh_ndim = n;
  l.placements[0] = a;
  l.placements[1] = b;
  return l;
}

/* Checks the status and, when `msg` is not NULL, the exact message. */
static void expect(mt_layout src, mt_layout dst, int dtype, int code, const char *msg) {
  mt_error err = {0};
  int rc = mt_plan_check(&src, &dst, dtype, &err);
  CHECK_MSG(rc == code, "status %s, expected %s (%s)", mt_status_name(rc),
            mt_status_name(code), err.msg);
  if (msg != NULL) CHECK_MSG(strcmp(err.msg, msg) == 0, "message '%s'", err.msg);
}

static void test_allowed(void) {
  expect(on_mesh(1, R(), R()), on_mesh(1, S(0), R()), MT_DTYPE_INT32, MT_OK, NULL);
  expect(on_mesh(1, S(1), R()), on_mesh(1, R(), R()), MT_DTYPE_BOOL, MT_OK, NULL);
  expect(on_mesh(1, P(MT_REDUCE_SUM), R()), on_mesh(1, S(0), R()), MT_DTYPE_INT8, MT_OK,
         NULL);
  expect(on_mesh(1, P(MT_REDUCE_AVG), R()), on_mesh(1, R(), R()), MT_DTYPE_FLOAT16,
         MT_OK, NULL);
  expect(on_mesh(1, P(MT_REDUCE_AVG), R()), on_mesh(1, R(), R()), MT_DTYPE_COMPLEX64,
         MT_OK, NULL);
  expect(on_mesh(1, P(MT_REDUCE_MAX), R()), on_mesh(1, R(), R()), MT_DTYPE_UINT16,
         MT_OK, NULL);
  /* A Partial kept as it is needs no reduction, whatever the dtype. */
  expect(on_mesh(2, P(MT_REDUCE_MAX), S(0)), on_mesh(2, P(MT_REDUCE_MAX), R()),
         MT_DTYPE_COMPLEX128, MT_OK, NULL);
  expect(on_mesh(1, P(MT_REDUCE_AVG), R()), on_mesh(1, P(MT_REDUCE_AVG), R()),
         MT_DTYPE_INT64, MT_OK, NULL);
  /* A Replicate with a stray dim still equals Replicate. */
  mt_placement odd = {MT_PLACEMENT_REPLICATE, 5, 3, 0};
  expect(on_mesh(1, P(MT_REDUCE_SUM), R()), on_mesh(1, P(MT_REDUCE_SUM), odd),
         MT_DTYPE_FLOAT32, MT_OK, NULL);
}

static void test_partial_targets(void) {
  expect(on_mesh(1, R(), R()), on_mesh(1, P(MT_REDUCE_SUM), R()), MT_DTYPE_FLOAT64,
         MT_ESTATE,
         "Can not redistribute from R to P(sum) on mesh dim 0: redistributing to "
         "Partial is for internal use only! Partial tensors come from "
         "DTensor.from_local and from operators.");
  expect(on_mesh(2, S(0), S(1)), on_mesh(2, S(0), P(MT_REDUCE_MAX)), MT_DTYPE_FLOAT32,
         MT_ESTATE,
         "Can not redistribute from S(1) to P(max) on mesh dim 1: redistributing to "
         "Partial is for internal use only! Partial tensors come from "
         "DTensor.from_local and from operators.");
  expect(on_mesh(1, P(MT_REDUCE_SUM), R()), on_mesh(1, P(MT_REDUCE_AVG), R()),
         MT_DTYPE_FLOAT32, MT_ESTATE,
         "Can not redistribute from P(sum) to P(avg) on mesh dim 0: redistributing to "
         "Partial is for internal use only! Partial tensors come from "
         "DTensor.from_local and from operators.");
}

static void test_reductions(void) {
  expect(on_mesh(1, P(MT_REDUCE_MAX), R()), on_mesh(1, R(), R()), MT_DTYPE_COMPLEX64,
         MT_ETYPE, "Partial(max) of complex64 values: complex numbers have no order");
  expect(on_mesh(1, P(MT_REDUCE_MIN), R()), on_mesh(1, S(0), R()), MT_DTYPE_COMPLEX128,
         MT_ETYPE, "Partial(min) of complex128 values: complex numbers have no order");
  expect(on_mesh(1, P(MT_REDUCE_AVG), R()), on_mesh(1, S(0), R()), MT_DTYPE_INT32,
         MT_ETYPE,
         "Partial(avg) of int32 values: an average is not a int32; cast to a float "
         "dtype first (forward_dtype=)");
  expect(on_mesh(1, P(MT_REDUCE_AVG), R()), on_mesh(1, R(), R()), MT_DTYPE_BOOL,
         MT_ETYPE, NULL);
  expect(on_mesh(1, P(MT_REDUCE_AVG), R()), on_mesh(1, R(), R()), MT_DTYPE_UINT64,
         MT_ETYPE, NULL);
  /* The first mesh dim that fails is the one reported. */
  expect(on_mesh(2, P(MT_REDUCE_AVG), R()), on_mesh(2, R(), P(MT_REDUCE_SUM)),
         MT_DTYPE_INT16, MT_ETYPE, NULL);
  expect(on_mesh(2, R(), P(MT_REDUCE_AVG)), on_mesh(2, P(MT_REDUCE_SUM), R()),
         MT_DTYPE_INT16, MT_ESTATE, NULL);
  mt_error err = {0};
  CHECK(mt_partial_check(MT_DTYPE_COUNT, MT_REDUCE_SUM, &err) == MT_ETYPE);
  CHECK(mt_partial_check(-1, MT_REDUCE_SUM, &err) == MT_ETYPE);
  CHECK(mt_partial_check(MT_DTYPE_FLOAT32, MT_REDUCE_COUNT, &err) == MT_EINVAL);
  CHECK(mt_partial_check(MT_DTYPE_FLOAT16, MT_REDUCE_PRODUCT, NULL) == MT_OK);
}

static void test_bad_input(void) {
  mt_layout a = on_mesh(1, R(), R()), b = on_mesh(2, R(), R());
  expect(a, b, MT_DTYPE_FLOAT32, MT_EINVAL, NULL);
  expect(on_mesh(0, R(), R()), on_mesh(0, R(), R()), MT_DTYPE_FLOAT32, MT_EINVAL, NULL);
  mt_placement weird = {7, 0, 0, 0}, bad_op = {MT_PLACEMENT_PARTIAL, 0, 9, 0};
  expect(on_mesh(1, weird, R()), a, MT_DTYPE_FLOAT32, MT_EINVAL, NULL);
  expect(a, on_mesh(1, bad_op, R()), MT_DTYPE_FLOAT32, MT_EINVAL, NULL);
  mt_error err = {0};
  CHECK(mt_plan_check(NULL, &a, MT_DTYPE_FLOAT32, &err) == MT_EINVAL);
  /* The planner refuses a new Partial by the same rule: same status, same words. */
  int64_t shape[1] = {4}, mesh[1] = {2};
  mt_placement r = R(), p = P(MT_REDUCE_SUM);
  mt_layout src, dst;
  CHECK(mt_layout_init(&src, 1, shape, 1, mesh, &r, &err) == MT_OK);
  CHECK(mt_layout_init(&dst, 1, shape, 1, mesh, &p, &err) == MT_OK);
  mt_error checked = {0, ""};
  CHECK(mt_plan_check(&src, &dst, MT_DTYPE_FLOAT32, &checked) == MT_ESTATE);
  mt_plan *plan = NULL;
  CHECK(mt_plan_create(&src, &dst, 4, &plan, &err) == MT_ESTATE && plan == NULL);
  CHECK(strcmp(err.msg, checked.msg) == 0);
}

int main(void) {
  test_allowed();
  test_partial_targets();
  test_reductions();
  test_bad_input();
  return mt_test_exit("test_plan_check");
}
