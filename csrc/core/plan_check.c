/* What a redistribution refuses before anything moves (plan.h): creating a
 * Partial, and reductions that do not exist for the dtype. Pure and cheap, so every
 * rank runs it on the same arguments and raises the same error, before any
 * collective. The messages are torch's where torch has the rule.
 *
 * Below them, the checks every plan and exchange makes of its layouts (the
 * planner's, through plan-private.h): each valid, both one tensor on one mesh,
 * and a mesh no larger than MPI can number. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"
#include "plan-private.h"

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

/* Redistribution never creates a pending reduction: a Partial target on mesh dim
 * `m` needs the same Partial in the source. The one statement of the rule, for
 * mt_plan_check and mt_plan_create alike, with torch's RuntimeError and message. */
static int refuse_partial(const mt_placement *s, const mt_placement *d, int m,
                          mt_error *err) {
  if (!creates_partial(s, d)) return MT_OK;
  char from[32], to[32];
  return mt__fail(err, MT_ESTATE,
                  "Can not redistribute from %s to %s on mesh dim %d: "
                  "redistributing to Partial is for internal use only! Partial "
                  "tensors come from DTensor.from_local and from operators.",
                  mt__placement_text(s, 1, from, sizeof from),
                  mt__placement_text(d, 1, to, sizeof to), m);
}

int mt_plan_check(const mt_layout *src, const mt_layout *dst, int dtype,
                  mt_error *err) {
  int rc = check_frame(src, dst, err);
  for (int m = 0; rc == MT_OK && m < src->mesh_ndim; ++m) {
    const mt_placement *s = &src->placements[m], *d = &dst->placements[m];
    if (placement_eq(s, d)) continue;
    rc = refuse_partial(s, d, m, err);
    if (rc == MT_OK && s->kind == MT_PLACEMENT_PARTIAL)
      rc = mt_partial_check(dtype, s->reduce_op, err);
  }
  return rc;
}

/* Validates one layout into a clean copy; the message names which layout. */
int mt__check_layout(const mt_layout *l, const char *what, mt_layout *out,
                     mt_error *err) {
  int rc = mt_layout_init(out, l->ndim, l->shape, l->mesh_ndim, l->mesh_shape,
                          l->placements, err);
  if (rc == MT_OK || err == NULL) return rc;
  char msg[MT_ERROR_LEN];
  memcpy(msg, err->msg, sizeof msg);
  return mt__fail(err, rc, "The %s layout is invalid: %s", what, msg);
}

/* Both layouts must describe one tensor on one mesh. */
static int check_same_frame(const mt_layout *a, const mt_layout *b, mt_error *err) {
  if (a->ndim != b->ndim)
    return mt__fail(err, MT_EINVAL,
                    "The source layout has %d tensor dims and the target %d; "
                    "redistribution keeps the global shape",
                    a->ndim, b->ndim);
  for (int d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d])
      return mt__fail(err, MT_EINVAL,
                      "Tensor dim %d has size %" PRId64 " in the source and %" PRId64
                      " in the target; redistribution keeps the shape",
                      d, a->shape[d], b->shape[d]);
  }
  if (a->mesh_ndim != b->mesh_ndim)
    return mt__fail(err, MT_EINVAL,
                    "The source mesh has %d dims and the target mesh %d; "
                    "redistribution to another mesh is not supported",
                    a->mesh_ndim, b->mesh_ndim);
  for (int m = 0; m < a->mesh_ndim; ++m) {
    if (a->mesh_shape[m] != b->mesh_shape[m])
      return mt__fail(err, MT_EINVAL,
                      "Mesh dim %d has size %" PRId64 " in the source and %" PRId64
                      " in the target; both must use the same mesh",
                      m, a->mesh_shape[m], b->mesh_shape[m]);
  }
  return MT_OK;
}

/* Planning and exchanges visit every rank; refuse meshes no MPI job can have. */
int mt__check_mesh_size(const mt_layout *l, mt_error *err) {
  int64_t n = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) {
    n *= l->mesh_shape[m];
    if (n > MT__MAX_MESH_NUMEL)
      return mt__fail(err, MT_EINVAL,
                      "The mesh has more than %" PRId64
                      " ranks, more than MPI can number",
                      MT__MAX_MESH_NUMEL);
  }
  return MT_OK;
}

/* Validates src and dst into clean copies of one tensor on one mesh. */
int mt__check_pair(const mt_layout *src, const mt_layout *dst, mt_layout *a,
                   mt_layout *b, mt_error *err) {
  int rc = mt__check_layout(src, "source", a, err);
  if (rc == MT_OK) rc = mt__check_layout(dst, "target", b, err);
  if (rc == MT_OK) rc = check_same_frame(a, b, err);
  if (rc == MT_OK) rc = mt__check_mesh_size(a, err);
  return rc;
}

int mt__check_partials(const mt_layout *a, const mt_layout *b, mt_error *err) {
  int rc = MT_OK;
  for (int m = 0; rc == MT_OK && m < a->mesh_ndim; ++m)
    rc = refuse_partial(&a->placements[m], &b->placements[m], m, err);
  return rc;
}
