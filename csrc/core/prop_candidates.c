/* The candidates of one mesh dim: all Replicate, one per label the mesh dim may
 * shard, and the Partial pass-throughs the op's rule allows, each saying what
 * every input needs there and what the output gets. */
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/prop.h"
#include "prop-private.h"

static int even_only(const mt_dimmap *map, int l) {
  return bit(map->even_only, l) || (map->label_kind[l] == MT_LABEL_REDUCE &&
                                    map->label_reduce_op[l] == MT_REDUCE_AVG);
}

/* Whether a shard of label l may be empty: a kept label leaves an output shard
 * empty (as its inputs already are), and a contraction or a sum or product over
 * an empty shard is its identity (0 or 1), which the pending Partial adds or
 * multiplies in harmlessly; so are all's and any's (empty_identity). Max and min
 * have no such value, and an average weighs its shards equally, so those need an
 * element in every shard. */
static int may_be_empty(const mt_dimmap *map, int l) {
  int kind = map->label_kind[l], op = map->label_reduce_op[l];
  return kind == MT_LABEL_KEEP || kind == MT_LABEL_CONTRACT ||
         (kind == MT_LABEL_REDUCE && (op == MT_REDUCE_SUM || op == MT_REDUCE_PRODUCT ||
                                      bit(map->empty_identity, l)));
}

/* Whether label l may be cut into `shards` chunks: even_only labels need equal
 * shards, and labels that may not leave a shard empty need an element in each. */
int mt__prop_fits(const mt__engine *e, int l, int64_t shards) {
  /* torch.chunk's rule cuts chunks of ceil(n/k): 4 over 3 is 2, 2, 0, so n >= k
   * does not make every shard non-empty; the last one is when (k-1) chunks leave
   * some of n over. */
  if (!may_be_empty(e->map, l) &&
      (e->size[l] < shards ||
       sat_mul((e->size[l] + shards - 1) / shards, shards - 1) >= e->size[l]))
    return 0;
  return !even_only(e->map, l) || e->size[l] % shards == 0;
}

static mt__cand *new_cand(mt__dim_cands *dc, int kind, int label) {
  mt__cand *c = &dc->c[dc->n++];
  memset(c, 0, sizeof *c);
  c->kind = kind;
  c->label = label;
  c->out = replicate();
  for (int i = 0; i < MT_PROP_MAX_INPUTS; ++i) c->in[i] = replicate();
  return c;
}

static void add_label(const mt__engine *e, mt__dim_cands *dc, int l) {
  mt__cand *c = new_cand(dc, MT__CAND_LABEL, l);
  for (int i = 0; i < e->ninputs; ++i) {
    if (e->dim_of[i][l] >= 0) c->in[i] = shard(e->dim_of[i][l]);
  }
  int kind = e->map->label_kind[l];
  c->creates = kind != MT_LABEL_KEEP;
  if (kind == MT_LABEL_KEEP)
    c->out = shard(e->out_pos[l]);
  else
    c->out =
        partial(kind == MT_LABEL_CONTRACT ? MT_REDUCE_SUM : e->map->label_reduce_op[l]);
}

/* Every input keeps Partial `p` on this mesh dim, and so does the output. */
static void add_keep_all(const mt__engine *e, mt__dim_cands *dc, mt_placement p) {
  mt__cand *c = new_cand(dc, MT__CAND_PARTIAL, -1);
  for (int i = 0; i < e->ninputs; ++i) c->in[i] = p;
  c->out = p;
}

/* Whether every input carries Partial(op) on mesh dim m. */
static int all_partial(const mt__engine *e, int m, int op) {
  mt_placement p = partial(op);
  for (int i = 0; i < e->ninputs; ++i) {
    if (!placement_eq(&e->cur[i].placements[m], &p)) return 0;
  }
  return 1;
}

static int linear(int op) {
  return op == MT_REDUCE_SUM || op == MT_REDUCE_AVG;
}

/* Whether some input carries Partial(op) on mesh dim m. */
static int any_partial(const mt__engine *e, int m, int op) {
  mt_placement p = partial(op);
  for (int i = 0; i < e->ninputs; ++i) {
    if (placement_eq(&e->cur[i].placements[m], &p)) return 1;
  }
  return 0;
}

/* Whether every input is Partial(sum) or Replicate on mesh dim m: only those can
 * be Partial(sum) (a Shard or another Partial cannot become one, and on a mesh
 * dim of size 1 such a change would look free). */
