/* Sharding propagation: one engine for every op described as a dim map. It lists
 * candidate placements per mesh dim, combines them over the mesh, prices each
 * combination with the redistribution planner and keeps the cheapest (prop.h
 * gives the rules and the order of preference).
 *
 * Pricing is the expensive part (mt_plan_create_timed allocates, and a direct
 * exchange's price walks the ranks), so it is done as little as possible:
 * - On one mesh dim an input needs only a few distinct placements over all the
 *   candidates (its "variants"). The layout an input needs under a combination is
 *   then a mixed-radix number of variants, which indexes a memo of its price, so
 *   each distinct layout is classified and planned at most once per call.
 * - A layout that only cuts replicated mesh dims inside the input's existing cuts
 *   moves nothing: it is free without a plan.
 * - Needing no communication beats any cost, and whether a layout communicates is
 *   answered without planning (a Partial reduced, or a rank missing part of its
 *   box). A first pass therefore looks only for combinations that communicate
 *   nowhere; plans are made only when every combination communicates.
 * - Then each combination gets lower bounds from the same count (mt__lack, the
 *   planner's walk: elements ranks lack, ranks that lack any, the most one rank
 *   lacks, collectives for the Partials reduced, and from those a time), and
 *   combinations are planned in order of their bounds
 *   until no bound left can beat the best found: first for the reference
 *   pricing (bytes and messages), whose bytes cap the second search, for time.
 *   A (2,2)-mesh matmul that must communicate plans a handful of layouts instead
 *   of all of them; the two searches share the memo, so nothing is planned twice.
 * Allocation: one block of candidates, one memo and one list of bounds per call,
 * plus the plans priced, each freed at once. */
#include "mpitensor/prop.h"

#include <assert.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/layout.h"
#include "mpitensor/plan.h"
#include "mpitensor/status.h"
#include "mpitensor/timemodel.h"

/* All Replicate, one per shardable label, one per input for LINEAR_ONE. */
#define MAX_CANDS (1 + MT_PROP_MAX_LABELS + MT_PROP_MAX_INPUTS)

/* Planning and the count of what ranks lack may visit every rank; MPI numbers
 * ranks with an int, so no larger mesh exists. */
#define MAX_MESH_NUMEL ((int64_t)INT32_MAX)

enum { CAND_REPLICATE, CAND_LABEL, CAND_PARTIAL };

/* One candidate on one mesh dim: what each input needs there and what the
 * output gets. `creates` marks an output Partial the op makes (CONTRACT, REDUCE),
 * which must be reduced some day; a kept Partial was already pending. */
typedef struct cand {
  int kind;
  int label;
  int creates;
  mt_placement out;
  mt_placement in[MT_PROP_MAX_INPUTS];
  int variant[MT_PROP_MAX_INPUTS];
} cand;

typedef struct dim_cands {
  int n;
  int nvariants[MT_PROP_MAX_INPUTS];
  mt_placement variants[MT_PROP_MAX_INPUTS][MAX_CANDS];
  cand c[MAX_CANDS];
} dim_cands;

/* What is known of one layout an input may need. COMM: it communicates, not yet
 * planned, with a lower bound of its cost. DONE: planned (or free). INVALID: the
 * planner refused it. */
enum { PRICE_UNKNOWN = 0, PRICE_COMM, PRICE_DONE, PRICE_INVALID };

typedef struct price {
  int state;
  int64_t bytes;
  int64_t messages;
  double time;
  int64_t lb_bytes;
  int64_t lb_messages;
  double lb_time;
} price;

/* A combination (its row-major number over mesh dims) and a lower bound of its
 * cost. */
typedef struct bounded {
  int64_t lb;
  int64_t lb_bytes;
  double lb_time;
  int64_t idx;
} bounded;

/* A combination's standing: communicates at all, then (among those that do not)
 * how many input placements on mesh dims of size > 1 it changes, the cost of the
 * redistributions it needs now, the estimated cost of reducing later the Partials
 * it creates, then the bytes and messages moved now. The later reduction only
 * breaks ties: the rule is to move no more than torch's decision for this op, and
 * torch prices its strategies by what they move now. */
typedef struct score {
  int comm;
  int changes;
  int64_t cost;
  int64_t later;
  int64_t bytes;
  int64_t messages;
  double time;
  double later_time;  /* the later reductions' messages and bytes on the wire */
  double later_local; /* and their local pass, which reducing now pays in `time` */
} score;

typedef struct engine {
  const mt_dimmap *map;
  const mt_prop_inputs *in;
  int ninputs;
  int mesh_ndim;
  int64_t mesh_numel;
  int64_t out_itemsize;
  mt_layout cur[MT_PROP_MAX_INPUTS];
  int64_t size[MT_PROP_MAX_LABELS];
  int out_pos[MT_PROP_MAX_LABELS];
  int dim_of[MT_PROP_MAX_INPUTS][MT_PROP_MAX_LABELS]; /* -1: absent or broadcast */
  int shardable[MT_PROP_MAX_LABELS];
  int64_t out_shape[MT_MAX_NDIM];
  int64_t out_numel;
  dim_cands *dims;
  price *memo[MT_PROP_MAX_INPUTS]; /* NULL: not memoised (greedy search) */
  int64_t stride[MT_PROP_MAX_INPUTS][MT_MAX_MESH_NDIM];
  price *memo_block;
  const mt_time_model *model; /* what plans and candidates are timed by */
  int plan_rc; /* the first planning failure, reported if nothing is valid */
  mt_error plan_err;
} engine;

const char *mt_reduce_op_name(int op) {
  static const char *const names[MT_REDUCE_COUNT] = {"sum", "avg", "product", "max", "min"};
  return op >= 0 && op < MT_REDUCE_COUNT ? names[op] : NULL;
}

/* ---- Arithmetic and placements. ---- */

/* Costs saturate: a sum too large for int64 is simply the worst cost. */
static int64_t sat_add(int64_t a, int64_t b) {
  return a > INT64_MAX - b ? INT64_MAX : a + b;
}

static int64_t sat_mul(int64_t a, int64_t b) {
  return a != 0 && b > INT64_MAX / a ? INT64_MAX : a * b;
}

static int bit(uint32_t mask, int i) {
  return (int)((mask >> i) & 1u);
}

