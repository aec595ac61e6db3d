/* Sharding propagation: the decisions for NumPy's operations, with dim maps
 * written out here (elementwise with broadcasting, matmul with batch dims,
 * reductions, softmax, reshape), a checker that the chosen placements compute the
 * op correctly on every rank, the core's own map builders against those maps,
 * random cases through the checker, error paths, and decision times.
 *
 * `test_prop --quick` (or MT_TEST_QUICK=1) runs fewer random cases, for valgrind.
 * MPITENSOR_TRACE=1 prints decision times. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/prop.h"
#include "mpitensor/core/status.h"

static mt_placement R(void) {
  return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0};
}
static mt_placement P(int op) {
  return (mt_placement){MT_PLACEMENT_PARTIAL, 0, op, 0};
}
static mt_placement S(int dim) {
  return (mt_placement){MT_PLACEMENT_SHARD, dim, 0, 0};
}

#define PSUM P(MT_REDUCE_SUM)
#define PAVG P(MT_REDUCE_AVG)
#define PMAX P(MT_REDUCE_MAX)

static int quick = 0;
static int trace = 0;

static int peq(mt_placement a, mt_placement b) {
  if (a.kind != b.kind) return 0;
  if (a.kind == MT_PLACEMENT_SHARD) return a.dim == b.dim;
  if (a.kind == MT_PLACEMENT_PARTIAL) return a.reduce_op == b.reduce_op;
  return 1;
}

static const char *pname(mt_placement p, char *buf) {
  static const char *ops[] = {"sum", "avg", "prod", "max", "min"};
  if (p.kind == MT_PLACEMENT_SHARD)
    sprintf(buf, "S%d", p.dim);
  else if (p.kind == MT_PLACEMENT_PARTIAL)
    sprintf(buf, "P(%s)", p.reduce_op >= 0 && p.reduce_op < 5 ? ops[p.reduce_op] : "?");
  else
    sprintf(buf, "R");
  return buf;
}

/* ---- Dim maps written out, the references of the core's builders. ---- */

/* NumPy broadcasting: the output has the largest rank; input dims align to the
 * right and take the output dim's label; an input dim of size 1 where the output
 * is larger broadcasts. Labels are the output dims, all KEEP. */
static mt_dimmap map_elementwise(int nin, const int *ndim, const int64_t (*shape)[4],
                                 int rule) {
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  int n = 0;
  for (int i = 0; i < nin; ++i) n = ndim[i] > n ? ndim[i] : n;
  int64_t out[4] = {1, 1, 1, 1};
  for (int i = 0; i < nin; ++i) {
    for (int d = 0; d < ndim[i]; ++d) {
      int o = n - ndim[i] + d;
      if (shape[i][d] != 1) out[o] = shape[i][d];
    }
  }
  map.ninputs = nin, map.nlabels = n, map.out_ndim = n;
  for (int o = 0; o < n; ++o) map.out_labels[o] = o;
  for (int i = 0; i < nin; ++i) {
    map.in_ndim[i] = ndim[i];
    for (int d = 0; d < ndim[i]; ++d) {
      int o = n - ndim[i] + d;
      map.in_labels[i][d] = o;
      if (shape[i][d] == 1 && out[o] != 1) map.in_bcast[i] |= 1u << d;
    }
  }
  map.partial_rule = rule;
  return map;
}

/* matmul of x (..., n, k) and y (..., k, m), batch dims broadcast as NumPy does:
 * labels 0..nb-1 for the output batch dims, then i, j (KEEP) and k (CONTRACT).
 * P @ R -> P for either operand. */
static mt_dimmap map_matmul(int xnd, const int64_t *xs, int ynd, const int64_t *ys) {
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  int xb = xnd - 2, yb = ynd - 2, nb = xb > yb ? xb : yb;
  int li = nb, lj = nb + 1, lk = nb + 2;
  map.ninputs = 2, map.nlabels = nb + 3, map.out_ndim = nb + 2;
  for (int b = 0; b < nb + 2; ++b) map.out_labels[b] = b;
  map.label_kind[lk] = MT_LABEL_CONTRACT;
  const int nds[2] = {xnd, ynd};
  const int64_t *shapes[2] = {xs, ys};
  for (int t = 0; t < 2; ++t) {
    int bt = nds[t] - 2;
    map.in_ndim[t] = nds[t];
    for (int d = 0; d < bt; ++d) {
      map.in_labels[t][d] = nb - bt + d;
      if (shapes[t][d] == 1) map.in_bcast[t] |= 1u << d;
    }
    map.in_labels[t][bt] = t == 0 ? li : lk;
    map.in_labels[t][bt + 1] = t == 0 ? lk : lj;
  }
  map.partial_rule = MT_PARTIAL_LINEAR_ONE;
  map.partial_inputs = 3;
  return map;
}

enum { RED_SUM, RED_MEAN, RED_MAX, RED_STD };

/* A reduction over the dims in `axes` (a bitmask) of an ndim-d input: sum and mean
 * are linear (P(sum) in, P(sum) out); max keeps P(max); std reduces every Partial
 * and may not split its reduced dims. With `keepdims` each reduced dim stays as
 * an output dim of size 1, labelled by a new sized REPLICATE label. */
static mt_dimmap map_reduce(int ndim, uint32_t axes, int op, int keepdims) {
  static const int red_op[] = {MT_REDUCE_SUM, MT_REDUCE_AVG, MT_REDUCE_MAX, 0};
  static const int rule[] = {MT_PARTIAL_LINEAR_ALL, MT_PARTIAL_LINEAR_ALL,
                             MT_PARTIAL_SAME_OP, MT_PARTIAL_NONE};
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = 1, map.nlabels = ndim, map.in_ndim[0] = ndim;
  for (int d = 0; d < ndim; ++d) {
    map.in_labels[0][d] = d;
    int reduced = (int)((axes >> d) & 1u);
    if (reduced) {
      map.label_kind[d] = op == RED_STD ? MT_LABEL_REPLICATE : MT_LABEL_REDUCE;
      map.label_reduce_op[d] = red_op[op];
      if (op == RED_MEAN) map.even_only |= 1u << d;
    }
    if (!reduced) {
      map.out_labels[map.out_ndim++] = d;
    } else if (keepdims) {
      int l = map.nlabels++;
      map.label_kind[l] = MT_LABEL_REPLICATE;
      map.sized_labels |= 1u << l;
      map.label_size[l] = 1;
      map.out_labels[map.out_ndim++] = l;
    }
  }
  map.partial_rule = rule[op];
  map.partial_ops = 1u << MT_REDUCE_MAX;
  return map;
}

/* softmax along `axis`: that dim must be whole, the others pass through. */
static mt_dimmap map_softmax(int ndim, int axis) {
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = 1, map.nlabels = ndim, map.in_ndim[0] = ndim, map.out_ndim = ndim;
  for (int d = 0; d < ndim; ++d) map.in_labels[0][d] = map.out_labels[d] = d;
  map.label_kind[axis] = MT_LABEL_REPLICATE;
  return map;
}

/* A new REPLICATE label of size n on output dim j. */
static void new_output_dim(mt_dimmap *map, int j, int64_t n) {
  int l = map->nlabels++;
  map->label_kind[l] = MT_LABEL_REPLICATE;
  map->sized_labels |= 1u << l;
  map->label_size[l] = n;
  map->out_labels[j] = l;
}

/* reshape from shape `is` to `os` (no size 0), grouped as the Python layer does:
 * a size-1 dim facing a larger one stands alone; otherwise input and output dims
 * are taken until their products agree. A group's leftmost input label is KEEP on
 * the group's leftmost output dim (resized where the sizes differ); its other
 * input labels are REPLICATE and its other output dims new REPLICATE labels.
 * reshape is linear: P(sum) and P(avg) pass. */
static mt_dimmap map_reshape(int nin, const int64_t *is, int nout, const int64_t *os) {
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = 1, map.in_ndim[0] = nin, map.nlabels = nin, map.out_ndim = nout;
  map.partial_rule = MT_PARTIAL_LINEAR_ALL;
  for (int d = 0; d < nin; ++d)
    map.in_labels[0][d] = d, map.label_kind[d] = MT_LABEL_REPLICATE;
  int i = 0, j = 0;
  while (i < nin || j < nout) {
    if (j == nout || (i < nin && is[i] == 1 && os[j] != 1)) {
      ++i;
      continue;
    }
    if (i == nin || (os[j] == 1 && is[i] != 1)) {
      new_output_dim(&map, j++, 1);
      continue;
    }
    int i0 = i, j0 = j;
    int64_t f = is[i++], t = os[j++];
    while (f != t) {
      if (f < t)
        f *= is[i++];
      else
        t *= os[j++];
    }
    map.label_kind[i0] = MT_LABEL_KEEP;
    map.out_labels[j0] = i0;
    if (is[i0] != os[j0]) map.out_resized |= 1u << j0, map.out_size[j0] = os[j0];
    for (int k = j0 + 1; k < j; ++k) new_output_dim(&map, k, os[k]);
  }
  return map;
}

/* ---- Inputs and decisions. ---- */

typedef struct tin {
  int ndim;
  int64_t shape[4];
  mt_placement pl[4];
} tin;

static mt_prop_inputs make_inputs(int nin, const tin *t, int mesh_ndim,
                                  const int64_t *mesh) {
  mt_prop_inputs in;
  memset(&in, 0, sizeof in);
  in.ninputs = nin, in.mesh_ndim = mesh_ndim;
  for (int m = 0; m < mesh_ndim; ++m) in.mesh_shape[m] = mesh[m];
  for (int i = 0; i < nin; ++i) {
    in.ndim[i] = t[i].ndim;
    in.itemsize[i] = 8;
    for (int d = 0; d < t[i].ndim; ++d) in.shape[i][d] = t[i].shape[d];
    for (int m = 0; m < mesh_ndim; ++m) in.placements[i][m] = t[i].pl[m];
  }
  return in;
}

static mt_prop_result decide(const mt_dimmap *map, const mt_prop_inputs *in) {
  mt_prop_result res;
  mt_error err = {0, ""};
  memset(&res, 0, sizeof res);
  int rc = mt_propagate(map, in, &res, &err);
  CHECK_MSG(rc == MT_OK, "propagate failed: %s: %s", mt_status_name(rc), err.msg);
  return res;
}

static mt_layout layout_of(const mt_prop_inputs *in, int i, const mt_placement *pl) {
  mt_layout l;
  int rc = mt_layout_init(&l, in->ndim[i], in->shape[i], in->mesh_ndim, in->mesh_shape,
                          pl, NULL);
  CHECK(rc == MT_OK);
  return l;
}

/* Bytes and messages of moving input i from its placements to `to`. */
static void plan_cost(const mt_prop_inputs *in, int i, const mt_placement *to,
                      int64_t *bytes, int64_t *msgs) {
  mt_placement moved[MT_MAX_MESH_NDIM];
  for (int m = 0; m < in->mesh_ndim; ++m) {
    /* partitioning a Replicate input is local: it is planned as Replicate */
    int part = to[m].kind == MT_PLACEMENT_PARTIAL &&
               in->placements[i][m].kind == MT_PLACEMENT_REPLICATE;
    moved[m] = part ? R() : to[m];
  }
  mt_layout a = layout_of(in, i, in->placements[i]), b = layout_of(in, i, moved);
  mt_plan *plan = NULL;
  int rc = mt_plan_create(&a, &b, in->itemsize[i], &plan, NULL);
  CHECK(rc == MT_OK);
  *bytes = mt_plan_bytes(plan);
  *msgs = mt_plan_messages(plan);
  mt_plan_destroy(plan);
}

/* The output placements are `want` (mesh_ndim of them). */
static int out_is(const mt_prop_result *r, int mesh_ndim, const mt_placement *want) {
  for (int m = 0; m < mesh_ndim; ++m) {
    if (!peq(r->out_placements[m], want[m])) return 0;
  }
  return 1;
}

static int in_is(const mt_prop_result *r, int i, int mesh_ndim,
                 const mt_placement *want) {
  for (int m = 0; m < mesh_ndim; ++m) {
    if (!peq(r->in_placements[i][m], want[m])) return 0;
  }
  return 1;
}

static void describe(const mt_prop_result *r, int nin, int mesh_ndim, char *buf) {
  char p[32];
  buf[0] = '\0';
  for (int i = 0; i < nin; ++i) {
    strcat(buf, "in[");
    for (int m = 0; m < mesh_ndim; ++m)
      strcat(strcat(buf, " "), pname(r->in_placements[i][m], p));
    strcat(buf, " ] ");
  }
  strcat(buf, "-> out[");
  for (int m = 0; m < mesh_ndim; ++m)
    strcat(strcat(buf, " "), pname(r->out_placements[m], p));
  sprintf(buf + strlen(buf), " ] bytes %lld msgs %lld", (long long)r->bytes,
          (long long)r->messages);
}

#define EXPECT_OUT(r, nin, mesh_ndim, ...)                                       \
  do {                                                                           \
    char _b[512];                                                                \
    describe(&(r), nin, mesh_ndim, _b);                                          \
    CHECK_MSG(out_is(&(r), mesh_ndim, (mt_placement[]){__VA_ARGS__}), "%s", _b); \
  } while (0)

#define EXPECT_IN(r, i, nin, mesh_ndim, ...)                                       \
  do {                                                                             \
    char _b[512];                                                                  \
    describe(&(r), nin, mesh_ndim, _b);                                            \
    CHECK_MSG(in_is(&(r), i, mesh_ndim, (mt_placement[]){__VA_ARGS__}), "%s", _b); \
  } while (0)

/* ---- The semantic checker: the decision computes the op on every rank. ---- */

typedef struct range {
  int64_t lo, n;
} range;

/* The range of label l that the rank at `coord` computes with, from the inputs
 * holding it (all must agree); the whole label when none splits it. */
static int label_range(const mt_dimmap *map, const mt_prop_inputs *in,
                       const mt_prop_result *r, const int64_t *coord, int l,
                       int64_t size, range *out) {
  int seen = 0;
  out->lo = 0, out->n = size;
  for (int i = 0; i < map->ninputs; ++i) {
    for (int d = 0; d < map->in_ndim[i]; ++d) {
      if (map->in_labels[i][d] != l || ((map->in_bcast[i] >> d) & 1u)) continue;
      mt_layout lay = layout_of(in, i, r->in_placements[i]);
      mt_box b;
      mt_layout_local_box(&lay, coord, &b, NULL);
      range got = {b.shape[d] == 0 ? 0 : b.offset[d], b.shape[d]};
      if (seen && (got.n != out->n || (got.n > 0 && got.lo != out->lo))) return 0;
      *out = got, seen = 1;
    }
  }
  return 1;
}

/* Whether tensor `t` placed by `pl` is cut along label-holding dim d on mesh m. */
static int cuts(const mt_placement *pl, int m, int d) {
  return pl[m].kind == MT_PLACEMENT_SHARD && pl[m].dim == d;
}

/* A mesh dim where some input keeps a Partial: the op's rule allows it and the
 * output keeps that Partial; no input is cut there. */
static int partial_ok(const mt_dimmap *map, const mt_prop_result *r, int m,
                      int npartial, int nrep, int cut_label) {
  mt_placement out = r->out_placements[m];
  int linear = out.reduce_op == MT_REDUCE_SUM || out.reduce_op == MT_REDUCE_AVG;
  if (cut_label >= 0 || out.kind != MT_PLACEMENT_PARTIAL) return 0;
  if (map->partial_rule == MT_PARTIAL_LINEAR_ONE) {
    for (int i = 0; i < map->ninputs; ++i) {
      mt_placement p = r->in_placements[i][m];
      if (p.kind == MT_PLACEMENT_PARTIAL &&
          (!peq(p, out) || !((map->partial_inputs >> i) & 1u)))
        return 0;
    }
    return npartial == 1 && nrep == map->ninputs - 1 && linear;
  }
  if (map->partial_rule == MT_PARTIAL_NEGATE) return map->ninputs == 1;
  if (map->partial_rule == MT_PARTIAL_MONOTONE) {
    /* P(max|min) on the inputs that carry it (the first only unless preserved). */
    if (!peq(out, P(MT_REDUCE_MAX)) && !peq(out, P(MT_REDUCE_MIN))) return 0;
    for (int i = 0; i < map->ninputs; ++i) {
      mt_placement p = r->in_placements[i][m];
      if (!peq(p, out) && p.kind != MT_PLACEMENT_REPLICATE) return 0;
    }
    return npartial == 1 || ((map->partial_ops >> out.reduce_op) & 1u);
  }
  if (map->partial_rule == MT_PARTIAL_ADDITIVE) {
    /* sum: every input P(sum); avg: P(avg) or R; max, min: input 0 only, of two. */
    for (int i = 0; i < map->ninputs; ++i) {
      mt_placement p = r->in_placements[i][m];
      if (!peq(p, out) && !(p.kind == MT_PLACEMENT_REPLICATE && !peq(out, PSUM)))
        return 0;
    }
    if (peq(out, PSUM) || peq(out, PAVG)) return 1;
    return (peq(out, P(MT_REDUCE_MAX)) || peq(out, P(MT_REDUCE_MIN))) &&
           map->ninputs == 2 && npartial == 1 && peq(r->in_placements[0][m], out);
  }
  if (npartial != map->ninputs) return 0;
  for (int i = 0; i < map->ninputs; ++i)
    if (!peq(r->in_placements[i][m], out)) return 0;
  if (map->partial_rule == MT_PARTIAL_LINEAR_ALL) return linear;
  return map->partial_rule == MT_PARTIAL_SAME_OP &&
         ((map->partial_ops >> out.reduce_op) & 1u);
}

