/* Strided layouts (strided.h): expansion, local box and common plain form.
 *
 * Each tensor dim is tracked as a list of factors (a finer shape whose product is
 * the dim) while the placements apply, mesh dim by mesh dim: a STRIDED placement
 * first makes its `split_factor` pieces a boundary between factors, splitting one
 * factor in two where the boundary falls inside it, and every cut shards one
 * factor. The factors are the expansion's dims; each cut is a SHARD of one. */
#include "mpitensor/core/strided.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core-private.h"

/* One tensor dim's factors while placements apply: global sizes, local sizes (cut
 * evenly so far, or unevenly by the last cut, after which nothing may cut the dim)
 * and the factor each mesh dim cuts. */
typedef struct factors {
  int n;
  int uneven;
  int64_t size[MT_MAX_NDIM];
  int64_t local[MT_MAX_NDIM];
  int owner[MT_MAX_MESH_NDIM];
} factors;

static void factors_init(factors *f, const int64_t *sizes, int n) {
  memset(f, 0, sizeof *f);
  f->n = n;
  for (int i = 0; i < n; ++i) f->size[i] = f->local[i] = sizes[i];
}

/* Cuts over `ranks` the first factor from `start` that holds more than one
 * element; a plain layout can say so only when the cut falls between its
 * entries: evenly, or with nothing held after it. A cut past the last factor
 * cuts a new factor of size 1. 0, or -1 when there is no such cut. */
static int cut(factors *f, int start, int m, int64_t ranks) {
  if (start == f->n) {
    if (f->n == MT_MAX_NDIM) return -1;
    f->size[f->n] = f->local[f->n] = 1;
    f->n++;
  }
  int k = start;
  while (k < f->n && f->local[k] <= 1) ++k;
  if (k == f->n) k = start;
  /* Local sizes multiply to at most the dim's size: no overflow. */
  int64_t rest = 1;
  for (int i = k + 1; i < f->n; ++i) rest *= f->local[i];
  if (f->uneven || (f->local[k] % ranks != 0 && rest != 1)) return -1;
  f->uneven = f->local[k] % ranks != 0;
  f->local[k] /= ranks;
  f->owner[m] = k + 1; /* 0 means none */
  return 0;
}

/* Makes the end of the first `pieces` pieces of the local extent a boundary
 * between factors, splitting the factor it falls inside. The index of the first
 * factor after it, or -1 when the pieces are not whole factors' worth. */
static int split(factors *f, int64_t pieces) {
  int64_t prefix = 1;
  for (int k = 0; k < f->n; ++k) {
    if (prefix == pieces) return k;
    int64_t a = pieces / prefix, n = f->local[k];
    if (a < n) {
      if (n % a != 0 || f->n == MT_MAX_NDIM) return -1;
      /* Factor k was cut evenly if at all (no split follows an uneven cut), so its
       * global size is a multiple of the inner part, and the cut stays outside. */
      int64_t inner = n / a;
      size_t tail = (size_t)(f->n - k - 1);
      memmove(&f->size[k + 2], &f->size[k + 1], tail * sizeof *f->size);
      memmove(&f->local[k + 2], &f->local[k + 1], tail * sizeof *f->local);
      f->size[k + 1] = f->local[k + 1] = inner;
      f->size[k] /= inner;
      f->local[k] = a;
      for (int m = 0; m < MT_MAX_MESH_NDIM; ++m)
        if (f->owner[m] > k + 1) f->owner[m]++;
      f->n++;
      return k + 1;
    }
    if (n == 0 || a % n != 0) return -1;
    prefix *= n;
  }
  return prefix == pieces ? f->n : -1;
}

/* Applies `l`'s placements to its dims' factors `f`. 0, or -1 with *bad the first
 * mesh dim whose placement has no plain form. */
static int apply(const mt_layout *l, factors *f, int *bad) {
  int strided[MT_MAX_NDIM] = {0};
  for (int m = 0; m < l->mesh_ndim; ++m)
    if (l->placements[m].kind == MT_PLACEMENT_STRIDED) strided[l->placements[m].dim] = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) {
    const mt_placement *p = &l->placements[m];
    if (p->kind != MT_PLACEMENT_SHARD && p->kind != MT_PLACEMENT_STRIDED) continue;
    factors *d = &f[p->dim];
    /* A dim that stays one factor is cut as a plain layout cuts it, unevenly as
     * often as it likes: nothing reads its local extents. */
    if (!strided[p->dim] && d->n == 1) {
      d->owner[m] = 1;
      continue;
    }
    int start = 0;
    if (p->kind == MT_PLACEMENT_STRIDED) {
      int64_t total = 1;
      for (int i = 0; i < d->n; ++i) total *= d->local[i];
      start = d->uneven || total % p->split_factor != 0 ? -1 : split(d, p->split_factor);
    }
    if (start < 0 || cut(d, start, m, l->mesh_shape[m]) < 0) return *bad = m, -1;
  }
  return 0;
}