static int sum_or_replicate(const mt__engine *e, int m) {
  mt_placement p = partial(MT_REDUCE_SUM);
  for (int i = 0; i < e->ninputs; ++i) {
    const mt_placement *c = &e->cur[i].placements[m];
    if (!placement_eq(c, &p) && c->kind != MT_PLACEMENT_REPLICATE) return 0;
  }
  return 1;
}

/* The ADDITIVE rule's candidates on mesh dim m (prop.h): at most two, since
 * input 0 carries one op and a sum with an avg gives two. */
static void add_additive(const mt__engine *e, mt__dim_cands *dc, int m) {
  mt_placement p0 = e->cur[0].placements[m];
  /* First, so that a tie keeps input 0's, as torch's order of rules does. */
  if (e->ninputs == 2 && p0.kind == MT_PLACEMENT_PARTIAL &&
      (p0.reduce_op == MT_REDUCE_MAX || p0.reduce_op == MT_REDUCE_MIN)) {
    mt__cand *c = new_cand(dc, MT__CAND_PARTIAL, -1);
    c->in[0] = p0;
    c->out = p0;
  }
  if (any_partial(e, m, MT_REDUCE_SUM) && sum_or_replicate(e, m))
    add_keep_all(e, dc, partial(MT_REDUCE_SUM));
  if (any_partial(e, m, MT_REDUCE_AVG)) {
    mt_placement p = partial(MT_REDUCE_AVG);
    mt__cand *c = new_cand(dc, MT__CAND_PARTIAL, -1);
    for (int i = 0; i < e->ninputs; ++i) {
      if (placement_eq(&e->cur[i].placements[m], &p)) c->in[i] = p;
    }
    c->out = p;
  }
}

/* NEGATE (prop.h): one candidate for input 0's Partial. */
static void add_negate(const mt__engine *e, mt__dim_cands *dc, int m) {
  mt_placement p = e->cur[0].placements[m];
  if (p.kind != MT_PLACEMENT_PARTIAL || p.reduce_op == MT_REDUCE_PRODUCT) return;
  mt__cand *c = new_cand(dc, MT__CAND_PARTIAL, -1);
  c->in[0] = p;
  c->out = p.reduce_op == MT_REDUCE_MAX   ? partial(MT_REDUCE_MIN)
           : p.reduce_op == MT_REDUCE_MIN ? partial(MT_REDUCE_MAX)
                                          : p;
}

/* MONOTONE (prop.h): at most two candidates, one per order op carried. */
static void add_monotone(const mt__engine *e, mt__dim_cands *dc, int m) {
  static const int ops[2] = {MT_REDUCE_MAX, MT_REDUCE_MIN};
  for (int k = 0; k < 2; ++k) {
    mt_placement p = partial(ops[k]);
    int all = bit(e->map->partial_ops, ops[k]), kept = 0;
    mt__cand c;
    memset(&c, 0, sizeof c);
    for (int i = 0; i < e->ninputs; ++i) {
      c.in[i] = replicate();
      if (placement_eq(&e->cur[i].placements[m], &p) && (all || kept == 0))
        c.in[i] = p, ++kept;
    }
    if (kept == 0) continue;
    mt__cand *n = new_cand(dc, MT__CAND_PARTIAL, -1);
    memcpy(n->in, c.in, sizeof c.in);
    n->out = p;
  }
}

/* The Partial pass-throughs the op's rule allows for mesh dim m. */
static void add_partials(const mt__engine *e, mt__dim_cands *dc, int m) {
  const mt_dimmap *map = e->map;
  if (map->partial_rule == MT_PARTIAL_ADDITIVE) {
    add_additive(e, dc, m);
    return;
  }
  if (map->partial_rule == MT_PARTIAL_NEGATE) {
    add_negate(e, dc, m);
    return;
  }
  if (map->partial_rule == MT_PARTIAL_MONOTONE) {
    add_monotone(e, dc, m);
    return;
  }
  mt_placement p0 = e->cur[0].placements[m];
  int op = p0.reduce_op, p0_partial = p0.kind == MT_PLACEMENT_PARTIAL;
  if (map->partial_rule == MT_PARTIAL_LINEAR_ALL && p0_partial && linear(op) &&
      all_partial(e, m, op))
    add_keep_all(e, dc, p0);
  if (map->partial_rule == MT_PARTIAL_SAME_OP && p0_partial &&
      bit(map->partial_ops, op) && all_partial(e, m, op))
    add_keep_all(e, dc, p0);
  if (map->partial_rule != MT_PARTIAL_LINEAR_ONE) return;
  for (int i = 0; i < e->ninputs; ++i) {
    mt_placement p = e->cur[i].placements[m];
    if (!bit(map->partial_inputs, i) || p.kind != MT_PLACEMENT_PARTIAL ||
        !linear(p.reduce_op))
      continue;
    mt__cand *c = new_cand(dc, MT__CAND_PARTIAL, -1);
    c->in[i] = p;
    c->out = p;
  }
}

