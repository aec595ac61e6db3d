/* Strided layouts: worked examples, the plain functions' refusal, and a sweep of
 * every layout of small tensors on small meshes against an independent model of
 * torch's _StridedShard (cut the held indices into split_factor pieces, chunk each
 * over the ranks, concatenate), for expansions, local boxes and common forms. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/strided.h"

enum { MAXN = 24 };

static mt_placement R(void) { return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0}; }
static mt_placement S(int dim) { return (mt_placement){MT_PLACEMENT_SHARD, dim, 0, 0}; }
static mt_placement SS(int dim, int sf) {
  return (mt_placement){MT_PLACEMENT_STRIDED, dim, 0, sf};
}

static long sweep_layouts, sweep_pairs;

/* torch's chunk `c` of `n` over `k`: [*lo, *lo + *len). */
static void chunk(int64_t n, int64_t k, int64_t c, int64_t *lo, int64_t *len) {
  int64_t size = (n + k - 1) / k;
  *lo = c * size < n ? c * size : n;
  *len = (c + 1) * size < n ? size : n - *lo;
}

/* The model: the global indices a rank holds along each dim, in local order, by
 * torch's definition. 0, or -1 when a split factor does not divide. */
static int model(const mt_layout *l, const int64_t *coord, int64_t idx[][MAXN],
                 int64_t *len) {
  for (int d = 0; d < l->ndim; ++d) {
    len[d] = l->shape[d];
    for (int64_t i = 0; i < len[d]; ++i) idx[d][i] = i;
  }
  for (int m = 0; m < l->mesh_ndim; ++m) {
    const mt_placement *p = &l->placements[m];
    if (p->kind != MT_PLACEMENT_SHARD && p->kind != MT_PLACEMENT_STRIDED) continue;
    int64_t *v = idx[p->dim], n = len[p->dim], sf = p->kind == MT_PLACEMENT_SHARD ? 1 : p->split_factor;
    if (n % sf != 0) return -1;
    int64_t out[MAXN], k = 0, piece = n / sf;
    for (int64_t s = 0; s < sf; ++s) {
      int64_t lo, cnt;
      chunk(piece, l->mesh_shape[m], coord[m], &lo, &cnt);
      for (int64_t i = 0; i < cnt; ++i) out[k++] = v[s * piece + lo + i];
    }
    memcpy(v, out, (size_t)k * sizeof *v);
    len[p->dim] = k;
  }
  return 0;
}

/* Flat indices (C order over `shape`) of the model's elements; their count. */
static int64_t model_flat(const mt_layout *l, const int64_t *coord, int64_t *flat) {
  int64_t idx[MT_MAX_NDIM][MAXN], len[MT_MAX_NDIM], n = 1;
  if (model(l, coord, idx, len) < 0) return -1;
  for (int d = 0; d < l->ndim; ++d) n *= len[d];
  for (int64_t e = 0; e < n; ++e) {
    int64_t rest = e, f = 0, sub[MT_MAX_NDIM];
    for (int d = l->ndim - 1; d >= 0; --d) sub[d] = rest % len[d], rest /= len[d];
    for (int d = 0; d < l->ndim; ++d) f = f * l->shape[d] + idx[d][sub[d]];
    flat[e] = f;
  }
  return n;
}

/* Flat indices of a plain layout's box, which reshapes to the same C order. */
static int64_t box_flat(const mt_layout *l, const int64_t *coord, int64_t *flat) {
  mt_box b;
  if (mt_layout_local_box(l, coord, &b, NULL) != MT_OK) return -2;
  int64_t n = mt_box_numel(&b);
  for (int64_t e = 0; e < n; ++e) {
    int64_t rest = e, f = 0, sub[MT_MAX_NDIM];
    for (int d = l->ndim - 1; d >= 0; --d) sub[d] = rest % b.shape[d], rest /= b.shape[d];
    for (int d = 0; d < l->ndim; ++d) f = f * l->shape[d] + b.offset[d] + sub[d];
    flat[e] = f;
  }
  return n;
}

/* Whether plain `p` holds on every rank what the model says `l` holds. */
static int same_elements(const mt_layout *l, const mt_layout *p) {
  int64_t coord[MT_MAX_MESH_NDIM] = {0};
  for (;;) {
    int64_t a[MAXN * MAXN], b[MAXN * MAXN];
    int64_t na = model_flat(l, coord, a), nb = box_flat(p, coord, b);
    if (na != nb || memcmp(a, b, (size_t)(na > 0 ? na : 0) * sizeof *a) != 0) return 0;
    int m = l->mesh_ndim - 1;
    while (m >= 0 && ++coord[m] == l->mesh_shape[m]) coord[m--] = 0;
    if (m < 0) return 1;
  }
}

