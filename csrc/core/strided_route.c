/* The route of a move between layouts when one is strided (strided_route.h). */
#include "mpitensor/core/strided_route.h"

#include "mpitensor/core/strided.h"

/* `l`'s tensor and mesh with the placements `strided`'s plain rule gives them
 * (mt_strided_plain; every Shard too when `all`). */
static int plain_layout(const mt_layout *l, int all, mt_layout *out, mt_error *err) {
  mt_placement p[MT_MAX_MESH_NDIM];
  int rc = mt_strided_plain(l->placements, l->mesh_ndim, all, p, err);
  return rc == MT_OK ? mt_strided_init(out, l->ndim, l->shape, l->mesh_ndim, l->mesh_shape, p, err)
                     : rc;
}

int mt_strided_route(const mt_layout *src, const mt_layout *dst, mt_layout *from,
                     mt_layout *to, mt_layout *mid, int *hops, mt_error *err) {
  mt_layout e;
  int group[MT_MAX_NDIM + 1];
  int rc = mt_strided_expand(src, &e, group, err);
  if (rc == MT_OK) rc = mt_strided_expand(dst, &e, group, err);
  if (rc != MT_OK) return rc;
  /* The refinements that fail only say there is no common form: not an error. */
  mt_error none = {0};
  *hops = 1;
  if (mt_strided_refine(src, dst, from, to, &none) == MT_OK) return MT_OK;
  *hops = 2;
  int all = !mt_strided_has(src);
  if (!all) {
    rc = plain_layout(src, 0, mid, err);
    if (rc != MT_OK) return rc;
    all = mt_strided_refine(src, mid, from, to, &none) != MT_OK;
  }
  return all ? plain_layout(src, 1, mid, err) : MT_OK;
}