/* The mask of bits 0 .. n-1, for range checks of bitmasks. */
static uint32_t low_bits(int n) {
  return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

/* ---- Checking a dim map. ---- */

static int check_counts(const mt_dimmap *map, mt_error *err) {
  if (map->ninputs < 1 || map->ninputs > MT_PROP_MAX_INPUTS)
    return mt__fail(err, MT_EINVAL, "A dim map has 1 to %d inputs, got %d",
                    MT_PROP_MAX_INPUTS, map->ninputs);
  if (map->nlabels < 0 || map->nlabels > MT_PROP_MAX_LABELS)
    return mt__fail(err, MT_EINVAL, "A dim map has 0 to %d labels, got %d",
                    MT_PROP_MAX_LABELS, map->nlabels);
  if (map->out_ndim < 0 || map->out_ndim > MT_MAX_NDIM)
    return mt__fail(err, MT_EINVAL, "The output may have 0 to %d dims, got %d",
                    MT_MAX_NDIM, map->out_ndim);
  for (int i = 0; i < map->ninputs; ++i) {
    if (map->in_ndim[i] < 0 || map->in_ndim[i] > MT_MAX_NDIM)
      return mt__fail(err, MT_EINVAL, "Input %d may have 0 to %d dims, got %d", i,
                      MT_MAX_NDIM, map->in_ndim[i]);
    if (map->in_bcast[i] & ~low_bits(map->in_ndim[i]))
      return mt__fail(err, MT_EINVAL,
                      "in_bcast[%d] marks dims beyond the input's %d dims", i,
                      map->in_ndim[i]);
  }
  return MT_OK;
}

static int check_masks(const mt_dimmap *map, mt_error *err) {
  if (map->partial_rule < MT_PARTIAL_NONE || map->partial_rule > MT_PARTIAL_MONOTONE)
    return mt__fail(err, MT_EINVAL, "Unknown partial rule %d", map->partial_rule);
  if (map->partial_inputs & ~low_bits(map->ninputs))
    return mt__fail(err, MT_EINVAL, "partial_inputs names inputs beyond the %d inputs",
                    map->ninputs);
  if (map->partial_ops & ~low_bits(MT_REDUCE_COUNT))
    return mt__fail(err, MT_EINVAL, "partial_ops names unknown reduce ops");
  if ((map->even_only | map->sized_labels) & ~low_bits(map->nlabels))
    return mt__fail(err, MT_EINVAL,
                    "even_only or sized_labels names labels beyond the %d labels",
                    map->nlabels);
  for (int l = 0; l < map->nlabels; ++l) {
    if (bit(map->sized_labels, l) && map->label_size[l] < 0)
      return mt__fail(err, MT_EINVAL, "label_size[%d] is %" PRId64 "; it must be >= 0",
                      l, map->label_size[l]);
  }
  if (map->out_resized & ~low_bits(map->out_ndim))
    return mt__fail(err, MT_EINVAL, "out_resized names dims beyond the output's %d dims",
                    map->out_ndim);
  for (int d = 0; d < map->out_ndim; ++d) {
    if (bit(map->out_resized, d) && map->out_size[d] < 0)
      return mt__fail(err, MT_EINVAL, "out_size[%d] is %" PRId64 "; it must be >= 0", d,
                      map->out_size[d]);
  }
  return MT_OK;
}

static int check_kinds(const mt_dimmap *map, mt_error *err) {
  for (int l = 0; l < map->nlabels; ++l) {
    int kind = map->label_kind[l], op = map->label_reduce_op[l];
    if (kind < MT_LABEL_KEEP || kind > MT_LABEL_REPLICATE)
      return mt__fail(err, MT_EINVAL,
                      "Label %d has kind %d, not KEEP, CONTRACT, REDUCE or REPLICATE",
                      l, kind);
    if (kind == MT_LABEL_REDUCE && (op < 0 || op >= MT_REDUCE_COUNT))
      return mt__fail(err, MT_EINVAL, "Label %d reduces with unknown op %d", l, op);
  }
  return MT_OK;
}

static int check_input_labels(const mt_dimmap *map, uint32_t *held, mt_error *err) {
  *held = 0;
  for (int i = 0; i < map->ninputs; ++i) {
    for (int d = 0; d < map->in_ndim[i]; ++d) {
      int l = map->in_labels[i][d];
      if (l < 0 || l >= map->nlabels)
        return mt__fail(err, MT_EINVAL, "Input %d dim %d has label %d, outside [0, %d)",
                        i, d, l, map->nlabels);
      *held |= 1u << l;
    }
  }
  return MT_OK;
}

static int check_output_labels(const mt_dimmap *map, uint32_t held, uint32_t *out,
                               mt_error *err) {
  *out = 0;
  for (int d = 0; d < map->out_ndim; ++d) {
    int l = map->out_labels[d];
    if (l < 0 || l >= map->nlabels)
      return mt__fail(err, MT_EINVAL, "Output dim %d has label %d, outside [0, %d)", d,
                      l, map->nlabels);
    int kind = map->label_kind[l];
    if (kind != MT_LABEL_KEEP && kind != MT_LABEL_REPLICATE)
      return mt__fail(err, MT_EINVAL,
                      "Output dim %d has label %d, which the op %s away; output "
                      "labels are KEEP or REPLICATE",
                      d, l, kind == MT_LABEL_CONTRACT ? "contracts" : "reduces");
    if (bit(*out, l))
      return mt__fail(err, MT_EINVAL, "Label %d labels two output dims", l);
    if (!bit(held, l) && !bit(map->sized_labels, l))
      return mt__fail(err, MT_EINVAL,
                      "Output label %d has no size: no input holds it and it is not "
                      "in sized_labels",
                      l);
    if (bit(map->out_resized, d) && (!bit(held, l) || bit(map->sized_labels, l)))
      return mt__fail(err, MT_EINVAL,
                      "Output dim %d is resized, so its label %d must be held by an "
                      "input and not be in sized_labels",
                      d, l);
    *out |= 1u << l;
  }
  return MT_OK;
}

int mt_dimmap_check(const mt_dimmap *map, mt_error *err) {
  if (map == NULL) return mt__fail(err, MT_EINVAL, "The dim map is required");
  uint32_t held = 0, out = 0;
  int rc = check_counts(map, err);
  if (rc == MT_OK) rc = check_masks(map, err);
  if (rc == MT_OK) rc = check_kinds(map, err);
  if (rc == MT_OK) rc = check_input_labels(map, &held, err);
  if (rc == MT_OK) rc = check_output_labels(map, held, &out, err);
  for (int l = 0; rc == MT_OK && l < map->nlabels; ++l) {
    if (map->label_kind[l] == MT_LABEL_KEEP && !bit(out, l))
      rc = mt__fail(err, MT_EINVAL,
                    "Label %d is KEEP but labels no output dim (a dim the op removes "
                    "is CONTRACT, REDUCE or REPLICATE)",
                    l);
  }
  return rc;
}

/* ---- Loading the inputs. ---- */

/* Validates input i into e->cur[i]; the message names the input. */
static int load_input(engine *e, int i, mt_error *err) {
  const mt_prop_inputs *in = e->in;
  if (in->ndim[i] != e->map->in_ndim[i])
    return mt__fail(err, MT_EINVAL, "Input %d has %d dims but the dim map labels %d", i,
                    in->ndim[i], e->map->in_ndim[i]);
  if (in->itemsize[i] < 1)
    return mt__fail(err, MT_EINVAL,
                    "Input %d has item size %" PRId64 "; it must be >= 1", i,
                    in->itemsize[i]);
  int rc = mt_layout_init(&e->cur[i], in->ndim[i], in->shape[i], in->mesh_ndim,
                          in->mesh_shape, in->placements[i], err);
  if (rc == MT_OK || err == NULL) return rc;
  char msg[MT_ERROR_LEN];
  memcpy(msg, err->msg, sizeof msg);
  msg[MT_ERROR_LEN - 1] = '\0';
  return mt__fail(err, rc, "Input %d: %s", i, msg);
}

/* Input i's alias, if any, is an earlier input of the same layout and item size. */
static int check_alias(const engine *e, int i, mt_error *err) {
  int j = e->in->alias[i] - 1;
  if (j < 0) return MT_OK;
  const mt_layout *a = &e->cur[i], *b = &e->cur[j];
  int same = j < i && a->ndim == b->ndim && e->in->itemsize[i] == e->in->itemsize[j] &&
             memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape) == 0;
  for (int m = 0; same && m < a->mesh_ndim; ++m)
    same = placement_eq(&a->placements[m], &b->placements[m]);
  if (!same)
    return mt__fail(err, MT_EINVAL, "Input %d is given as the same tensor as input %d, "
                    "but their layouts differ", i, j);
  return MT_OK;
}