static void test_examples(void) {
  int64_t n48 = 48, two = 2, mesh22[2] = {2, 2}, s86[2] = {8, 6};
  mt_placement ss8[1] = {SS(0, 8)};
  mt_layout l, e, ra, rb;
  int group[MT_MAX_NDIM + 1];
  mt_error err = {0};
  CHECK(mt_layout_init(&l, 1, &n48, 1, &two, ss8, &err) == MT_EINVAL &&
        strstr(err.msg, "_StridedShard(dim=0, sf=8) on mesh dim 0 has no box"));
  CHECK(mt_strided_init(&l, 1, &n48, 1, &two, ss8, NULL) == MT_OK && mt_strided_has(&l));
  CHECK(mt_strided_expand(&l, &e, group, NULL) == MT_OK);
  CHECK(e.ndim == 2 && e.shape[0] == 8 && e.shape[1] == 6 && group[0] == 0 &&
        group[1] == 2 && e.placements[0].kind == MT_PLACEMENT_SHARD &&
        e.placements[0].dim == 1);
  int64_t one = 1;
  mt_box b;
  CHECK(mt_strided_local_box(&l, &one, &b, NULL) == MT_OK && b.shape[0] == 24 &&
        b.offset[0] == 3);
  /* FSDP over TP: rows cut by mesh dim 1, then each half by mesh dim 0. */
  mt_placement fsdp[2] = {SS(0, 2), S(0)}, rows[2] = {S(0), S(0)};
  mt_layout a2, b2;
  CHECK(mt_strided_init(&a2, 2, s86, 2, mesh22, fsdp, NULL) == MT_OK);
  CHECK(mt_strided_init(&b2, 2, s86, 2, mesh22, rows, NULL) == MT_OK);
  CHECK(mt_strided_refine(&a2, &b2, &ra, &rb, NULL) == MT_OK);
  CHECK(ra.ndim == 3 && ra.shape[0] == 2 && ra.shape[1] == 4 && ra.shape[2] == 6);
  CHECK(ra.placements[0].dim == 1 && ra.placements[1].dim == 0 &&
        rb.placements[0].dim == 0 && rb.placements[1].dim == 1);
  /* Pieces of 2 and of 3 of one dim do not nest. */
  int64_t six = 6, three = 3;
  mt_placement p2[1] = {SS(0, 2)}, p3[1] = {SS(0, 3)};
  CHECK(mt_strided_init(&a2, 1, &six, 1, &three, p2, NULL) == MT_OK);
  CHECK(mt_strided_init(&b2, 1, &six, 1, &three, p3, NULL) == MT_OK);
  CHECK(mt_strided_refine(&a2, &b2, &ra, &rb, &err) == MT_EINVAL &&
        strstr(err.msg, "no common plain form"));
  /* A cut after an uneven one has no plain form. */
  int64_t m42[2] = {4, 2};
  mt_placement bad[2] = {S(0), SS(0, 2)};
  CHECK(mt_strided_init(&l, 1, &six, 2, m42, bad, NULL) == MT_OK);
  CHECK(mt_strided_expand(&l, &e, group, &err) == MT_EINVAL &&
        strstr(err.msg, "does not cut dim 0 into whole pieces"));
  mt_placement zero[1] = {SS(0, 0)};
  CHECK(mt_strided_init(&l, 1, &six, 1, &two, zero, &err) == MT_EINDEX);
}

/* Every placement of a tensor dim choice on one mesh dim, by index. */
static int placement_at(int i, int ndim, mt_placement *p) {
  static const int factors[] = {2, 3, 4};
  if (i == 0) return *p = R(), 1;
  if (--i < ndim) return *p = S(i), 1;
  i -= ndim;
  if (i < ndim * 3) return *p = SS(i / 3, factors[i % 3]), 1;
  return 0;
}

static void sweep(int ndim, const int64_t *shape, int mesh_ndim, const int64_t *mesh) {
  int per = 1 + 4 * ndim, total = 1;
  for (int m = 0; m < mesh_ndim; ++m) total *= per;
  mt_layout all[400];
  int n = 0;
  for (int code = 0; code < total && n < 400; ++code) {
    mt_placement pl[MT_MAX_MESH_NDIM];
    for (int m = 0, c = code; m < mesh_ndim; ++m, c /= per) placement_at(c % per, ndim, &pl[m]);
    mt_layout l, e;
    int group[MT_MAX_NDIM + 1];
    CHECK(mt_strided_init(&l, ndim, shape, mesh_ndim, mesh, pl, NULL) == MT_OK);
    if (mt_strided_expand(&l, &e, group, NULL) != MT_OK) continue;
    ++sweep_layouts;
    CHECK_MSG(same_elements(&l, &e), "expansion of layout %d", code);
    all[n++] = l;
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      mt_layout ra, rb;
      if (mt_strided_refine(&all[i], &all[j], &ra, &rb, NULL) != MT_OK) continue;
      ++sweep_pairs;
      CHECK_MSG(same_elements(&all[i], &ra) && same_elements(&all[j], &rb),
                "common form of layouts %d and %d", i, j);
    }
}