/* Per mesh dim: the output's placement follows from what the inputs need there. */
static int check_mesh_dim(const mt_dimmap *map, const mt_prop_inputs *in,
                          const mt_prop_result *r, int m, const int64_t *size) {
  mt_placement out = r->out_placements[m];
  int npartial = 0, nrep = 0, cut_label = -1;
  for (int i = 0; i < map->ninputs; ++i) {
    mt_placement p = r->in_placements[i][m];
    npartial += p.kind == MT_PLACEMENT_PARTIAL;
    nrep += p.kind == MT_PLACEMENT_REPLICATE;
    /* A needed Partial is one the input has, or under ADDITIVE a Partial(sum) a
     * Replicate input is partitioned into. */
    mt_placement had = in->placements[i][m];
    int partitioned = map->partial_rule == MT_PARTIAL_ADDITIVE && peq(p, PSUM) &&
                      had.kind == MT_PLACEMENT_REPLICATE;
    if (p.kind == MT_PLACEMENT_PARTIAL && !peq(p, had) && !partitioned) return 0;
    if (p.kind != MT_PLACEMENT_SHARD) continue;
    int l = map->in_labels[i][p.dim];
    if (cut_label >= 0 && cut_label != l) return 0;
    cut_label = l;
  }
  if (npartial > 0) return partial_ok(map, r, m, npartial, nrep, cut_label);
  if (cut_label < 0) return out.kind == MT_PLACEMENT_REPLICATE;
  /* Every input holding the label (not broadcast) is cut on it. */
  for (int i = 0; i < map->ninputs; ++i) {
    for (int d = 0; d < map->in_ndim[i]; ++d) {
      if (map->in_labels[i][d] == cut_label && !((map->in_bcast[i] >> d) & 1u) &&
          !cuts(r->in_placements[i], m, d))
        return 0;
    }
  }
  int kind = map->label_kind[cut_label];
  (void)size;
  if (kind == MT_LABEL_REPLICATE) return 0;
  if (kind == MT_LABEL_CONTRACT) return peq(out, PSUM);
  if (kind == MT_LABEL_REDUCE) return peq(out, P(map->label_reduce_op[cut_label]));
  for (int d = 0; d < map->out_ndim; ++d)
    if (map->out_labels[d] == cut_label) return peq(out, S(d));
  return 0;
}

/* Sizes of every label from the inputs (or label_size). */
static void sizes_of(const mt_dimmap *map, const mt_prop_inputs *in, int64_t *size) {
  for (int l = 0; l < map->nlabels; ++l)
    size[l] = ((map->sized_labels >> l) & 1u) ? map->label_size[l] : 1;
  for (int i = 0; i < map->ninputs; ++i)
    for (int d = 0; d < map->in_ndim[i]; ++d)
      if (!((map->in_bcast[i] >> d) & 1u)) size[map->in_labels[i][d]] = in->shape[i][d];
}

/* Output extent [o, o+n) of a dim of size b holds the same share of its group as
 * range g of a label of size a (the same range when not resized). */
static int same_share(int64_t o, int64_t n, int64_t b, range g, int64_t a) {
  if (n == 0 || g.n == 0) return n == 0 && g.n == 0;
  return n * a == g.n * b && o * a == g.lo * b;
}

/* Every rank's inputs agree on each label's range, its output box is exactly the
 * ranges of the output labels, and every mean shard has the same size. */
static int check_ranks(const mt_dimmap *map, const mt_prop_inputs *in,
                       const mt_prop_result *r, const int64_t *size) {
  mt_layout out;
  if (mt_layout_init(&out, r->out_ndim, r->out_shape, in->mesh_ndim, in->mesh_shape,
                     r->out_placements, NULL) != MT_OK)
    return 0;
  int64_t coord[MT_MAX_MESH_NDIM] = {0}, mean_n[MT_PROP_MAX_LABELS];
  for (int l = 0; l < map->nlabels; ++l) mean_n[l] = -1;
  for (;;) {
    mt_box ob;
    mt_layout_local_box(&out, coord, &ob, NULL);
    int empty = mt_box_numel(&ob) == 0;
    for (int l = 0; l < map->nlabels; ++l) {
      range g;
      if (!label_range(map, in, r, coord, l, size[l], &g)) return 0;
      int evenl = ((map->even_only >> l) & 1u) && g.n < size[l];
      if (evenl && mean_n[l] >= 0 && mean_n[l] != g.n) return 0;
      if (evenl) mean_n[l] = g.n;
      for (int d = 0; d < map->out_ndim && !empty; ++d) {
        if (map->out_labels[d] != l || ((map->sized_labels >> l) & 1u)) continue;
        if (!same_share(ob.offset[d], ob.shape[d], r->out_shape[d], g, size[l]))
          return 0;
      }
    }
    int m = in->mesh_ndim - 1;
    while (m >= 0 && ++coord[m] == in->mesh_shape[m]) coord[m--] = 0;
    if (m < 0) return 1;
  }
}

/* The decision is a correct way to run the op, its cost is the plans' cost, and
 * deciding again gives the same answer. */
static void check_semantics(const mt_dimmap *map, const mt_prop_inputs *in,
                            const mt_prop_result *r) {
  int64_t size[MT_PROP_MAX_LABELS], bytes = 0, msgs = 0;
  char buf[512];
  sizes_of(map, in, size);
  describe(r, map->ninputs, in->mesh_ndim, buf);
  for (int m = 0; m < in->mesh_ndim; ++m)
    CHECK_MSG(check_mesh_dim(map, in, r, m, size), "mesh dim %d: %s", m, buf);
  CHECK_MSG(check_ranks(map, in, r, size), "ranks: %s", buf);
  for (int i = 0; i < map->ninputs; ++i) {
    int64_t b, n;
    int j = in->alias[i] - 1; /* the same tensor moved to the same layout: once */
    if (j >= 0 && memcmp(r->in_placements[i], r->in_placements[j],
                         (size_t)in->mesh_ndim * sizeof(mt_placement)) == 0)
      continue;
    plan_cost(in, i, r->in_placements[i], &b, &n);
    bytes += b, msgs += n;
  }
  CHECK_MSG(r->bytes == bytes && r->messages == msgs,
            "cost %lld/%lld vs plans %lld/%lld", (long long)r->bytes,
            (long long)r->messages, (long long)bytes, (long long)msgs);
  mt_prop_result again = decide(map, in);
  CHECK(memcmp(&again, r, sizeof again) == 0);
}

/* ---- An oracle: prop.h's rules by brute force, every combination planned. ---- */

typedef struct ocand {
  mt_placement in[MT_PROP_MAX_INPUTS];
  mt_placement out;
  int label, creates;
} ocand;

static int held_ok(const mt_dimmap *map, int l) {
  int held = 0;
  for (int i = 0; i < map->ninputs; ++i) {
    int count = 0;
    for (int d = 0; d < map->in_ndim[i]; ++d) {
      if (map->in_labels[i][d] != l) continue;
      ++count;
      held |= !((map->in_bcast[i] >> d) & 1u);
    }
    if (count > 1) return 0;
  }
  return held && map->label_kind[l] != MT_LABEL_REPLICATE;
}

static int o_fits(const mt_dimmap *map, const int64_t *size, int l, int64_t shards) {
  int even = ((map->even_only >> l) & 1u) || (map->label_kind[l] == MT_LABEL_REDUCE &&
                                              map->label_reduce_op[l] == MT_REDUCE_AVG);
  /* chunks of ceil(n/k): every shard holds an element iff (k-1) chunks leave some */
  /* sum, product and contraction have an identity for an empty shard */
  int op = map->label_reduce_op[l];
  int empty_ok = map->label_kind[l] == MT_LABEL_KEEP ||
                 map->label_kind[l] == MT_LABEL_CONTRACT ||
                 (map->label_kind[l] == MT_LABEL_REDUCE &&
                  (op == MT_REDUCE_SUM || op == MT_REDUCE_PRODUCT));
  if (!empty_ok &&
      (size[l] < shards || (size[l] + shards - 1) / shards * (shards - 1) >= size[l]))
    return 0;
  return !even || size[l] % shards == 0;
}

static ocand o_new(int label) {
  ocand c;
  memset(&c, 0, sizeof c);
  c.label = label;
  c.out = R();
  for (int i = 0; i < MT_PROP_MAX_INPUTS; ++i) c.in[i] = R();
  return c;
}

static void o_label(const mt_dimmap *map, int l, ocand *c) {
  *c = o_new(l);
  for (int i = 0; i < map->ninputs; ++i)
    for (int d = 0; d < map->in_ndim[i]; ++d)
      if (map->in_labels[i][d] == l && !((map->in_bcast[i] >> d) & 1u)) c->in[i] = S(d);
  int kind = map->label_kind[l];
  c->creates = kind != MT_LABEL_KEEP;
  if (kind == MT_LABEL_CONTRACT) c->out = PSUM;
  if (kind == MT_LABEL_REDUCE) c->out = P(map->label_reduce_op[l]);
  for (int d = 0; d < map->out_ndim; ++d)
    if (kind == MT_LABEL_KEEP && map->out_labels[d] == l) c->out = S(d);
}

/* Pass-throughs of mesh dim m, appended to c[*n]. */
static void o_partials(const mt_dimmap *map, const mt_prop_inputs *in, int m, ocand *c,
                       int *n) {
  mt_placement p0 = in->placements[0][m];
  int all = p0.kind == MT_PLACEMENT_PARTIAL;
  for (int i = 0; i < map->ninputs; ++i) all &= peq(in->placements[i][m], p0);
  int lin0 = p0.reduce_op == MT_REDUCE_SUM || p0.reduce_op == MT_REDUCE_AVG;
  if (map->partial_rule == MT_PARTIAL_NEGATE) {
    if (p0.kind == MT_PLACEMENT_PARTIAL && p0.reduce_op != MT_REDUCE_PRODUCT) {
      c[*n] = o_new(-1);
      c[*n].in[0] = p0;
      int op = p0.reduce_op;
      c[(*n)++].out = op == MT_REDUCE_MAX ? P(MT_REDUCE_MIN)
                      : op == MT_REDUCE_MIN ? P(MT_REDUCE_MAX) : p0;
    }
    return;
  }
  if (map->partial_rule == MT_PARTIAL_MONOTONE) {
    const int ops[2] = {MT_REDUCE_MAX, MT_REDUCE_MIN};
    for (int k = 0; k < 2; ++k) {
      ocand x = o_new(-1);
      int kept = 0, every = (map->partial_ops >> ops[k]) & 1u;
      for (int i = 0; i < map->ninputs; ++i)
        if (peq(in->placements[i][m], P(ops[k])) && (every || !kept)) x.in[i] = P(ops[k]), ++kept;
      x.out = P(ops[k]);
      if (kept) c[(*n)++] = x;
    }
    return;
  }
  if (map->partial_rule == MT_PARTIAL_ADDITIVE) {
    int has[MT_REDUCE_COUNT] = {0}, other = 0;
    for (int i = 0; i < map->ninputs; ++i) {
      mt_placement p = in->placements[i][m];
      if (p.kind == MT_PLACEMENT_PARTIAL) has[p.reduce_op] = 1;
      other |= !peq(p, PSUM) && p.kind != MT_PLACEMENT_REPLICATE;
    }
    if (map->ninputs == 2 && p0.kind == MT_PLACEMENT_PARTIAL &&
        (p0.reduce_op == MT_REDUCE_MAX || p0.reduce_op == MT_REDUCE_MIN)) {
      c[*n] = o_new(-1);
      c[*n].in[0] = p0;
      c[(*n)++].out = p0;
    }
    if (has[MT_REDUCE_SUM] && !other) {
      c[*n] = o_new(-1);
      for (int i = 0; i < map->ninputs; ++i) c[*n].in[i] = PSUM;
      c[(*n)++].out = PSUM;
    }
    if (has[MT_REDUCE_AVG]) {
      c[*n] = o_new(-1);
      for (int i = 0; i < map->ninputs; ++i)
        if (peq(in->placements[i][m], PAVG)) c[*n].in[i] = PAVG;
      c[(*n)++].out = PAVG;
    }
    return;
  }
  if (all && ((map->partial_rule == MT_PARTIAL_LINEAR_ALL && lin0) ||
              (map->partial_rule == MT_PARTIAL_SAME_OP &&
               ((map->partial_ops >> p0.reduce_op) & 1u)))) {
    c[*n] = o_new(-1);
    for (int i = 0; i < map->ninputs; ++i) c[*n].in[i] = p0;
    c[(*n)++].out = p0;
  }
  for (int i = 0; map->partial_rule == MT_PARTIAL_LINEAR_ONE && i < map->ninputs; ++i) {
    mt_placement p = in->placements[i][m];
    if (!((map->partial_inputs >> i) & 1u) || p.kind != MT_PLACEMENT_PARTIAL ||
        (p.reduce_op != MT_REDUCE_SUM && p.reduce_op != MT_REDUCE_AVG))
      continue;
    c[*n] = o_new(-1);
    c[*n].in[i] = p;
    c[(*n)++].out = p;
  }
}

/* The rank of a candidate on a mesh dim of size 1, lower first: inputs that
 * must change, then whether it creates a Partial, then whether its output is not
 * a Shard. */
static int o_rank_on_one(const mt_dimmap *map, const mt_prop_inputs *in, int m,
                         const ocand *c) {
  int change = 0;
  for (int i = 0; i < map->ninputs; ++i) change += !peq(c->in[i], in->placements[i][m]);
  return change * 4 + c->creates * 2 + (c->out.kind != MT_PLACEMENT_SHARD);
}

static int o_cands(const mt_dimmap *map, const mt_prop_inputs *in, const int64_t *size,
                   int m, ocand *c) {
  int n = 0;
  int64_t g = in->mesh_shape[m];
  ocand all[48];
  all[n++] = o_new(-1);
  for (int l = 0; l < map->nlabels; ++l)
    if (held_ok(map, l) && o_fits(map, size, l, g)) o_label(map, l, &all[n++]);
  o_partials(map, in, m, all, &n);
  if (g != 1) {
    memcpy(c, all, (size_t)n * sizeof *c);
    return n;
  }
  /* Size 1: every candidate is free, so the order decides (rank, then as built). */
  int k = 0;
  for (int r = 0; r < 4 * MT_PROP_MAX_INPUTS + 4; ++r)
    for (int j = 0; j < n; ++j)
      if (o_rank_on_one(map, in, m, &all[j]) == r) c[k++] = all[j];
  CHECK(k == n);
  return n;
}

static int64_t o_out_size(const mt_dimmap *map, const int64_t *size, int d) {
  return ((map->out_resized >> d) & 1u) ? map->out_size[d] : size[map->out_labels[d]];
}

/* Every rank's output box on a resized dim holds the same share of its group as
 * the rank's input 0 box holds of the dim's label (reshape maps: one input whose
 * dim l carries label l). */
static int o_scales(const mt_dimmap *map, const mt_prop_inputs *in, const int64_t *size,
                    ocand (*c)[48], const int *ch) {
  if (map->out_resized == 0) return 1;
  mt_placement to[MT_MAX_MESH_NDIM], op[MT_MAX_MESH_NDIM];
  int64_t oshape[MT_MAX_NDIM], coord[MT_MAX_MESH_NDIM] = {0};
  for (int m = 0; m < in->mesh_ndim; ++m) to[m] = c[m][ch[m]].in[0], op[m] = c[m][ch[m]].out;
  for (int d = 0; d < map->out_ndim; ++d) oshape[d] = o_out_size(map, size, d);
  mt_layout il = layout_of(in, 0, to), ol;
  CHECK(mt_layout_init(&ol, map->out_ndim, oshape, in->mesh_ndim, in->mesh_shape, op,
                       NULL) == MT_OK);
  for (;;) {
    mt_box ib, ob;
    mt_layout_local_box(&il, coord, &ib, NULL);
    mt_layout_local_box(&ol, coord, &ob, NULL);
    for (int d = 0; d < map->out_ndim; ++d) {
      int l = map->out_labels[d];
      if (!((map->out_resized >> d) & 1u)) continue;
      range g = {ib.shape[l] == 0 ? 0 : ib.offset[l], ib.shape[l]};
      if (!same_share(ob.offset[d], ob.shape[d], oshape[d], g, size[l])) return 0;
    }
    int m = in->mesh_ndim - 1;
    while (m >= 0 && ++coord[m] == in->mesh_shape[m]) coord[m--] = 0;
    if (m < 0) return 1;
  }
}

