/* The boxes of an exchange (plan.h): what the rank at a coordinate sends to and
 * receives from every rank of the mesh, for a step of a plan or a selection. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"
#include "plan-private.h"

/* Advances a row-major mesh coordinate; returns 0 once it wraps to all zeros. */
static int next_coord(int64_t *coord, const mt_layout *l) {
  for (int m = l->mesh_ndim - 1; m >= 0; --m) {
    if (++coord[m] < l->mesh_shape[m]) return 1;
    coord[m] = 0;
  }
  return 0;
}

/* A box holding no element, in the layout's convention for empty extents. */
static void empty_box(const mt_layout *l, mt_box *out) {
  memset(out, 0, sizeof *out);
  out->ndim = l->ndim;
  for (int d = 0; d < l->ndim; ++d) out->offset[d] = l->shape[d];
}

/* Which mesh dims a rank's peers may differ on. A direct exchange reaches across
 * every dim the source shards (their source boxes partition the tensor). A step
 * on one mesh dim reaches along it, except from Replicate (a chunk), where every
 * rank already holds what it keeps and takes it from itself. From Partial (a
 * reduction) recv[p] is p's contribution to this rank's box, so each element
 * arrives once from every rank of the group rather than once in all. */
static void exchange_scope(const mt_layout *src, int mesh_dim, int *scope) {
  for (int m = 0; m < src->mesh_ndim; ++m) {
    int kind = src->placements[m].kind;
    if (mesh_dim < 0)
      scope[m] = kind == MT_PLACEMENT_SHARD;
    else
      scope[m] = m == mesh_dim && kind != MT_PLACEMENT_REPLICATE;
  }
}

static int is_peer(const mt_layout *l, const int64_t *a, const int64_t *b,
                   const int *scope) {
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (!scope[m] && a[m] != b[m]) return 0;
  }
  return 1;
}

/* x ∩ y, or the empty box of `l`. */
static void meet(const mt_box *x, const mt_box *y, const mt_layout *l, mt_box *out) {
  if (!mt_box_intersect(x, y, out)) empty_box(l, out);
}

/* The src box of a rank in b's coordinates: its image under `sel`, or the box
 * itself without one. */
static void src_box(const mt_layout *a, const mt_selection *sel, const int64_t *coord,
                    mt_box *out) {
  mt_box box;
  local_box(a, coord, &box);
  if (sel == NULL)
    *out = box;
  else
    mt_selection_image(sel, &box, out);
}

/* The send and recv boxes of the rank at `coord` against every mesh rank; with a
 * selection, src boxes are mapped to b's coordinates first. */
static void fill_exchange(const mt_layout *a, const mt_selection *sel,
                          const mt_layout *b, const int64_t *coord, const int *scope,
                          mt_box *send, mt_box *recv) {
  mt_box s_me, t_me;
  src_box(a, sel, coord, &s_me);
  local_box(b, coord, &t_me);
  int64_t pc[MT_MAX_MESH_NDIM] = {0}, p = 0;
  do {
    if (is_peer(a, coord, pc, scope)) {
      mt_box s_p, t_p;
      src_box(a, sel, pc, &s_p);
      local_box(b, pc, &t_p);
      meet(&s_me, &t_p, b, &send[p]);
      meet(&s_p, &t_me, b, &recv[p]);
    } else {
      empty_box(b, &send[p]);
      empty_box(b, &recv[p]);
    }
    ++p;
  } while (next_coord(pc, a));
}

/* Checks the arguments of mt_exchange_boxes beyond the layouts themselves. */
static int check_exchange(const mt_layout *a, int mesh_dim, const int64_t *coord,
                          int64_t npeers, const int *scope, mt_error *err) {
  if (mesh_dim < -1 || mesh_dim >= a->mesh_ndim)
    return mt__fail(err, MT_EINDEX,
                    "Mesh dim %d is out of range for a %d-dim mesh (-1 means a "
                    "direct exchange)",
                    mesh_dim, a->mesh_ndim);
  if (npeers != mesh_numel(a))
    return mt__fail(err, MT_EINVAL,
                    "npeers is %" PRId64 " but the mesh has %" PRId64 " ranks", npeers,
                    mesh_numel(a));
  mt_box probe;
  int rc = mt_layout_local_box(a, coord, &probe, err);
  if (rc != MT_OK || a->ndim > 0) return rc;
  /* A 0-d box always holds its one element, so "no message" has no box. */
  for (int m = 0; m < a->mesh_ndim; ++m) {
    if (!scope[m] && a->mesh_shape[m] > 1)
      return mt__fail(err, MT_ENOTSUP,
                      "A 0-d tensor has no empty box for the ranks outside this "
                      "exchange (mesh dim %d of size %" PRId64 " is not part of it)",
                      m, a->mesh_shape[m]);
  }
  return MT_OK;
}

