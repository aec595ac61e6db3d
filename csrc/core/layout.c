/* Layout math: validation of (shape, mesh, placements) and the box each mesh
 * coordinate owns. Nothing here touches MPI, so any rank can answer for any other. */
#include <assert.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"

/* "dim" or "dims", so messages read naturally for 1-d tensors. */
static const char *dims_word(int n) { return n == 1 ? "dim" : "dims"; }

void mt_chunk(int64_t n, int64_t k, int64_t i, int64_t *size, int64_t *offset) {
  assert(n >= 0 && k >= 1 && i >= 0 && i < k);
  /* ceil(n / k) without forming n + k - 1, which could overflow. */
  int64_t chunk = n / k + (n % k != 0);
  /* i > n / chunk implies i * chunk > n, so the product is only formed when it
   * cannot overflow. */
  if (chunk == 0 || i > n / chunk || i * chunk == n) {
    *size = 0;
    *offset = n;
    return;
  }
  int64_t start = i * chunk;
  *size = n - start < chunk ? n - start : chunk;
  *offset = start;
}

/* Checks a tensor's rank and sizes; `shape` may be NULL only for a 0-d tensor. */
static int check_tensor(int ndim, const int64_t *shape, mt_error *err) {
  if (ndim < 0 || ndim > MT_MAX_NDIM)
    return mt__fail(err, MT_EINVAL, "A tensor may have 0 to %d dims, got %d",
                    MT_MAX_NDIM, ndim);
  if (ndim > 0 && shape == NULL)
    return mt__fail(err, MT_EINVAL, "The shape of a %d-dim tensor is missing (NULL)",
                    ndim);
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] < 0)
      return mt__fail(err, MT_EINVAL,
                      "Tensor dim %d has size %" PRId64 "; sizes must be >= 0", d,
                      shape[d]);
  }
  return MT_OK;
}

/* Global flat indices are int64, so a tensor whose element count does not fit
 * could not be indexed, drawn from or planned for; reject it up front. */
static int check_numel(int ndim, const int64_t *shape, mt_error *err) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) return MT_OK;
  }
  for (int d = 0; d < ndim; ++d) {
    if (numel > INT64_MAX / shape[d])
      return mt__fail(err, MT_EOVERFLOW,
                      "The tensor has more than %" PRId64 " elements", INT64_MAX);
    numel *= shape[d];
  }
  return MT_OK;
}

/* Checks the placement of mesh dim `m` against a tensor of `ndim` dims; a STRIDED
 * one only where `strided` says the caller reads it. */
static int check_placement(int ndim, int m, const mt_placement *p, int strided,
                           mt_error *err) {
  switch (p->kind) {
    case MT_PLACEMENT_REPLICATE:
      return MT_OK;
    case MT_PLACEMENT_SHARD:
      if (p->dim < 0 || p->dim >= ndim)
        return mt__fail(err, MT_EINDEX,
                        "Shard(dim=%d) on mesh dim %d is out of range for a tensor "
                        "with %d %s",
                        p->dim, m, ndim, dims_word(ndim));
      return MT_OK;
    case MT_PLACEMENT_PARTIAL:
      if (p->reduce_op < 0 || p->reduce_op >= MT_REDUCE_COUNT)
        return mt__fail(err, MT_EINVAL,
                        "Partial on mesh dim %d has unknown reduce op %d", m,
                        p->reduce_op);
      return MT_OK;
    case MT_PLACEMENT_STRIDED:
      if (!strided)
        return mt__fail(err, MT_EINVAL,
                        "_StridedShard(dim=%d, sf=%d) on mesh dim %d has no box of its "
                        "own: only its plain expansion (mt_strided_expand) is a layout here",
                        p->dim, p->split_factor, m);
      if (p->dim < 0 || p->dim >= ndim || p->split_factor < 1)
        return mt__fail(err, MT_EINDEX,
                        "_StridedShard(dim=%d, sf=%d) on mesh dim %d needs a dim of a "
                        "tensor with %d %s and a split factor >= 1",
                        p->dim, p->split_factor, m, ndim, dims_word(ndim));
      return MT_OK;
    default:
      return mt__fail(err, MT_EINVAL,
                      "Placement kind %d on mesh dim %d is not Replicate (0), "
                      "Shard (1) or Partial (2)",
                      p->kind, m);
  }
}