typedef struct okey {
  int comm, changes;
  int64_t cost, later, bytes, msgs;
  double time, later_time, later_local;
} okey;

/* Whether the labels a combination shards fit their shards and scale. */
static int o_valid(const mt_dimmap *map, const mt_prop_inputs *in, const int64_t *size,
                   ocand (*c)[48], const int *ch) {
  int64_t shards[MT_PROP_MAX_LABELS];
  for (int l = 0; l < map->nlabels; ++l) shards[l] = 1;
  for (int m = 0; m < in->mesh_ndim; ++m)
    if (c[m][ch[m]].label >= 0) shards[c[m][ch[m]].label] *= in->mesh_shape[m];
  for (int l = 0; l < map->nlabels; ++l)
    if (shards[l] > 1 && !o_fits(map, size, l, shards[l])) return 0;
  return o_scales(map, in, size, c, ch);
}

/* Prices one combination; 0 when it is not valid. */
static int o_price(const mt_dimmap *map, const mt_prop_inputs *in, const int64_t *size,
                   ocand (*c)[48], const int *ch, okey *k) {
  int64_t numel = 1, ranks = 1, bytes = 0, msgs = 0;
  for (int m = 0; m < in->mesh_ndim; ++m) ranks *= in->mesh_shape[m];
  if (!o_valid(map, in, size, c, ch)) return 0;
  k->changes = 0;
  k->time = 0.0;
  for (int i = 0; i < map->ninputs; ++i) {
    mt_placement to[MT_MAX_MESH_NDIM];
    for (int m = 0; m < in->mesh_ndim; ++m) {
      to[m] = c[m][ch[m]].in[i];
      k->changes += in->mesh_shape[m] > 1 && !peq(to[m], in->placements[i][m]);
      /* partitioning a Replicate input is local: it is planned as Replicate */
      if (to[m].kind == MT_PLACEMENT_PARTIAL &&
          in->placements[i][m].kind == MT_PLACEMENT_REPLICATE)
        to[m] = R();
    }
    mt_layout a = layout_of(in, i, in->placements[i]), b = layout_of(in, i, to);
    mt_plan *plan = NULL;
    if (mt_plan_create(&a, &b, in->itemsize[i], &plan, NULL) != MT_OK) return 0;
    bytes += mt_plan_bytes(plan), msgs += mt_plan_messages(plan);
    k->time += mt_plan_time(plan);
    mt_plan_destroy(plan);
  }
  for (int d = 0; d < map->out_ndim; ++d) numel *= o_out_size(map, size, d);
  int64_t held = numel, db = 0, dm = 0;
  for (int m = 0; m < in->mesh_ndim; ++m)
    if (c[m][ch[m]].out.kind != MT_PLACEMENT_SHARD) held *= in->mesh_shape[m];
  for (int m = 0; m < in->mesh_ndim; ++m) {
    int64_t g = in->mesh_shape[m];
    if (!c[m][ch[m]].creates) continue;
    db += held / g * (g - 1) * 8, dm += ranks * (g - 1), held /= g;
  }
  /* Later in seconds: each reduce-scatter on the output one rank holds then. */
  mt_time_model model = mt_time_model_default();
  int64_t rank_held = numel, stride = ranks;
  for (int m = 0; m < in->mesh_ndim; ++m)
    if (c[m][ch[m]].out.kind == MT_PLACEMENT_SHARD)
      rank_held = (rank_held + in->mesh_shape[m] - 1) / in->mesh_shape[m];
  k->later_time = k->later_local = 0.0;
  for (int m = 0; m < in->mesh_ndim; ++m) {
    int64_t g = in->mesh_shape[m], v = rank_held * 8;
    stride /= g;
    if (!c[m][ch[m]].creates) continue;
    k->later_time += mt_time_coll(&model, MT_TIME_REDUCE_SCATTER, g, v, v - v / g,
                                  mt_time_link(&model, ranks, g, stride));
    rank_held = (rank_held + g - 1) / g;
  }
  /* The local pass of reducing every Partial of the output, kept ones too. */
  rank_held = numel;
  for (int m = 0; m < in->mesh_ndim; ++m)
    if (c[m][ch[m]].out.kind == MT_PLACEMENT_SHARD)
      rank_held = (rank_held + in->mesh_shape[m] - 1) / in->mesh_shape[m];
  for (int m = 0; m < in->mesh_ndim; ++m) {
    int64_t g = in->mesh_shape[m], v = rank_held * 8;
    if (c[m][ch[m]].out.kind != MT_PLACEMENT_PARTIAL) continue;
    k->later_local += mt_time_local(&model, 0, v - v / g);
    rank_held = (rank_held + g - 1) / g;
  }
  k->comm = bytes > 0 || msgs > 0;
  k->cost = bytes + msgs * MT_PROP_MESSAGE_BYTES;
  k->later = db + dm * MT_PROP_MESSAGE_BYTES;
  k->bytes = bytes, k->msgs = msgs;
  return 1;
}

static int o_better(const okey *a, const okey *b) {
  if (a->comm != b->comm) return a->comm < b->comm;
  if (!a->comm && a->changes != b->changes) return a->changes < b->changes;
  if (a->cost != b->cost) return a->cost < b->cost;
  if (a->later != b->later) return a->later < b->later;
  if (a->bytes != b->bytes) return a->bytes < b->bytes;
  return a->msgs < b->msgs;
}

static int o_time_cmp(double a, double b) {
  double tol = 1e-6 * (a > b ? a : b);
  return a < b - tol ? -1 : a > b + tol ? 1 : 0;
}

/* Among combinations moving at most the bytes of o_better's pick: the faster,
 * the local pass of the reductions it defers counted with its moves now. */
static int o_faster(const okey *a, const okey *b) {
  if (a->comm != b->comm) return a->comm < b->comm;
  if (!a->comm && a->changes != b->changes) return a->changes < b->changes;
  int order = o_time_cmp(a->time + a->later_local, b->time + b->later_local);
  if (order == 0) order = o_time_cmp(a->later_time, b->later_time);
  if (order != 0) return order < 0;
  if (a->bytes != b->bytes) return a->bytes < b->bytes;
  return a->msgs < b->msgs;
}

/* Candidate k of mesh dim m is one of torch's strategies (prop_torch.c): on a
 * mesh dim of one rank the first; else all Replicate, or keeping some input's
 * Shard or Partial. */
static int o_torch_like(const mt_dimmap *map, const mt_prop_inputs *in, int m,
                        const ocand *c, int k) {
  if (in->mesh_shape[m] == 1) return k == 0;
  int all_r = 1;
  for (int i = 0; i < map->ninputs; ++i) {
    mt_placement p = in->placements[i][m];
    all_r &= c->in[i].kind == MT_PLACEMENT_REPLICATE;
    if (p.kind != MT_PLACEMENT_REPLICATE && peq(c->in[i], p)) return 1;
  }
  return all_r;
}

/* What torch charges a combination (mt_plan_torch_cost of each input's move,
 * partitioning as Replicate), or HUGE_VAL when it is none of torch's. */
static double o_torch_cost(const mt_dimmap *map, const mt_prop_inputs *in,
                           ocand (*c)[48], const int *ch) {
  double total = 0.0;
  for (int m = 0; m < in->mesh_ndim; ++m)
    if (!o_torch_like(map, in, m, &c[m][ch[m]], ch[m])) return HUGE_VAL;
  for (int i = 0; i < map->ninputs; ++i) {
    mt_placement to[MT_MAX_MESH_NDIM];
    for (int m = 0; m < in->mesh_ndim; ++m) {
      to[m] = c[m][ch[m]].in[i];
      if (to[m].kind == MT_PLACEMENT_PARTIAL &&
          in->placements[i][m].kind == MT_PLACEMENT_REPLICATE)
        to[m] = R();
    }
    mt_layout a = layout_of(in, i, in->placements[i]), b = layout_of(in, i, to);
    double us;
    if (mt_plan_torch_cost(&a, &b, in->itemsize[i], &us, NULL) != MT_OK) return HUGE_VAL;
    total += us;
  }
  return total;
}

/* The bytes of torch's decision: the valid combination torch charges least, the
 * first on a tie, priced as the oracle prices any; INT64_MAX when it has none or
 * its plans fail. */
static int64_t o_torch_bytes(const mt_dimmap *map, const mt_prop_inputs *in,
                             const int64_t *size, ocand (*c)[48], const int *n) {
  int ch[MT_MAX_MESH_NDIM] = {0}, pick[MT_MAX_MESH_NDIM] = {0}, found = 0;
  double best = HUGE_VAL;
  for (;;) {
    if (o_valid(map, in, size, c, ch)) {
      double cost = o_torch_cost(map, in, c, ch);
      if (cost < best) best = cost, found = 1, memcpy(pick, ch, sizeof ch);
    }
    int m = in->mesh_ndim - 1;
    while (m >= 0 && ++ch[m] == n[m]) ch[m--] = 0;
    if (m < 0) break;
  }
  okey k;
  return found && o_price(map, in, size, c, pick, &k) ? k.bytes : INT64_MAX;
}

/* The engine's decision is the oracle's (inputs of itemsize 8): the pick of
 * o_better over every combination that moves no more bytes than torch's
 * decision, then, when it communicates, the first fastest (o_faster) of those
 * moving no more bytes than it. */
static void check_oracle(const mt_dimmap *map, const mt_prop_inputs *in,
                         const mt_prop_result *r) {
  static ocand c[MT_MAX_MESH_NDIM][48];
  int n[MT_MAX_MESH_NDIM], ch[MT_MAX_MESH_NDIM] = {0}, best[MT_MAX_MESH_NDIM] = {0};
  int64_t size[MT_PROP_MAX_LABELS];
  int found = 0;
  okey bk = {0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0};
  sizes_of(map, in, size);
  for (int m = 0; m < in->mesh_ndim; ++m) n[m] = o_cands(map, in, size, m, c[m]);
  int64_t torch = o_torch_bytes(map, in, size, c, n);
  for (;;) {
    okey k;
    if (o_price(map, in, size, c, ch, &k) && k.bytes <= torch &&
        (!found || o_better(&k, &bk)))
      found = 1, bk = k, memcpy(best, ch, sizeof ch);
    int m = in->mesh_ndim - 1;
    while (m >= 0 && ++ch[m] == n[m]) ch[m--] = 0;
    if (m < 0) break;
  }
  if (found && bk.comm) {
    int64_t cap = bk.bytes;
    int fast = 0;
    memset(ch, 0, sizeof ch);
    for (;;) {
      okey k;
      if (o_price(map, in, size, c, ch, &k) && k.bytes <= cap &&
          (!fast || o_faster(&k, &bk)))
        fast = 1, bk = k, memcpy(best, ch, sizeof ch);
      int m = in->mesh_ndim - 1;
      while (m >= 0 && ++ch[m] == n[m]) ch[m--] = 0;
      if (m < 0) break;
    }
  }
  char buf[512];
  describe(r, map->ninputs, in->mesh_ndim, buf);
  CHECK_MSG(found, "oracle found nothing: %s", buf);
  int same = r->bytes == bk.bytes && r->messages == bk.msgs;
  for (int m = 0; m < in->mesh_ndim; ++m) {
    same &= peq(r->out_placements[m], c[m][best[m]].out);
    for (int i = 0; i < map->ninputs; ++i)
      same &= peq(r->in_placements[i][m], c[m][best[m]].in[i]);
  }
  CHECK_MSG(same, "engine %s; oracle bytes %lld msgs %lld", buf, (long long)bk.bytes,
            (long long)bk.msgs);
}

/* decide() followed by check_semantics(). */
static mt_prop_result run(const mt_dimmap *map, const mt_prop_inputs *in) {
  mt_error err = {0, ""};
  CHECK_MSG(mt_dimmap_check(map, &err) == MT_OK, "bad map: %s", err.msg);
  mt_prop_result r = decide(map, in);
  check_semantics(map, in, &r);
  return r;
}

/* ---- Case by case: elementwise, Partial, matmul, reductions, meshes, reshape. ---- */

static const int64_t MESH2[1] = {2};

/* A binary elementwise op of two 8 x 8 (or broadcast) tensors on 2 ranks. */
static mt_prop_result binary(int rule, tin a, tin b) {
  tin t[2] = {a, b};
  const int nd[2] = {a.ndim, b.ndim};
  const int64_t shapes[2][4] = {{a.shape[0], a.shape[1], a.shape[2], a.shape[3]},
                                {b.shape[0], b.shape[1], b.shape[2], b.shape[3]}};
  mt_dimmap map = map_elementwise(2, nd, shapes, rule);
  if (rule == MT_PARTIAL_LINEAR_ONE) map.partial_inputs = 3;
  if (rule == MT_PARTIAL_SAME_OP) map.partial_ops = 1u << MT_REDUCE_MAX;
  mt_prop_inputs in = make_inputs(2, t, 1, MESH2);
  return run(&map, &in);
}

static tin t88(mt_placement p) {
  return (tin){2, {8, 8}, {p}};
}

static void test_elementwise(void) {
  mt_prop_result r = binary(MT_PARTIAL_LINEAR_ALL, t88(S(0)), t88(S(0)));
  EXPECT_OUT(r, 2, 1, S(0));
  CHECK(r.bytes == 0 && r.messages == 0);
  CHECK(r.out_ndim == 2 && r.out_shape[0] == 8 && r.out_shape[1] == 8);
  /* S0 + S1: one input moves by one all-to-all; ties go to the first label. */
  r = binary(MT_PARTIAL_LINEAR_ALL, t88(S(0)), t88(S(1)));
  EXPECT_OUT(r, 2, 1, S(0));
  EXPECT_IN(r, 0, 2, 1, S(0));
  EXPECT_IN(r, 1, 2, 1, S(0));
  CHECK(r.bytes == 32 * 8 && r.messages == 2);
  r = binary(MT_PARTIAL_LINEAR_ALL, t88(S(1)), t88(S(0)));
  EXPECT_OUT(r, 2, 1, S(0));
  EXPECT_IN(r, 1, 2, 1, S(0));
  /* Broadcasting: (8,) aligned to the last dim, and an explicit (1, 8). */
  r = binary(MT_PARTIAL_LINEAR_ALL, t88(S(0)), (tin){1, {8}, {R()}});
  EXPECT_OUT(r, 2, 1, S(0));
  EXPECT_IN(r, 1, 2, 1, R());
  CHECK(r.bytes == 0 && r.messages == 0);
  r = binary(MT_PARTIAL_LINEAR_ALL, (tin){2, {1, 8}, {R()}}, t88(S(0)));
  EXPECT_OUT(r, 2, 1, S(0));
  EXPECT_IN(r, 0, 2, 1, R());
  CHECK(r.bytes == 0);
  /* (8,)[S0] + (8, 8)[R]: the small one's shard goes along the last dim. */
  r = binary(MT_PARTIAL_LINEAR_ALL, (tin){1, {8}, {S(0)}}, t88(R()));
  EXPECT_OUT(r, 2, 1, S(1));
  CHECK(r.bytes == 0);
  /* Replicate everywhere stays Replicate (ties go to all-Replicate). */
  r = binary(MT_PARTIAL_LINEAR_ALL, t88(R()), t88(R()));
  EXPECT_OUT(r, 2, 1, R());
  /* S0 + R cuts the replicated operand for free. */
  r = binary(MT_PARTIAL_NONE, t88(S(0)), t88(R()));
  EXPECT_OUT(r, 2, 1, S(0));
  EXPECT_IN(r, 1, 2, 1, S(0));
  CHECK(r.bytes == 0 && r.messages == 0);
}