/* The plain layout a strided one passes through: strided shards (and, asked, every
 * shard) gathered, partials kept; in place too. */
static void test_plain(void) {
  mt_placement in[3] = {S(1), SS(0, 4), {MT_PLACEMENT_PARTIAL, 0, MT_REDUCE_MAX, 0}}, out[3];
  CHECK(mt_strided_plain(in, 3, 0, out, NULL) == MT_OK);
  CHECK(out[0].kind == MT_PLACEMENT_SHARD && out[0].dim == 1 &&
        out[1].kind == MT_PLACEMENT_REPLICATE && out[1].split_factor == 0 &&
        out[2].kind == MT_PLACEMENT_PARTIAL && out[2].reduce_op == MT_REDUCE_MAX);
  CHECK(mt_strided_plain(in, 3, 1, in, NULL) == MT_OK);
  CHECK(in[0].kind == MT_PLACEMENT_REPLICATE && in[0].dim == 0 &&
        in[1].kind == MT_PLACEMENT_REPLICATE && in[2].kind == MT_PLACEMENT_PARTIAL);
  mt_error err = {0};
  CHECK(mt_strided_plain(in, 0, 0, out, &err) == MT_EINVAL && strstr(err.msg, "0 dims"));
  CHECK(mt_strided_plain(NULL, 1, 0, out, NULL) == MT_EINVAL);
}

/* Normal forms: a strided layout and its expansion, a size-1 dim and an even
 * merge leave it unchanged; an uneven cut keeps its dims apart. */
static void test_canonical(void) {
  int64_t two = 2, n48 = 48, s86[2] = {8, 6}, s186[3] = {1, 8, 6}, s4x12[2] = {4, 12};
  int64_t s5x12[2] = {5, 12}, three = 3;
  mt_placement ss8[1] = {SS(0, 8)}, s1[1] = {S(1)}, s2[1] = {S(2)}, s0[1] = {S(0)};
  mt_layout a, b, c;
  CHECK(mt_strided_init(&a, 1, &n48, 1, &two, ss8, NULL) == MT_OK);
  CHECK(mt_strided_canonical(&a, &c, NULL) == MT_OK && c.ndim == 2 && c.shape[0] == 8 &&
        c.shape[1] == 6 && c.placements[0].kind == MT_PLACEMENT_SHARD &&
        c.placements[0].dim == 1);
  CHECK(mt_strided_init(&b, 2, s86, 1, &two, s1, NULL) == MT_OK && mt_strided_same(&a, &b));
  CHECK(mt_strided_init(&b, 3, s186, 1, &two, s2, NULL) == MT_OK && mt_strided_same(&a, &b));
  CHECK(mt_strided_init(&b, 2, s86, 1, &two, s0, NULL) == MT_OK && !mt_strided_same(&a, &b));
  CHECK(mt_strided_init(&b, 2, s86, 1, &three, s1, NULL) == MT_OK && !mt_strided_same(&a, &b));
  /* Rows of 12 cut evenly in two are 24 elements each: one dim of 48. */
  CHECK(mt_strided_init(&b, 2, s4x12, 1, &two, s0, NULL) == MT_OK);
  CHECK(mt_strided_canonical(&b, &c, NULL) == MT_OK && c.ndim == 1 && c.shape[0] == 48);
  CHECK(mt_strided_init(&a, 1, &n48, 1, &two, s0, NULL) == MT_OK && mt_strided_same(&a, &b));
  CHECK(mt_strided_init(&b, 2, s5x12, 1, &two, s0, NULL) == MT_OK);
  CHECK(mt_strided_canonical(&b, &c, NULL) == MT_OK && c.ndim == 2 && c.shape[0] == 5);
  /* No expansion, no normal form: never the same, even as itself. */
  int64_t six = 6, m42[2] = {4, 2};
  mt_placement bad[2] = {S(0), SS(0, 2)};
  mt_error err = {0};
  CHECK(mt_strided_init(&a, 1, &six, 2, m42, bad, NULL) == MT_OK);
  CHECK(mt_strided_canonical(&a, &c, &err) == MT_EINVAL && strstr(err.msg, "whole pieces"));
  CHECK(!mt_strided_same(&a, &a));
}

int main(void) {
  test_examples();
  test_plain();
  test_canonical();
  int64_t s12 = 12, s8 = 8, s6[2] = {6, 4}, s5[2] = {5, 6};
  int64_t m2 = 2, m3 = 3, m22[2] = {2, 2}, m32[2] = {3, 2};
  sweep(1, &s12, 1, &m2);
  sweep(1, &s12, 2, m22);
  sweep(1, &s8, 2, m32);
  sweep(2, s6, 1, &m3);
  sweep(2, s6, 2, m22);
  sweep(2, s5, 2, m32);
  printf("test_strided: %ld layouts, %ld common forms swept\n", sweep_layouts, sweep_pairs);
  CHECK(sweep_layouts > 80 && sweep_pairs > 1000);
  return mt_test_exit("test_strided");
}