/* Checks a mesh shape and its placements for a tensor of `ndim` dims. */
static int check_mesh(int ndim, int mesh_ndim, const int64_t *mesh_shape,
                      const mt_placement *placements, int strided, mt_error *err) {
  if (mesh_ndim < 1 || mesh_ndim > MT_MAX_MESH_NDIM)
    return mt__fail(err, MT_EINVAL, "A mesh may have 1 to %d dims, got %d",
                    MT_MAX_MESH_NDIM, mesh_ndim);
  if (mesh_shape == NULL || placements == NULL)
    return mt__fail(err, MT_EINVAL,
                    "The mesh shape and the placements (one per mesh dim) are "
                    "required");
  for (int m = 0; m < mesh_ndim; ++m) {
    if (mesh_shape[m] < 1)
      return mt__fail(err, MT_EINVAL,
                      "Mesh dim %d has size %" PRId64 "; sizes must be >= 1", m,
                      mesh_shape[m]);
    int rc = check_placement(ndim, m, &placements[m], strided, err);
    if (rc != MT_OK) return rc;
  }
  return MT_OK;
}

int mt__layout_init(mt_layout *out, int ndim, const int64_t *shape, int mesh_ndim,
                    const int64_t *mesh_shape, const mt_placement *placements,
                    int strided, mt_error *err) {
  if (out == NULL) return mt__fail(err, MT_EINVAL, "The output layout is NULL");
  int rc = check_tensor(ndim, shape, err);
  if (rc == MT_OK) rc = check_numel(ndim, shape, err);
  if (rc == MT_OK) rc = check_mesh(ndim, mesh_ndim, mesh_shape, placements, strided, err);
  if (rc != MT_OK) return rc;
  /* Zero the unused tails so two equal layouts are also equal byte for byte. */
  mt_layout l;
  memset(&l, 0, sizeof l);
  l.ndim = ndim;
  if (ndim > 0) memcpy(l.shape, shape, (size_t)ndim * sizeof *shape);
  l.mesh_ndim = mesh_ndim;
  memcpy(l.mesh_shape, mesh_shape, (size_t)mesh_ndim * sizeof *mesh_shape);
  for (int m = 0; m < mesh_ndim; ++m) {
    /* Only the fields a kind reads are kept, so equal layouts are equal bytes. */
    const mt_placement *p = &placements[m];
    l.placements[m].kind = p->kind;
    if (p->kind == MT_PLACEMENT_SHARD || p->kind == MT_PLACEMENT_STRIDED)
      l.placements[m].dim = p->dim;
    if (p->kind == MT_PLACEMENT_PARTIAL) l.placements[m].reduce_op = p->reduce_op;
    if (p->kind == MT_PLACEMENT_STRIDED) l.placements[m].split_factor = p->split_factor;
  }
  *out = l;
  return MT_OK;
}

int mt_layout_init(mt_layout *out, int ndim, const int64_t *shape, int mesh_ndim,
                   const int64_t *mesh_shape, const mt_placement *placements,
                   mt_error *err) {
  return mt__layout_init(out, ndim, shape, mesh_ndim, mesh_shape, placements, 0, err);
}

/* A layout is plain data the caller may have filled by hand, so it is checked
 * again before it steers any array index. */
static int check_layout(const mt_layout *layout, mt_error *err) {
  int rc = check_tensor(layout->ndim, layout->shape, err);
  if (rc != MT_OK) return rc;
  return check_mesh(layout->ndim, layout->mesh_ndim, layout->mesh_shape,
                    layout->placements, 0, err);
}