static void test_partial_rules(void) {
  /* add: P + P -> P, for sum and avg; mixed ops or P + R reduce first. */
  mt_prop_result r = binary(MT_PARTIAL_LINEAR_ALL, t88(PSUM), t88(PSUM));
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.bytes == 0 && r.messages == 0);
  r = binary(MT_PARTIAL_LINEAR_ALL, t88(PAVG), t88(PAVG));
  EXPECT_OUT(r, 2, 1, PAVG);
  r = binary(MT_PARTIAL_LINEAR_ALL, t88(PSUM), t88(PAVG));
  CHECK(r.out_placements[0].kind != MT_PLACEMENT_PARTIAL);
  r = binary(MT_PARTIAL_LINEAR_ALL, t88(PSUM), t88(R()));
  CHECK(r.out_placements[0].kind != MT_PLACEMENT_PARTIAL);
  CHECK(r.bytes > 0);
  r = binary(MT_PARTIAL_LINEAR_ALL, t88(PMAX), t88(PMAX));
  CHECK(r.out_placements[0].kind != MT_PLACEMENT_PARTIAL);
}

/* add and subtract of tensors, torch's additive rules. */
static void test_partial_additive(void) {
  /* P(sum) + R keeps P(sum) for free, R partitioned, either way round. */
  mt_prop_result r = binary(MT_PARTIAL_ADDITIVE, t88(PSUM), t88(R()));
  EXPECT_OUT(r, 2, 1, PSUM);
  EXPECT_IN(r, 1, 2, 1, PSUM);
  CHECK(r.bytes == 0 && r.messages == 0);
  r = binary(MT_PARTIAL_ADDITIVE, t88(R()), t88(PSUM));
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.bytes == 0 && r.messages == 0);
  /* A broadcast Replicate operand is partitioned too. */
  r = binary(MT_PARTIAL_ADDITIVE, t88(PSUM), (tin){1, {8}, {R()}});
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.bytes == 0);
  /* P(avg) + R and R + P(avg): R stays R. */
  r = binary(MT_PARTIAL_ADDITIVE, t88(R()), t88(PAVG));
  EXPECT_OUT(r, 2, 1, PAVG);
  EXPECT_IN(r, 0, 2, 1, R());
  CHECK(r.bytes == 0);
  /* P(max) + R keeps P(max); R + P(max) does not (subtract would flip it). */
  r = binary(MT_PARTIAL_ADDITIVE, t88(PMAX), t88(R()));
  EXPECT_OUT(r, 2, 1, PMAX);
  CHECK(r.bytes == 0);
  r = binary(MT_PARTIAL_ADDITIVE, t88(R()), t88(PMAX));
  CHECK(r.out_placements[0].kind != MT_PLACEMENT_PARTIAL && r.bytes > 0);
  /* P(max) + P(max): one all-reduce of input 1, P(max) kept (not two
   * reduce-scatters). */
  r = binary(MT_PARTIAL_ADDITIVE, t88(PMAX), t88(PMAX));
  EXPECT_OUT(r, 2, 1, PMAX);
  EXPECT_IN(r, 0, 2, 1, PMAX);
  EXPECT_IN(r, 1, 2, 1, R());
  /* A Shard is not made Partial: P(sum) + S0 reduce-scatters. */
  r = binary(MT_PARTIAL_ADDITIVE, t88(PSUM), t88(S(0)));
  EXPECT_OUT(r, 2, 1, S(0));
  /* On (2, 2), [P, S0] + [R, S0] -> [P(sum), S(0)] free. */
  const int64_t m22[2] = {2, 2};
  tin t[2] = {{2, {8, 8}, {PSUM, S(0)}}, {2, {8, 8}, {R(), S(0)}}};
  const int nd[2] = {2, 2};
  const int64_t sh[2][4] = {{8, 8}, {8, 8}};
  mt_dimmap add = map_elementwise(2, nd, sh, MT_PARTIAL_ADDITIVE);
  mt_prop_inputs in = make_inputs(2, t, 2, m22);
  r = run(&add, &in);
  EXPECT_OUT(r, 2, 2, PSUM, S(0));
  CHECK(r.bytes == 0 && r.messages == 0);
  /* On a mesh dim of size 1 P(avg) is not turned into P(sum) (plan_check would
   * refuse it at decide time). */
  const int64_t m12[2] = {1, 2};
  t[0].pl[0] = PSUM, t[0].pl[1] = R(), t[1].pl[0] = PAVG, t[1].pl[1] = R();
  in = make_inputs(2, t, 2, m12);
  r = run(&add, &in);
  CHECK(!(r.in_placements[1][0].kind == MT_PLACEMENT_PARTIAL &&
          r.in_placements[1][0].reduce_op == MT_REDUCE_SUM));
}

/* The unary kinds built by the core: negative flips max and min, a
 * non-decreasing op keeps them (torch's rules). */
static void test_partial_unary_kinds(void) {
  const int nd[1] = {2};
  const int64_t sh[1][MT_MAX_NDIM] = {{8, 8}};
  const struct { int kind; mt_placement in, out; } cases[] = {
      {MT_ELEMENTWISE_NEG, PMAX, P(MT_REDUCE_MIN)}, {MT_ELEMENTWISE_NEG, PSUM, PSUM},
      {MT_ELEMENTWISE_NEG, P(MT_REDUCE_MIN), PMAX},
      {MT_ELEMENTWISE_INCREASING, PMAX, PMAX},
      {MT_ELEMENTWISE_INCREASING, P(MT_REDUCE_MIN), P(MT_REDUCE_MIN)},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    mt_dimmap map;
    CHECK(mt_dimmap_elementwise(cases[k].kind, 1, 1u, nd, sh, &map, NULL) == MT_OK);
    tin t = t88(cases[k].in);
    mt_prop_inputs in = make_inputs(1, &t, 1, MESH2);
    mt_prop_result r = run(&map, &in);
    EXPECT_OUT(r, 2, 1, cases[k].out);
    CHECK(r.bytes == 0 && r.messages == 0);
  }
  /* A non-decreasing op reduces a Partial(sum) first. */
  mt_dimmap map;
  CHECK(mt_dimmap_elementwise(MT_ELEMENTWISE_INCREASING, 1, 1u, nd, sh, &map, NULL) == MT_OK);
  tin t = t88(PSUM);
  mt_prop_inputs in = make_inputs(1, &t, 1, MESH2);
  mt_prop_result r = run(&map, &in);
  CHECK(r.out_placements[0].kind != MT_PLACEMENT_PARTIAL);
}

/* The rewrites hold only where the dtypes keep them exact (mt_partial_exact):
 * -P(max) of ints would wrap, so the Partial is reduced first; of floats it is
 * P(min) with nothing moved. A cast to int or a wider int reduces a Partial(sum)
 * first; a mean into an int gathers its shards. */
static void test_partial_dtypes(void) {
  CHECK(mt_partial_exact(MT_REDUCE_SUM, MT_DTYPE_FLOAT32, MT_DTYPE_COMPLEX128, 0));
  CHECK(!mt_partial_exact(MT_REDUCE_SUM, MT_DTYPE_FLOAT64, MT_DTYPE_FLOAT32, 0));
  CHECK(!mt_partial_exact(MT_REDUCE_AVG, MT_DTYPE_FLOAT16, MT_DTYPE_BFLOAT16, 0));
  CHECK(mt_partial_exact(MT_REDUCE_MAX, MT_DTYPE_FLOAT64, MT_DTYPE_FLOAT16, 0));
  CHECK(mt_partial_exact(MT_REDUCE_SUM, MT_DTYPE_INT64, MT_DTYPE_UINT8, 0));
  CHECK(!mt_partial_exact(MT_REDUCE_SUM, MT_DTYPE_INT8, MT_DTYPE_INT64, 0));
  CHECK(!mt_partial_exact(MT_REDUCE_SUM, MT_DTYPE_FLOAT64, MT_DTYPE_INT64, 0));
  CHECK(!mt_partial_exact(MT_REDUCE_SUM, MT_DTYPE_FLOAT64, MT_DTYPE_BOOL, 0));
  CHECK(!mt_partial_exact(MT_REDUCE_AVG, MT_DTYPE_INT64, MT_DTYPE_INT64, 0));
  CHECK(mt_partial_exact(MT_REDUCE_MAX, MT_DTYPE_INT8, MT_DTYPE_INT16, 0));
  CHECK(mt_partial_exact(MT_REDUCE_MAX, MT_DTYPE_UINT8, MT_DTYPE_INT16, 0));
  CHECK(!mt_partial_exact(MT_REDUCE_MAX, MT_DTYPE_INT8, MT_DTYPE_UINT16, 0));
  CHECK(!mt_partial_exact(MT_REDUCE_MAX, MT_DTYPE_INT8, MT_DTYPE_INT8, 1));
  CHECK(mt_partial_exact(MT_REDUCE_MIN, MT_DTYPE_INT8, MT_DTYPE_FLOAT32, 1));
  const int nd[1] = {2};
  const int64_t sh[1][MT_MAX_NDIM] = {{8, 8}};
  const int dtypes[2] = {MT_DTYPE_INT8, MT_DTYPE_FLOAT64};
  for (int k = 0; k < 2; ++k) {
    mt_dimmap map;
    CHECK(mt_dimmap_elementwise(MT_ELEMENTWISE_NEG, 1, 1u, nd, sh, &map, NULL) == MT_OK);
    mt_dimmap_dtypes(&map, &dtypes[k], -1);
    tin t = t88(PMAX);
    mt_prop_inputs in = make_inputs(1, &t, 1, MESH2);
    mt_prop_result r = run(&map, &in);
    if (k == 0) CHECK(r.out_placements[0].kind != MT_PLACEMENT_PARTIAL);
    else EXPECT_OUT(r, 2, 1, P(MT_REDUCE_MIN));
  }
  const mt_reduction_rule mean = {MT_REDUCE_AVG, MT_PARTIAL_LINEAR_ALL, 0, 1, 0};
  const int half = MT_DTYPE_FLOAT16;
  const int outs[3] = {MT_DTYPE_INT64, MT_DTYPE_FLOAT16, MT_DTYPE_FLOAT32};
  for (int k = 0; k < 3; ++k) {
    mt_dimmap map;
    CHECK(mt_dimmap_reduction(&mean, 2, 1u, 0, half, &map, NULL) == MT_OK);
    mt_dimmap_dtypes(&map, &half, outs[k]);
    CHECK(map.label_kind[0] == (k == 0 ? MT_LABEL_REPLICATE : MT_LABEL_REDUCE));
  }
}

/* A gradient wanted: the decision also prices its way back. exp of a Partial(sum)
 * reduce-scatters it when no gradient is wanted (half an all-reduce's bytes);
 * with one, the shard's gradient would need an all-gather to reach the input's
 * Replicate gradient, so the all-reduce, whose gradient stays where it is, wins
 * as torch's does. */
static void test_gradient_way_back(void) {
  const int nd[1] = {2};
  const int64_t sh[1][MT_MAX_NDIM] = {{8, 8}};
  mt_dimmap map;
  CHECK(mt_dimmap_elementwise(MT_ELEMENTWISE_INCREASING, 1, 1u, nd, sh, &map, NULL) == MT_OK);
  tin t = t88(PSUM);
  mt_prop_inputs in = make_inputs(1, &t, 1, MESH2);
  mt_prop_result r = decide(&map, &in);
  EXPECT_OUT(r, 2, 1, S(0));
  in.grad = 1u;
  r = decide(&map, &in);
  EXPECT_IN(r, 0, 2, 1, R());
  EXPECT_OUT(r, 2, 1, R());
  /* Nothing to bring back from a free combination: S(0) stays S(0). */
  t = t88(S(0));
  in = make_inputs(1, &t, 1, MESH2);
  in.grad = 1u;
  r = decide(&map, &in);
  EXPECT_OUT(r, 2, 1, S(0));
  CHECK(r.bytes == 0 && r.messages == 0);
}

/* Bytes of moving input i's shape from placements `from` to `to`. */
static int64_t move_bytes(const mt_prop_inputs *in, int i, const mt_placement *from,
                          const mt_placement *to) {
  mt_layout a = layout_of(in, i, from), b = layout_of(in, i, to);
  mt_plan *plan = NULL;
  CHECK(mt_plan_create(&a, &b, in->itemsize[i], &plan, NULL) == MT_OK);
  int64_t bytes = mt_plan_bytes(plan);
  mt_plan_destroy(plan);
  return bytes;
}

/* No decision moves more bytes than torch's for the same op and placements, its
 * gradients' way back counted alike. [P(sum), R] + [S0, S1] of an (8, 1) column on
 * a (2, 2) mesh, both wanting gradients: all-reducing the Partial (and gathering
 * the column) costs least by bytes and messages, and no gradient moves back, but
 * it moves more bytes than torch's decision, which follows the column's S0 on
 * mesh dim 0 (the Partial reduce-scattered) and replicates on mesh dim 1 (the
 * column's S1 is on its broadcast dim), then gathers the Partial's gradient back.
 * The engine takes torch's bytes, in one more collective. */
static void test_torch_decision_caps_bytes(void) {
  const int64_t m22[2] = {2, 2};
  tin t[2] = {{2, {8, 8}, {PSUM, R()}}, {2, {8, 1}, {S(0), S(1)}}};
  const int nd[2] = {2, 2};
  const int64_t sh[2][MT_MAX_NDIM] = {{8, 8}, {8, 1}};
  mt_dimmap map;
  CHECK(mt_dimmap_elementwise(MT_ELEMENTWISE_ADD, 2, 3u, nd, sh, &map, NULL) == MT_OK);
  mt_prop_inputs in = make_inputs(2, t, 2, m22);
  mt_placement rr[2] = {R(), R()}, s0r[2] = {S(0), R()};
  int64_t torch = move_bytes(&in, 0, in.placements[0], s0r) +
                  move_bytes(&in, 1, in.placements[1], s0r) +
                  move_bytes(&in, 0, s0r, rr);
  int64_t reduced = move_bytes(&in, 0, in.placements[0], rr) +
                    move_bytes(&in, 1, in.placements[1], rr);
  CHECK_MSG(torch < reduced, "torch %lld, all-reduced %lld", (long long)torch,
            (long long)reduced);
  in.grad = 3u;
  mt_prop_result r = decide(&map, &in);
  char buf[512];
  describe(&r, 2, 2, buf);
  CHECK_MSG(r.bytes <= torch, "%s; torch's %lld", buf, (long long)torch);
  EXPECT_IN(r, 0, 2, 2, S(0), R());
  EXPECT_OUT(r, 2, 2, S(0), R());
}

/* An output headed somewhere (mt_prop_inputs.want) is made there when moving it
 * after would cost more: S0 + S1 moves one input either way, and the one that
 * lands on the wanted S1 spares the output's move. A wanted layout of another
 * shape is ignored. */
static void test_output_way_out(void) {
  tin t[2] = {t88(S(0)), t88(S(1))};
  const int nd[2] = {2, 2};
  const int64_t shapes[2][4] = {{8, 8}, {8, 8}};
  mt_dimmap map = map_elementwise(2, nd, shapes, MT_PARTIAL_LINEAR_ALL);
  mt_prop_inputs in = make_inputs(2, t, 1, MESH2);
  mt_prop_result plain = decide(&map, &in);
  EXPECT_OUT(plain, 2, 1, S(0));
  in.want = 1, in.want_ndim = 2, in.want_shape[0] = 8, in.want_shape[1] = 8;
  in.want_placements[0] = S(1);
  mt_prop_result r = decide(&map, &in);
  EXPECT_OUT(r, 2, 1, S(1));
  EXPECT_IN(r, 0, 2, 1, S(1));
  CHECK(r.bytes == plain.bytes && r.messages == plain.messages);
  in.want_shape[1] = 1;
  r = decide(&map, &in);
  EXPECT_OUT(r, 2, 1, S(0));
}

static void test_partial_multiply(void) {
  /* multiply: P * R -> P either way round, free. */
  mt_prop_result r;
  r = binary(MT_PARTIAL_LINEAR_ONE, t88(PSUM), t88(R()));
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.bytes == 0 && r.messages == 0);
  r = binary(MT_PARTIAL_LINEAR_ONE, t88(R()), t88(PAVG));
  EXPECT_OUT(r, 2, 1, PAVG);
  /* P * S: gathering the sharded operand to keep the Partial moves as much as
   * reduce-scattering the Partial onto the other's shards; the reduction's local
   * pass is paid now or later alike, so the reduce-scatter, which leaves no
   * reduction pending, wins the tie. */
  r = binary(MT_PARTIAL_LINEAR_ONE, t88(PSUM), t88(S(0)));
  EXPECT_IN(r, 0, 2, 1, S(0));
  EXPECT_IN(r, 1, 2, 1, S(0));
  EXPECT_OUT(r, 2, 1, S(0));
  CHECK(r.bytes == 64 * 8 && r.messages == 2);
  /* P * P: never both kept; here one is all-reduced and the other kept. */
  r = binary(MT_PARTIAL_LINEAR_ONE, t88(PSUM), t88(PSUM));
  int kept = (r.in_placements[0][0].kind == MT_PLACEMENT_PARTIAL) +
             (r.in_placements[1][0].kind == MT_PLACEMENT_PARTIAL);
  CHECK(kept <= 1);
  CHECK(kept == (r.out_placements[0].kind == MT_PLACEMENT_PARTIAL));
  EXPECT_IN(r, 0, 2, 1, PSUM);
  EXPECT_IN(r, 1, 2, 1, R());
}