static int load_inputs(engine *e, mt_error *err) {
  const mt_prop_inputs *in = e->in;
  if (in->ninputs != e->map->ninputs)
    return mt__fail(err, MT_EINVAL, "%d inputs were given to an op of %d inputs",
                    in->ninputs, e->map->ninputs);
  if (in->out_itemsize < 0)
    return mt__fail(err, MT_EINVAL, "The output item size is %" PRId64,
                    in->out_itemsize);
  e->ninputs = in->ninputs;
  e->out_itemsize = in->out_itemsize;
  for (int i = 0; i < e->ninputs; ++i) {
    int rc = load_input(e, i, err);
    if (rc == MT_OK) rc = check_alias(e, i, err);
    if (rc != MT_OK) return rc;
    if (in->itemsize[i] > e->out_itemsize && in->out_itemsize == 0)
      e->out_itemsize = in->itemsize[i];
  }
  e->mesh_ndim = in->mesh_ndim;
  e->mesh_numel = 1;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    e->mesh_numel *= in->mesh_shape[m];
    if (e->mesh_numel > MAX_MESH_NUMEL)
      return mt__fail(err, MT_EINVAL, "The mesh has more than %" PRId64 " ranks",
                      MAX_MESH_NUMEL);
  }
  return MT_OK;
}

/* Records input i dim d as holding label l (of size `n`), or fails when an
 * earlier holder disagrees. `from` remembers the first holder for the message. */
static int hold_label(engine *e, int i, int d, int (*from)[2], mt_error *err) {
  int l = e->map->in_labels[i][d];
  int64_t n = e->in->shape[i][d];
  if (bit(e->map->in_bcast[i], d)) {
    if (n == 1) return MT_OK;
    return mt__fail(err, MT_EINVAL,
                    "Input %d dim %d broadcasts, so its size must be 1, not %" PRId64,
                    i, d, n);
  }
  e->dim_of[i][l] = e->dim_of[i][l] == -1 ? d : -2; /* -2: repeated */
  if (e->size[l] < 0) {
    e->size[l] = n;
    from[l][0] = i, from[l][1] = d;
  } else if (e->size[l] != n) {
    if (from[l][0] < 0)
      return mt__fail(err, MT_EINVAL,
                      "Input %d dim %d has size %" PRId64
                      " but label %d is sized %" PRId64,
                      i, d, n, l, e->size[l]);
    return mt__fail(err, MT_EINVAL,
                    "Input %d dim %d has size %" PRId64
                    " but input %d dim %d, the same "
                    "label %d, has size %" PRId64,
                    i, d, n, from[l][0], from[l][1], l, e->size[l]);
  }
  return MT_OK;
}

/* Sizes every label, and the output shape from them. */
static int label_sizes(engine *e, mt_error *err) {
  const mt_dimmap *map = e->map;
  int from[MT_PROP_MAX_LABELS][2];
  for (int l = 0; l < MT_PROP_MAX_LABELS; ++l) {
    int sized = l < map->nlabels && bit(map->sized_labels, l);
    e->size[l] = sized ? map->label_size[l] : -1;
    from[l][0] = from[l][1] = -1;
    for (int i = 0; i < MT_PROP_MAX_INPUTS; ++i) e->dim_of[i][l] = -1;
  }
  for (int i = 0; i < e->ninputs; ++i) {
    for (int d = 0; d < map->in_ndim[i]; ++d) {
      int rc = hold_label(e, i, d, from, err);
      if (rc != MT_OK) return rc;
    }
  }
  e->out_numel = 1;
  for (int l = 0; l < map->nlabels; ++l) e->size[l] = e->size[l] < 0 ? 1 : e->size[l];
  for (int d = 0; d < map->out_ndim; ++d) {
    e->out_shape[d] =
        bit(map->out_resized, d) ? map->out_size[d] : e->size[map->out_labels[d]];
    e->out_numel = sat_mul(e->out_numel, e->out_shape[d]);
  }
  if (e->out_numel == INT64_MAX)
    return mt__fail(err, MT_EOVERFLOW, "The output would have too many elements");
  return MT_OK;
}

/* Which labels a candidate may shard, and where each output label lies. */
static void label_roles(engine *e) {
  const mt_dimmap *map = e->map;
  for (int l = 0; l < MT_PROP_MAX_LABELS; ++l) e->out_pos[l] = -1;
  for (int d = 0; d < map->out_ndim; ++d) e->out_pos[map->out_labels[d]] = d;
  for (int l = 0; l < map->nlabels; ++l) {
    int held = 0, repeated = 0;
    for (int i = 0; i < e->ninputs; ++i) {
      held |= e->dim_of[i][l] >= 0;
      repeated |= e->dim_of[i][l] == -2;
    }
    e->shardable[l] = held && !repeated && map->label_kind[l] != MT_LABEL_REPLICATE;
  }
  /* A repeated label is never sharded, so no input is cut on it. */
  for (int i = 0; i < e->ninputs; ++i) {
    for (int l = 0; l < map->nlabels; ++l) {
      if (e->dim_of[i][l] == -2) e->dim_of[i][l] = -1;
    }
  }
}

/* ---- Candidates. ---- */

static int even_only(const mt_dimmap *map, int l) {
  return bit(map->even_only, l) || (map->label_kind[l] == MT_LABEL_REDUCE &&
                                    map->label_reduce_op[l] == MT_REDUCE_AVG);
}

/* Whether a shard of label l may be empty: a kept label leaves an output shard
 * empty (as its inputs already are), and a contraction or a sum or product over
 * an empty shard is its identity (0 or 1), which the pending Partial adds or
 * multiplies in harmlessly. Max and min have no such value, and an average
 * weighs its shards equally, so those need an element in every shard. */
static int may_be_empty(const mt_dimmap *map, int l) {
  int kind = map->label_kind[l], op = map->label_reduce_op[l];
  return kind == MT_LABEL_KEEP || kind == MT_LABEL_CONTRACT ||
         (kind == MT_LABEL_REDUCE && (op == MT_REDUCE_SUM || op == MT_REDUCE_PRODUCT));
}

/* Whether label l may be cut into `shards` chunks: even_only labels need equal
 * shards, and labels that may not leave a shard empty need an element in each. */
static int fits(const engine *e, int l, int64_t shards) {
  /* torch.chunk's rule cuts chunks of ceil(n/k): 4 over 3 is 2, 2, 0, so n >= k
   * does not make every shard non-empty; the last one is when (k-1) chunks leave
   * some of n over. */
  if (!may_be_empty(e->map, l) &&
      (e->size[l] < shards ||
       sat_mul((e->size[l] + shards - 1) / shards, shards - 1) >= e->size[l]))
    return 0;
  return !even_only(e->map, l) || e->size[l] % shards == 0;
}

