/* Reshape (reshape.h): the groups of dims a reshape keeps together. */
#include "mpitensor/core/reshape.h"

#include <string.h>

#include "core-private.h"

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