static void test_partial_other(void) {
  /* maximum keeps P(max) with P(max), nothing else. */
  mt_prop_result r;
  r = binary(MT_PARTIAL_SAME_OP, t88(PMAX), t88(PMAX));
  EXPECT_OUT(r, 2, 1, PMAX);
  CHECK(r.bytes == 0);
  r = binary(MT_PARTIAL_SAME_OP, t88(PSUM), t88(PSUM));
  CHECK(r.out_placements[0].kind != MT_PLACEMENT_PARTIAL);
  /* A unary op without a rule reduces first: a reduce-scatter beats an
   * all-reduce, so the output comes out sharded. */
  const int nd[1] = {2};
  const int64_t sh[1][4] = {{8, 8}};
  mt_dimmap exp_map = map_elementwise(1, nd, sh, MT_PARTIAL_NONE);
  tin x = t88(PSUM);
  mt_prop_inputs in = make_inputs(1, &x, 1, MESH2);
  r = run(&exp_map, &in);
  EXPECT_OUT(r, 1, 1, S(0));
  EXPECT_IN(r, 0, 1, 1, S(0));
  int64_t b, n;
  plan_cost(&in, 0, (mt_placement[]){S(0)}, &b, &n);
  CHECK(r.bytes == b && b == 64 * 8); /* each rank receives its half */
}

static mt_prop_result matmul(int mesh_ndim, const int64_t *mesh, tin x, tin y) {
  tin t[2] = {x, y};
  mt_dimmap map = map_matmul(x.ndim, x.shape, y.ndim, y.shape);
  mt_prop_inputs in = make_inputs(2, t, mesh_ndim, mesh);
  return run(&map, &in);
}

/* Candidates are timed by the model they are given, within the bytes of the
 * reference pricing. x [S0] @ y [S1] (4 x 4 each, 4 ranks): the reference gathers
 * y (384 B, 12 messages); gathering x instead moves as much, and its rows land in
 * place where y's columns need a pass that places them, so with latency
 * dominating x is gathered; with messages free the all-to-alls of both operands
 * into a pending Partial(sum) move half as much and win. [P] @ [P] with a long
 * contracted dim: an all-reduce of y (a ring of 6 rounds) and two reduce-scatters
 * (recursive halving, 2 rounds each) move the same bytes; when latency dominates
 * the 4 rounds win, when only bytes count the single step does. */
static void test_timed_candidates(void) {
  const int64_t mesh4[1] = {4};
  mt_time_model bytes_only = mt_time_model_default(), latency = bytes_only;
  bytes_only.alpha[MT_LINK_SHM] = bytes_only.alpha[MT_LINK_NET] = bytes_only.call = 0.0;
  bytes_only.copy = bytes_only.reduce = 0.0;
  latency.alpha[MT_LINK_SHM] = 1e-3, latency.alpha[MT_LINK_NET] = 2e-3;
  tin x = {2, {4, 4}, {S(0)}}, y = {2, {4, 4}, {S(1)}};
  tin t[2] = {x, y};
  mt_dimmap map = map_matmul(2, x.shape, 2, y.shape);
  mt_prop_inputs in = make_inputs(2, t, 1, mesh4);
  in.model = &latency;
  mt_prop_result r = run(&map, &in);
  EXPECT_IN(r, 0, 2, 1, R());
  EXPECT_IN(r, 1, 2, 1, S(1));
  CHECK(r.bytes == 384 && r.messages == 12);
  in.model = &bytes_only;
  r = run(&map, &in);
  EXPECT_IN(r, 0, 2, 1, S(1));
  EXPECT_IN(r, 1, 2, 1, S(0));
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.bytes == 192 && r.messages == 24);
  tin px = {2, {4, 512}, {PSUM}}, py = {2, {512, 4}, {PSUM}};
  tin pt[2] = {px, py};
  map = map_matmul(2, px.shape, 2, py.shape);
  in = make_inputs(2, pt, 1, mesh4);
  in.model = &latency;
  r = run(&map, &in);
  EXPECT_IN(r, 0, 2, 1, S(1));
  EXPECT_IN(r, 1, 2, 1, S(0));
  in.model = &bytes_only;
  mt_prop_result b = run(&map, &in);
  EXPECT_IN(b, 0, 2, 1, PSUM);
  EXPECT_IN(b, 1, 2, 1, R());
  CHECK(b.bytes == r.bytes && b.messages < r.messages);
}

static void test_matmul(void) {
  tin x = {2, {8, 8}, {S(0)}}, y = {2, {8, 32}, {S(0)}};
  /* x [S0] @ y [S0]: what moves now decides (never more than torch,
   * which prices its strategies so). Moving the small x by one all-to-all and
   * leaving a Partial(sum) beats gathering the large y. */
  mt_prop_result r = matmul(1, MESH2, x, y);
  EXPECT_OUT(r, 2, 1, PSUM);
  EXPECT_IN(r, 0, 2, 1, S(1));
  EXPECT_IN(r, 1, 2, 1, S(0));
  mt_layout lx;
  mt_layout_init(&lx, 2, x.shape, 1, MESH2, x.pl, NULL);
  mt_layout lr = lx;
  lr.placements[0] = S(1);
  mt_plan *plan = NULL;
  CHECK(mt_plan_create(&lx, &lr, 8, &plan, NULL) == MT_OK);
  CHECK(mt_plan_nsteps(plan) == 1 && mt_plan_step(plan, 0)->kind == MT_STEP_ALLTOALL);
  CHECK(r.bytes == mt_plan_bytes(plan) && r.messages == mt_plan_messages(plan));
  CHECK(r.out_shape[0] == 8 && r.out_shape[1] == 32);
  mt_plan_destroy(plan);
  /* A large x and a small y: gathering y (one all-gather) moves less, [S0] out. */
  tin xl = {2, {32, 8}, {S(0)}}, ys = {2, {8, 8}, {S(0)}};
  r = matmul(1, MESH2, xl, ys);
  EXPECT_OUT(r, 2, 1, S(0));
  EXPECT_IN(r, 0, 2, 1, S(0));
  EXPECT_IN(r, 1, 2, 1, R());
  mt_layout ly;
  mt_layout_init(&ly, 2, ys.shape, 1, MESH2, ys.pl, NULL);
  lr = ly;
  lr.placements[0] = R();
  plan = NULL;
  CHECK(mt_plan_create(&ly, &lr, 8, &plan, NULL) == MT_OK);
  CHECK(mt_plan_nsteps(plan) == 1 && mt_plan_step(plan, 0)->kind == MT_STEP_ALLGATHER);
  CHECK(r.bytes == mt_plan_bytes(plan));
  mt_plan_destroy(plan);
  /* S1 @ S0 -> Partial(sum), free; S0 @ R -> S0; R @ S1 -> S1. */
  x.pl[0] = S(1);
  r = matmul(1, MESH2, x, y);
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.bytes == 0 && r.messages == 0);
  x.pl[0] = S(0), y.pl[0] = R();
  r = matmul(1, MESH2, x, y);
  EXPECT_OUT(r, 2, 1, S(0));
  CHECK(r.bytes == 0);
  x.pl[0] = R(), y.pl[0] = S(1);
  r = matmul(1, MESH2, x, y);
  EXPECT_OUT(r, 2, 1, S(1));
  CHECK(r.bytes == 0);
  /* Partial(sum) @ R -> Partial(sum). */
  x.pl[0] = PSUM, y.pl[0] = R();
  r = matmul(1, MESH2, x, y);
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.bytes == 0);
}

static void test_batch_matmul(void) {
  /* Batch dims shard through, also when one operand broadcasts them. */
  mt_prop_result r;
  tin bx = {3, {4, 8, 8}, {S(0)}}, by = {3, {4, 8, 8}, {S(0)}};
  r = matmul(1, MESH2, bx, by);
  EXPECT_OUT(r, 2, 1, S(0));
  CHECK(r.bytes == 0 && r.out_ndim == 3 && r.out_shape[0] == 4);
  tin b1 = {3, {1, 8, 8}, {R()}};
  r = matmul(1, MESH2, bx, b1);
  EXPECT_OUT(r, 2, 1, S(0));
  EXPECT_IN(r, 1, 2, 1, R());
  CHECK(r.bytes == 0);
  tin y2 = {2, {8, 8}, {R()}};
  r = matmul(1, MESH2, bx, y2);
  EXPECT_OUT(r, 2, 1, S(0));
  CHECK(r.bytes == 0 && r.out_ndim == 3);
}

static mt_prop_result reduce(tin x, int mesh_ndim, const int64_t *mesh, uint32_t axes,
                             int op, int keepdims) {
  mt_dimmap map = map_reduce(x.ndim, axes, op, keepdims);
  mt_prop_inputs in = make_inputs(1, &x, mesh_ndim, mesh);
  return run(&map, &in);
}

static void test_reductions(void) {
  mt_prop_result r = reduce(t88(S(0)), 1, MESH2, 2u, RED_SUM, 0);
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes == 0 && r.messages == 0 && r.out_ndim == 1 && r.out_shape[0] == 8);
  r = reduce(t88(S(0)), 1, MESH2, 1u, RED_SUM, 0);
  EXPECT_OUT(r, 1, 1, PSUM);
  CHECK(r.bytes == 0);
  r = reduce(t88(S(1)), 1, MESH2, 3u, RED_SUM, 0); /* x.sum() */
  EXPECT_OUT(r, 1, 1, PSUM);
  CHECK(r.bytes == 0 && r.out_ndim == 0);
  r = reduce(t88(S(0)), 1, MESH2, 1u, RED_MAX, 0);
  EXPECT_OUT(r, 1, 1, PMAX);
  CHECK(r.bytes == 0);
  r = reduce(t88(PMAX), 1, MESH2, 1u, RED_MAX, 0); /* max of P(max) keeps it */
  EXPECT_OUT(r, 1, 1, PMAX);
  r = reduce(t88(PSUM), 1, MESH2, 1u, RED_SUM, 0); /* sum is linear */
  EXPECT_OUT(r, 1, 1, PSUM);
  CHECK(r.bytes == 0);
}

static void test_mean_std(void) {
  mt_prop_result r;
  /* mean: Partial(avg) over even shards only; uneven ones are not split on the
   * reduced dim (here one all-to-all puts the cut on the kept dim). */
  r = reduce(t88(S(0)), 1, MESH2, 1u, RED_MEAN, 0);
  EXPECT_OUT(r, 1, 1, PAVG);
  CHECK(r.bytes == 0);
  r = reduce((tin){2, {7, 8}, {S(0)}}, 1, MESH2, 1u, RED_MEAN, 0);
  EXPECT_IN(r, 0, 1, 1, S(1));
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes > 0);
  /* keepdims: the reduced dim stays as a size-1 dim. */
  r = reduce(t88(S(1)), 1, MESH2, 1u, RED_MEAN, 1);
  EXPECT_OUT(r, 1, 1, S(1));
  CHECK(r.out_ndim == 2 && r.out_shape[0] == 1 && r.out_shape[1] == 8 && r.bytes == 0);
  /* std may not split its reduced dim. */
  r = reduce(t88(S(0)), 1, MESH2, 1u, RED_STD, 0);
  EXPECT_IN(r, 0, 1, 1, S(1));
  EXPECT_OUT(r, 1, 1, S(0));
  r = reduce(t88(S(1)), 1, MESH2, 1u, RED_STD, 0);
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes == 0);
  /* Nested uneven mean: 6 rows over 2 x 2 ranks are 2, 1, 2, 1. */
  const int64_t m22[2] = {2, 2};
  r = reduce((tin){2, {6, 8}, {S(0), S(0)}}, 2, m22, 1u, RED_MEAN, 0);
  CHECK(r.out_placements[0].kind != MT_PLACEMENT_PARTIAL ||
        r.out_placements[1].kind != MT_PLACEMENT_PARTIAL);
  r = reduce((tin){2, {8, 8}, {S(0), S(0)}}, 2, m22, 1u, RED_MEAN, 0);
  EXPECT_OUT(r, 1, 2, PAVG, PAVG);
  CHECK(r.bytes == 0);
}

static void test_softmax(void) {
  mt_dimmap map = map_softmax(2, 1);
  tin x = t88(S(1));
  mt_prop_inputs in = make_inputs(1, &x, 1, MESH2);
  mt_prop_result r = run(&map, &in);
  EXPECT_IN(r, 0, 1, 1, S(0));
  EXPECT_OUT(r, 1, 1, S(0));
  int64_t b, n;
  plan_cost(&in, 0, (mt_placement[]){S(0)}, &b, &n);
  CHECK(r.bytes == b && b > 0);
  x = t88(S(0));
  in = make_inputs(1, &x, 1, MESH2);
  r = run(&map, &in);
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes == 0 && r.messages == 0);
}

static void test_meshes_2d(void) {
  const int64_t m22[2] = {2, 2};
  tin a = {2, {8, 8}, {S(0), S(1)}};
  tin t[2] = {a, a};
  const int nd[2] = {2, 2};
  const int64_t sh[2][4] = {{8, 8}, {8, 8}};
  mt_dimmap add = map_elementwise(2, nd, sh, MT_PARTIAL_LINEAR_ALL);
  mt_prop_inputs in = make_inputs(2, t, 2, m22);
  mt_prop_result r = run(&add, &in);
  EXPECT_OUT(r, 2, 2, S(0), S(1));
  CHECK(r.bytes == 0 && r.messages == 0);
  /* A label cut by both mesh dims (nested) passes through. */
  t[0].pl[1] = t[1].pl[1] = S(0);
  in = make_inputs(2, t, 2, m22);
  r = run(&add, &in);
  EXPECT_OUT(r, 2, 2, S(0), S(0));
  CHECK(r.bytes == 0);
  /* [S0, S1] + [S1, S0]: one input moves. */
  t[0] = a, t[1].pl[0] = S(1), t[1].pl[1] = S(0);
  in = make_inputs(2, t, 2, m22);
  r = run(&add, &in);
  CHECK(r.bytes > 0 && (in_is(&r, 0, 2, a.pl) || in_is(&r, 1, 2, t[1].pl)));
  /* matmul [S0, R] @ [R, S1] -> [S0, S1] for free. */
  r = matmul(2, m22, (tin){2, {8, 8}, {S(0), R()}}, (tin){2, {8, 8}, {R(), S(1)}});
  EXPECT_OUT(r, 2, 2, S(0), S(1));
  CHECK(r.bytes == 0 && r.messages == 0);
  /* [S1, S0] @ [S0, S1]: both mesh dims contract -> [P, P]... or cheaper. */
  r = matmul(2, m22, (tin){2, {8, 8}, {S(1), R()}}, (tin){2, {8, 8}, {S(0), S(1)}});
  EXPECT_OUT(r, 2, 2, PSUM, S(1));
  CHECK(r.bytes == 0);
  /* Free ties go to what leaves the inputs as they are, as torch: [R,S1] @ [R,S0]
   * is [R, P(sum)], not cut to [S(0), P(sum)]. */
  r = matmul(2, m22, (tin){2, {8, 8}, {R(), S(1)}}, (tin){2, {8, 8}, {R(), S(0)}});
  EXPECT_OUT(r, 2, 2, R(), PSUM);
  CHECK(r.bytes == 0 && r.messages == 0);
  /* mean(1) of [R, S1] is [R, P(avg)]. */
  r = reduce((tin){2, {8, 8}, {R(), S(1)}}, 2, m22, 2u, RED_MEAN, 0);
  EXPECT_OUT(r, 2, 1, R(), PAVG);
}

static mt_prop_result reshape(tin x, int mesh_ndim, const int64_t *mesh, int nout,
                              const int64_t *os);

/* Size-1 mesh dims cost nothing; ties there go to what most inputs hold, then to
 * no new Partial, then to a Shard (torch keeps a Shard on a one-rank mesh). */