int mt_layout_local_box(const mt_layout *layout, const int64_t *coord, mt_box *out,
                        mt_error *err) {
  if (layout == NULL || coord == NULL || out == NULL)
    return mt__fail(err, MT_EINVAL,
                    "The layout, coordinate and output box are required");
  int rc = check_layout(layout, err);
  if (rc != MT_OK) return rc;
  for (int m = 0; m < layout->mesh_ndim; ++m) {
    if (coord[m] < 0 || coord[m] >= layout->mesh_shape[m])
      return mt__fail(err, MT_EINDEX,
                      "Coordinate %" PRId64 " on mesh dim %d is out of range for "
                      "its size %" PRId64,
                      coord[m], m, layout->mesh_shape[m]);
  }
  /* No error can happen past this point, so `out` is written in place. */
  int ndim = layout->ndim;
  out->ndim = ndim;
  for (int d = 0; d < MT_MAX_NDIM; ++d) {
    out->offset[d] = 0;
    out->shape[d] = d < ndim ? layout->shape[d] : 0;
  }
  for (int m = 0; m < layout->mesh_ndim; ++m) {
    const mt_placement *p = &layout->placements[m];
    if (p->kind != MT_PLACEMENT_SHARD) continue;
    int64_t size, offset;
    mt_chunk(out->shape[p->dim], layout->mesh_shape[m], coord[m], &size, &offset);
    out->offset[p->dim] += offset;
    out->shape[p->dim] = size;
  }
  /* Where an empty shard starts is arbitrary; the global size keeps it
   * inside [0, size] and identical on every rank that holds nothing. */
  for (int d = 0; d < ndim; ++d) {
    if (out->shape[d] == 0) out->offset[d] = layout->shape[d];
  }
  return MT_OK;
}

int mt_layout_even_global_shape(int ndim, const int64_t *local_shape, int mesh_ndim,
                                const int64_t *mesh_shape,
                                const mt_placement *placements, int64_t *global_shape,
                                mt_error *err) {
  int rc = check_tensor(ndim, local_shape, err);
  if (rc == MT_OK) rc = check_mesh(ndim, mesh_ndim, mesh_shape, placements, 0, err);
  if (rc != MT_OK) return rc;
  if (ndim > 0 && global_shape == NULL)
    return mt__fail(err, MT_EINVAL, "The output global shape is NULL");
  int64_t shape[MT_MAX_NDIM];
  for (int d = 0; d < ndim; ++d) shape[d] = local_shape[d];
  for (int m = 0; m < mesh_ndim; ++m) {
    if (placements[m].kind != MT_PLACEMENT_SHARD) continue;
    int d = placements[m].dim;
    if (shape[d] > INT64_MAX / mesh_shape[m])
      return mt__fail(err, MT_EOVERFLOW,
                      "Global size of dim %d overflows int64 when Shard(dim=%d) on "
                      "mesh dim %d multiplies it by %" PRId64,
                      d, d, m, mesh_shape[m]);
    shape[d] *= mesh_shape[m];
  }
  for (int d = 0; d < ndim; ++d) global_shape[d] = shape[d];
  return MT_OK;
}

int64_t mt_box_numel(const mt_box *box) {
  assert(box != NULL && box->ndim >= 0 && box->ndim <= MT_MAX_NDIM);
  /* An empty dim makes the box empty however large the others are, so test for it
   * before multiplying. */
  for (int d = 0; d < box->ndim; ++d) {
    if (box->shape[d] == 0) return 0;
  }
  int64_t numel = 1;
  for (int d = 0; d < box->ndim; ++d) numel *= box->shape[d];
  return numel;
}

int mt_box_intersect(const mt_box *a, const mt_box *b, mt_box *out) {
  assert(a != NULL && b != NULL && out != NULL);
  /* Boxes of different ranks share no element; there is no error channel here. */
  if (a->ndim != b->ndim) return 0;
  mt_box r;
  memset(&r, 0, sizeof r);
  r.ndim = a->ndim;
  for (int d = 0; d < a->ndim; ++d) {
    int64_t lo = a->offset[d] > b->offset[d] ? a->offset[d] : b->offset[d];
    int64_t a_hi = a->offset[d] + a->shape[d];
    int64_t b_hi = b->offset[d] + b->shape[d];
    int64_t hi = a_hi < b_hi ? a_hi : b_hi;
    if (hi <= lo) return 0;
    r.offset[d] = lo;
    r.shape[d] = hi - lo;
  }
  *out = r;
  return 1;
}