static cand *new_cand(dim_cands *dc, int kind, int label) {
  cand *c = &dc->c[dc->n++];
  memset(c, 0, sizeof *c);
  c->kind = kind;
  c->label = label;
  c->out = replicate();
  for (int i = 0; i < MT_PROP_MAX_INPUTS; ++i) c->in[i] = replicate();
  return c;
}

static void add_label(const engine *e, dim_cands *dc, int l) {
  cand *c = new_cand(dc, CAND_LABEL, l);
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
static void add_keep_all(const engine *e, dim_cands *dc, mt_placement p) {
  cand *c = new_cand(dc, CAND_PARTIAL, -1);
  for (int i = 0; i < e->ninputs; ++i) c->in[i] = p;
  c->out = p;
}

/* Whether every input carries Partial(op) on mesh dim m. */
static int all_partial(const engine *e, int m, int op) {
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
static int any_partial(const engine *e, int m, int op) {
  mt_placement p = partial(op);
  for (int i = 0; i < e->ninputs; ++i) {
    if (placement_eq(&e->cur[i].placements[m], &p)) return 1;
  }
  return 0;
}

/* Whether every input is Partial(sum) or Replicate on mesh dim m: only those can
 * be Partial(sum) (a Shard or another Partial cannot become one, and on a mesh
 * dim of size 1 such a change would look free). */
static int sum_or_replicate(const engine *e, int m) {
  mt_placement p = partial(MT_REDUCE_SUM);
  for (int i = 0; i < e->ninputs; ++i) {
    const mt_placement *c = &e->cur[i].placements[m];
    if (!placement_eq(c, &p) && c->kind != MT_PLACEMENT_REPLICATE) return 0;
  }
  return 1;
}

/* The ADDITIVE rule's candidates on mesh dim m (prop.h): at most two, since
 * input 0 carries one op and a sum with an avg gives two. */
static void add_additive(const engine *e, dim_cands *dc, int m) {
  mt_placement p0 = e->cur[0].placements[m];
  /* First, so that a tie keeps input 0's, as torch's order of rules does. */
  if (e->ninputs == 2 && p0.kind == MT_PLACEMENT_PARTIAL &&
      (p0.reduce_op == MT_REDUCE_MAX || p0.reduce_op == MT_REDUCE_MIN)) {
    cand *c = new_cand(dc, CAND_PARTIAL, -1);
    c->in[0] = p0;
    c->out = p0;
  }
  if (any_partial(e, m, MT_REDUCE_SUM) && sum_or_replicate(e, m))
    add_keep_all(e, dc, partial(MT_REDUCE_SUM));
  if (any_partial(e, m, MT_REDUCE_AVG)) {
    mt_placement p = partial(MT_REDUCE_AVG);
    cand *c = new_cand(dc, CAND_PARTIAL, -1);
    for (int i = 0; i < e->ninputs; ++i) {
      if (placement_eq(&e->cur[i].placements[m], &p)) c->in[i] = p;
    }
    c->out = p;
  }
}

/* NEGATE (prop.h): one candidate for input 0's Partial. */
static void add_negate(const engine *e, dim_cands *dc, int m) {
  mt_placement p = e->cur[0].placements[m];
  if (p.kind != MT_PLACEMENT_PARTIAL || p.reduce_op == MT_REDUCE_PRODUCT) return;
  cand *c = new_cand(dc, CAND_PARTIAL, -1);
  c->in[0] = p;
  c->out = p.reduce_op == MT_REDUCE_MAX   ? partial(MT_REDUCE_MIN)
           : p.reduce_op == MT_REDUCE_MIN ? partial(MT_REDUCE_MAX)
                                          : p;
}

/* MONOTONE (prop.h): at most two candidates, one per order op carried. */
static void add_monotone(const engine *e, dim_cands *dc, int m) {
  static const int ops[2] = {MT_REDUCE_MAX, MT_REDUCE_MIN};
  for (int k = 0; k < 2; ++k) {
    mt_placement p = partial(ops[k]);
    int all = bit(e->map->partial_ops, ops[k]), kept = 0;
    cand c;
    memset(&c, 0, sizeof c);
    for (int i = 0; i < e->ninputs; ++i) {
      c.in[i] = replicate();
      if (placement_eq(&e->cur[i].placements[m], &p) && (all || kept == 0))
        c.in[i] = p, ++kept;
    }
    if (kept == 0) continue;
    cand *n = new_cand(dc, CAND_PARTIAL, -1);
    memcpy(n->in, c.in, sizeof c.in);
    n->out = p;
  }
}

/* The Partial pass-throughs the op's rule allows for mesh dim m. */
static void add_partials(const engine *e, dim_cands *dc, int m) {
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
    cand *c = new_cand(dc, CAND_PARTIAL, -1);
    c->in[i] = p;
    c->out = p;
  }
}

/* Numbers each input's distinct needed placements on one mesh dim. */
static void assign_variants(const engine *e, dim_cands *dc) {
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
static int held_now(const engine *e, int m, const cand *c) {
  int n = 0;
  for (int i = 0; i < e->ninputs; ++i)
    n += placement_eq(&c->in[i], &e->cur[i].placements[m]);
  return n;
}

/* Whether `a` goes before `b` on a mesh dim of size 1: the one more inputs hold
 * now, then one creating no Partial, then one keeping a Shard. */
static int first_on_one(const engine *e, int m, const cand *a, const cand *b) {
  int ha = held_now(e, m, a), hb = held_now(e, m, b);
  if (ha != hb) return ha > hb;
  if (a->creates != b->creates) return b->creates;
  return a->out.kind == MT_PLACEMENT_SHARD && b->out.kind != MT_PLACEMENT_SHARD;
}

/* A mesh dim of size 1 holds every input whole, so all its candidates are free
 * and the earliest wins a tie: a stable sort puts first what the inputs already
 * have, so a Shard stays a Shard there, as in torch. */
static void order_on_one(const engine *e, int m, dim_cands *dc) {
  for (int k = 1; k < dc->n; ++k) {
    cand c = dc->c[k];
    int j = k;
    for (; j > 0 && first_on_one(e, m, &c, &dc->c[j - 1]); --j) dc->c[j] = dc->c[j - 1];
    dc->c[j] = c;
  }
}

/* The candidates of mesh dim m. */
static void build_dim(const engine *e, int m, dim_cands *dc) {
  int64_t g = e->in->mesh_shape[m];
  dc->n = 0;
  new_cand(dc, CAND_REPLICATE, -1);
  for (int l = 0; l < e->map->nlabels; ++l) {
    if (e->shardable[l] && fits(e, l, g)) add_label(e, dc, l);
  }
  add_partials(e, dc, m);
  if (g == 1) order_on_one(e, m, dc);
  assign_variants(e, dc);
}

/* ---- Classifying and pricing one input's needed layout. ---- */

/* The layout input i must be moved to under `choice`. A Replicate input that a
 * candidate partitions into a Partial stays Replicate here: partitioning is local
 * (mt_decision's `partition`), so only the rest of the move is priced. */
static void needed_layout(const engine *e, int i, const int *choice, mt_layout *out) {
  *out = e->cur[i];
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const mt_placement *p = &e->dims[m].c[choice[m]].in[i];
    if (!(p->kind == MT_PLACEMENT_PARTIAL &&
          e->cur[i].placements[m].kind == MT_PLACEMENT_REPLICATE))
      out->placements[m] = *p;
  }
}

/* Whether cur -> need only cuts replicated mesh dims, each after every mesh dim
 * that already cuts the same tensor dim: every rank's new box lies in its old one,
 * so the plan is chunks alone. Mesh dims of size 1 do not count. */
static int only_cuts(const mt_layout *cur, const mt_layout *need) {
  for (int m = 0; m < cur->mesh_ndim; ++m) {
    const mt_placement *a = &cur->placements[m], *b = &need->placements[m];
    if (cur->mesh_shape[m] == 1 || placement_eq(a, b)) continue;
    if (a->kind != MT_PLACEMENT_REPLICATE || b->kind != MT_PLACEMENT_SHARD) return 0;
    for (int k = m + 1; k < cur->mesh_ndim; ++k) {
      if (cur->mesh_shape[k] > 1 && is_shard(&cur->placements[k], b->dim)) return 0;
    }
  }
  return 1;
}

/* A lower bound of the plan cur -> need into p->lb_*, and in *comm whether it
 * communicates at all. Every element a rank lacks must reach it in some step that
 * is not a reduction (reductions never grow a box), every such rank receives at
 * least one message, and each Partial reduced on a mesh dim of size G is one
 * collective of N (G - 1) messages in the plan's model. */
static int bound(const engine *e, int i, const mt_layout *need, price *p, int *comm,
                 mt_error *err) {
  const mt_layout *cur = &e->cur[i];
  int64_t moved = 0, lacking = 0, reduce_msgs = 0, most = 0, reductions = 0;
  for (int m = 0; m < cur->mesh_ndim; ++m) {
    const mt_placement *a = &cur->placements[m];
    if (cur->mesh_shape[m] > 1 && a->kind == MT_PLACEMENT_PARTIAL &&
        !placement_eq(a, &need->placements[m])) {
      reduce_msgs += e->mesh_numel * (cur->mesh_shape[m] - 1);
      ++reductions;
    }
  }
  mt_error werr = {0, ""};
  int rc = mt__lack(cur, need, &moved, &most, &lacking, &werr);
  if (rc == MT_EOVERFLOW) {
    /* More lacking elements than int64 counts: some rank lacks some, and the
     * bound saturates as costs do. */
    moved = INT64_MAX, most = 0, lacking = 1;
  } else if (rc != MT_OK) {
    return mt__fail(err, rc, "%s", werr.msg);
  }
  p->lb_bytes = sat_mul(moved, e->in->itemsize[i]);
  p->lb_messages = reduce_msgs + lacking;
  /* Each reduction is a step of at least one message, and what the busiest rank
   * lacks reaches it in other steps (reductions never grow a box), at least one
   * message and its bytes, all at shared memory's price at best. */
  const mt_time_model *t = e->model;
  double step = t->call + t->alpha[MT_LINK_SHM];
  p->lb_time = (double)reductions * step +
               (lacking > 0 ? step + (double)most * (double)e->in->itemsize[i] *
                                         t->beta[MT_LINK_SHM]
                            : 0.0);
  *comm = p->lb_messages > 0;
  return MT_OK;
}

/* Plans cur -> need into `p`. Only running out of memory fails the call; any
 * other planning error makes this layout, and the combinations needing it,
 * invalid. */
static int plan_price(engine *e, int i, const mt_layout *need, price *p,
                      mt_error *err) {
  mt_plan *plan = NULL;
  mt_error perr = {0, ""};
  int rc = mt_plan_create_timed(&e->cur[i], need, e->in->itemsize[i], e->model, &plan,
                                &perr);
  if (rc == MT_ENOMEM) return mt__fail(err, rc, "%s", perr.msg);
  if (rc != MT_OK) {
    if (e->plan_rc == MT_OK) e->plan_rc = rc, e->plan_err = perr;
    p->state = PRICE_INVALID;
    return MT_OK;
  }
  p->bytes = mt_plan_bytes(plan);
  p->messages = mt_plan_messages(plan);
  p->time = mt_plan_time(plan);
  p->state = PRICE_DONE;
  mt_plan_destroy(plan);
  return MT_OK;
}

/* A layout seen for the first time: free of communication (mere cuts, which
 * cost their copies), communicating (bounded, and planned only when `full`), or
 * one that moves nothing without being mere cuts (planned, for exact counts;
 * only empty boxes get here). */
static int classify(engine *e, int i, const mt_layout *need, int full, price *p,
                    mt_error *err) {
  if (only_cuts(&e->cur[i], need)) {
    p->state = PRICE_DONE, p->bytes = 0, p->messages = 0;
    p->time = mt__cuts_time(&e->cur[i], need, e->in->itemsize[i], e->model);
    return MT_OK;
  }
  int comm = 0, rc = bound(e, i, need, p, &comm, err);
  if (rc != MT_OK) return rc;
  if (comm && !full) {
    p->state = PRICE_COMM;
    return MT_OK;
  }
  return plan_price(e, i, need, p, err);
}

/* The price of input i's needed layout under `choice`, from the memo when there
 * is one. With `full` a communicating layout is planned, else only marked. */
static int input_price(engine *e, int i, const int *choice, int full, price *out,
                       mt_error *err) {
  price local = {PRICE_UNKNOWN, 0, 0, 0.0, 0, 0, 0.0}, *p = &local;
  if (e->memo[i] != NULL) {
    int64_t idx = 0;
    for (int m = 0; m < e->mesh_ndim; ++m)
      idx += e->dims[m].c[choice[m]].variant[i] * e->stride[i][m];
    p = &e->memo[i][idx];
  }
  int rc = MT_OK;
  if (p->state == PRICE_UNKNOWN || (p->state == PRICE_COMM && full)) {
    mt_layout need;
    needed_layout(e, i, choice, &need);
    rc = p->state == PRICE_UNKNOWN ? classify(e, i, &need, full, p, err)
                                   : plan_price(e, i, &need, p, err);
  }
  *out = *p;
  return rc;
}

/* ---- Combinations. ---- */

/* The extent [*off, *off + *n) of a dim of size `size` held at `idx`, nested
 * chunks over `k` mesh dims of sizes `g` (an empty extent has offset 0). */
static void nested_extent(int64_t size, const int64_t *g, const int64_t *idx, int k,
                          int64_t *off, int64_t *n) {
  int64_t o = 0, s = size;
  for (int j = 0; j < k; ++j) {
    int64_t sz, of;
    mt_chunk(s, g[j], idx[j], &sz, &of);
    o += sz > 0 ? of : 0;
    s = sz;
  }
  *off = s > 0 ? o : 0, *n = s;
}

/* Whether x/a == y/b, as x*b == y*a; a product too large for int64 counts as
 * different, which only keeps a shard from passing (a redistribution is safe). */
static int same_fraction(int64_t x, int64_t a, int64_t y, int64_t b) {
  int64_t p = sat_mul(x, b), q = sat_mul(y, a);
  return p == q && p != INT64_MAX;
}

/* Whether label l, cut by the mesh dims `choice` shards it on, may stay sharded on
 * its resized output dim: every rank's share of the label (size a) and of the
 * output dim (size b) is the same fraction of the group (prop.h). */
static int scales(const engine *e, const int *choice, int l) {
  int d = e->out_pos[l], k = 0;
  if (d < 0 || !bit(e->map->out_resized, d)) return 1;
  int64_t g[MT_MAX_MESH_NDIM], idx[MT_MAX_MESH_NDIM] = {0};
  for (int m = 0; m < e->mesh_ndim; ++m) {
    if (e->dims[m].c[choice[m]].kind == CAND_LABEL && e->dims[m].c[choice[m]].label == l)
      g[k++] = e->in->mesh_shape[m];
  }
  int64_t a = e->size[l], b = e->out_shape[d];
  for (;;) {
    int64_t ia, na, ib, nb;
    nested_extent(a, g, idx, k, &ia, &na);
    nested_extent(b, g, idx, k, &ib, &nb);
    if (!same_fraction(na, a, nb, b) || !same_fraction(ia, a, ib, b)) return 0;
    int j = k - 1;
    while (j >= 0 && ++idx[j] == g[j]) idx[j--] = 0;
    if (j < 0) return 1;
  }
}

/* Every max/min/avg REDUCE label has an element per shard, even_only labels divide
 * evenly and labels kept on a resized dim scale, counting the shards of all mesh
 * dims that cut them. */
static int combo_valid(const engine *e, const int *choice) {
  int labels[MT_MAX_MESH_NDIM], n = 0;
  int64_t shards[MT_MAX_MESH_NDIM];
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const cand *c = &e->dims[m].c[choice[m]];
    if (c->kind != CAND_LABEL) continue;
    int k = 0;
    while (k < n && labels[k] != c->label) ++k;
    if (k == n) labels[n] = c->label, shards[n++] = 1;
    shards[k] = sat_mul(shards[k], e->in->mesh_shape[m]);
  }
  for (int k = 0; k < n; ++k) {
    if (!fits(e, labels[k], shards[k]) || !scales(e, choice, labels[k])) return 0;
  }
  return 1;
}