static void test_size1_mesh_dims(void) {
  const int64_t m41[2] = {4, 1}, m14[2] = {1, 4};
  tin a = {2, {8, 8}, {S(0), S(1)}};
  tin t[2] = {a, (tin){2, {8, 8}, {S(0), R()}}};
  const int nd[2] = {2, 2};
  const int64_t sh[2][4] = {{8, 8}, {8, 8}};
  mt_dimmap add = map_elementwise(2, nd, sh, MT_PARTIAL_LINEAR_ALL);
  mt_prop_inputs in;
  mt_prop_result r;
  in = make_inputs(2, t, 2, m41);
  r = run(&add, &in);
  check_oracle(&add, &in, &r);
  EXPECT_OUT(r, 2, 2, S(0), S(1));
  EXPECT_IN(r, 0, 2, 2, S(0), S(1));
  EXPECT_IN(r, 1, 2, 2, S(0), S(1));
  CHECK(r.bytes == 0 && r.messages == 0);
  t[0] = (tin){2, {8, 8}, {S(1), S(0)}}, t[1] = (tin){2, {8, 8}, {PSUM, S(0)}};
  in = make_inputs(2, t, 2, m14);
  r = run(&add, &in);
  check_oracle(&add, &in, &r);
  EXPECT_OUT(r, 2, 2, S(1), S(0));
  CHECK(r.bytes == 0 && r.messages == 0);
  /* Both inputs Partial(sum) on the one-rank dim: add keeps it. */
  t[0] = (tin){2, {8, 8}, {PSUM, S(0)}};
  in = make_inputs(2, t, 2, m14);
  r = run(&add, &in);
  check_oracle(&add, &in, &r);
  EXPECT_OUT(r, 2, 2, PSUM, S(0));
  r = matmul(2, m14, (tin){2, {8, 8}, {PMAX, S(1)}}, (tin){2, {8, 8}, {S(1), S(0)}});
  EXPECT_OUT(r, 2, 2, S(1), PSUM);
  CHECK(r.bytes == 0);
  /* A one-rank mesh: x [S0] + y [R] stays [S0], a reshape keeps its Shard, and
   * all-Replicate inputs stay Replicate. */
  const int64_t m1[1] = {1};
  t[0] = (tin){2, {8, 8}, {S(0)}}, t[1] = (tin){2, {8, 8}, {R()}};
  in = make_inputs(2, t, 1, m1);
  r = run(&add, &in);
  check_oracle(&add, &in, &r);
  EXPECT_OUT(r, 2, 1, S(0));
  t[0] = (tin){2, {8, 8}, {R()}};
  in = make_inputs(2, t, 1, m1);
  r = run(&add, &in);
  EXPECT_OUT(r, 2, 1, R());
  const int64_t flat[1] = {24};
  r = reshape((tin){2, {4, 6}, {S(0)}}, 1, m1, 1, flat);
  EXPECT_OUT(r, 1, 1, S(0));
}

/* Shards may be empty along kept and contracted labels and sum or product ones
 * (0 and 1 are their identities), never along max, min or avg ones. */
static void test_small_dims(void) {
  const int64_t m4[1] = {4};
  tin a = {2, {3, 8}, {S(0)}};
  tin t[2] = {a, a};
  const int nd[2] = {2, 2};
  const int64_t sh[2][4] = {{3, 8}, {3, 8}};
  mt_dimmap add = map_elementwise(2, nd, sh, MT_PARTIAL_LINEAR_ALL);
  mt_prop_inputs in = make_inputs(2, t, 1, m4);
  mt_prop_result r = run(&add, &in);
  EXPECT_OUT(r, 2, 1, S(0));
  CHECK(r.bytes == 0);
  /* 3 rows over 4 ranks are 1, 1, 1, 0: the last rank's sum is 0. */
  r = reduce(a, 1, m4, 1u, RED_SUM, 0);
  EXPECT_OUT(r, 1, 1, PSUM);
  CHECK(r.bytes == 0 && r.messages == 0);
  r = reduce(a, 1, m4, 1u, RED_MAX, 0);
  CHECK(r.out_placements[0].kind != MT_PLACEMENT_PARTIAL);
  CHECK(r.bytes > 0);
  /* A row-wise Linear of 6 features over 4 ranks (2, 2, 2, 0): x [S1] @ w.T [S0]
   * contracts locally, no gather; and 2 features over 4 (1, 1, 0, 0) too. */
  r = matmul(1, m4, (tin){2, {5, 6}, {S(1)}}, (tin){2, {6, 3}, {S(0)}});
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.bytes == 0 && r.messages == 0);
  r = matmul(1, m4, (tin){2, {5, 2}, {S(1)}}, (tin){2, {2, 3}, {S(0)}});
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.bytes == 0 && r.messages == 0);
  /* A zero-size tensor moves no bytes, whatever it needs. */
  r = reduce((tin){2, {0, 8}, {S(0)}}, 1, m4, 1u, RED_MAX, 0);
  CHECK(r.bytes == 0 && r.out_shape[0] == 8);
}

/* broadcast_to and expand_dims: new output dims are sized labels. */
static void test_new_dims(void) {
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = 1, map.nlabels = 2, map.in_ndim[0] = 1, map.in_labels[0][0] = 1;
  map.out_ndim = 2, map.out_labels[0] = 0, map.out_labels[1] = 1;
  map.sized_labels = 1u, map.label_size[0] = 4;
  tin x = {1, {8}, {S(0)}};
  mt_prop_inputs in = make_inputs(1, &x, 1, MESH2);
  mt_prop_result r = run(&map, &in);
  EXPECT_OUT(r, 1, 1, S(1));
  CHECK(r.out_shape[0] == 4 && r.out_shape[1] == 8 && r.bytes == 0);
  map.label_size[0] = 1; /* expand_dims(x, 0) */
  r = run(&map, &in);
  EXPECT_OUT(r, 1, 1, S(1));
  CHECK(r.out_shape[0] == 1 && r.out_ndim == 2);
  /* transpose: labels permuted. */
  mt_dimmap tr;
  memset(&tr, 0, sizeof tr);
  tr.ninputs = 1, tr.nlabels = 2, tr.in_ndim[0] = 2, tr.out_ndim = 2;
  tr.in_labels[0][0] = 0, tr.in_labels[0][1] = 1;
  tr.out_labels[0] = 1, tr.out_labels[1] = 0;
  tr.partial_rule = MT_PARTIAL_LINEAR_ALL;
  x = (tin){2, {8, 4}, {S(0)}};
  in = make_inputs(1, &x, 1, MESH2);
  r = run(&tr, &in);
  EXPECT_OUT(r, 1, 1, S(1));
  CHECK(r.out_shape[0] == 4 && r.bytes == 0);
  /* einsum "ii->i" (diagonal): the repeated label is never cut. */
  mt_dimmap dg;
  memset(&dg, 0, sizeof dg);
  dg.ninputs = 1, dg.nlabels = 1, dg.in_ndim[0] = 2, dg.out_ndim = 1;
  x = (tin){2, {8, 8}, {S(0)}};
  in = make_inputs(1, &x, 1, MESH2);
  r = run(&dg, &in);
  EXPECT_IN(r, 0, 1, 1, R());
  EXPECT_OUT(r, 1, 1, R());
}

static mt_prop_result reshape(tin x, int mesh_ndim, const int64_t *mesh, int nout,
                              const int64_t *os) {
  mt_dimmap map = map_reshape(x.ndim, x.shape, nout, os);
  mt_prop_inputs in = make_inputs(1, &x, mesh_ndim, mesh);
  mt_prop_result r = run(&map, &in);
  check_oracle(&map, &in, &r);
  for (int d = 0; d < nout; ++d) CHECK(r.out_shape[d] == os[d]);
  return r;
}

/* A merged group keeps a shard on its leftmost dim and a split on its first
 * piece when the shares scale (even shards, and uneven ones that happen to);
 * otherwise the input moves first. */
static void test_reshape(void) {
  static const int64_t MESH4[1] = {4}, MESH3[1] = {3}, MESH22[2] = {2, 2};
  const int64_t o32[1] = {32}, o84[2] = {8, 4}, o32b[2] = {3, 2}, o10[1] = {10};
  const int64_t o6[1] = {6}, o64[2] = {6, 4}, o284[3] = {2, 4, 4};
  mt_prop_result r = reshape((tin){2, {8, 4}, {S(0)}}, 1, MESH2, 1, o32);
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes == 0 && r.messages == 0);
  /* A shard on a merged dim that is not leftmost moves to the leftmost one
   * (an all-to-all is cheaper than the all-gather torch does). */
  r = reshape((tin){2, {8, 4}, {S(1)}}, 1, MESH2, 1, o32);
  EXPECT_IN(r, 0, 1, 1, S(0));
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes > 0);
  r = reshape((tin){1, {32}, {S(0)}}, 1, MESH2, 2, o84);
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes == 0);
  /* Uneven but scaling: 6 over 4 is (2, 2, 2, 0), 3 rows of 2 are (1, 1, 1, 0). */
  r = reshape((tin){1, {6}, {S(0)}}, 1, MESH4, 2, o32b);
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes == 0);
  /* 5 rows of 2 over 3: (2, 2, 1) rows are (4, 4, 2) of 10. */
  r = reshape((tin){2, {5, 2}, {S(0)}}, 1, MESH3, 1, o10);
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes == 0);
  /* 3 rows of 2 over 2 are (4, 2) elements, but 6 over 2 is (3, 3): replicate. */
  r = reshape((tin){2, {3, 2}, {S(0)}}, 1, MESH2, 1, o6);
  EXPECT_IN(r, 0, 1, 1, R());
  EXPECT_OUT(r, 1, 1, R());
  /* Merge and split in one group: (4, 6) -> (6, 4), halves on both sides. */
  r = reshape((tin){2, {4, 6}, {S(0)}}, 1, MESH2, 2, o64);
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes == 0);
  /* Nested shards on a 2-D mesh, and a Partial passing through. */
  r = reshape((tin){2, {8, 4}, {S(0), S(0)}}, 2, MESH22, 1, o32);
  EXPECT_OUT(r, 1, 2, S(0), S(0));
  CHECK(r.bytes == 0);
  r = reshape((tin){2, {8, 4}, {PSUM, S(0)}}, 2, MESH22, 3, o284);
  EXPECT_OUT(r, 1, 2, PSUM, S(0));
  CHECK(r.bytes == 0);
  /* Size-1 dims stand alone: (1, 8) -> (8, 1) keeps the shard. */
  const int64_t o81[2] = {8, 1};
  r = reshape((tin){2, {1, 8}, {S(1)}}, 1, MESH2, 2, o81);
  EXPECT_OUT(r, 1, 1, S(0));
  CHECK(r.bytes == 0);
}

/* ---- The core's builders against the maps above. ---- */

/* The placements a tensor of `ndim` dims can hold on one mesh dim. */
static int some_placements(int ndim, mt_placement *out) {
  int n = 0;
  out[n++] = R(), out[n++] = PSUM, out[n++] = PAVG, out[n++] = PMAX;
  for (int d = 0; d < ndim; ++d) out[n++] = S(d);
  return n;
}

/* Both maps decide alike for every pair of placements of two inputs (one input
 * when nin is 1) on a mesh of 2 ranks, and the built map decides correctly. */
static void same_decisions(const mt_dimmap *built, const mt_dimmap *ref, int nin,
                           const tin *shapes) {
  mt_placement pa[8], pb[8];
  int na = some_placements(shapes[0].ndim, pa);
  int nb = nin == 2 ? some_placements(shapes[1].ndim, pb) : 1;
  for (int a = 0; a < na; ++a) {
    for (int b = 0; b < nb; ++b) {
      tin t[2] = {shapes[0], nin == 2 ? shapes[1] : shapes[0]};
      t[0].pl[0] = pa[a];
      t[1].pl[0] = nin == 2 ? pb[b] : R();
      mt_prop_inputs in = make_inputs(nin, t, 1, MESH2);
      mt_prop_result x = run(built, &in), y = decide(ref, &in);
      char bx[512], by[512];
      describe(&x, nin, 1, bx);
      describe(&y, nin, 1, by);
      CHECK_MSG(strcmp(bx, by) == 0, "built %s, reference %s", bx, by);
    }
  }
}

/* Python's partial rules by kind and by which of two operands are tensors. */
static void reference_rule(int kind, uint32_t tensors, mt_dimmap *m) {
  int both = tensors == 3u;
  m->partial_rule = MT_PARTIAL_NONE, m->partial_inputs = 0, m->partial_ops = 0;
  if (kind == MT_ELEMENTWISE_ADD && both) m->partial_rule = MT_PARTIAL_ADDITIVE;
  if (kind == MT_ELEMENTWISE_MUL) {
    m->partial_rule = both ? MT_PARTIAL_LINEAR_ONE : MT_PARTIAL_LINEAR_ALL;
    m->partial_inputs = both ? 3u : 0u;
  }
  if (kind == MT_ELEMENTWISE_DIV && (tensors & 1u)) {
    m->partial_rule = both ? MT_PARTIAL_LINEAR_ONE : MT_PARTIAL_LINEAR_ALL;
    m->partial_inputs = both ? 1u : 0u;
  }
  if (kind == MT_ELEMENTWISE_MAX || kind == MT_ELEMENTWISE_MIN) {
    m->partial_rule = both ? MT_PARTIAL_MONOTONE : MT_PARTIAL_SAME_OP;
    m->partial_ops = 1u << (kind == MT_ELEMENTWISE_MAX ? MT_REDUCE_MAX : MT_REDUCE_MIN);
  }
  /* NEG and INCREASING are unary: with two operands nothing passes. */
}

static mt_dimmap built_elementwise(int kind, int nops, uint32_t tensors, int nin,
                                   const tin *t) {
  int nd[2] = {t[0].ndim, nin == 2 ? t[1].ndim : 0};
  int64_t sh[2][MT_MAX_NDIM] = {{0}};
  for (int i = 0; i < nin; ++i)
    for (int d = 0; d < t[i].ndim; ++d) sh[i][d] = t[i].shape[d];
  mt_dimmap map;
  mt_error err = {0, ""};
  int rc = mt_dimmap_elementwise(kind, nops, tensors, nd,
                                 (const int64_t(*)[MT_MAX_NDIM])sh, &map, &err);
  CHECK_MSG(rc == MT_OK, "elementwise map: %s", err.msg);
  return map;
}

static void test_builder_elementwise(void) {
  const tin pairs[][2] = {
      {{2, {8, 8}, {R()}}, {2, {8, 8}, {R()}}},
      {{2, {8, 6}, {R()}}, {1, {6}, {R()}}},
      {{2, {1, 6}, {R()}}, {2, {8, 6}, {R()}}},
      {{3, {4, 1, 6}, {R()}}, {2, {5, 6}, {R()}}},
  };
  for (int kind = 0; kind < MT_ELEMENTWISE_COUNT; ++kind) {
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; ++p) {
      const tin *t = pairs[p];
      int nd[2] = {t[0].ndim, t[1].ndim};
      const int64_t sh[2][4] = {{t[0].shape[0], t[0].shape[1], t[0].shape[2], 0},
                                {t[1].shape[0], t[1].shape[1], t[1].shape[2], 0}};
      mt_dimmap ref = map_elementwise(2, nd, sh, 0);
      reference_rule(kind, 3u, &ref);
      mt_dimmap built = built_elementwise(kind, 2, 3u, 2, t);
      same_decisions(&built, &ref, 2, t);
      for (uint32_t one = 1; one <= 2; ++one) { /* the other operand a scalar */
        const tin *u = &t[one - 1];
        mt_dimmap ref1 = map_elementwise(1, &u->ndim,
                                         (const int64_t(*)[4])(one == 1 ? sh[0] : sh[1]), 0);
        reference_rule(kind, one, &ref1);
        mt_dimmap built1 = built_elementwise(kind, 2, one, 1, u);
        same_decisions(&built1, &ref1, 1, u);
      }
    }
  }
  /* NumPy's message for shapes that do not broadcast. */
  mt_dimmap map;
  mt_error err = {0, ""};
  int nd[2] = {2, 1};
  int64_t sh[2][MT_MAX_NDIM] = {{8, 6}, {3}};
  int rc = mt_dimmap_elementwise(0, 2, 3u, nd, (const int64_t(*)[MT_MAX_NDIM])sh, &map,
                                 &err);
  CHECK(rc == MT_EINVAL &&
        strstr(err.msg, "could not be broadcast together with shapes (8,6) (3,)") != NULL);
  CHECK(mt_dimmap_elementwise(9, 2, 3u, nd, (const int64_t(*)[MT_MAX_NDIM])sh, &map,
                              NULL) == MT_EINVAL);
  CHECK(mt_dimmap_elementwise(0, 2, 4u, nd, (const int64_t(*)[MT_MAX_NDIM])sh, &map,
                              NULL) == MT_EINVAL);
}

static mt_dimmap built_matmul(tin x, tin y, int transpose_b) {
  mt_dimmap map;
  mt_error err = {0, ""};
  int rc = mt_dimmap_matmul(x.ndim, x.shape, y.ndim, y.shape, transpose_b, &map, &err);
  CHECK_MSG(rc == MT_OK, "matmul map: %s", err.msg);
  return map;
}

