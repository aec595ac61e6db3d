/* What a redistribution refuses before anything moves (plan.h): creating a
 * Partial, and reductions that do not exist for the dtype. Pure and cheap, so every
 * rank runs it on the same arguments and raises the same error, before any
 * collective. The messages are torch's where torch has the rule. */
#include "core-private.h"
#include "mpitensor/dtype.h"
#include "mpitensor/plan.h"

int mt_partial_check(int dtype, int op, mt_error *err) {
  if (mt_dtype_size(dtype) == 0) {
    return mt__fail(err, MT_ETYPE, "dtype code %d cannot be reduced", dtype);
  }
  if (op < 0 || op >= MT_REDUCE_COUNT) {
    return mt__fail(err, MT_EINVAL, "unknown reduce op %d", op);
  }
  int complex = dtype == MT_DTYPE_COMPLEX64 || dtype == MT_DTYPE_COMPLEX128;
  if (complex && (op == MT_REDUCE_MAX || op == MT_REDUCE_MIN)) {
    return mt__fail(err, MT_ETYPE,
                    "Partial(%s) of %s values: complex numbers have no "
                    "order",
                    mt__reduce_name(op), mt_dtype_name(dtype));
  }
  int exact = dtype <= MT_DTYPE_UINT64; /* bool and the integers */
  if (exact && op == MT_REDUCE_AVG) {
    return mt__fail(err, MT_ETYPE,
                    "Partial(avg) of %s values: an average is not a %s; "
                    "cast to a float dtype first (forward_dtype=)",
                    mt_dtype_name(dtype), mt_dtype_name(dtype));
  }
  return MT_OK;
}

static int check_kinds(const mt_layout *l, mt_error *err) {
  for (int m = 0; m < l->mesh_ndim; ++m) {
    const mt_placement *p = &l->placements[m];
    if (p->kind < MT_PLACEMENT_REPLICATE || p->kind > MT_PLACEMENT_PARTIAL)
      return mt__fail(err, MT_EINVAL, "unknown placement kind %d on mesh dim %d",
                      p->kind, m);
    if (p->kind == MT_PLACEMENT_PARTIAL &&
        (p->reduce_op < 0 || p->reduce_op >= MT_REDUCE_COUNT))
      return mt__fail(err, MT_EINVAL, "unknown reduce op %d on mesh dim %d",
                      p->reduce_op, m);
  }
  return MT_OK;
}

static int check_frame(const mt_layout *src, const mt_layout *dst, mt_error *err) {
  if (src == NULL || dst == NULL)
    return mt__fail(err, MT_EINVAL, "the source and target layouts are required");
  if (src->mesh_ndim < 1 || src->mesh_ndim > MT_MAX_MESH_NDIM ||
      dst->mesh_ndim != src->mesh_ndim)
    return mt__fail(err, MT_EINVAL, "%d source and %d target placements for one mesh",
                    src->mesh_ndim, dst->mesh_ndim);
  int rc = check_kinds(src, err);
  return rc == MT_OK ? check_kinds(dst, err) : rc;
}

int mt_plan_check(const mt_layout *src, const mt_layout *dst, int dtype,
                  mt_error *err) {
  int rc = check_frame(src, dst, err);
  for (int m = 0; rc == MT_OK && m < src->mesh_ndim; ++m) {
    const mt_placement *s = &src->placements[m], *d = &dst->placements[m];
    if (placement_eq(s, d)) continue;
    if (creates_partial(s, d)) {
      char from[32], to[32];
      return mt__fail(err, MT_ESTATE,
                      "Can not redistribute from %s to %s on mesh dim %d: "
                      "redistributing to Partial is for internal use only! Partial "
                      "tensors come from DTensor.from_local and from operators.",
                      mt__placement_text(s, 1, from, sizeof from),
                      mt__placement_text(d, 1, to, sizeof to), m);
    }
    if (s->kind == MT_PLACEMENT_PARTIAL)
      rc = mt_partial_check(dtype, s->reduce_op, err);
  }
  return rc;
}