/* Appends v[0..n) as Python prints a tuple to buf[*at..len). */
static void tuple_text(char *buf, size_t len, size_t *at, int n, const int64_t *v) {
  *at += (size_t)snprintf(buf + *at, len - *at, "(");
  for (int i = 0; i < n && *at < len; ++i)
    *at += (size_t)snprintf(buf + *at, len - *at, "%s%" PRId64, i ? ", " : "", v[i]);
  if (*at < len) *at += (size_t)snprintf(buf + *at, len - *at, n == 1 ? ",)" : ")");
}

/* "placements (...) of a tensor of shape (...) on a mesh of shape (...)". */
static const char *layout_text(const mt_layout *l, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "placements (");
  char p[64];
  for (int m = 0; m < l->mesh_ndim && at < len; ++m)
    at += (size_t)snprintf(buf + at, len - at, "%s%s", m ? ", " : "",
                           mt__placement_text(&l->placements[m], 0, p, sizeof p));
  if (at < len)
    at += (size_t)snprintf(buf + at, len - at, "%s) of a tensor of shape ",
                           l->mesh_ndim == 1 ? "," : "");
  if (at < len) tuple_text(buf, len, &at, l->ndim, l->shape);
  if (at < len) at += (size_t)snprintf(buf + at, len - at, " on a mesh of shape ");
  if (at < len) tuple_text(buf, len, &at, l->mesh_ndim, l->mesh_shape);
  return buf;
}

/* The plain layout of `l`'s dims as factors `f`: dim d's factors become the dims
 * from group[d], each cut a SHARD of the factor it cuts. */
static int assemble(const mt_layout *l, const factors *f, mt_layout *out, int *group,
                    mt_error *err) {
  int64_t shape[MT_MAX_NDIM];
  int first[MT_MAX_NDIM + 1], n = 0;
  for (int d = 0; d < l->ndim; ++d) {
    first[d] = n;
    if (n + f[d].n > MT_MAX_NDIM)
      return mt__fail(err, MT_EINVAL, "The plain form of these strided shards has more "
                      "than %d dims", MT_MAX_NDIM);
    for (int i = 0; i < f[d].n; ++i) shape[n++] = f[d].size[i];
  }
  first[l->ndim] = n;
  mt_placement pl[MT_MAX_MESH_NDIM];
  for (int m = 0; m < l->mesh_ndim; ++m) {
    const mt_placement *p = &l->placements[m];
    int cuts = p->kind == MT_PLACEMENT_SHARD || p->kind == MT_PLACEMENT_STRIDED;
    pl[m] = cuts ? shard(first[p->dim] + f[p->dim].owner[m] - 1) : *p;
  }
  int rc = mt_layout_init(out, n, shape, l->mesh_ndim, l->mesh_shape, pl, err);
  if (rc == MT_OK && group != NULL) memcpy(group, first, (size_t)(l->ndim + 1) * sizeof *first);
  return rc;
}

int mt_strided_init(mt_layout *out, int ndim, const int64_t *shape, int mesh_ndim,
                    const int64_t *mesh_shape, const mt_placement *placements,
                    mt_error *err) {
  return mt__layout_init(out, ndim, shape, mesh_ndim, mesh_shape, placements, 1, err);
}

int mt_strided_has(const mt_layout *layout) {
  for (int m = 0; m < layout->mesh_ndim; ++m)
    if (layout->placements[m].kind == MT_PLACEMENT_STRIDED) return 1;
  return 0;
}

/* `in` checked again (it is plain data) into `l`, its dims as single factors. */
static int begin(const mt_layout *in, mt_layout *l, factors *f, mt_error *err) {
  memset(l, 0, sizeof *l);
  if (in == NULL) return mt__fail(err, MT_EINVAL, "The layout is NULL");
  int rc = mt__layout_init(l, in->ndim, in->shape, in->mesh_ndim, in->mesh_shape,
                           in->placements, 1, err);
  for (int d = 0; rc == MT_OK && d < l->ndim; ++d) factors_init(&f[d], &l->shape[d], 1);
  return rc;
}