static void test_builder_matmul(void) {
  const tin pairs[][2] = {
      {{2, {8, 6}, {R()}}, {2, {6, 4}, {R()}}},
      {{3, {2, 8, 6}, {R()}}, {2, {6, 4}, {R()}}},
      {{3, {3, 8, 6}, {R()}}, {3, {1, 6, 4}, {R()}}},
  };
  for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; ++p) {
    const tin *t = pairs[p];
    mt_dimmap ref = map_matmul(t[0].ndim, t[0].shape, t[1].ndim, t[1].shape);
    mt_dimmap built = built_matmul(t[0], t[1], 0);
    same_decisions(&built, &ref, 2, t);
  }
  /* a @ b.T with b held as (4, 6): as a @ (6, 4), its placements transposed. */
  tin x = {2, {8, 6}, {R()}}, w = {2, {4, 6}, {R()}}, wt = {2, {6, 4}, {R()}};
  mt_dimmap lin = built_matmul(x, w, 1);
  mt_dimmap mm = map_matmul(2, x.shape, 2, wt.shape);
  mt_placement px[8];
  for (int a = 0, na = some_placements(2, px); a < na; ++a) {
    for (int b = 0; b < na; ++b) {
      mt_placement pw = px[b], pwt = pw.kind == MT_PLACEMENT_SHARD ? S(1 - pw.dim) : pw;
      tin t1[2] = {x, w}, t2[2] = {x, wt};
      t1[0].pl[0] = t2[0].pl[0] = px[a];
      t1[1].pl[0] = pw, t2[1].pl[0] = pwt;
      mt_prop_inputs i1 = make_inputs(2, t1, 1, MESH2), i2 = make_inputs(2, t2, 1, MESH2);
      mt_prop_result r1 = run(&lin, &i1), r2 = decide(&mm, &i2);
      CHECK(peq(r1.out_placements[0], r2.out_placements[0]) &&
            peq(r1.in_placements[0][0], r2.in_placements[0][0]) &&
            r1.bytes == r2.bytes && r1.messages == r2.messages);
    }
  }
  /* 1-D operands: (6,) @ (6, 4) -> (4,); sharded inner dims give Partial(sum). */
  tin v = {1, {6}, {S(0)}}, m = {2, {6, 4}, {S(0)}};
  mt_dimmap vm = built_matmul(v, m, 0);
  tin t[2] = {v, m};
  mt_prop_inputs in = make_inputs(2, t, 1, MESH2);
  mt_prop_result r = run(&vm, &in);
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.out_ndim == 1 && r.out_shape[0] == 4 && r.bytes == 0);
  tin u = {1, {6}, {S(0)}};
  mt_dimmap vv = built_matmul(v, u, 0);
  t[1] = u;
  in = make_inputs(2, t, 1, MESH2);
  r = run(&vv, &in);
  EXPECT_OUT(r, 2, 1, PSUM);
  CHECK(r.out_ndim == 0);
  mt_dimmap bad;
  mt_error err = {0, ""};
  CHECK(mt_dimmap_matmul(0, NULL, 2, m.shape, 0, &bad, &err) == MT_EINVAL &&
        strstr(err.msg, "at least one dim") != NULL);
  CHECK(mt_dimmap_matmul(2, x.shape, 1, v.shape, 1, &bad, NULL) == MT_EINVAL);
  tin b1 = {3, {3, 8, 6}, {R()}}, b2 = {3, {2, 6, 4}, {R()}};
  CHECK(mt_dimmap_matmul(3, b1.shape, 3, b2.shape, 0, &bad, NULL) == MT_EINVAL);
}

/* The join of np.concatenate: each input's axis is its own whole label, the
 * output's axis as long as theirs together, the other dims shared; the ranks
 * and the other dims must agree, the axis be in range. */
static void test_builder_join(void) {
  const int ndim[3] = {2, 2, 2};
  const int64_t shape[3][MT_MAX_NDIM] = {{4, 3}, {4, 2}, {4, 5}};
  mt_dimmap m;
  mt_error err = {0, ""};
  CHECK_MSG(mt_dimmap_join(3, ndim, shape, 1, &m, &err) == MT_OK, "join: %s", err.msg);
  CHECK(m.ninputs == 3 && m.out_ndim == 2 && m.nlabels == 5);
  CHECK(m.label_kind[0] == MT_LABEL_KEEP && m.label_kind[1] == MT_LABEL_REPLICATE);
  for (int t = 0; t < 3; ++t)
    CHECK(m.in_labels[t][0] == 0 && m.in_labels[t][1] == 2 + t &&
          m.label_kind[2 + t] == MT_LABEL_REPLICATE);
  CHECK(m.sized_labels == 1u << 1 && m.label_size[1] == 10);
  CHECK(m.partial_rule == MT_PARTIAL_ADDITIVE);
  const int64_t other[2][MT_MAX_NDIM] = {{4, 3}, {5, 3}};
  CHECK(mt_dimmap_join(2, ndim, other, 1, &m, &err) == MT_EINVAL &&
        strstr(err.msg, "must match exactly") != NULL);
  const int ranks[2] = {2, 1};
  CHECK(mt_dimmap_join(2, ranks, shape, 0, &m, NULL) == MT_EINVAL);
  CHECK(mt_dimmap_join(2, ndim, shape, 2, &m, NULL) == MT_EINVAL);
  CHECK(mt_dimmap_join(2, ndim, shape, -1, &m, NULL) == MT_EINVAL);
}

/* The stack of np.stack: the inputs' dims shared, the new output dim a whole
 * label as long as the inputs are many, at the axis asked (the last included);
 * the shapes must agree, the axis be in 0..ndim. */
static void test_builder_stack(void) {
  const int ndim[3] = {2, 2, 2};
  const int64_t shape[3][MT_MAX_NDIM] = {{4, 3}, {4, 3}, {4, 3}};
  mt_error err = {0, ""};
  for (int axis = 0; axis <= 2; ++axis) {
    mt_dimmap m;
    CHECK_MSG(mt_dimmap_stack(3, ndim, shape, axis, &m, &err) == MT_OK, "stack: %s", err.msg);
    CHECK(m.ninputs == 3 && m.out_ndim == 3 && m.nlabels == 3);
    CHECK(m.out_labels[axis] == 2 && m.label_kind[2] == MT_LABEL_REPLICATE);
    CHECK(m.sized_labels == 1u << 2 && m.label_size[2] == 3);
    for (int t = 0; t < 3; ++t) CHECK(m.in_labels[t][0] == 0 && m.in_labels[t][1] == 1);
    for (int k = 0, j = 0; k < 3; ++k)
      if (k != axis)
        CHECK(m.out_labels[k] == j++ && m.label_kind[m.out_labels[k]] == MT_LABEL_KEEP);
    CHECK(m.partial_rule == MT_PARTIAL_ADDITIVE);
  }
  mt_dimmap m;
  const int64_t other[2][MT_MAX_NDIM] = {{4, 3}, {4, 2}};
  CHECK(mt_dimmap_stack(2, ndim, other, 0, &m, &err) == MT_EINVAL &&
        strstr(err.msg, "same shape") != NULL);
  const int ranks[2] = {2, 1};
  CHECK(mt_dimmap_stack(2, ranks, shape, 0, &m, NULL) == MT_EINVAL);
  CHECK(mt_dimmap_stack(2, ndim, shape, 3, &m, NULL) == MT_EINVAL);
  CHECK(mt_dimmap_stack(2, ndim, shape, -1, &m, NULL) == MT_EINVAL);
  /* through the op family, as the executor asks */
  const mt_op_sig sig = {MT_OP_STACK, 0, {0, 0, 0, 0, 0}};
  const mt_op_args args = {2, 3u, 1u << 2, 0, 0};
  mt_prop_inputs in;
  memset(&in, 0, sizeof in);
  in.ninputs = 2, in.ndim[0] = in.ndim[1] = 2;
  in.shape[0][0] = in.shape[1][0] = 4, in.shape[0][1] = in.shape[1][1] = 3;
  CHECK(mt_op_dimmap(&sig, &args, &in, MT_DTYPE_FLOAT64, &m, NULL) == MT_OK &&
        m.out_ndim == 3 && m.out_labels[2] == 2 && m.label_size[2] == 2);
}

/* The lanes of np.diff: the input's axis whole, the output's a label of its own,
 * `shorten` shorter and never below 0, the other dims kept; Partials reduced
 * first; the axis in range, `shorten` not negative. */
static void test_builder_lanes(void) {
  const int64_t shape[MT_MAX_NDIM] = {4, 6, 3};
  mt_error err = {0, ""};
  mt_dimmap m;
  CHECK_MSG(mt_dimmap_lanes(3, shape, 1, 2, &m, &err) == MT_OK, "lanes: %s", err.msg);
  CHECK(m.ninputs == 1 && m.out_ndim == 3 && m.nlabels == 4);
  CHECK(m.in_labels[0][1] == 1 && m.label_kind[1] == MT_LABEL_REPLICATE);
  CHECK(m.out_labels[0] == 0 && m.out_labels[1] == 3 && m.out_labels[2] == 2);
  CHECK(m.label_kind[0] == MT_LABEL_KEEP && m.label_kind[2] == MT_LABEL_KEEP);
  CHECK(m.label_kind[3] == MT_LABEL_REPLICATE && m.sized_labels == 1u << 3 &&
        m.label_size[3] == 4);
  CHECK(m.partial_rule == MT_PARTIAL_NONE);
  CHECK(mt_dimmap_lanes(3, shape, 2, 9, &m, NULL) == MT_OK && m.label_size[3] == 0);
  CHECK(mt_dimmap_lanes(3, shape, 3, 1, &m, NULL) == MT_EINVAL);
  CHECK(mt_dimmap_lanes(3, shape, -1, 1, &m, NULL) == MT_EINVAL);
  CHECK(mt_dimmap_lanes(3, shape, 0, -1, &m, NULL) == MT_EINVAL);
  CHECK(mt_dimmap_lanes(0, shape, 0, 1, &m, NULL) == MT_EINVAL);
  /* through the op family, as the executor asks: S(1) of the axis must move. */
  const mt_op_sig sig = {MT_OP_LANES, 0, {-1, 0, 0, 0, 0}};
  const mt_op_args args = {1, 1u, 1u << 1, 0, 1};
  mt_prop_inputs in;
  memset(&in, 0, sizeof in);
  in.ninputs = 1, in.ndim[0] = 2, in.shape[0][0] = 4, in.shape[0][1] = 6;
  CHECK(mt_op_dimmap(&sig, &args, &in, MT_DTYPE_FLOAT64, &m, NULL) == MT_OK &&
        m.out_ndim == 2 && m.label_size[m.out_labels[1]] == 5);
}

/* Field by field: the reference map of map_reduce and the built one. */
static int same_reduction(const mt_dimmap *a, const mt_dimmap *b) {
  int same = a->nlabels == b->nlabels && a->out_ndim == b->out_ndim &&
             a->even_only == b->even_only && a->partial_rule == b->partial_rule &&
             a->sized_labels == b->sized_labels && a->in_ndim[0] == b->in_ndim[0];
  for (int l = 0; same && l < a->nlabels; ++l) {
    same = a->label_kind[l] == b->label_kind[l] &&
           (a->label_kind[l] != MT_LABEL_REDUCE ||
            a->label_reduce_op[l] == b->label_reduce_op[l]);
  }
  for (int d = 0; same && d < a->out_ndim; ++d) same = a->out_labels[d] == b->out_labels[d];
  if (same && a->partial_rule == MT_PARTIAL_SAME_OP) same = a->partial_ops == b->partial_ops;
  return same;
}

static void test_builder_reduction(void) {
  static const mt_reduction_rule rules[4] = {
      {MT_REDUCE_SUM, MT_PARTIAL_LINEAR_ALL, 0, 0, 0},
      {MT_REDUCE_AVG, MT_PARTIAL_LINEAR_ALL, 0, 1, 0},
      {MT_REDUCE_MAX, MT_PARTIAL_SAME_OP, 1u << MT_REDUCE_MAX, 0, 0},
      {-1, MT_PARTIAL_NONE, 0, 0, 0},
  };
  for (int op = 0; op < 4; ++op) {
    for (uint32_t axes = 1; axes < 8; ++axes) {
      for (int keep = 0; keep < 2; ++keep) {
        mt_dimmap built, ref = map_reduce(3, axes, op, keep);
        int rc = mt_dimmap_reduction(&rules[op], 3, axes, keep, MT_DTYPE_FLOAT64, &built, NULL);
        CHECK_MSG(rc == MT_OK && same_reduction(&built, &ref), "op %d axes %u keep %d",
                  op, axes, keep);
      }
    }
  }
  /* max of bool or complex values: the reduced dims may not be sharded. */
  mt_dimmap m;
  CHECK(mt_dimmap_reduction(&rules[2], 2, 1u, 0, MT_DTYPE_BOOL, &m, NULL) == MT_OK);
  CHECK(m.label_kind[0] == MT_LABEL_REPLICATE && m.partial_rule == MT_PARTIAL_NONE);
  CHECK(mt_dimmap_reduction(&rules[2], 2, 1u, 0, MT_DTYPE_COMPLEX128, &m, NULL) == MT_OK);
  CHECK(m.label_kind[0] == MT_LABEL_REPLICATE);
  CHECK(mt_dimmap_reduction(&rules[2], 2, 1u, 0, MT_DTYPE_FLOAT64, &m, NULL) == MT_OK);
  CHECK(m.label_kind[0] == MT_LABEL_REDUCE && m.label_reduce_op[0] == MT_REDUCE_MAX);
  CHECK(mt_dimmap_reduction(&rules[0], 2, 4u, 0, MT_DTYPE_FLOAT64, &m, NULL) == MT_EINVAL);
  /* any and all: a bool Partial(max|min) whatever the input's dtype, bool and
   * complex included; Partial inputs are reduced first. */
  const mt_reduction_rule any = {MT_REDUCE_MAX, MT_PARTIAL_NONE, 0, 0, 1};
  const int dtypes[3] = {MT_DTYPE_BOOL, MT_DTYPE_COMPLEX128, MT_DTYPE_INT8};
  for (int k = 0; k < 3; ++k) {
    CHECK(mt_dimmap_reduction(&any, 2, 3u, 0, dtypes[k], &m, NULL) == MT_OK);
    CHECK_MSG(m.label_kind[0] == MT_LABEL_REDUCE && m.label_kind[1] == MT_LABEL_REDUCE &&
                  m.label_reduce_op[0] == MT_REDUCE_MAX && m.out_ndim == 0 &&
                  m.partial_rule == MT_PARTIAL_NONE && m.empty_identity == 3u,
              "dtype %d", dtypes[k]);
  }
  /* 9 rows over 4 ranks leave one shard empty (3, 3, 3, 0): any's Partial(max)
   * still holds there (False), where max's would have nothing to hold. */
  static const int64_t four[1] = {4};
  tin nine = {2, {9, 3}, {S(0)}};
  mt_prop_inputs in = make_inputs(1, &nine, 1, four);
  CHECK(mt_dimmap_reduction(&any, 2, 3u, 0, MT_DTYPE_BOOL, &m, NULL) == MT_OK);
  mt_prop_result r = run(&m, &in);
  EXPECT_OUT(r, 1, 1, P(MT_REDUCE_MAX));
  CHECK(r.bytes == 0);
  CHECK(mt_dimmap_reduction(&rules[2], 2, 3u, 0, MT_DTYPE_FLOAT64, &m, NULL) == MT_OK);
  r = run(&m, &in);
  CHECK(r.out_placements[0].kind != MT_PLACEMENT_PARTIAL);
}

/* ---- Random cases through the checker. ---- */

static unsigned rng_state = 12345u;

static int rnd(int n) {
  rng_state = rng_state * 1103515245u + 12345u;
  return (int)((rng_state >> 16) % (unsigned)n);
}

static mt_placement random_placement(int ndim) {
  static const int ops[] = {MT_REDUCE_SUM, MT_REDUCE_AVG, MT_REDUCE_MAX};
  int k = rnd(ndim + 2);
  if (k < ndim) return S(k);
  return k == ndim ? R() : P(ops[rnd(3)]);
}

static tin random_tin(int ndim, const int64_t *shape, int mesh_ndim) {
  tin t;
  memset(&t, 0, sizeof t);
  t.ndim = ndim;
  for (int d = 0; d < ndim; ++d) t.shape[d] = shape[d];
  for (int m = 0; m < mesh_ndim; ++m) t.pl[m] = random_placement(ndim);
  return t;
}