/* An estimate of reducing later the Partials this combination creates: a
 * reduce-scatter of the output per such mesh dim, first mesh dim first, each
 * shrinking what the next carries. Summed over ranks like plan costs; every rank
 * holds the output whole except along the mesh dims that shard it. */
static void deferred(const engine *e, const int *choice, int64_t *bytes,
                     int64_t *messages) {
  int64_t held = e->out_numel;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    if (e->dims[m].c[choice[m]].out.kind != MT_PLACEMENT_SHARD)
      held = sat_mul(held, e->in->mesh_shape[m]);
  }
  *bytes = *messages = 0;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    int64_t g = e->in->mesh_shape[m];
    if (!e->dims[m].c[choice[m]].creates) continue;
    *bytes = sat_add(*bytes, sat_mul(held / g * (g - 1), e->out_itemsize));
    *messages = sat_add(*messages, sat_mul(e->mesh_numel, g - 1));
    held /= g;
  }
}

/* The cost of moving `bytes` in `messages`. */
static int64_t cost_of(int64_t bytes, int64_t messages) {
  return sat_add(bytes, sat_mul(messages, MT_PROP_MESSAGE_BYTES));
}

/* The estimated cost of reducing later the Partials `choice` creates. */
static int64_t later_cost(const engine *e, const int *choice) {
  int64_t db, dm;
  deferred(e, choice, &db, &dm);
  return cost_of(db, dm);
}