int mt_strided_expand(const mt_layout *layout, mt_layout *out, int *group, mt_error *err) {
  mt_layout l;
  factors f[MT_MAX_NDIM];
  int rc = begin(layout, &l, f, err), bad = 0;
  if (rc != MT_OK) return rc;
  if (out == NULL || group == NULL)
    return mt__fail(err, MT_EINVAL, "The output layout and groups are required");
  if (apply(&l, f, &bad) < 0) {
    char text[512], p[64];
    const mt_placement *q = &l.placements[bad];
    return mt__fail(err, MT_EINVAL,
                    "%s: %s on mesh dim %d does not cut dim %d into whole pieces; "
                    "redistribute to Shard or Replicate placements first",
                    layout_text(&l, text, sizeof text),
                    mt__placement_text(q, 0, p, sizeof p), bad, q->dim);
  }
  return assemble(&l, f, out, group, err);
}

int mt_strided_local_box(const mt_layout *layout, const int64_t *coord, mt_box *out,
                         mt_error *err) {
  mt_layout e;
  mt_box eb;
  int group[MT_MAX_NDIM + 1] = {0};
  int rc = mt_strided_expand(layout, &e, group, err);
  if (rc == MT_OK) rc = mt_layout_local_box(&e, coord, &eb, err);
  if (rc != MT_OK) return rc;
  memset(out, 0, sizeof *out);
  out->ndim = layout->ndim;
  for (int d = 0; d < layout->ndim; ++d) {
    int64_t size = 1, flat = 0;
    for (int i = group[d]; i < group[d + 1]; ++i) {
      size *= eb.shape[i];
      /* An empty factor reports its size as offset; clamped, the flat index stays
       * inside the dim, and the dim's own empty offset is set below. */
      int64_t at = eb.offset[i] < e.shape[i] ? eb.offset[i] : e.shape[i] - 1;
      flat = flat * e.shape[i] + (at > 0 ? at : 0);
    }
    out->shape[d] = size;
    out->offset[d] = size != 0 ? flat : layout->shape[d];
  }
  return MT_OK;
}

/* The boundaries (global prefix products, strictly inside the dim) of factors `f`
 * merged into the sorted set b[0..*n). */
static void boundaries(const factors *f, int64_t size, int64_t *b, int *n) {
  int64_t p = 1;
  for (int i = 0; i + 1 < f->n; ++i) {
    p *= f->size[i];
    if (p <= 1 || p >= size) continue;
    int j = 0;
    while (j < *n && b[j] < p) ++j;
    if (j < *n && b[j] == p) continue;
    memmove(&b[j + 1], &b[j], (size_t)(*n - j) * sizeof *b);
    b[j] = p, ++*n;
  }
}

/* The finest factors of dim `size` that both `a` and `b` refine into `pre`
 * (`*npre` of them), and whether they differ from what `pre` held. 0, or -1 when
 * the two sets of boundaries do not nest (no shape splits at both). */
static int common_factors(const factors *a, const factors *b, int64_t size, int64_t *pre,
                          int *npre, int *changed) {
  if (size <= 1) return 0;
  int64_t bd[2 * MT_MAX_NDIM];
  int n = 0;
  boundaries(a, size, bd, &n);
  boundaries(b, size, bd, &n);
  if (n + 1 > MT_MAX_NDIM) return -1;
  int64_t prev = 1, next[MT_MAX_NDIM] = {0};
  for (int i = 0; i <= n; ++i) {
    int64_t cur = i < n ? bd[i] : size;
    if (cur % prev != 0) return -1;
    next[i] = cur / prev, prev = cur;
  }
  *changed |= n + 1 != *npre || memcmp(next, pre, (size_t)(n + 1) * sizeof *pre) != 0;
  memcpy(pre, next, (size_t)(n + 1) * sizeof *pre);
  *npre = n + 1;
  return 0;
}

/* The plain layouts of `la` and `lb` on one shape, from their factors on the same
 * boundaries: equal sizes pair up, and a factor of size 1 on one side only (a cut
 * past the end, or the dim's own size 1) becomes a dim the other side leaves
 * whole. 0, or -1 when the factors do not pair up. */