int mt_box_check_local(const mt_box *box, int ndim, const int64_t *shape, mt_error *err) {
  assert(box != NULL && (shape != NULL || ndim == 0));
  int ok = ndim == box->ndim;
  for (int d = 0; ok && d < ndim; ++d) ok = shape[d] == box->shape[d];
  if (ok) return MT_OK;
  /* The shape as Python prints a tuple, which is how the user sees the array's. */
  char text[MT_MAX_NDIM * 22 + 4] = "(";
  size_t at = 1;
  for (int d = 0; d < ndim && d < MT_MAX_NDIM; ++d)
    at += (size_t)snprintf(text + at, sizeof text - at, "%s%" PRId64, d ? ", " : "", shape[d]);
  snprintf(text + at, sizeof text - at, ndim == 1 ? ",)" : ")");
  return mt__fail(err, MT_EINVAL,
                  "the local array of shape %s is not this rank's shard (%d dims) of the "
                  "DTensor; was it built with from_local from uneven shards without "
                  "shape= and stride=?", text, box->ndim);
}

/* ---- Selections. ---- */

/* Floor of a / b for b > 0. */
static int64_t floor_div(int64_t a, int64_t b) {
  assert(b > 0);
  /* b is |step| of a checked selection. cppcheck, which ignores asserts, reads the
   * sign test in picked() as a zero test. */
  /* cppcheck-suppress zerodivcond */
  int64_t q = a / b, r = a % b;
  return (r != 0 && a < 0) ? q - 1 : q;
}

static int64_t clamp(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

int mt_selection_check(const mt_selection *sel, int ndim, const int64_t *shape,
                       mt_error *err) {
  if (sel == NULL || (ndim > 0 && shape == NULL))
    return mt__fail(err, MT_EINVAL, "The selection and shape are required");
  if (sel->ndim != ndim)
    return mt__fail(err, MT_EINVAL, "The selection has %d dims but the tensor %d",
                    sel->ndim, ndim);
  for (int d = 0; d < ndim; ++d) {
    int64_t n = sel->count[d], first = sel->start[d];
    if (sel->step[d] == 0 || n < 0)
      return mt__fail(err, MT_EINVAL,
                      "Dim %d selects with step %" PRId64 " and count %" PRId64
                      "; the step must be nonzero and the count >= 0",
                      d, sel->step[d], n);
    if (n == 0) continue;
    /* |step| * (n - 1) < shape keeps the last index from overflowing. */
    int64_t span = sel->step[d] > 0 ? sel->step[d] : -sel->step[d];
    int ok = first >= 0 && first < shape[d] && (n - 1) <= (shape[d] - 1) / span;
    int64_t last = ok ? first + (n - 1) * sel->step[d] : -1;
    if (!ok || last < 0 || last >= shape[d])
      return mt__fail(err, MT_EINDEX,
                      "Dim %d of size %" PRId64 " cannot select %" PRId64
                      " indices from %" PRId64 " by %" PRId64,
                      d, shape[d], n, first, sel->step[d]);
  }
  return MT_OK;
}

/* The k with start + k * step in [lo, hi), as [*k0, *k1) within [0, count). */
static void picked(const mt_selection *sel, int d, int64_t lo, int64_t hi, int64_t *k0,
                   int64_t *k1) {
  int64_t start = sel->start[d], step = sel->step[d], n = sel->count[d];
  assert(step != 0); /* sel passed mt_selection_check */
  if (step > 0) {
    *k0 = -floor_div(start - lo, step);
    *k1 = -floor_div(start - hi, step);
  } else {
    *k0 = floor_div(start - hi, -step) + 1;
    *k1 = floor_div(start - lo, -step) + 1;
  }
  *k0 = clamp(*k0, 0, n), *k1 = clamp(*k1, *k0, n);
}

int mt_selection_image(const mt_selection *sel, const mt_box *in, mt_box *out) {
  assert(sel != NULL && in != NULL && out != NULL && sel->ndim == in->ndim);
  int any = 1;
  memset(out, 0, sizeof *out);
  out->ndim = in->ndim;
  for (int d = 0; d < in->ndim; ++d) {
    int64_t k0 = 0, k1 = 0;
    if (in->shape[d] > 0)
      picked(sel, d, in->offset[d], in->offset[d] + in->shape[d], &k0, &k1);
    out->offset[d] = k0;
    out->shape[d] = k1 - k0;
    any &= k1 > k0;
  }
  return any;
}
