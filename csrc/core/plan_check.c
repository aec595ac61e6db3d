/* The redistributions no plan may make, refused from the arguments alone. */
#include <stdio.h>

#include "core-private.h"
#include "mpitensor/dtype.h"
#include "mpitensor/plan.h"
#include "mpitensor/prop.h"

/* A placement's short form, as Python's str(): S(0), R, P(sum). */
static const char *short_name(const mt_placement *p, char *buf, size_t len) {
  const char *op = mt_reduce_op_name(p->reduce_op);
  if (p->kind == MT_PLACEMENT_SHARD)
    snprintf(buf, len, "S(%d)", p->dim);
  else if (p->kind == MT_PLACEMENT_PARTIAL && op != NULL)
    snprintf(buf, len, "P(%s)", op);
  else
    snprintf(buf, len, "R");
  return buf;
}

static int same_partial(const mt_placement *a, const mt_placement *b) {
  return a->kind == MT_PLACEMENT_PARTIAL && b->kind == MT_PLACEMENT_PARTIAL &&
         a->reduce_op == b->reduce_op;
}

/* Whether reducing Partial(op) of `dtype` values is defined. */
static int reduce_check(int op, int dtype, mt_error *err) {
  const char *name = mt_dtype_name(dtype);
  int complex = dtype == MT_DTYPE_COMPLEX64 || dtype == MT_DTYPE_COMPLEX128;
  if (complex && (op == MT_REDUCE_MAX || op == MT_REDUCE_MIN))
    return mt__fail(err, MT_ETYPE, "Partial(%s) of %s values: complex numbers have no "
                    "order", op == MT_REDUCE_MAX ? "max" : "min", name);
  if (dtype <= MT_DTYPE_UINT64 && op == MT_REDUCE_AVG)
    return mt__fail(err, MT_ETYPE, "Partial(avg) of %s values: an average is not a %s; "
                    "cast to a float dtype first (forward_dtype=)", name, name);
  return MT_OK;
}

int mt_plan_check(const mt_layout *src, const mt_layout *dst, int dtype, mt_error *err) {
  if (src == NULL || dst == NULL || src->mesh_ndim != dst->mesh_ndim)
    return mt__fail(err, MT_EINVAL, "Two layouts of one mesh are required");
  for (int m = 0; m < src->mesh_ndim; ++m) {
    const mt_placement *s = &src->placements[m], *d = &dst->placements[m];
    if (s->kind != MT_PLACEMENT_PARTIAL && d->kind != MT_PLACEMENT_PARTIAL) continue;
    if (same_partial(s, d)) continue;
    if (d->kind == MT_PLACEMENT_PARTIAL) {
      char from[32], to[32];
      return mt__fail(err, MT_ESTATE,
                      "Can not redistribute from %s to %s on mesh dim %d: "
                      "redistributing to Partial is for internal use only! Partial "
                      "tensors come from DTensor.from_local and from operators.",
                      short_name(s, from, sizeof from), short_name(d, to, sizeof to), m);
    }
    int rc = reduce_check(s->reduce_op, dtype, err);
    if (rc != MT_OK) return rc;
  }
  return MT_OK;
}