static int merge(const mt_layout *la, const factors *fa, const mt_layout *lb,
                 const factors *fb, mt_layout *ra, mt_layout *rb, mt_error *err) {
  int64_t shape[MT_MAX_NDIM];
  int ia[MT_MAX_NDIM][MT_MAX_NDIM], ib[MT_MAX_NDIM][MT_MAX_NDIM], n = 0;
  for (int d = 0; d < la->ndim; ++d) {
    const factors *x = &fa[d], *y = &fb[d];
    int i = 0, j = 0;
    while (i < x->n || j < y->n) {
      if (n == MT_MAX_NDIM) return -1;
      int one_x = i < x->n && x->size[i] == 1, one_y = j < y->n && y->size[j] == 1;
      if (one_x || one_y) {
        shape[n] = 1;
        if (one_x) ia[d][i++] = n;
        if (one_y) ib[d][j++] = n;
      } else {
        if (i == x->n || j == y->n || x->size[i] != y->size[j]) return -1;
        shape[n] = x->size[i];
        ia[d][i++] = n, ib[d][j++] = n;
      }
      ++n;
    }
  }
  mt_placement pa[MT_MAX_MESH_NDIM], pb[MT_MAX_MESH_NDIM];
  for (int m = 0; m < la->mesh_ndim; ++m) {
    const mt_placement *p = &la->placements[m], *q = &lb->placements[m];
    int cut_a = p->kind == MT_PLACEMENT_SHARD || p->kind == MT_PLACEMENT_STRIDED;
    int cut_b = q->kind == MT_PLACEMENT_SHARD || q->kind == MT_PLACEMENT_STRIDED;
    pa[m] = cut_a ? shard(ia[p->dim][fa[p->dim].owner[m] - 1]) : *p;
    pb[m] = cut_b ? shard(ib[q->dim][fb[q->dim].owner[m] - 1]) : *q;
  }
  int rc = mt_layout_init(ra, n, shape, la->mesh_ndim, la->mesh_shape, pa, err);
  if (rc == MT_OK) rc = mt_layout_init(rb, n, shape, lb->mesh_ndim, lb->mesh_shape, pb, err);
  return rc;
}

/* The error when two layouts have no common plain form. */
static int no_common(const mt_layout *a, const mt_layout *b, mt_error *err) {
  char ta[512], tb[512];
  return mt__fail(err, MT_EINVAL, "%s and %s have no common plain form",
                  layout_text(a, ta, sizeof ta), layout_text(b, tb, sizeof tb));
}

int mt_strided_refine(const mt_layout *a, const mt_layout *b, mt_layout *ra,
                      mt_layout *rb, mt_error *err) {
  mt_layout la, lb;
  factors fa[MT_MAX_NDIM], fb[MT_MAX_NDIM];
  int rc = begin(a, &la, fa, err);
  if (rc == MT_OK) rc = begin(b, &lb, fb, err);
  if (rc != MT_OK) return rc;
  if (ra == NULL || rb == NULL)
    return mt__fail(err, MT_EINVAL, "The two output layouts are required");
  int same = la.ndim == lb.ndim && la.mesh_ndim == lb.mesh_ndim &&
             memcmp(la.shape, lb.shape, sizeof la.shape) == 0 &&
             memcmp(la.mesh_shape, lb.mesh_shape, sizeof la.mesh_shape) == 0;
  if (!same)
    return mt__fail(err, MT_EINVAL, "Only layouts of one tensor shape on one mesh "
                    "have a common plain form");
  /* Factors both layouts' boundaries: each round applies the placements to the
   * boundaries found so far, which can only add more; when none appear, both are
   * plain on the same factors. */
  int64_t pre[MT_MAX_NDIM][MT_MAX_NDIM];
  int npre[MT_MAX_NDIM];
  for (int d = 0; d < la.ndim; ++d) pre[d][0] = la.shape[d], npre[d] = 1;
  for (int round = 0; round <= MT_MAX_NDIM; ++round) {
    int bad = 0, changed = 0;
    for (int d = 0; d < la.ndim; ++d) {
      factors_init(&fa[d], pre[d], npre[d]);
      factors_init(&fb[d], pre[d], npre[d]);
    }
    if (apply(&la, fa, &bad) < 0 || apply(&lb, fb, &bad) < 0) break;
    int nested = 1;
    for (int d = 0; nested && d < la.ndim; ++d)
      nested = common_factors(&fa[d], &fb[d], la.shape[d], pre[d], &npre[d], &changed) == 0;
    if (!nested) break;
    if (!changed) {
      if (merge(&la, fa, &lb, fb, ra, rb, err) == 0) return MT_OK;
      break;
    }
  }
  return no_common(&la, &lb, err);
}