int mt_exchange_boxes(const mt_layout *src, const mt_layout *dst, int mesh_dim,
                      const int64_t *coord, int64_t npeers, mt_box *send, mt_box *recv,
                      mt_error *err) {
  if (src == NULL || dst == NULL || coord == NULL || send == NULL || recv == NULL)
    return mt__fail(err, MT_EINVAL,
                    "The layouts, coordinate and send and recv arrays are required");
  mt_layout a, b;
  int rc = mt__check_pair(src, dst, &a, &b, err);
  if (rc != MT_OK) return rc;
  int scope[MT_MAX_MESH_NDIM] = {0};
  if (mesh_dim >= -1 && mesh_dim < a.mesh_ndim) exchange_scope(&a, mesh_dim, scope);
  rc = check_exchange(&a, mesh_dim, coord, npeers, scope, err);
  if (rc != MT_OK) return rc;
  fill_exchange(&a, NULL, &b, coord, scope, send, recv);
  return MT_OK;
}

/* A selection's layouts: one mesh, dst shaped as the selection, Partials kept. */
static int check_selection_pair(const mt_layout *a, const mt_selection *sel,
                                const mt_layout *b, mt_error *err) {
  int rc = mt_selection_check(sel, a->ndim, a->shape, err);
  if (rc != MT_OK) return rc;
  if (a->ndim == 0 || b->ndim != a->ndim || a->mesh_ndim != b->mesh_ndim)
    return mt__fail(err, MT_EINVAL,
                    "A selection exchange needs layouts of equal ndim (>= 1) on one "
                    "mesh; got %d and %d dims on %d- and %d-dim meshes",
                    a->ndim, b->ndim, a->mesh_ndim, b->mesh_ndim);
  for (int d = 0; d < a->ndim; ++d) {
    if (b->shape[d] != sel->count[d])
      return mt__fail(err, MT_EINVAL,
                      "The target's dim %d has size %" PRId64
                      " but the selection picks %" PRId64,
                      d, b->shape[d], sel->count[d]);
  }
  for (int m = 0; m < a->mesh_ndim; ++m) {
    const mt_placement *p = &a->placements[m], *q = &b->placements[m];
    int pa = p->kind == MT_PLACEMENT_PARTIAL, pb = q->kind == MT_PLACEMENT_PARTIAL;
    if (a->mesh_shape[m] != b->mesh_shape[m])
      return mt__fail(err, MT_EINVAL, "The layouts are on different meshes");
    if ((pa || pb) && !placement_eq(p, q))
      return mt__fail(err, MT_EINVAL,
                      "Mesh dim %d: a selection exchange keeps Partials as they are",
                      m);
  }
  return MT_OK;
}

int mt_selection_exchange_boxes(const mt_layout *src, const mt_selection *sel,
                                const mt_layout *dst, const int64_t *coord,
                                int64_t npeers, mt_box *send, mt_box *recv,
                                mt_error *err) {
  if (src == NULL || sel == NULL || dst == NULL || coord == NULL || send == NULL ||
      recv == NULL)
    return mt__fail(err, MT_EINVAL,
                    "The layouts, selection, coordinate and send and recv arrays are "
                    "required");
  mt_layout a, b;
  int rc = mt__check_layout(src, "source", &a, err);
  if (rc == MT_OK) rc = mt__check_layout(dst, "target", &b, err);
  if (rc == MT_OK) rc = check_selection_pair(&a, sel, &b, err);
  if (rc == MT_OK) rc = mt__check_mesh_size(&a, err);
  if (rc != MT_OK) return rc;
  int scope[MT_MAX_MESH_NDIM] = {0};
  exchange_scope(&a, -1, scope);
  rc = check_exchange(&a, -1, coord, npeers, scope, err);
  if (rc != MT_OK) return rc;
  fill_exchange(&a, sel, &b, coord, scope, send, recv);
  return MT_OK;
}