static void random_case(int mesh_ndim, const int64_t *mesh) {
  int64_t s[4] = {1 + rnd(9), 1 + rnd(9), 1 + rnd(9), 0};
  int op = rnd(7);
  mt_dimmap map;
  tin t[2];
  if (op < 3) { /* elementwise, the second operand maybe broadcast */
    static const int rules[] = {MT_PARTIAL_LINEAR_ALL, MT_PARTIAL_LINEAR_ONE,
                                MT_PARTIAL_SAME_OP};
    int64_t s2[2] = {rnd(3) == 0 ? 1 : s[0], s[1]};
    t[0] = random_tin(2, s, mesh_ndim), t[1] = random_tin(2, s2, mesh_ndim);
    const int nd[2] = {2, 2};
    const int64_t sh[2][4] = {{s[0], s[1]}, {s2[0], s2[1]}};
    map = map_elementwise(2, nd, sh, op == 0 && rnd(2) ? MT_PARTIAL_ADDITIVE : rules[op]);
    map.partial_inputs = 3, map.partial_ops = 1u << MT_REDUCE_MAX;
  } else if (op == 3) {
    int64_t xs[2] = {s[0], s[1]}, ys[2] = {s[1], s[2]};
    t[0] = random_tin(2, xs, mesh_ndim), t[1] = random_tin(2, ys, mesh_ndim);
    map = map_matmul(2, xs, 2, ys);
  } else if (op == 6) { /* reshape: split, merge or both */
    int k = rnd(4);
    int64_t a = s[0], b = s[1], c = s[2];
    int64_t ins[4][3] = {{a * b, c}, {a, b, c}, {a, b * c}, {a, b, c}};
    int64_t outs[4][3] = {{a, b, c}, {a * b, c}, {a * b, c}, {c, a * b}};
    int nin[4] = {2, 3, 2, 3}, nout[4] = {3, 2, 2, 2};
    t[0] = random_tin(nin[k], ins[k], mesh_ndim);
    map = map_reshape(nin[k], ins[k], nout[k], outs[k]);
  } else {
    t[0] = random_tin(2, s, mesh_ndim);
    map = op == 4 ? map_reduce(2, 1u + (unsigned)rnd(3), rnd(4), rnd(2))
                  : map_softmax(2, rnd(2));
  }
  mt_prop_inputs in = make_inputs(map.ninputs, t, mesh_ndim, mesh);
  mt_prop_result r = run(&map, &in);
  check_oracle(&map, &in, &r);
}

static void test_random(void) {
  static const int64_t meshes[][2] = {{1, 0}, {2, 0}, {3, 0}, {4, 0}, {2, 2},
                                      {2, 3}, {1, 3}, {3, 1}, {4, 2}};
  int n = quick ? 60 : 600;
  for (size_t k = 0; k < sizeof meshes / sizeof meshes[0]; ++k) {
    int mesh_ndim = meshes[k][1] == 0 ? 1 : 2;
    for (int c = 0; c < n; ++c) random_case(mesh_ndim, meshes[k]);
  }
}

/* ---- Errors. ---- */

static mt_dimmap good_map(void) {
  const int nd[2] = {2, 2};
  const int64_t sh[2][4] = {{8, 8}, {8, 8}};
  return map_elementwise(2, nd, sh, MT_PARTIAL_LINEAR_ALL);
}

static void expect_bad_map(mt_dimmap map, const char *needle) {
  mt_error err = {0, ""};
  int rc = mt_dimmap_check(&map, &err);
  CHECK_MSG(rc == MT_EINVAL && err.code == MT_EINVAL && strstr(err.msg, needle) != NULL,
            "rc %d msg '%s' (wanted '%s')", rc, err.msg, needle);
}

static void test_map_errors(void) {
  mt_dimmap m = good_map();
  CHECK(mt_dimmap_check(&m, NULL) == MT_OK);
  CHECK(mt_dimmap_check(NULL, NULL) == MT_EINVAL);
  m.ninputs = MT_PROP_MAX_INPUTS + 1;
  expect_bad_map(m, "inputs");
  m = good_map(), m.ninputs = 0;
  expect_bad_map(m, "inputs");
  m = good_map(), m.nlabels = MT_PROP_MAX_LABELS + 1;
  expect_bad_map(m, "labels");
  m = good_map(), m.in_labels[1][0] = 2;
  expect_bad_map(m, "outside");
  m = good_map(), m.in_labels[0][1] = -1;
  expect_bad_map(m, "outside");
  m = good_map(), m.out_labels[0] = 5;
  expect_bad_map(m, "outside");
  m = good_map(), m.out_labels[1] = 0;
  expect_bad_map(m, "two output dims");
  m = good_map(), m.label_kind[1] = MT_LABEL_CONTRACT;
  expect_bad_map(m, "contracts");
  m = good_map(), m.out_ndim = 1;
  expect_bad_map(m, "KEEP");
  m = good_map(), m.label_kind[0] = 7;
  expect_bad_map(m, "kind");
  m = good_map(), m.out_ndim = 1, m.label_kind[1] = MT_LABEL_REDUCE,
  m.label_reduce_op[1] = MT_REDUCE_COUNT;
  expect_bad_map(m, "unknown op");
  m = good_map(), m.in_bcast[0] = 4u;
  expect_bad_map(m, "in_bcast");
}

static void test_map_errors_masks(void) {
  mt_dimmap m = good_map();
  m.partial_inputs = 4u;
  expect_bad_map(m, "partial_inputs");
  m = good_map(), m.partial_ops = 1u << MT_REDUCE_COUNT;
  expect_bad_map(m, "partial_ops");
  m = good_map(), m.partial_rule = 9;
  expect_bad_map(m, "partial rule");
  m = good_map(), m.even_only = 4u;
  expect_bad_map(m, "even_only");
  m = good_map(), m.sized_labels = 1u, m.label_size[0] = -1;
  expect_bad_map(m, "label_size");
  m = good_map(), m.in_ndim[0] = MT_MAX_NDIM + 1;
  expect_bad_map(m, "dims");
  m = good_map(), m.out_ndim = MT_MAX_NDIM + 1;
  expect_bad_map(m, "output");
  /* An output label no input holds needs a size. */
  m = good_map(), m.nlabels = 3, m.out_ndim = 3, m.out_labels[2] = 2;
  expect_bad_map(m, "no size");
  m.sized_labels = 4u, m.label_size[2] = 5;
  CHECK(mt_dimmap_check(&m, NULL) == MT_OK);
  /* Resized output dims: in range, sized >= 0, on a label an input holds. */
  m = good_map(), m.out_resized = 4u;
  expect_bad_map(m, "out_resized");
  m = good_map(), m.out_resized = 1u, m.out_size[0] = -1;
  expect_bad_map(m, "out_size");
  m.sized_labels = 4u, m.label_size[2] = 5, m.nlabels = 3, m.out_ndim = 3;
  m.out_labels[2] = 2, m.out_resized = 4u, m.out_size[2] = 3, m.out_size[0] = 0;
  expect_bad_map(m, "resized");
}

static void expect_bad_call(const mt_dimmap *map, const mt_prop_inputs *in, int code,
                            const char *needle) {
  mt_error err = {0, ""};
  mt_prop_result res, before;
  memset(&res, 0x5a, sizeof res);
  before = res;
  int rc = mt_propagate(map, in, &res, &err);
  CHECK_MSG(rc == code && strstr(err.msg, needle) != NULL,
            "rc %s msg '%s' (wanted %s '%s')", mt_status_name(rc), err.msg,
            mt_status_name(code), needle);
  CHECK(memcmp(&res, &before, sizeof res) == 0);
}

static void test_call_errors(void) {
  mt_dimmap m = good_map();
  tin t[2] = {t88(S(0)), t88(S(0))};
  mt_prop_inputs in = make_inputs(2, t, 1, MESH2);
  mt_prop_result res;
  CHECK(mt_propagate(&m, &in, &res, NULL) == MT_OK);
  CHECK(mt_propagate(NULL, &in, &res, NULL) == MT_EINVAL);
  CHECK(mt_propagate(&m, NULL, &res, NULL) == MT_EINVAL);
  CHECK(mt_propagate(&m, &in, NULL, NULL) == MT_EINVAL);
  mt_prop_inputs bad = in;
  bad.shape[1][0] = 7;
  expect_bad_call(&m, &bad, MT_EINVAL, "size 7");
  bad = in, bad.ninputs = 3;
  expect_bad_call(&m, &bad, MT_EINVAL, "inputs");
  bad = in, bad.ndim[1] = 1;
  expect_bad_call(&m, &bad, MT_EINVAL, "dims");
  bad = in, bad.itemsize[0] = 0;
  expect_bad_call(&m, &bad, MT_EINVAL, "item size");
  bad = in, bad.out_itemsize = -1;
  expect_bad_call(&m, &bad, MT_EINVAL, "item size");
  bad = in, bad.placements[1][0] = S(2);
  expect_bad_call(&m, &bad, MT_EINDEX, "Input 1");
  bad = in, bad.mesh_ndim = 0;
  expect_bad_call(&m, &bad, MT_EINVAL, "mesh");
  bad = in, bad.mesh_shape[0] = 0;
  expect_bad_call(&m, &bad, MT_EINVAL, "Mesh dim 0");
  /* A broadcast dim must have size 1. */
  mt_dimmap mb = m;
  mb.in_bcast[1] = 1u;
  expect_bad_call(&mb, &in, MT_EINVAL, "broadcasts");
  /* A sized label must agree with the inputs holding it. */
  mt_dimmap ms = m;
  ms.sized_labels = 1u, ms.label_size[0] = 9;
  expect_bad_call(&ms, &in, MT_EINVAL, "sized 9");
  mt_dimmap mk = m;
  mk.ninputs = MT_PROP_MAX_INPUTS + 1;
  expect_bad_call(&mk, &in, MT_EINVAL, "inputs");
}

/* ---- Determinism, the greedy fallback and timing. ---- */

static double now_us(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* 8-d tensors on a 4-d mesh: 9^4 combinations, above MT_PROP_MAX_COMBOS. */
static void test_greedy(void) {
  const int64_t mesh[4] = {2, 2, 2, 2};
  tin a;
  memset(&a, 0, sizeof a);
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = 2, map.nlabels = 8, map.out_ndim = 8;
  map.in_ndim[0] = map.in_ndim[1] = 8;
  for (int d = 0; d < 8; ++d)
    map.in_labels[0][d] = map.in_labels[1][d] = map.out_labels[d] = d;
  mt_prop_inputs in;
  memset(&in, 0, sizeof in);
  in.ninputs = 2, in.mesh_ndim = 4;
  for (int i = 0; i < 2; ++i) {
    in.ndim[i] = 8, in.itemsize[i] = 4;
    for (int d = 0; d < 8; ++d) in.shape[i][d] = 4;
    for (int m = 0; m < 4; ++m) {
      in.mesh_shape[m] = mesh[m];
      in.placements[i][m] = S(i == 0 ? m : (m + 1) % 4);
    }
  }
  in.placements[1][0] = S(0), in.placements[1][1] = S(1);
  in.placements[1][2] = S(2), in.placements[1][3] = S(3);
  double t0 = now_us();
  mt_prop_result r = run(&map, &in);
  double t1 = now_us();
  EXPECT_OUT(r, 2, 4, S(0), S(1), S(2), S(3));
  CHECK(r.bytes == 0);
  in.placements[1][3] = S(7);
  r = run(&map, &in);
  CHECK(r.bytes > 0);
  if (trace) printf("greedy 8-d on (2,2,2,2): %.1f us\n", t1 - t0);
  (void)a;
}

static void time_one(const char *what, const mt_dimmap *map, const mt_prop_inputs *in) {
  int n = quick ? 20 : strstr(what, "(64,64)") != NULL ? 20 : 10000;
  mt_prop_result r;
  double t0 = now_us();
  for (int k = 0; k < n; ++k) CHECK(mt_propagate(map, in, &r, NULL) == MT_OK);
  double t1 = now_us();
  if (trace) printf("%s: %.2f us per decision (%d runs)\n", what, (t1 - t0) / n, n);
}

static void test_timing(void) {
  const int64_t m22[2] = {2, 2};
  tin x = {2, {8, 8}, {S(0), R()}}, y = {2, {8, 8}, {R(), S(1)}};
  tin t[2] = {x, y};
  mt_dimmap mm = map_matmul(2, x.shape, 2, y.shape);
  mt_prop_inputs in = make_inputs(2, t, 2, m22);
  time_one("matmul (2,2) [S0,R]@[R,S1], no comm", &mm, &in);
  t[0].pl[0] = S(1), t[0].pl[1] = S(0), t[1].pl[0] = S(1), t[1].pl[1] = S(0);
  in = make_inputs(2, t, 2, m22);
  time_one("matmul (2,2) [S1,S0]@[S1,S0], comm", &mm, &in);
  tin big[2] = {{2, {2048, 2048}, {S(1), S(0)}}, {2, {2048, 2048}, {S(1), S(0)}}};
  in = make_inputs(2, big, 2, m22);
  time_one("matmul (2,2) 2048^2 [S1,S0]@[S1,S0], comm", &mm, &in);
  /* A simulated 64 x 64 mesh: every layout walks 4,096 ranks. */
  const int64_t m64[2] = {64, 64};
  tin h[2] = {{2, {4096, 4096}, {S(1), S(0)}}, {2, {4096, 4096}, {S(1), S(0)}}};
  in = make_inputs(2, h, 2, m64);
  time_one("matmul (64,64) 4096^2 [S1,S0]@[S1,S0], comm", &mm, &in);
  const int nd[2] = {2, 2};
  const int64_t sh[2][4] = {{8, 8}, {8, 8}};
  mt_dimmap add = map_elementwise(2, nd, sh, MT_PARTIAL_LINEAR_ALL);
  tin e[2] = {t88(S(0)), t88(S(0))};
  in = make_inputs(2, e, 1, MESH2);
  time_one("add (2) [S0]+[S0]", &add, &in);
  e[1] = t88(S(1));
  in = make_inputs(2, e, 1, MESH2);
  time_one("add (2) [S0]+[S1], comm", &add, &in);
}

/* x * x of a Partial x: the engine knows the two inputs are one tensor, so
 * moving both to one layout is one move, priced once; it beats reducing one and
 * keeping the other Partial (the same bytes now, and no Partial left to reduce). */
static void test_partial_multiply_alias(void) {
  tin t[2] = {t88(PSUM), t88(PSUM)};
  const int nd[2] = {2, 2};
  const int64_t shapes[2][4] = {{8, 8}, {8, 8}};
  mt_dimmap map = map_elementwise(2, nd, shapes, MT_PARTIAL_LINEAR_ONE);
  map.partial_inputs = 3;
  mt_prop_inputs in = make_inputs(2, t, 1, MESH2);
  mt_prop_result apart = run(&map, &in);
  in.alias[1] = 1;
  mt_prop_result one = run(&map, &in);
  const mt_placement *p0 = &one.in_placements[0][0], *p1 = &one.in_placements[1][0];
  CHECK(p0->kind == p1->kind && p0->dim == p1->dim && p0->reduce_op == p1->reduce_op);
  CHECK(one.in_placements[0][0].kind != MT_PLACEMENT_PARTIAL);
  CHECK(one.out_placements[0].kind != MT_PLACEMENT_PARTIAL);
  CHECK(one.bytes <= apart.bytes && one.bytes > 0);
  /* An alias must be an earlier input of the same layout. */
  in.placements[1][0] = R();
  expect_bad_call(&map, &in, MT_EINVAL, "same tensor");
}

int main(int argc, char **argv) {
  const char *q = getenv("MT_TEST_QUICK");
  quick = (argc > 1 && strcmp(argv[1], "--quick") == 0) || (q != NULL && q[0] == '1');
  trace = getenv("MPITENSOR_TRACE") != NULL;
  test_elementwise();
  test_partial_rules();
  test_partial_additive();
  test_partial_unary_kinds();
  test_partial_dtypes();
  test_partial_multiply();
  test_gradient_way_back();
  test_torch_decision_caps_bytes();
  test_output_way_out();
  test_partial_other();
  test_partial_multiply_alias();
  test_matmul();
  test_timed_candidates();
  test_batch_matmul();
  test_reductions();
  test_mean_std();
  test_softmax();
  test_meshes_2d();
  test_size1_mesh_dims();
  test_small_dims();
  test_new_dims();
  test_reshape();
  test_builder_elementwise();
  test_builder_matmul();
  test_builder_join();
  test_builder_stack();
  test_builder_lanes();
  test_builder_reduction();
  test_random();
  test_map_errors();
  test_map_errors_masks();
  test_call_errors();
  test_greedy();
  test_timing();
  return mt_test_exit("test_prop");
}