int mt_strided_plain(const mt_placement *placements, int mesh_ndim, int all,
                     mt_placement *out, mt_error *err) {
  if (placements == NULL || out == NULL)
    return mt__fail(err, MT_EINVAL, "The placements and the output are required");
  if (mesh_ndim < 1 || mesh_ndim > MT_MAX_MESH_NDIM)
    return mt__fail(err, MT_EINVAL, "A mesh of %d dims; 1 to %d are supported", mesh_ndim,
                    MT_MAX_MESH_NDIM);
  for (int m = 0; m < mesh_ndim; ++m) {
    int kind = placements[m].kind;
    int gather = kind == MT_PLACEMENT_STRIDED || (all && kind == MT_PLACEMENT_SHARD);
    out[m] = gather ? replicate() : placements[m];
  }
  return MT_OK;
}

/* Whether the cuts of dim `d` of plain `l`, in mesh-dim order, divide `size`
 * evenly, so a dim merged after it keeps every rank's share one box. */
static int cut_evenly(const mt_layout *l, int d, int64_t size) {
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (!is_shard(&l->placements[m], d)) continue;
    if (size % l->mesh_shape[m] != 0) return 0;
    size /= l->mesh_shape[m];
  }
  return 1;
}

/* Whether a mesh dim of plain `l` cuts dim `d`. */
static int is_cut(const mt_layout *l, int d) {
  for (int m = 0; m < l->mesh_ndim; ++m)
    if (is_shard(&l->placements[m], d)) return 1;
  return 0;
}

/* The dims of plain `e` merged as mt_strided_canonical says: `shape` (`*n` dims),
 * and the merged dim of each dim of `e` (-1 for a dropped one). MT_EOVERFLOW when
 * a merged size leaves int64. */
static int merged_dims(const mt_layout *e, int64_t *shape, int *n, int *dim_of,
                       mt_error *err) {
  int head = -1;
  *n = 0;
  for (int d = 0; d < e->ndim; ++d) {
    int cuts = is_cut(e, d);
    int64_t size = e->shape[d];
    dim_of[d] = -1;
    if (size == 1 && !cuts) continue;
    if (*n > 0 && !cuts && cut_evenly(e, head, shape[*n - 1])) {
      if (size != 0 && shape[*n - 1] > INT64_MAX / size)
        return mt__fail(err, MT_EOVERFLOW, "A merged size of the layout leaves int64");
      shape[*n - 1] *= size;
      dim_of[d] = *n - 1;
      continue;
    }
    head = d, dim_of[d] = *n, shape[(*n)++] = size;
  }
  return MT_OK;
}

int mt_strided_canonical(const mt_layout *layout, mt_layout *out, mt_error *err) {
  mt_layout e;
  memset(&e, 0, sizeof e);
  int group[MT_MAX_NDIM + 1], dim_of[MT_MAX_NDIM], n = 0;
  int64_t shape[MT_MAX_NDIM];
  int rc = mt_strided_expand(layout, &e, group, err);
  if (rc == MT_OK) rc = merged_dims(&e, shape, &n, dim_of, err);
  if (rc != MT_OK) return rc;
  if (out == NULL) return mt__fail(err, MT_EINVAL, "The output layout is required");
  mt_placement pl[MT_MAX_MESH_NDIM];
  for (int m = 0; m < e.mesh_ndim; ++m) {
    const mt_placement *p = &e.placements[m];
    pl[m] = p->kind == MT_PLACEMENT_SHARD ? shard(dim_of[p->dim]) : *p;
  }
  return mt_layout_init(out, n, shape, e.mesh_ndim, e.mesh_shape, pl, err);
}

int mt_strided_same(const mt_layout *a, const mt_layout *b) {
  mt_layout ca, cb;
  if (mt_strided_canonical(a, &ca, NULL) != MT_OK ||
      mt_strided_canonical(b, &cb, NULL) != MT_OK)
    return 0;
  if (ca.ndim != cb.ndim || ca.mesh_ndim != cb.mesh_ndim) return 0;
  for (int d = 0; d < ca.ndim; ++d)
    if (ca.shape[d] != cb.shape[d]) return 0;
  for (int m = 0; m < ca.mesh_ndim; ++m)
    if (ca.mesh_shape[m] != cb.mesh_shape[m] ||
        !placement_eq(&ca.placements[m], &cb.placements[m]))
      return 0;
  return 1;
}