/* Whether candidate c keeps on some input a Partial that the op's dtypes do not
 * keep exact there (mt_dimmap.reduce_first). */
static int inexact(const mt__engine *e, const mt__cand *c) {
  for (int i = 0; i < e->ninputs; ++i) {
    const mt_placement *p = &c->in[i];
    if (p->kind == MT_PLACEMENT_PARTIAL && bit(e->map->reduce_first[i], p->reduce_op))
      return 1;
  }
  return 0;
}

/* Drops the candidates from `first` on that keep an inexact Partial: those
 * inputs are reduced first instead, by the candidates that remain. */
static void drop_inexact(const mt__engine *e, mt__dim_cands *dc, int first) {
  int n = first;
  for (int k = first; k < dc->n; ++k)
    if (!inexact(e, &dc->c[k])) dc->c[n++] = dc->c[k];
  dc->n = n;
}

/* Numbers each input's distinct needed placements on one mesh dim. */
static void assign_variants(const mt__engine *e, mt__dim_cands *dc) {
  for (int i = 0; i < e->ninputs; ++i) {
    int nv = 0;
    for (int k = 0; k < dc->n; ++k) {
      const mt_placement *p = &dc->c[k].in[i];
      int v = 0;
      while (v < nv && !placement_eq(&dc->variants[i][v], p)) ++v;
      if (v == nv) dc->variants[i][nv++] = *p;
      dc->c[k].variant[i] = v;
    }
    dc->nvariants[i] = nv;
  }
}

/* How many inputs already hold on mesh dim m what candidate c needs there. */
static int held_now(const mt__engine *e, int m, const mt__cand *c) {
  int n = 0;
  for (int i = 0; i < e->ninputs; ++i)
    n += placement_eq(&c->in[i], &e->cur[i].placements[m]);
  return n;
}

/* Whether `a` goes before `b` on a mesh dim of size 1: the one more inputs hold
 * now, then one creating no Partial, then one keeping a Shard. */
static int first_on_one(const mt__engine *e, int m, const mt__cand *a,
                        const mt__cand *b) {
  int ha = held_now(e, m, a), hb = held_now(e, m, b);
  if (ha != hb) return ha > hb;
  if (a->creates != b->creates) return b->creates;
  return a->out.kind == MT_PLACEMENT_SHARD && b->out.kind != MT_PLACEMENT_SHARD;
}

/* A mesh dim of size 1 holds every input whole, so all its candidates are free
 * and the earliest wins a tie: a stable sort puts first what the inputs already
 * have, so a Shard stays a Shard there, as in torch. */
static void order_on_one(const mt__engine *e, int m, mt__dim_cands *dc) {
  for (int k = 1; k < dc->n; ++k) {
    mt__cand c = dc->c[k];
    int j = k;
    for (; j > 0 && first_on_one(e, m, &c, &dc->c[j - 1]); --j) dc->c[j] = dc->c[j - 1];
    dc->c[j] = c;
  }
}

/* The candidates of mesh dim m. */
void mt__prop_build_dim(const mt__engine *e, int m, mt__dim_cands *dc) {
  int64_t g = e->in->mesh_shape[m];
  dc->n = 0;
  new_cand(dc, MT__CAND_REPLICATE, -1);
  for (int l = 0; l < e->map->nlabels; ++l) {
    if (e->shardable[l] && mt__prop_fits(e, l, g)) add_label(e, dc, l);
  }
  int first = dc->n;
  add_partials(e, dc, m);
  /* One rank's Partial is the value itself, which any rewrite keeps. */
  if (g == 1) order_on_one(e, m, dc);
  else drop_inexact(e, dc, first);
  assign_variants(e, dc);
}
