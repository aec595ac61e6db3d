/* Torch's decision for the same op and placements: the combination torch's
 * sharding propagation would take. Its bytes, priced as the engine prices every
 * combination (the inputs' moves, the output's way out, the gradients' way back),
 * cap every decision (prop_search.c): bytes are the rule, and fewer collectives
 * never buy more bytes than torch moves.
 *
 * Torch ranks its strategies by the cost of redistributing the inputs to them,
 * and nothing else (_select_min_cost_strategy in
 * torch/distributed/tensor/_sharding_prop.py, priced by mt_plan_torch_cost), and
 * takes the first of least cost. Its strategies follow the inputs' placements:
 * pointwise ops, reductions, softmax and norms follow an input, and matmul and
 * einsum list every sharding of their dims, all-Replicate first. On a mesh dim of
 * more than one rank a strategy torch can take therefore replicates every input
 * or keeps some input's Shard or Partial as it is: exp of a Partial is
 * all-reduced, never reduce-scattered, and softmax over a sharded dim gathers it
 * rather than move the shard to another dim. */
#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/prop.h"
#include "prop-private.h"

/* Whether candidate c of mesh dim m is one torch's strategies hold there: all
 * Replicate, or one keeping some input's Shard or Partial as it is. */
static int torch_like(const mt__engine *e, int m, const mt__cand *c) {
  if (c->kind == MT__CAND_REPLICATE) return 1;
  for (int i = 0; i < e->ninputs; ++i) {
    const mt_placement *p = &e->cur[i].placements[m];
    if (p->kind != MT_PLACEMENT_REPLICATE && placement_eq(&c->in[i], p)) return 1;
  }
  return 0;
}

/* Torch's candidates of every mesh dim into idx[m][0 .. n[m]); on a mesh dim of
 * one rank, where every candidate is free, the first (what most inputs hold, as
 * torch keeps it). Returns how many combinations they make, saturating. */
static int64_t torch_candidates(const mt__engine *e, int idx[][MT__PROP_MAX_CANDS],
                                int *n) {
  int64_t combos = 1;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const mt__dim_cands *dc = &e->dims[m];
    n[m] = 0;
    for (int k = 0; k < dc->n && (e->in->mesh_shape[m] > 1 || n[m] == 0); ++k)
      if (e->in->mesh_shape[m] == 1 || torch_like(e, m, &dc->c[k])) idx[m][n[m]++] = k;
    combos = sat_mul(combos, n[m]);
  }
  return combos;
}

/* What torch charges for `choice`: each input's move to the layout it needs,
 * every operand on its own as torch moves it (the same tensor twice too);
 * HUGE_VAL where a move cannot be priced. */
static double torch_cost(const mt__engine *e, const int *choice) {
  double total = 0.0;
  for (int i = 0; i < e->ninputs; ++i) {
    mt_layout need;
    double us;
    mt__prop_needed_layout(e, i, choice, &need);
    if (mt_plan_torch_cost(&e->cur[i], &need, e->in->itemsize[i], &us, NULL) != MT_OK)
      return HUGE_VAL;
    total += us;
  }
  return total;
}

/* Advances `at` over the torch candidates, last mesh dim fastest; 0 once it
 * wraps. */
static int next_torch(const mt__engine *e, const int *n, int *at) {
  for (int m = e->mesh_ndim - 1; m >= 0; --m) {
    if (++at[m] < n[m]) return 1;
    at[m] = 0;
  }
  return 0;
}

/* Whether torch takes one of the combinations; if so, the valid one it charges
 * least for, the first of them on a tie, into `choice`. None above
 * MT_PROP_MAX_COMBOS of torch's combinations, which are then not ranked. */
int mt__prop_torch_pick(const mt__engine *e, int *choice) {
  int idx[MT_MAX_MESH_NDIM][MT__PROP_MAX_CANDS] = {{0}}, n[MT_MAX_MESH_NDIM] = {0};
  int at[MT_MAX_MESH_NDIM] = {0}, found = 0;
  assert(e->mesh_ndim >= 1 && e->mesh_ndim <= MT_MAX_MESH_NDIM); /* prop_load checked */
  if (torch_candidates(e, idx, n) > MT_PROP_MAX_COMBOS) return 0;
  double best = HUGE_VAL;
  do {
    int c[MT_MAX_MESH_NDIM];
    for (int m = 0; m < e->mesh_ndim; ++m) c[m] = idx[m][at[m]];
    if (!mt__prop_combo_valid(e, c)) continue;
    double cost = torch_cost(e, c);
    if (cost < best) {
      best = cost, found = 1;
      memcpy(choice, c, (size_t)e->mesh_ndim * sizeof *c);
    }
  } while (next_torch(e, n, at));
  return found;
}