/* The elements of the output the rank at coordinate 0 holds under `choice`:
 * the largest share, as chunks shrink towards the end. */
static int64_t held_output(const engine *e, const int *choice) {
  int64_t held = e->out_numel;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    int64_t g = e->in->mesh_shape[m];
    if (e->dims[m].c[choice[m]].out.kind == MT_PLACEMENT_SHARD) held = held / g + (held % g != 0);
  }
  return held;
}

/* The same estimate in seconds under the engine's model: each reduce-scatter
 * takes the output one rank holds at that point over its group, on the link its
 * groups use. */
static double later_time(const engine *e, const int *choice) {
  int64_t held = held_output(e, choice), stride = e->mesh_numel;
  double t = 0.0;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    int64_t g = e->in->mesh_shape[m];
    stride /= g;
    if (!e->dims[m].c[choice[m]].creates) continue;
    int64_t vector = sat_mul(held, e->out_itemsize);
    int link = mt_time_link(e->model, e->mesh_numel, g, stride);
    t += mt_time_coll(e->model, MT_TIME_REDUCE_SCATTER, g, vector, vector - vector / g, link);
    held = held / g + (held % g != 0);
  }
  return t;
}

/* The local pass of reducing later every Partial of the output, created by the
 * operation or kept from an input: mesh dim by mesh dim, each reduce-scatter
 * reduces what a rank receives of the output it holds then. */
static double later_local(const engine *e, const int *choice) {
  int64_t held = held_output(e, choice);
  double t = 0.0;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    int64_t g = e->in->mesh_shape[m];
    if (e->dims[m].c[choice[m]].out.kind != MT_PLACEMENT_PARTIAL) continue;
    int64_t vector = sat_mul(held, e->out_itemsize);
    t += mt_time_local(e->model, 0, vector - vector / g);
    held = held / g + (held % g != 0);
  }
  return t;
}

/* -1 when `a` seconds is less than `b`, 1 when more, 0 when they agree within a
 * part in a million (the same collectives, priced alike). */
static int time_cmp(double a, double b) {
  double tol = 1e-6 * (a > b ? a : b);
  return a < b - tol ? -1 : a > b + tol ? 1 : 0;
}

/* How many (input, mesh dim of size > 1) pairs `choice` asks to change. */
static int changes(const engine *e, const int *choice) {
  int n = 0;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    if (e->in->mesh_shape[m] == 1) continue;
    for (int i = 0; i < e->ninputs; ++i)
      n += !placement_eq(&e->dims[m].c[choice[m]].in[i], &e->cur[i].placements[m]);
  }
  return n;
}

/* Whether input i is the same tensor as an earlier input that `choice` moves to
 * the same layout: one move serves both, so it is priced once. */
static int moved_with_alias(const engine *e, int i, const int *choice) {
  int j = e->in->alias[i] - 1;
  if (j < 0) return 0;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const cand *c = &e->dims[m].c[choice[m]];
    if (!placement_eq(&c->in[i], &c->in[j])) return 0;
  }
  return 1;
}

/* Scores one combination into `s`; `*valid` is 0 when it is not allowed or a
 * plan fails. Without `full` a communicating combination is only flagged. */
