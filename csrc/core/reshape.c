/* Reshape (reshape.h): the groups of dims a reshape keeps together, and the
 * strided layout of a reshape that moves no data. */
#include "mpitensor/core/reshape.h"

#include <string.h>

#include "core-private.h"
#include "mpitensor/core/strided.h"

/* *p times n, or -1 when the product leaves int64 (no tensor has such a group). */
static int times(int64_t *p, int64_t n) {
  if (n != 0 && *p > INT64_MAX / n) return -1;
  *p *= n;
  return 0;
}

/* Takes dims from the side with the smaller product, from src dim *i and dst dim
 * *j on, until the products agree; advances both. -1 when a side runs out first. */
static int grow(const int64_t *src, int ns, int *i, const int64_t *dst, int nd, int *j) {
  int64_t f = src[(*i)++], t = dst[(*j)++];
  while (f != t) {
    int rc = -1;
    if (f < t && *i < ns)
      rc = times(&f, src[(*i)++]);
    else if (t < f && *j < nd)
      rc = times(&t, dst[(*j)++]);
    if (rc < 0) return -1;
  }
  return 0;
}

/* MT_OK when `n` sizes at `shape` are a shape the core takes. */
static int check_shape(int n, const int64_t *shape, const char *what, mt_error *err) {
  if (n < 0 || n > MT_MAX_NDIM)
    return mt__fail(err, MT_EINDEX, "The %s shape has %d dims; 0 to %d are supported",
                    what, n, MT_MAX_NDIM);
  if (n > 0 && shape == NULL) return mt__fail(err, MT_EINVAL, "The %s shape is NULL", what);
  for (int d = 0; d < n; ++d)
    if (shape[d] < 0)
      return mt__fail(err, MT_EINDEX, "The %s shape has a negative size on dim %d", what, d);
  return MT_OK;
}

int mt_reshape_groups(int src_ndim, const int64_t *src, int dst_ndim, const int64_t *dst,
                      int *ngroups, int *src_at, int *dst_at, mt_error *err) {
  int rc = check_shape(src_ndim, src, "input", err);
  if (rc == MT_OK) rc = check_shape(dst_ndim, dst, "output", err);
  if (rc != MT_OK) return rc;
  if (ngroups == NULL || src_at == NULL || dst_at == NULL)
    return mt__fail(err, MT_EINVAL, "The group count and bounds are required");
  int si[2 * MT_MAX_NDIM + 1], di[2 * MT_MAX_NDIM + 1], n = 0, i = 0, j = 0;
  while (i < src_ndim || j < dst_ndim) {
    si[n] = i, di[n] = j;
    if (j == dst_ndim || (i < src_ndim && src[i] == 1 && dst[j] != 1))
      ++i;
    else if (i == src_ndim || (dst[j] == 1 && src[i] != 1))
      ++j;
    else if (grow(src, src_ndim, &i, dst, dst_ndim, &j) < 0)
      return mt__fail(err, MT_EINVAL, "The sizes of the two shapes do not line up in "
                      "groups of equal products");
    ++n;
  }
  si[n] = i, di[n] = j;
  memcpy(src_at, si, (size_t)(n + 1) * sizeof *si);
  memcpy(dst_at, di, (size_t)(n + 1) * sizeof *di);
  *ngroups = n;
  return MT_OK;
}

/* The view's placement for Shard `p`, whose dim is in the group of input dims
 * [s0, s1) and output dims [d0, d1), given the local sizes and unevenness the
 * earlier mesh dims left. 0, or -1 when there is no view. */
static int view_cut(const mt_placement *p, int s0, int s1, int d0, int d1,
                    const int64_t *local, const int *uneven, mt_placement *out) {
  if (d1 == d0 || (s1 - s0 > 1 && d1 - d0 > 1)) return -1;
  if (p->dim == s0) return *out = shard(d0), 0;
  /* A dim before it cut unevenly has no one local size, so no split factor
   * describes every rank's share. */
  int64_t factor = 1;
  for (int i = s0; i < p->dim; ++i) {
    if (uneven[i] || local[i] < 1 || factor > INT32_MAX / local[i]) return -1;
    factor *= local[i];
  }
  *out = (mt_placement){MT_PLACEMENT_STRIDED, d0, 0, (int)factor};
  return 0;
}

/* The view's placements of plain `l` by groups `si`/`di` (`n` of them). 0, or -1
 * when there is none. */
static int view_placements(const mt_layout *l, const int *si, const int *di, int n,
                           mt_placement *out) {
  int group[MT_MAX_NDIM] = {0}, uneven[MT_MAX_NDIM] = {0};
  int64_t local[MT_MAX_NDIM];
  for (int g = 0; g < n; ++g)
    for (int i = si[g]; i < si[g + 1]; ++i) group[i] = g;
  memcpy(local, l->shape, sizeof local);
  for (int m = 0; m < l->mesh_ndim; ++m) {
    const mt_placement *p = &l->placements[m];
    out[m] = *p;
    if (p->kind != MT_PLACEMENT_SHARD) continue;
    int g = group[p->dim];
    if (view_cut(p, si[g], si[g + 1], di[g], di[g + 1], local, uneven, &out[m]) < 0)
      return -1;
    uneven[p->dim] |= local[p->dim] % l->mesh_shape[m] != 0;
    local[p->dim] /= l->mesh_shape[m];
  }
  return 0;
}

int mt_reshape_view(const mt_layout *layout, int ndim, const int64_t *shape,
                    mt_layout *out, mt_error *err) {
  if (layout == NULL || out == NULL)
    return mt__fail(err, MT_EINVAL, "The layout and the output are required");
  /* Checked again: it is plain data, and its dims index the groups. */
  mt_layout l, view;
  int si[2 * MT_MAX_NDIM + 1], di[2 * MT_MAX_NDIM + 1], n = 0;
  int rc = mt_strided_init(&l, layout->ndim, layout->shape, layout->mesh_ndim,
                           layout->mesh_shape, layout->placements, err);
  if (rc == MT_OK) rc = mt_reshape_groups(l.ndim, l.shape, ndim, shape, &n, si, di, err);
  if (rc != MT_OK) return rc;
  mt_placement pl[MT_MAX_MESH_NDIM];
  if (mt_strided_has(&l) || view_placements(&l, si, di, n, pl) < 0 ||
      mt_strided_init(&view, ndim, shape, l.mesh_ndim, l.mesh_shape, pl, NULL) != MT_OK ||
      !mt_strided_same(&l, &view))
    return mt__fail(err, MT_EINVAL, "This reshape of the layout is no view: the data "
                    "must move");
  *out = view;
  return MT_OK;
}