static int score_combo(engine *e, const int *choice, int full, score *s, int *valid,
                       mt_error *err) {
  *valid = 0;
  if (!combo_valid(e, choice)) return MT_OK;
  memset(s, 0, sizeof *s);
  for (int i = 0; i < e->ninputs; ++i) {
    price p;
    if (moved_with_alias(e, i, choice)) continue;
    int rc = input_price(e, i, choice, full, &p, err);
    if (rc != MT_OK || p.state == PRICE_INVALID) return rc;
    if (p.state == PRICE_COMM) {
      s->comm = 1, *valid = 1;
      return MT_OK;
    }
    s->bytes = sat_add(s->bytes, p.bytes);
    s->messages = sat_add(s->messages, p.messages);
    s->time += p.time;
  }
  s->comm = s->bytes > 0 || s->messages > 0;
  s->changes = changes(e, choice);
  s->cost = cost_of(s->bytes, s->messages);
  s->later = later_cost(e, choice);
  s->later_time = later_time(e, choice);
  s->later_local = later_local(e, choice);
  *valid = 1;
  return MT_OK;
}

/* Whether `a` beats `b`; on a tie the earlier one (b) stays. Among combinations
 * that move nothing, the one that leaves more inputs as they are wins before any
 * estimate of later costs, as torch keeps [R, S(1)] summed over dim 1 [R, P(avg)]
 * rather than cut it to [S(0), P(avg)]. */
static int better(const score *a, const score *b) {
  if (a->comm != b->comm) return a->comm < b->comm;
  if (!a->comm && a->changes != b->changes) return a->changes < b->changes;
  if (a->cost != b->cost) return a->cost < b->cost;
  if (a->later != b->later) return a->later < b->later;
  if (a->bytes != b->bytes) return a->bytes < b->bytes;
  return a->messages < b->messages;
}

/* What a combination is timed by: its moves now and the local pass of every
 * reduction its output leaves pending. Each Partial is reduced sooner or later,
 * and reducing one now is charged its local pass in `time`; charging deferral
 * the same keeps that pass from favouring it, so the later messages decide
 * between reducing now and later. */
static double now_time(const score *s) { return s->time + s->later_local; }

/* Whether `a` is faster than `b` under the engine's model, the rule among the
 * combinations that move no more bytes than the one `better` picks: free first
 * and fewer changes among free ones as there, then the predicted time of the
 * moves now (now_time), of the reductions' messages later, fewer bytes, fewer
 * messages. */
static int faster(const score *a, const score *b) {
  if (a->comm != b->comm) return a->comm < b->comm;
  if (!a->comm && a->changes != b->changes) return a->changes < b->changes;
  int order = time_cmp(now_time(a), now_time(b));
  if (order == 0) order = time_cmp(a->later_time, b->later_time);
  if (order != 0) return order < 0;
  if (a->bytes != b->bytes) return a->bytes < b->bytes;
  return a->messages < b->messages;
}

/* Advances a combination, last mesh dim fastest; 0 once it wraps. */
static int next_choice(const engine *e, int *choice) {
  for (int m = e->mesh_ndim - 1; m >= 0; --m) {
    if (++choice[m] < e->dims[m].n) return 1;
    choice[m] = 0;
  }
  return 0;
}

/* One pass over every combination for those that communicate nowhere; none is
 * planned unless its boxes are empty. */
static int search_free(engine *e, int *best, score *best_s, int *found, mt_error *err) {
  int choice[MT_MAX_MESH_NDIM] = {0};
  *found = 0;
  do {
    score s;
    int valid, rc = score_combo(e, choice, 0, &s, &valid, err);
    if (rc != MT_OK) return rc;
    if (!valid || s.comm) continue;
    if (!*found || better(&s, best_s)) {
      memcpy(best, choice, sizeof choice);
      *best_s = s, *found = 1;
    }
  } while (next_choice(e, choice));
  return MT_OK;
}

/* A lower bound of a combination's cost without planning (exact prices where the
 * memo has them); `*valid` is 0 when it is not allowed or a plan failed. */
static int combo_bound(engine *e, const int *choice, bounded *b, int *valid,
                       mt_error *err) {
  int64_t bytes = 0, messages = 0;
  double time = 0.0;
  *valid = 0;
  if (!combo_valid(e, choice)) return MT_OK;
  for (int i = 0; i < e->ninputs; ++i) {
    price p;
    if (moved_with_alias(e, i, choice)) continue;
    int rc = input_price(e, i, choice, 0, &p, err);
    if (rc != MT_OK || p.state == PRICE_INVALID) return rc;
    int exact = p.state == PRICE_DONE;
    bytes = sat_add(bytes, exact ? p.bytes : p.lb_bytes);
    messages = sat_add(messages, exact ? p.messages : p.lb_messages);
    time += exact ? p.time : p.lb_time;
  }
  b->lb = cost_of(bytes, messages);
  b->lb_bytes = bytes;
  b->lb_time = time;
  *valid = 1;
  return MT_OK;
}

/* Bounds every valid combination into `list` (numbered in enumeration order). */
static int collect_bounds(engine *e, bounded *list, int64_t *n, mt_error *err) {
  int choice[MT_MAX_MESH_NDIM] = {0};
  int64_t idx = 0;
  *n = 0;
  do {
    int valid, rc = combo_bound(e, choice, &list[*n], &valid, err);
    if (rc != MT_OK) return rc;
    if (valid) list[*n].idx = idx, ++*n;
    ++idx;
  } while (next_choice(e, choice));
  return MT_OK;
}

static int cmp_bounded(const void *pa, const void *pb) {
  const bounded *a = pa, *b = pb;
  if (a->lb != b->lb) return a->lb < b->lb ? -1 : 1;
  return a->idx < b->idx ? -1 : a->idx > b->idx;
}

static int cmp_timed(const void *pa, const void *pb) {
  const bounded *a = pa, *b = pb;
  if (a->lb_time != b->lb_time) return a->lb_time < b->lb_time ? -1 : 1;
  return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* The combination numbered `idx` in enumeration order. */
static void decode(const engine *e, int64_t idx, int *choice) {
  for (int m = e->mesh_ndim - 1; m >= 0; --m) {
    choice[m] = (int)(idx % e->dims[m].n);
    idx /= e->dims[m].n;
  }
}

/* Among the combinations of `list` moving at most the bytes of the one in
 * *best_s (numbered *best_idx), the fastest, planned in order of their time
 * bounds until the next bound is slower than the best beyond time_cmp's
 * tolerance; ties go to the earlier combination, as an exhaustive pass would. */
static int search_timed(engine *e, bounded *list, int64_t n, int *best, score *best_s,
                        int64_t *best_idx, mt_error *err) {
  int64_t cap = best_s->bytes;
  qsort(list, (size_t)n, sizeof *list, cmp_timed);
  for (int64_t k = 0; k < n; ++k) {
    if (list[k].lb_time > now_time(best_s) * (1.0 + 2e-6)) break;
    if (list[k].lb_bytes > cap) continue;
    int choice[MT_MAX_MESH_NDIM] = {0}, valid;
    score s;
    decode(e, list[k].idx, choice);
    int rc = score_combo(e, choice, 1, &s, &valid, err);
    if (rc != MT_OK) return rc;
    if (!valid || s.bytes > cap) continue;
    int tie = !faster(&s, best_s) && !faster(best_s, &s);
    if (faster(&s, best_s) || (tie && list[k].idx < *best_idx)) {
      memcpy(best, choice, sizeof choice);
      *best_s = s, *best_idx = list[k].idx;
    }
  }
  return MT_OK;
}

/* When every combination communicates: plan them in order of their lower bounds
 * until the next bound exceeds the best cost found. Equal costs still go to fewer
 * bytes, fewer messages and then the earlier combination, so the winner is the
 * one an exhaustive pass would pick. That winner's bytes then cap the fastest
 * (search_timed). */
static int search_bounded(engine *e, int64_t combos, int *best, score *best_s,
                          int *found, mt_error *err) {
  bounded *list = malloc((size_t)combos * sizeof *list);
  if (list == NULL)
    return mt__fail(err, MT_ENOMEM, "Out of memory choosing placements");
  int64_t n = 0, best_idx = -1;
  int rc = collect_bounds(e, list, &n, err);
  if (rc == MT_OK) qsort(list, (size_t)n, sizeof *list, cmp_bounded);
  for (int64_t k = 0; rc == MT_OK && k < n; ++k) {
    if (*found && list[k].lb > best_s->cost) break;
    int choice[MT_MAX_MESH_NDIM] = {0}, valid;
    score s;
    decode(e, list[k].idx, choice);
    rc = score_combo(e, choice, 1, &s, &valid, err);
    if (rc != MT_OK || !valid) continue;
    int tie = !better(&s, best_s) && !better(best_s, &s);
    if (!*found || better(&s, best_s) || (tie && list[k].idx < best_idx)) {
      memcpy(best, choice, sizeof choice);
      *best_s = s, *found = 1, best_idx = list[k].idx;
    }
  }
  if (rc == MT_OK && *found) rc = search_timed(e, list, n, best, best_s, &best_idx, err);
  free(list);
  return rc;
}

/* Above MT_PROP_MAX_COMBOS: each mesh dim in turn takes its best candidate, the
 * earlier ones fixed and the later ones at their first (Replicate, or on a
 * mesh dim of size 1 the one ordered first). */
static int search_greedy(engine *e, int *best, score *best_s, int *found,
                         mt_error *err) {
  int choice[MT_MAX_MESH_NDIM] = {0};
  for (int m = 0; m < e->mesh_ndim; ++m) {
    int pick = 0, any = 0;
    for (int c = 0; c < e->dims[m].n; ++c) {
      score s;
      int valid, rc;
      choice[m] = c;
      rc = score_combo(e, choice, 1, &s, &valid, err);
      if (rc != MT_OK) return rc;
      if (valid && (!any || better(&s, best_s))) pick = c, *best_s = s, any = 1;
    }
    choice[m] = pick;
  }
  int rc = score_combo(e, choice, 1, best_s, found, err);
  memcpy(best, choice, sizeof choice);
  return rc;
}

/* Sizes the per-input memos for an exhaustive search (each at most the number of
 * combinations) and allocates them in one block. */
static int alloc_memo(engine *e, mt_error *err) {
  assert(e->ninputs >= 1 && e->mesh_ndim >= 1); /* load_inputs checked them */
  int64_t total = 0;
  for (int i = 0; i < e->ninputs; ++i) {
    int64_t n = 1;
    for (int m = 0; m < e->mesh_ndim; ++m) {
      e->stride[i][m] = n;
      n *= e->dims[m].nvariants[i];
    }
    total += n;
  }
  /* calloc(0) may return NULL, which would read as out of memory. */
  e->memo_block = calloc((size_t)(total > 0 ? total : 1), sizeof *e->memo_block);
  if (e->memo_block == NULL)
    return mt__fail(err, MT_ENOMEM, "Out of memory choosing placements");
  for (int i = 0, off = 0; i < e->ninputs; ++i) {
    e->memo[i] = e->memo_block + off;
    int64_t n = 1;
    for (int m = 0; m < e->mesh_ndim; ++m) n *= e->dims[m].nvariants[i];
    off += (int)n;
  }
  return MT_OK;
}

/* Finds the winning combination: exhaustively when there are at most
 * MT_PROP_MAX_COMBOS (first among those that communicate nowhere, else among
 * all, planning only those whose lower bound can still win), greedily otherwise. */
static int search(engine *e, int *best, score *best_s, mt_error *err) {
  int64_t combos = 1;
  for (int m = 0; m < e->mesh_ndim; ++m) combos = sat_mul(combos, e->dims[m].n);
  int rc, found = 0;
  if (combos > MT_PROP_MAX_COMBOS) {
    rc = search_greedy(e, best, best_s, &found, err);
  } else {
    rc = alloc_memo(e, err);
    if (rc == MT_OK) rc = search_free(e, best, best_s, &found, err);
    if (rc == MT_OK && !found)
      rc = search_bounded(e, combos, best, best_s, &found, err);
  }
  if (rc != MT_OK || found) return rc;
  if (e->plan_rc != MT_OK) return mt__fail(err, e->plan_rc, "%s", e->plan_err.msg);
  return mt__fail(err, MT_EINVAL, "No valid placement exists for this op");
}

static void fill_result(const engine *e, const int *choice, const score *s,
                        mt_prop_result *out) {
  memset(out, 0, sizeof *out);
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const cand *c = &e->dims[m].c[choice[m]];
    for (int i = 0; i < e->ninputs; ++i) out->in_placements[i][m] = c->in[i];
    out->out_placements[m] = c->out;
  }
  out->out_ndim = e->map->out_ndim;
  for (int d = 0; d < out->out_ndim; ++d) out->out_shape[d] = e->out_shape[d];
  out->bytes = s->bytes;
  out->messages = s->messages;
}

/* Loads and checks the inputs, then builds every mesh dim's candidates. */
static int prepare(engine *e, mt_error *err) {
  int rc = load_inputs(e, err);
  if (rc == MT_OK) rc = label_sizes(e, err);
  if (rc != MT_OK) return rc;
  label_roles(e);
  assert(e->mesh_ndim >= 1 && e->mesh_ndim <= MT_MAX_MESH_NDIM);
  e->dims = malloc((size_t)e->mesh_ndim * sizeof *e->dims);
  if (e->dims == NULL)
    return mt__fail(err, MT_ENOMEM, "Out of memory choosing placements");
  for (int m = 0; m < e->mesh_ndim; ++m) build_dim(e, m, &e->dims[m]);
  return MT_OK;
}

int mt_propagate(const mt_dimmap *map, const mt_prop_inputs *in, mt_prop_result *out,
                 mt_error *err) {
  if (map == NULL || in == NULL || out == NULL)
    return mt__fail(err, MT_EINVAL, "The dim map, inputs and result are required");
  int rc = mt_dimmap_check(map, err);
  if (rc != MT_OK) return rc;
  engine e;
  memset(&e, 0, sizeof e);
  e.map = map, e.in = in;
  mt_time_model fallback = mt_time_model_default();
  e.model = in->model != NULL ? in->model : &fallback;
  rc = mt_time_model_check(e.model, err);
  if (rc != MT_OK) return rc;
  int best[MT_MAX_MESH_NDIM] = {0};
  score best_s;
  memset(&best_s, 0, sizeof best_s);
  rc = prepare(&e, err);
  if (rc == MT_OK) rc = search(&e, best, &best_s, err);
  if (rc == MT_OK) fill_result(&e, best, &best_s, out);
  free(e.memo_block);
  free(e.dims);
  return rc;
}
